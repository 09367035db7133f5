//! Converting prometheus-client's OpenMetrics text into the classic Prometheus text format.
//!
//! prometheus-client only writes OpenMetrics 1.0: a counter family is declared as
//! `# TYPE vllm:prompt_tokens counter` while its sample is `vllm:prompt_tokens_total`, and the
//! text ends with `# EOF`. A parser of the classic format (`text/plain; version=0.0.4`, what
//! vLLM's Python client serves and what `promtool check metrics` reads) takes that sample for
//! a second, untyped family with no help text. So `/metrics` serves the classic format: the
//! family of a counter is renamed to its `_total` sample name, `# UNIT` and `# EOF` are
//! dropped, and everything else (samples, label escaping, histogram series) is already
//! identical in the two formats.

use crate::MetricsError;

/// Content type of [`crate::EngineMetrics::encode`]'s output.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Content type of [`crate::EngineMetrics::encode_openmetrics`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Rewrites an OpenMetrics text exposition (as prometheus-client writes it) into the classic
/// Prometheus text format 0.0.4.
pub fn openmetrics_to_prometheus_text(openmetrics: &str) -> Result<String, MetricsError> {
    let mut output = String::with_capacity(openmetrics.len());
    // HELP comes before TYPE, and only TYPE says whether the family is a counter, so the
    // HELP line waits here until its TYPE line arrives.
    let mut pending_help: Option<(&str, &str)> = None;

    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut output, pending_help.take(), None);
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, metric_type) = rest
                .split_once(' ')
                .ok_or_else(|| MetricsError::Exposition(format!("malformed TYPE line: {line}")))?;
            let (exposed_name, exposed_type) = match metric_type {
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (name.to_string(), metric_type),
                "unknown" => (name.to_string(), "untyped"),
                other => {
                    return Err(MetricsError::Exposition(format!(
                        "metric type {other} of {name} has no classic text equivalent"
                    )))
                }
            };
            let help = pending_help.take();
            match help {
                Some((help_name, _)) if help_name == name => {
                    flush_help(&mut output, help, Some(&exposed_name));
                }
                _ => flush_help(&mut output, help, None),
            }
            output.push_str("# TYPE ");
            output.push_str(&exposed_name);
            output.push(' ');
            output.push_str(exposed_type);
            output.push('\n');
            continue;
        }
        flush_help(&mut output, pending_help.take(), None);
        output.push_str(line);
        output.push('\n');
    }
    flush_help(&mut output, pending_help.take(), None);
    Ok(output)
}

fn flush_help(output: &mut String, help: Option<(&str, &str)>, renamed: Option<&str>) {
    if let Some((name, text)) = help {
        output.push_str("# HELP ");
        output.push_str(renamed.unwrap_or(name));
        output.push(' ');
        output.push_str(text);
        output.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_families_take_their_total_sample_name() {
        let openmetrics = "# HELP vllm:prompt_tokens Prompt tokens.\n\
                           # TYPE vllm:prompt_tokens counter\n\
                           vllm:prompt_tokens_total{model_name=\"m\",engine=\"0\"} 7\n\
                           # HELP vllm:num_requests_running Running.\n\
                           # TYPE vllm:num_requests_running gauge\n\
                           vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2\n\
                           # EOF\n";
        let expected = "# HELP vllm:prompt_tokens_total Prompt tokens.\n\
                        # TYPE vllm:prompt_tokens_total counter\n\
                        vllm:prompt_tokens_total{model_name=\"m\",engine=\"0\"} 7\n\
                        # HELP vllm:num_requests_running Running.\n\
                        # TYPE vllm:num_requests_running gauge\n\
                        vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2\n";
        assert_eq!(
            openmetrics_to_prometheus_text(openmetrics).ok().as_deref(),
            Some(expected)
        );
    }

    #[test]
    fn unit_lines_are_dropped_and_unknown_becomes_untyped() {
        let openmetrics = "# HELP x_seconds X.\n# TYPE x_seconds unknown\n# UNIT x_seconds seconds\nx_seconds 1\n# EOF\n";
        let expected = "# HELP x_seconds X.\n# TYPE x_seconds untyped\nx_seconds 1\n";
        assert_eq!(
            openmetrics_to_prometheus_text(openmetrics).ok().as_deref(),
            Some(expected)
        );
    }

    #[test]
    fn types_without_a_classic_equivalent_are_an_error() {
        let openmetrics = "# HELP build Build.\n# TYPE build info\nbuild_info{version=\"1\"} 1\n";
        assert!(matches!(
            openmetrics_to_prometheus_text(openmetrics),
            Err(MetricsError::Exposition(_))
        ));
    }
}
