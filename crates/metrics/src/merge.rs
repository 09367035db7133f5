//! One scrape out of several engines' registries (`--data-parallel-size N`).
//!
//! Each data-parallel engine keeps its own [`crate::EngineMetrics`] (its series carry
//! `engine="<rank>"`), so the engine threads never share a counter. A scrape must still name
//! each family once, as vLLM's single Python registry does with one labelled series per
//! engine: declaring `vllm:num_requests_running` twice is an invalid exposition. So the
//! OpenMetrics texts are merged family by family: the first text's families in its order,
//! each followed by the other texts' samples of the same family, then families only later
//! texts have. A series already present (same name and labels: the HTTP metrics, which every
//! registry declares but only the front end's records) is kept from the first text only.

use std::collections::{HashMap, HashSet};

/// One metric family of an OpenMetrics text: its `# HELP`/`# TYPE`/`# UNIT` lines and samples.
#[derive(Debug, Default)]
struct Family<'a> {
    header: Vec<&'a str>,
    samples: Vec<&'a str>,
}

/// The families of one OpenMetrics text in order, keyed by family name.
fn families(text: &str) -> Vec<(&str, Family<'_>)> {
    let mut out: Vec<(&str, Family<'_>)> = Vec::new();
    for line in text.lines() {
        if line == "# EOF" || line.is_empty() {
            continue;
        }
        let declared = ["# HELP ", "# TYPE ", "# UNIT "]
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix))
            .map(|rest| rest.split_once(' ').map_or(rest, |(name, _)| name));
        match (declared, out.last_mut()) {
            (Some(name), Some((last, family))) if *last == name => family.header.push(line),
            (Some(name), _) => out.push((
                name,
                Family {
                    header: vec![line],
                    samples: Vec::new(),
                },
            )),
            (None, Some((_, family))) => family.samples.push(line),
            // A sample before any declaration: keep it under an anonymous family.
            (None, None) => out.push((
                "",
                Family {
                    header: Vec::new(),
                    samples: vec![line],
                },
            )),
        }
    }
    out
}

/// The series a sample line names: its metric name and labels, without the value.
fn series_key(sample: &str) -> &str {
    match sample.rfind('}') {
        Some(end) => &sample[..=end],
        None => sample.split_once(' ').map_or(sample, |(name, _)| name),
    }
}

/// Merges OpenMetrics texts into one (see the module comment), ending with `# EOF`.
pub(crate) fn merge_openmetrics(texts: &[String]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut merged: HashMap<&str, Family<'_>> = HashMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for text in texts {
        for (name, family) in families(text) {
            let target = merged.entry(name).or_insert_with(|| {
                order.push(name);
                Family {
                    header: family.header.clone(),
                    samples: Vec::new(),
                }
            });
            for sample in family.samples {
                if seen.insert(series_key(sample)) {
                    target.samples.push(sample);
                }
            }
        }
    }
    let mut out = String::new();
    for name in order {
        if let Some(family) = merged.get(name) {
            for line in family.header.iter().chain(&family.samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_is_declared_once_with_every_engines_series() {
        let engine0 = "# HELP r Running.\n# TYPE r gauge\nr{engine=\"0\"} 1\n\
                       # HELP h HTTP.\n# TYPE h counter\nh_total{code=\"2xx\"} 5\n# EOF\n";
        let engine1 = "# HELP r Running.\n# TYPE r gauge\nr{engine=\"1\"} 3\n\
                       # HELP h HTTP.\n# TYPE h counter\nh_total{code=\"2xx\"} 0\n\
                       # HELP only1 Late.\n# TYPE only1 gauge\nonly1 2\n# EOF\n";
        let merged = merge_openmetrics(&[engine0.to_string(), engine1.to_string()]);
        assert_eq!(
            merged,
            "# HELP r Running.\n# TYPE r gauge\nr{engine=\"0\"} 1\nr{engine=\"1\"} 3\n\
             # HELP h HTTP.\n# TYPE h counter\nh_total{code=\"2xx\"} 5\n\
             # HELP only1 Late.\n# TYPE only1 gauge\nonly1 2\n# EOF\n"
        );
    }

    #[test]
    fn histogram_buckets_of_two_engines_stay_in_one_family() {
        let engine = |rank: u32, count: u32| {
            format!(
                "# HELP t TTFT.\n# TYPE t histogram\n\
                 t_sum{{engine=\"{rank}\"}} 1.5\nt_count{{engine=\"{rank}\"}} {count}\n\
                 t_bucket{{le=\"+Inf\",engine=\"{rank}\"}} {count}\n# EOF\n"
            )
        };
        let merged = merge_openmetrics(&[engine(0, 2), engine(1, 4)]);
        assert_eq!(merged.matches("# TYPE t histogram").count(), 1);
        assert!(merged.contains("t_bucket{le=\"+Inf\",engine=\"0\"} 2\n"));
        assert!(merged.contains("t_bucket{le=\"+Inf\",engine=\"1\"} 4\n"));
        assert!(merged.ends_with("t_bucket{le=\"+Inf\",engine=\"1\"} 4\n# EOF\n"));
    }

    #[test]
    fn one_text_passes_through_unchanged() {
        let text = "# HELP r Running.\n# TYPE r gauge\nr{engine=\"0\"} 1\n# EOF\n";
        assert_eq!(merge_openmetrics(&[text.to_string()]), text);
    }
}
