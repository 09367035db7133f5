//! Runs promtool over an encoded scrape, the alert rules, their unit tests and the example
//! Prometheus configuration. promtool comes from `scripts/install-promtool.sh`; without it
//! these tests fail rather than skip.

#![allow(clippy::expect_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{config, promtool, record_known_workload, repo_root};
use tokenmill_metrics::EngineMetrics;

/// promtool's exit code for "parsed fine, lint problems found".
const LINT_PROBLEMS_EXIT_CODE: i32 = 3;

fn check_metrics(scrape: &str) -> (Option<i32>, Vec<String>) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(scrape.as_bytes())
        .expect("scrape written to promtool");
    let output = child.wait_with_output().expect("promtool finishes");
    let problems = String::from_utf8_lossy(&output.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&output.stderr).lines())
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect();
    (output.status.code(), problems)
}

/// Lint findings that are the vLLM naming contract itself and so cannot be fixed: the `vllm:`
/// namespace uses a colon, and vLLM named a histogram `vllm:iteration_tokens_total`.
fn is_contractual(problem: &str) -> bool {
    let colon = problem
        .strip_suffix(" metric names should not contain ':'")
        .is_some_and(|name| name.starts_with("vllm:") && !name.contains(' '));
    colon
        || problem
            == "vllm:iteration_tokens_total non-counter metrics should not have \"_total\" suffix"
}

#[test]
fn check_metrics_finds_only_the_contractual_name_findings() {
    let metrics = EngineMetrics::new(config());
    record_known_workload(&metrics);
    let scrape = metrics.encode().expect("encode");
    let (code, problems) = check_metrics(&scrape);
    assert!(
        code == Some(0) || code == Some(LINT_PROBLEMS_EXIT_CODE),
        "promtool check metrics failed to parse the scrape (exit {code:?}): {problems:#?}"
    );
    let unexpected: Vec<&String> = problems.iter().filter(|p| !is_contractual(p)).collect();
    assert!(
        unexpected.is_empty(),
        "promtool check metrics: {unexpected:#?}"
    );
    // promtool read every family: each vllm:* family is reported once for its colon.
    assert_eq!(
        problems
            .iter()
            .filter(|p| p.ends_with("should not contain ':'"))
            .count(),
        23,
        "{problems:#?}"
    );
}

#[test]
fn check_metrics_accepts_a_fresh_registry() {
    let metrics = EngineMetrics::new(config());
    let (code, problems) = check_metrics(&metrics.encode().expect("encode"));
    assert!(
        code == Some(0) || code == Some(LINT_PROBLEMS_EXIT_CODE),
        "{problems:#?}"
    );
    let unexpected: Vec<&String> = problems.iter().filter(|p| !is_contractual(p)).collect();
    assert!(
        unexpected.is_empty(),
        "promtool check metrics: {unexpected:#?}"
    );
}

#[test]
fn unconverted_openmetrics_is_what_promtool_would_reject() {
    // Guards the reason for the conversion: the crate's raw OpenMetrics counters read as
    // help-less untyped families to a classic-format parser.
    let metrics = EngineMetrics::new(config());
    record_known_workload(&metrics);
    let (_, problems) = check_metrics(&metrics.encode_openmetrics().expect("encode"));
    assert!(
        problems
            .iter()
            .any(|p| p == "vllm:prompt_tokens_total no help text"),
        "{problems:#?}"
    );
}

fn run_in(directory: &Path, args: &[&str]) -> Output {
    Command::new(promtool())
        .args(args)
        .current_dir(directory)
        .output()
        .expect("promtool runs")
}

fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn observability_dir() -> std::path::PathBuf {
    repo_root().join("deploy/observability")
}

#[test]
fn alert_rules_pass_check_rules() {
    let output = run_in(&observability_dir(), &["check", "rules", "alerts.yml"]);
    assert_success(&output, "promtool check rules alerts.yml");
}

#[test]
fn alert_rule_unit_tests_pass() {
    let output = run_in(&observability_dir(), &["test", "rules", "alerts_test.yml"]);
    assert_success(&output, "promtool test rules alerts_test.yml");
    assert!(String::from_utf8_lossy(&output.stdout).contains("SUCCESS"));
}

#[test]
fn example_prometheus_config_is_valid() {
    let output = run_in(&observability_dir(), &["check", "config", "prometheus.yml"]);
    assert_success(&output, "promtool check config prometheus.yml");
}
