//! Fixture pairs for a healthy server and each pathology → the expected diagnosis, written in
//! vLLM's exposition format by the test builder.

mod common;

use std::time::Duration;

use common::{gauges, play_window, MetricsDumpBuilder, RequestShape};
use tokenmill_triage::{Direction, Pathology, Step, Symptom, TriageConfig, Verdict};

const WINDOW: Duration = Duration::from_secs(30);

fn config() -> TriageConfig {
    TriageConfig::default()
}

/// A server with some history before the window, so windowed numbers must come from deltas.
fn server_with_history(history: RequestShape) -> MetricsDumpBuilder {
    let mut builder = MetricsDumpBuilder::new("meta-llama/Llama-3.1-8B-Instruct");
    builder.complete(5_000, history);
    builder.engine(0).preempt(7);
    builder
}

#[test]
fn healthy_server_raises_no_alarm() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(22.0, 0.0, 0.48),
        gauges(24.0, 0.0, 0.55),
        gauges(21.0, 0.0, 0.60),
        gauges(23.0, 0.0, 0.52),
        gauges(20.0, 0.0, 0.50),
    ];
    let dumps = play_window(&mut server, WINDOW, &samples, 40, RequestShape::chat(), 0);
    let report = dumps.diagnose(&config());

    assert_eq!(report.overall, Verdict::Ok, "{report}");
    assert_eq!(report.symptom, Symptom::None);
    assert!(report.pathologies.is_empty(), "{report}");
    assert!(report.recommendations.is_empty(), "{report}");
    assert!(
        report.steps.iter().all(|step| step.verdict == Verdict::Ok),
        "{report}"
    );
    let metrics = &report.metrics;
    assert_eq!(metrics.completions.as_ref().unwrap().total, 160.0);
    assert!((metrics.requests_per_second.unwrap() - 160.0 / 30.0).abs() < 1e-9);
    assert_eq!(
        metrics.preemptions,
        Some(0.0),
        "history preemptions are outside the window"
    );
    assert!((metrics.prefix_cache_hit_rate.unwrap() - 160.0 / 300.0).abs() < 1e-9);
    let cache = metrics.cache_config.as_ref().unwrap();
    assert_eq!(cache.capacity_tokens, Some(2048.0 * 16.0));
    assert_eq!(cache.enable_prefix_caching, Some(true));
    assert_eq!(metrics.gauge_sample_count, 5);
}

#[test]
fn slow_history_outside_the_window_does_not_count() {
    let slow = RequestShape {
        queue_s: 4.0,
        itl_s: 0.3,
        ..RequestShape::chat()
    };
    let mut server = server_with_history(slow);
    let samples = [
        gauges(12.0, 0.0, 0.3),
        gauges(12.0, 0.0, 0.3),
        gauges(12.0, 0.0, 0.3),
    ];
    let report =
        play_window(&mut server, WINDOW, &samples, 50, RequestShape::chat(), 0).diagnose(&config());
    assert_eq!(report.symptom, Symptom::None, "{report}");
    let ttft = report.metrics.ttft.unwrap();
    assert!(
        ttft.p99.unwrap() <= 0.1,
        "TTFT p99 {:?} from the window only",
        ttft.p99
    );
}

fn thrashing_window() -> common::WindowDumps {
    let thrashing = RequestShape {
        prompt_tokens: 500,
        output_tokens: 300,
        queue_s: 2.0,
        prefill_s: 0.3,
        itl_s: 0.04,
        cached_prompt_tokens: 100,
        finished_reason: "stop",
    };
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(62.0, 14.0, 0.97),
        gauges(64.0, 18.0, 0.99),
        gauges(60.0, 12.0, 1.0),
        gauges(64.0, 20.0, 0.98),
        gauges(63.0, 16.0, 0.99),
    ];
    play_window(&mut server, WINDOW, &samples, 20, thrashing, 8)
}

#[test]
fn kv_cache_thrashing_is_detected_with_the_flags_to_change() {
    let report = thrashing_window().diagnose(&config());

    let finding = report
        .pathology(Pathology::KvCacheThrashing)
        .expect("thrashing detected");
    assert_eq!(finding.severity, Verdict::Problem);
    assert!(finding
        .evidence
        .iter()
        .any(|e| e.key == "preemptions" && e.value == 32.0));
    assert_eq!(
        report.step(Step::KvCache).unwrap().verdict,
        Verdict::Problem
    );
    assert_eq!(
        report.step(Step::Saturation).unwrap().verdict,
        Verdict::Problem
    );
    assert_eq!(report.overall, Verdict::Problem);

    let lower_seqs = report
        .recommendations
        .iter()
        .find(|rec| rec.flag.as_deref() == Some("--max-num-seqs"))
        .expect("a --max-num-seqs recommendation");
    assert_eq!(lower_seqs.direction, Direction::Decrease);
    // 002's rule: 32768 tokens × 0.85 / (500 + 300 tokens per request) = 34.8 → 34.
    let suggested = lower_seqs.suggested_value.expect("a suggested value");
    assert!((30.0..40.0).contains(&suggested), "suggested {suggested}");
    assert!(report.recommends("--kv-cache-memory", Direction::Increase));
    assert!(report
        .recommendations
        .iter()
        .any(|rec| rec.direction == Direction::ScaleOut));
    assert!(!report.recommends("--max-num-seqs", Direction::Increase));
}

#[test]
fn readme_sample_report_is_the_thrashing_fixture_rendered() {
    let readme = include_str!("../README.md");
    let rendered = thrashing_window().diagnose(&config()).to_string();
    assert!(
        readme.contains(&rendered),
        "README.md's sample report is stale; the fixture now renders:\n{rendered}"
    );
}

#[test]
fn queueing_behind_a_pinned_batch_is_prefill_starvation() {
    let queued = RequestShape {
        queue_s: 3.0,
        prefill_s: 0.1,
        itl_s: 0.02,
        ..RequestShape::chat()
    };
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(8.0, 12.0, 0.30),
        gauges(8.0, 15.0, 0.34),
        gauges(8.0, 20.0, 0.33),
        gauges(8.0, 18.0, 0.36),
        gauges(8.0, 16.0, 0.35),
    ];
    let report = play_window(&mut server, WINDOW, &samples, 10, queued, 0).diagnose(&config());

    assert_eq!(report.symptom, Symptom::Ttft, "{report}");
    let finding = report
        .pathology(Pathology::PrefillQueueing)
        .expect("queueing detected");
    assert_eq!(
        finding.severity,
        Verdict::Problem,
        "TTFT median misses its target"
    );
    assert!(report.pathology(Pathology::LongPrefills).is_none());
    assert!(report.pathology(Pathology::KvCacheThrashing).is_none());
    assert_eq!(
        report.step(Step::DeploymentShape).unwrap().verdict,
        Verdict::Warning
    );
    let inferred = report
        .step(Step::DeploymentShape)
        .unwrap()
        .evidence
        .iter()
        .find(|e| e.key == "max_num_seqs")
        .map(|e| e.value);
    assert_eq!(inferred, Some(8.0));
    assert!(
        report.recommends("--max-num-seqs", Direction::Increase),
        "{report}"
    );
    assert!(report
        .recommendations
        .iter()
        .any(|rec| rec.direction == Direction::ScaleOut));
}

#[test]
fn high_ttft_without_a_queue_is_long_prefills() {
    let rag = RequestShape {
        prompt_tokens: 6000,
        output_tokens: 120,
        queue_s: 0.001,
        prefill_s: 2.4,
        itl_s: 0.03,
        cached_prompt_tokens: 2400,
        finished_reason: "stop",
    };
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(5.0, 0.0, 0.35),
        gauges(6.0, 0.0, 0.40),
        gauges(4.0, 0.0, 0.30),
        gauges(5.0, 0.0, 0.38),
        gauges(6.0, 0.0, 0.36),
    ];
    let report = play_window(&mut server, WINDOW, &samples, 6, rag, 0).diagnose(&config());

    assert_eq!(report.symptom, Symptom::Ttft, "{report}");
    assert!(
        report.pathology(Pathology::LongPrefills).is_some(),
        "{report}"
    );
    assert!(report.pathology(Pathology::PrefillQueueing).is_none());
    assert!(
        report.pathology(Pathology::UnderUtilisation).is_none(),
        "small batches with slow TTFT are not idle capacity"
    );
    assert_eq!(
        report.step(Step::SequenceLengths).unwrap().verdict,
        Verdict::Warning
    );
    assert_eq!(report.step(Step::Saturation).unwrap().verdict, Verdict::Ok);
    assert!(report.recommends("--max-num-batched-tokens", Direction::Increase));
    assert!(report
        .recommendations
        .iter()
        .any(|rec| rec.direction == Direction::Restructure));
}

#[test]
fn small_batches_with_no_queue_are_under_utilisation() {
    let quick = RequestShape {
        prefill_s: 0.03,
        itl_s: 0.015,
        ..RequestShape::chat()
    };
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(1.0, 0.0, 0.02),
        gauges(2.0, 0.0, 0.04),
        gauges(3.0, 0.0, 0.05),
        gauges(1.0, 0.0, 0.02),
        gauges(2.0, 0.0, 0.03),
    ];
    let report = play_window(&mut server, WINDOW, &samples, 5, quick, 0).diagnose(&config());

    assert_eq!(report.symptom, Symptom::None);
    let finding = report
        .pathology(Pathology::UnderUtilisation)
        .expect("under-utilised");
    assert_eq!(finding.severity, Verdict::Warning);
    assert_eq!(report.pathologies.len(), 1, "{report}");
    assert!(report
        .recommendations
        .iter()
        .any(|rec| rec.direction == Direction::ScaleIn));
}

#[test]
fn kv_usage_with_nothing_running_is_a_block_leak() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [gauges(0.0, 0.0, 0.12); 5];
    let report =
        play_window(&mut server, WINDOW, &samples, 0, RequestShape::chat(), 0).diagnose(&config());

    assert_eq!(report.symptom, Symptom::NoTraffic);
    let leak = report
        .pathology(Pathology::BlockLeak)
        .expect("leak detected");
    assert_eq!(leak.severity, Verdict::Problem);
    assert!(report.pathology(Pathology::UnderUtilisation).is_none());
    assert!(report
        .recommendations
        .iter()
        .any(|rec| rec.direction == Direction::Investigate));
}

#[test]
fn kv_usage_rising_at_constant_load_while_requests_finish_is_a_suspected_leak() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(10.0, 0.0, 0.30),
        gauges(10.0, 0.0, 0.34),
        gauges(11.0, 0.0, 0.38),
        gauges(10.0, 0.0, 0.42),
        gauges(10.0, 0.0, 0.46),
    ];
    let report =
        play_window(&mut server, WINDOW, &samples, 20, RequestShape::chat(), 0).diagnose(&config());

    let leak = report
        .pathology(Pathology::BlockLeak)
        .expect("suspected leak");
    assert_eq!(leak.severity, Verdict::Warning);
    let slope = leak
        .evidence
        .iter()
        .find(|e| e.key == "kv_usage_slope")
        .unwrap();
    // 16 points over 30 s = 32 points per minute.
    assert!((slope.value - 32.0).abs() < 1e-6, "slope {}", slope.value);
}

#[test]
fn kv_usage_rising_while_the_same_requests_grow_is_not_a_leak() {
    // Long generations: the batch does not turn over, so growing contexts explain the rise.
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(10.0, 0.0, 0.30),
        gauges(10.0, 0.0, 0.34),
        gauges(10.0, 0.0, 0.38),
        gauges(10.0, 0.0, 0.42),
        gauges(10.0, 0.0, 0.46),
    ];
    let report =
        play_window(&mut server, WINDOW, &samples, 1, RequestShape::chat(), 0).diagnose(&config());
    assert!(report.pathology(Pathology::BlockLeak).is_none(), "{report}");
}

fn no_reuse() -> RequestShape {
    RequestShape {
        prompt_tokens: 800,
        cached_prompt_tokens: 16,
        ..RequestShape::chat()
    }
}

#[test]
fn low_hit_rate_with_caching_on_is_prefix_cache_misses() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(18.0, 0.0, 0.5),
        gauges(20.0, 0.0, 0.55),
        gauges(19.0, 0.0, 0.52),
    ];
    let report = play_window(&mut server, WINDOW, &samples, 60, no_reuse(), 0).diagnose(&config());

    let misses = report
        .pathology(Pathology::PrefixCacheMisses)
        .expect("misses detected");
    let rate = misses
        .evidence
        .iter()
        .find(|e| e.key == "prefix_cache_hit_rate")
        .unwrap();
    assert!((rate.value - 2.0).abs() < 1e-9, "hit rate {}%", rate.value);
    assert!(report
        .recommendations
        .iter()
        .any(|rec| rec.direction == Direction::Restructure));
}

#[test]
fn prefix_misses_need_caching_on() {
    let mut server = server_with_history(RequestShape::chat()).cache_config(16, 2048, false);
    let samples = [
        gauges(18.0, 0.0, 0.5),
        gauges(20.0, 0.0, 0.55),
        gauges(19.0, 0.0, 0.52),
    ];
    let report = play_window(&mut server, WINDOW, &samples, 60, no_reuse(), 0).diagnose(&config());
    assert!(
        report.pathology(Pathology::PrefixCacheMisses).is_none(),
        "{report}"
    );
    assert!(report
        .step(Step::DeploymentShape)
        .unwrap()
        .summary
        .contains("prefix caching off"));
}

#[test]
fn slow_decode_is_the_itl_symptom() {
    let slow_decode = RequestShape {
        itl_s: 0.12,
        ..RequestShape::chat()
    };
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(48.0, 0.0, 0.7),
        gauges(50.0, 0.0, 0.72),
        gauges(49.0, 0.0, 0.7),
    ];
    let report = play_window(&mut server, WINDOW, &samples, 30, slow_decode, 0).diagnose(&config());

    assert_eq!(report.symptom, Symptom::Itl, "{report}");
    assert_eq!(
        report.step(Step::Symptom).unwrap().verdict,
        Verdict::Problem
    );
    assert!(report.pathology(Pathology::LongPrefills).is_none());
    assert!(report.recommends("--max-num-seqs", Direction::Decrease));
    assert!(report.recommends("--max-num-batched-tokens", Direction::Decrease));
}

#[test]
fn slo_flags_move_the_targets() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(20.0, 0.0, 0.5),
        gauges(20.0, 0.0, 0.5),
        gauges(20.0, 0.0, 0.5),
    ];
    let dumps = play_window(&mut server, WINDOW, &samples, 30, RequestShape::chat(), 0);
    // The chat shape's TTFT is 72 ms: fine against the 500 ms default, not against 20 ms.
    assert_eq!(dumps.diagnose(&config()).symptom, Symptom::None);
    let strict = TriageConfig {
        slo_ttft: Some(Duration::from_millis(20)),
        ..config()
    };
    let report = dumps.diagnose(&strict);
    assert_eq!(report.symptom, Symptom::Ttft);
    let target = report
        .step(Step::Symptom)
        .unwrap()
        .evidence
        .iter()
        .find(|e| e.key == "ttft_target")
        .unwrap()
        .value;
    assert!((target - 20.0).abs() < 1e-9);
}

#[test]
fn an_idle_server_is_healthy() {
    let mut server = MetricsDumpBuilder::new("HuggingFaceTB/SmolLM2-135M-Instruct");
    let samples = [gauges(0.0, 0.0, 0.0); 5];
    let report =
        play_window(&mut server, WINDOW, &samples, 0, RequestShape::chat(), 0).diagnose(&config());
    assert_eq!(report.overall, Verdict::Ok, "{report}");
    assert_eq!(report.symptom, Symptom::NoTraffic);
    assert!(report.pathologies.is_empty());
    assert!(report.recommendations.is_empty());
}

#[test]
fn model_name_filter_separates_two_models() {
    let mut server = MetricsDumpBuilder::new("small").add_engine("big", "0");
    server.complete(1000, RequestShape::chat());
    let thrashing = RequestShape {
        queue_s: 2.0,
        ..RequestShape::chat()
    };
    let before = {
        server.engine(0).gauges = gauges(20.0, 0.0, 0.5);
        server.engine(1).gauges = gauges(60.0, 10.0, 0.99);
        server.render()
    };
    server.complete(50, RequestShape::chat());
    server.engine(1).complete(40, thrashing);
    server.engine(1).preempt(12);
    let after = {
        server.engine(0).gauges = gauges(21.0, 0.0, 0.55);
        server.engine(1).gauges = gauges(62.0, 14.0, 0.98);
        server.render()
    };
    let before = tokenmill_triage::Scrape::parse(&before).unwrap();
    let after = tokenmill_triage::Scrape::parse(&after).unwrap();
    let only = |model: &str| TriageConfig {
        model_name: Some(model.to_owned()),
        ..config()
    };

    let small = tokenmill_triage::diagnose(&before, &after, &[], WINDOW, &only("small"));
    assert!(small.pathologies.is_empty(), "{small}");
    assert_eq!(small.metrics.completions.as_ref().unwrap().total, 50.0);
    let big = tokenmill_triage::diagnose(&before, &after, &[], WINDOW, &only("big"));
    assert!(
        big.pathology(Pathology::KvCacheThrashing).is_some(),
        "{big}"
    );
    assert_eq!(big.model_filter.as_deref(), Some("big"));

    let all = tokenmill_triage::diagnose(&before, &after, &[], WINDOW, &config());
    assert_eq!(all.metrics.completions.as_ref().unwrap().total, 90.0);
    assert_eq!(
        all.metrics.model_names,
        vec!["big".to_owned(), "small".to_owned()]
    );
    assert_eq!(all.metrics.preemptions, Some(12.0));
}

#[test]
fn engines_of_one_model_are_summed() {
    let mut server = MetricsDumpBuilder::new("m").add_engine("m", "1");
    server.engine(0).gauges = gauges(10.0, 0.0, 0.4);
    server.engine(1).gauges = gauges(12.0, 0.0, 0.6);
    let before = server.render();
    server.complete(30, RequestShape::chat());
    server.engine(1).complete(20, RequestShape::chat());
    let after = server.render();
    let report = tokenmill_triage::diagnose(
        &tokenmill_triage::Scrape::parse(&before).unwrap(),
        &tokenmill_triage::Scrape::parse(&after).unwrap(),
        &[],
        WINDOW,
        &config(),
    );
    assert_eq!(report.metrics.engines, 2);
    assert_eq!(report.metrics.completions.as_ref().unwrap().total, 50.0);
    let running = report.metrics.gauges.running.as_ref().unwrap();
    assert_eq!(running.mean, 22.0);
    let usage = report.metrics.gauges.kv_usage.as_ref().unwrap();
    assert!(
        (usage.mean - 0.5).abs() < 1e-12,
        "KV usage is averaged over engines"
    );
}

#[test]
fn report_text_has_one_line_per_step_then_pathologies_and_recommendations() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [gauges(64.0, 18.0, 0.99), gauges(64.0, 20.0, 1.0)];
    let thrashing = RequestShape {
        queue_s: 2.0,
        ..RequestShape::chat()
    };
    let text = play_window(&mut server, WINDOW, &samples, 20, thrashing, 5)
        .diagnose(&config())
        .to_string();
    for needle in [
        "overall: PROBLEM",
        "1. symptom",
        "2. saturation",
        "3. KV cache",
        "4. sequence lengths",
        "5. deployment shape",
        "KV-cache thrashing [problem]",
        "preemptions 5",
        "--max-num-seqs",
        "--kv-cache-memory",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let step_lines = text
        .lines()
        .filter(|line| {
            line.trim_start().starts_with(|c: char| c.is_ascii_digit()) && line.contains(". ")
        })
        .count();
    assert!(step_lines >= 5, "{text}");
}

#[test]
fn preemptions_missed_by_the_usage_samples_still_call_for_fewer_sequences() {
    let mut server = server_with_history(RequestShape::chat());
    let samples = [
        gauges(4.0, 6.0, 0.70),
        gauges(4.0, 5.0, 0.80),
        gauges(4.0, 7.0, 0.75),
    ];
    let report =
        play_window(&mut server, WINDOW, &samples, 10, RequestShape::chat(), 3).diagnose(&config());
    assert!(
        report.pathology(Pathology::KvCacheThrashing).is_none(),
        "usage never read high"
    );
    assert_eq!(
        report.step(Step::KvCache).unwrap().verdict,
        Verdict::Problem
    );
    assert!(
        report.recommends("--max-num-seqs", Direction::Decrease),
        "{report}"
    );
    assert!(report.recommends("--kv-cache-memory", Direction::Increase));
    assert!(
        !report.recommends("--max-num-seqs", Direction::Increase),
        "never both directions for one flag: {report}"
    );
    let saturation = report.step(Step::Saturation).unwrap();
    assert!(
        !saturation.summary.contains("KV has room"),
        "preemptions show the KV cache ran out, so the batch is not capped by max_num_seqs: {report}"
    );
}

#[test]
fn slo_objectives_must_be_positive() {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        triage: tokenmill_triage::TriageArgs,
    }
    let parse = |slo: &str| {
        let flag = format!("--slo-ttft={slo}");
        let cli = Cli::try_parse_from(["t", "--url", "http://h", flag.as_str()]).unwrap();
        TriageConfig::from_args(&cli.triage)
    };
    assert_eq!(
        parse("250").unwrap().slo_ttft,
        Some(Duration::from_millis(250))
    );
    assert!(matches!(
        parse("0"),
        Err(tokenmill_triage::TriageError::InvalidObjective {
            flag: "--slo-ttft",
            ..
        })
    ));
    assert!(parse("-5").is_err());
}

#[test]
fn no_scenario_gets_contradictory_advice() {
    let shapes = [
        RequestShape::chat(),
        RequestShape {
            itl_s: 0.12,
            ..RequestShape::chat()
        },
        RequestShape {
            queue_s: 3.0,
            ..RequestShape::chat()
        },
        RequestShape {
            prompt_tokens: 3000,
            prefill_s: 1.5,
            cached_prompt_tokens: 0,
            ..RequestShape::chat()
        },
    ];
    for running in [2.0, 8.0, 64.0] {
        for waiting in [0.0, 10.0] {
            for usage in [0.3, 0.95] {
                for preemptions in [0, 3] {
                    for shape in shapes {
                        let mut server = server_with_history(RequestShape::chat());
                        let samples = [gauges(running, waiting, usage); 3];
                        let report =
                            play_window(&mut server, WINDOW, &samples, 10, shape, preemptions)
                                .diagnose(&config());
                        for rec in &report.recommendations {
                            assert!(!rec.because.is_empty());
                            let Some(flag) = rec.flag.as_deref() else {
                                continue;
                            };
                            let opposite = match rec.direction {
                                Direction::Increase => Direction::Decrease,
                                Direction::Decrease => Direction::Increase,
                                _ => continue,
                            };
                            assert!(
                                !report.recommends(flag, opposite),
                                "{flag} both ways:\n{report}"
                            );
                        }
                        let worst = report
                            .steps
                            .iter()
                            .map(|step| step.verdict)
                            .chain(report.pathologies.iter().map(|p| p.severity))
                            .max()
                            .unwrap();
                        assert_eq!(report.overall, worst);
                        assert!(report.pathologies.iter().all(|p| !p.evidence.is_empty()));
                        if report.overall == Verdict::Ok {
                            assert!(report.recommendations.is_empty(), "{report}");
                        }
                    }
                }
            }
        }
    }
}

/// A window in which the engine verified `drafts` drafts of `draft_tokens` tokens and accepted
/// `accepted` of them (after a history of good acceptance), under a healthy load.
fn speculating_window(drafts: u64, draft_tokens: u64, accepted: u64) -> common::WindowDumps {
    let mut server = server_with_history(RequestShape::chat());
    server.engine(0).speculate(1_000, 4_000, 3_000);
    server.set_gauges(gauges(20.0, 0.0, 0.5));
    let before = server.render();
    server.complete(40, RequestShape::chat());
    server.engine(0).speculate(drafts, draft_tokens, accepted);
    server.set_gauges(gauges(21.0, 0.0, 0.52));
    let after = server.render();
    common::WindowDumps {
        before,
        samples: Vec::new(),
        after,
        elapsed: WINDOW,
    }
}

#[test]
fn rejected_drafts_are_poor_speculative_acceptance_and_speculation_should_go() {
    let report = speculating_window(500, 2_000, 300).diagnose(&config());
    let spec = report.metrics.spec_decode.unwrap();
    assert!((spec.acceptance_rate.unwrap() - 0.15).abs() < 1e-9);
    assert!((spec.mean_acceptance_length.unwrap() - 1.6).abs() < 1e-9);
    let finding = report
        .pathology(Pathology::PoorSpecAcceptance)
        .expect("poor acceptance detected");
    assert_eq!(finding.severity, Verdict::Warning);
    assert!(
        report.recommendations.iter().any(|rec| {
            rec.direction == Direction::Disable
                && rec.flag.as_deref() == Some("--speculative-config")
        }),
        "{report}"
    );
}

#[test]
fn accepted_drafts_or_too_few_of_them_raise_nothing() {
    for (drafts, draft_tokens, accepted) in [(500, 2_000, 1_400), (20, 80, 0)] {
        let report = speculating_window(drafts, draft_tokens, accepted).diagnose(&config());
        assert!(
            report.pathology(Pathology::PoorSpecAcceptance).is_none(),
            "{report}"
        );
    }
    // A server that does not speculate has no spec_decode window at all.
    let mut server = server_with_history(RequestShape::chat());
    let samples = [gauges(20.0, 0.0, 0.5), gauges(21.0, 0.0, 0.52)];
    let report =
        play_window(&mut server, WINDOW, &samples, 40, RequestShape::chat(), 0).diagnose(&config());
    assert!(report.metrics.spec_decode.is_none());
}
