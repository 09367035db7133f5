//! A parser for the Prometheus text exposition format (version 0.0.4), the body of `/metrics`.
//!
//! Only what a diagnosis needs: metric families with their `# TYPE` and `# HELP`, samples with
//! escaped label values, special float values (`NaN`, `+Inf`, `-Inf`) and optional timestamps.
//! Samples are grouped into the family declared before them when their name is the family name
//! or the family name plus one of the conventional suffixes (`_total`, `_bucket`, `_sum`,
//! `_count`, `_created`, `_info`); anything else becomes its own untyped family. Lookups go by
//! sample name, so both vLLM's Python spelling (`# TYPE vllm:num_preemptions_total counter`)
//! and the OpenMetrics-style spelling (`# TYPE vllm:num_preemptions counter` with `_total`
//! samples) resolve the same way.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

/// The `# TYPE` of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl MetricType {
    fn from_keyword(keyword: &str) -> Self {
        match keyword {
            "counter" => Self::Counter,
            "gauge" => Self::Gauge,
            "histogram" | "gaugehistogram" => Self::Histogram,
            "summary" => Self::Summary,
            _ => Self::Untyped,
        }
    }
}

/// The label set of one sample, in exposition order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Vec<(String, String)>);

impl Labels {
    /// Builds a label set from `(name, value)` pairs.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }

    /// The value of label `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(label, _)| label == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// The same labels without `name`, sorted, used as a series key when summing over `name`.
    pub fn without(&self, name: &str) -> Labels {
        let mut pairs: Vec<(String, String)> = self
            .0
            .iter()
            .filter(|(label, _)| label != name)
            .cloned()
            .collect();
        pairs.sort();
        Labels(pairs)
    }

    /// The labels sorted by name, so that two scrapes' series compare equal.
    pub fn canonical(&self) -> Labels {
        let mut pairs = self.0.clone();
        pairs.sort();
        Labels(pairs)
    }
}

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

/// A metric family: its declared name, type and help text, and the samples that belong to it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    pub name: String,
    pub kind: MetricType,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

/// Why a `/metrics` body could not be read. Line numbers start at 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpositionError {
    #[error("line {line}: invalid metric name")]
    InvalidMetricName { line: usize },
    #[error("line {line}: malformed label set: {reason}")]
    InvalidLabels { line: usize, reason: &'static str },
    #[error("line {line}: invalid sample value {text:?}")]
    InvalidValue { line: usize, text: String },
    #[error("line {line}: invalid timestamp {text:?}")]
    InvalidTimestamp { line: usize, text: String },
}

/// One parsed `/metrics` body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    families: Vec<MetricFamily>,
    /// Sample name → (family index, sample index) for every sample of that name.
    by_sample_name: HashMap<String, Vec<(usize, usize)>>,
}

const FAMILY_SUFFIXES: [&str; 6] = ["_total", "_bucket", "_sum", "_count", "_created", "_info"];

impl Scrape {
    /// Parses a text exposition body.
    pub fn parse(text: &str) -> Result<Self, ExpositionError> {
        let mut scrape = Scrape::default();
        let mut current_family: Option<usize> = None;
        for (index, raw_line) in text.lines().enumerate() {
            let line_number = index + 1;
            let line = raw_line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                if let Some(family) = scrape.apply_comment(comment) {
                    current_family = Some(family);
                }
                continue;
            }
            let sample = parse_sample(line, line_number)?;
            let family = match current_family {
                Some(family) if belongs_to(&sample.name, &scrape.families[family].name) => family,
                _ => {
                    let family = scrape.family_index(&sample.name);
                    current_family = Some(family);
                    family
                }
            };
            let sample_index = scrape.families[family].samples.len();
            scrape
                .by_sample_name
                .entry(sample.name.clone())
                .or_default()
                .push((family, sample_index));
            scrape.families[family].samples.push(sample);
        }
        Ok(scrape)
    }

    /// All families in exposition order.
    pub fn families(&self) -> &[MetricFamily] {
        &self.families
    }

    /// The family declared with exactly this name.
    pub fn family(&self, name: &str) -> Option<&MetricFamily> {
        self.families.iter().find(|family| family.name == name)
    }

    /// Every sample whose full name (suffix included) is `name`.
    pub fn samples_named<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.by_sample_name
            .get(name)
            .into_iter()
            .flatten()
            .map(|&(family, sample)| &self.families[family].samples[sample])
    }

    /// Whether any sample name starts with `prefix` (e.g. `vllm:`).
    pub fn has_samples_with_prefix(&self, prefix: &str) -> bool {
        self.by_sample_name
            .keys()
            .any(|name| name.starts_with(prefix))
    }

    /// Handles a `# HELP` or `# TYPE` comment; returns the family it declared, if any.
    fn apply_comment(&mut self, comment: &str) -> Option<usize> {
        let comment = comment.trim_start();
        let (keyword, rest) = comment.split_once(char::is_whitespace)?;
        let rest = rest.trim_start();
        match keyword {
            "HELP" => {
                let (name, help) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                if !is_metric_name(name) {
                    return None;
                }
                let family = self.family_index(name);
                self.families[family].help = Some(unescape_help(help.trim_start()));
                Some(family)
            }
            "TYPE" => {
                let mut parts = rest.split_whitespace();
                let name = parts.next()?;
                if !is_metric_name(name) {
                    return None;
                }
                let family = self.family_index(name);
                self.families[family].kind = MetricType::from_keyword(parts.next().unwrap_or(""));
                Some(family)
            }
            _ => None,
        }
    }

    fn family_index(&mut self, name: &str) -> usize {
        if let Some(index) = self.families.iter().rposition(|family| family.name == name) {
            return index;
        }
        self.families.push(MetricFamily {
            name: name.to_owned(),
            kind: MetricType::Untyped,
            help: None,
            samples: Vec::new(),
        });
        self.families.len() - 1
    }
}

fn belongs_to(sample_name: &str, family_name: &str) -> bool {
    match sample_name.strip_prefix(family_name) {
        Some("") => true,
        Some(suffix) => FAMILY_SUFFIXES.contains(&suffix),
        None => false,
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn unescape_help(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn parse_sample(line: &str, line_number: usize) -> Result<Sample, ExpositionError> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(ExpositionError::InvalidMetricName { line: line_number });
    }
    let mut rest = line[name_end..].trim_start();
    let mut labels = Labels::default();
    if let Some(after_brace) = rest.strip_prefix('{') {
        let (parsed, remainder) = parse_labels(after_brace, line_number)?;
        labels = parsed;
        rest = remainder.trim_start();
    }
    let mut fields = rest.split_whitespace();
    let value_text = fields.next().unwrap_or("");
    let value = parse_value(value_text).ok_or_else(|| ExpositionError::InvalidValue {
        line: line_number,
        text: value_text.to_owned(),
    })?;
    let timestamp_ms = match fields.next() {
        None => None,
        Some(text) => Some(
            text.parse::<i64>()
                .map_err(|_| ExpositionError::InvalidTimestamp {
                    line: line_number,
                    text: text.to_owned(),
                })?,
        ),
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
        timestamp_ms,
    })
}

/// Parses `name="value",...}` (the opening brace already consumed); returns the labels and the
/// text after the closing brace.
fn parse_labels(text: &str, line_number: usize) -> Result<(Labels, &str), ExpositionError> {
    let invalid = |reason| ExpositionError::InvalidLabels {
        line: line_number,
        reason,
    };
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((Labels(labels), after));
        }
        let name_end = rest
            .find(|c: char| !is_label_name_char(c))
            .unwrap_or(rest.len());
        if name_end == 0 {
            return Err(invalid("expected a label name"));
        }
        let name = rest[..name_end].to_owned();
        rest = rest[name_end..].trim_start();
        rest = rest
            .strip_prefix('=')
            .ok_or(invalid("expected '='"))?
            .trim_start();
        rest = rest.strip_prefix('"').ok_or(invalid("expected '\"'"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let closing = loop {
            match chars.next() {
                None => return Err(invalid("unterminated label value")),
                Some((index, '"')) => break index,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => return Err(invalid("unterminated label value")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((name, value));
        rest = rest[closing + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err(invalid("expected ',' or '}'"));
        }
    }
}

/// Parses a sample value, accepting Prometheus' spellings of the special values.
pub(crate) fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => text.parse::<f64>().ok(),
    }
}

impl fmt::Display for MetricType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keyword = match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::Summary => "summary",
            Self::Untyped => "untyped",
        };
        f.write_str(keyword)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_value_escapes_are_decoded() {
        let scrape = Scrape::parse(r#"m{a="x\"y",b="back\\slash",c="new\nline",} 1"#).unwrap();
        let sample = scrape.samples_named("m").next().unwrap();
        assert_eq!(sample.labels.get("a"), Some("x\"y"));
        assert_eq!(sample.labels.get("b"), Some("back\\slash"));
        assert_eq!(sample.labels.get("c"), Some("new\nline"));
    }

    #[test]
    fn braces_and_commas_inside_label_values_do_not_end_the_label_set() {
        let scrape = Scrape::parse(r#"m{path="/a,b}c"} 2 1700000000000"#).unwrap();
        let sample = scrape.samples_named("m").next().unwrap();
        assert_eq!(sample.labels.get("path"), Some("/a,b}c"));
        assert_eq!(sample.value, 2.0);
        assert_eq!(sample.timestamp_ms, Some(1_700_000_000_000));
    }

    #[test]
    fn special_values_parse() {
        let scrape = Scrape::parse("a NaN\nb +Inf\nc -Inf\nd 1.5e+09\n").unwrap();
        assert!(scrape.samples_named("a").next().unwrap().value.is_nan());
        assert_eq!(
            scrape.samples_named("b").next().unwrap().value,
            f64::INFINITY
        );
        assert_eq!(
            scrape.samples_named("c").next().unwrap().value,
            f64::NEG_INFINITY
        );
        assert_eq!(scrape.samples_named("d").next().unwrap().value, 1.5e9);
    }

    #[test]
    fn malformed_lines_report_their_line_number() {
        assert_eq!(
            Scrape::parse("ok 1\nbad{a=\"x\" 1\n"),
            Err(ExpositionError::InvalidLabels {
                line: 2,
                reason: "expected ',' or '}'"
            })
        );
        assert_eq!(
            Scrape::parse("# comment\n\nm one\n"),
            Err(ExpositionError::InvalidValue {
                line: 3,
                text: "one".into()
            })
        );
        assert_eq!(
            Scrape::parse("9m 1"),
            Err(ExpositionError::InvalidMetricName { line: 1 })
        );
    }

    #[test]
    fn suffixed_samples_join_their_declared_family() {
        let text = "# HELP h Latency.\n# TYPE h histogram\nh_bucket{le=\"1.0\"} 1\n\
                    h_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\n# TYPE c counter\nc_total 4\n\
                    other 7\n";
        let scrape = Scrape::parse(text).unwrap();
        let histogram = scrape.family("h").unwrap();
        assert_eq!(histogram.kind, MetricType::Histogram);
        assert_eq!(histogram.help.as_deref(), Some("Latency."));
        assert_eq!(histogram.samples.len(), 4);
        assert_eq!(scrape.family("c").unwrap().samples[0].name, "c_total");
        assert_eq!(scrape.family("other").unwrap().kind, MetricType::Untyped);
    }
}
