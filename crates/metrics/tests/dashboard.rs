//! The shipped Grafana dashboard and alert rules select only metrics that tokenmill exposes.

#![allow(clippy::expect_used, clippy::panic)] // test helpers outside #[test] functions

mod common;
#[path = "common/promql.rs"]
mod promql;

use std::collections::BTreeSet;

use common::{config, record_known_workload, repo_root, Scrape};
use promql::{metric_names, recorded_names, rule_file_exprs};
use serde_json::Value;
use tokenmill_metrics::EngineMetrics;

fn exposed_sample_names() -> BTreeSet<String> {
    let metrics = EngineMetrics::new(config());
    record_known_workload(&metrics);
    Scrape::parse(&metrics.encode().expect("encode")).sample_names()
}

fn dashboard() -> Value {
    let path = repo_root().join("deploy/observability/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("dashboard file is readable");
    serde_json::from_str(&text).expect("dashboard is valid JSON")
}

/// Every panel, including panels nested in collapsed rows.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a [Value], into: &mut Vec<&'a Value>) {
        for panel in panels {
            into.push(panel);
            if let Some(nested) = panel["panels"].as_array() {
                walk(nested, into);
            }
        }
    }
    let mut panels = Vec::new();
    walk(
        dashboard["panels"]
            .as_array()
            .expect("dashboard has panels"),
        &mut panels,
    );
    panels
}

fn panel_exprs(dashboard: &Value) -> Vec<(String, String)> {
    all_panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_string();
            panel["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |target| {
                    let expr = target["expr"]
                        .as_str()
                        .unwrap_or_else(|| panic!("a target of {title} has no expr"))
                        .to_string();
                    (title.clone(), expr)
                })
        })
        .collect()
}

#[test]
fn every_dashboard_expression_selects_only_exposed_metrics() {
    let exposed = exposed_sample_names();
    let exprs = panel_exprs(&dashboard());
    assert!(exprs.len() >= 10, "dashboard has its queries: {exprs:?}");
    for (title, expr) in exprs {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "panel {title}: no metric in {expr}");
        for name in names {
            assert!(
                exposed.contains(&name),
                "panel {title}: {name} is not in the scrape (expr {expr})"
            );
        }
    }
}

#[test]
fn model_name_template_variable_queries_an_exposed_metric() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating list");
    let model_name = variables
        .iter()
        .find(|variable| variable["name"] == "model_name")
        .expect("a $model_name variable");
    let query = model_name["query"]["query"]
        .as_str()
        .expect("model_name has a query");
    let arguments = query
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
        .expect("label_values(metric, label)");
    let (selector, label) = arguments.split_once(',').expect("two arguments");
    assert_eq!(label.trim(), "model_name");
    let exposed = exposed_sample_names();
    for name in metric_names(selector) {
        assert!(exposed.contains(&name), "{name} is not in the scrape");
    }
}

#[test]
fn engine_queries_filter_by_the_model_name_variable() {
    for (title, expr) in panel_exprs(&dashboard()) {
        if metric_names(&expr)
            .iter()
            .any(|name| name.starts_with("vllm:"))
        {
            let selectors = expr.matches('{').count();
            let filtered = expr.matches(r#"model_name=~"$model_name""#).count();
            assert_eq!(selectors, filtered, "panel {title}: {expr}");
        }
    }
}

#[test]
fn dashboard_has_the_four_rows() {
    let dashboard = dashboard();
    let rows: Vec<&str> = all_panels(&dashboard)
        .into_iter()
        .filter(|panel| panel["type"] == "row")
        .filter_map(|panel| panel["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        vec![
            "Throughput",
            "Latency",
            "KV cache, preemption and prefix cache",
            "Scheduler"
        ]
    );
    let exprs: Vec<String> = panel_exprs(&dashboard)
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    for histogram in [
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
    ] {
        for quantile in ["0.5", "0.95", "0.99"] {
            assert!(
                exprs.iter().any(|expr| expr.contains(histogram)
                    && expr.starts_with(&format!("histogram_quantile({quantile},"))),
                "p{quantile} of {histogram}"
            );
        }
    }
}

#[test]
fn alert_rules_select_only_exposed_or_recorded_metrics() {
    let path = repo_root().join("deploy/observability/alerts.yml");
    let yaml = std::fs::read_to_string(path).expect("alerts.yml is readable");
    let recorded = recorded_names(&yaml);
    assert!(recorded.contains("tokenmill:slo_time_to_first_token_p95_seconds"));
    let exposed = exposed_sample_names();
    let exprs = rule_file_exprs(&yaml);
    assert_eq!(exprs.len(), 6, "{exprs:#?}");
    for expr in exprs {
        for name in metric_names(&expr) {
            assert!(
                exposed.contains(&name) || recorded.contains(&name),
                "{name} is neither exposed nor recorded (expr {expr})"
            );
        }
    }
}
