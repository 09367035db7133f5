//! Just enough PromQL and YAML reading to list the metric names an expression selects.

use std::collections::BTreeSet;

/// Aggregation operators and binary-operator keywords: identifiers that are never metric names
/// even when no `(` follows them directly (`sum by (le) (...)`, `x > on () group_left () y`).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised label list rather than an expression.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Metric names selected by a PromQL expression (Grafana `$variables` allowed inside label
/// matchers and ranges).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        if c == '"' || c == '\'' || c == '`' {
            index = skip_string(&chars, index);
        } else if c == '{' {
            index = skip_group(&chars, index, '{', '}');
        } else if c == '[' {
            index = skip_group(&chars, index, '[', ']');
        } else if c == '$' {
            index += 1;
            while index < chars.len() && is_identifier_char(chars[index]) {
                index += 1;
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(index + 1).is_some_and(char::is_ascii_digit))
        {
            while index < chars.len()
                && (chars[index].is_ascii_alphanumeric() || chars[index] == '.')
            {
                index += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = index;
            while index < chars.len() && is_identifier_char(chars[index]) {
                index += 1;
            }
            let identifier: String = chars[start..index].iter().collect();
            let next = next_non_space(&chars, index);
            if LABEL_LIST_KEYWORDS.contains(&identifier.as_str()) {
                if let Some(open) = next.filter(|&position| chars[position] == '(') {
                    index = skip_group(&chars, open, '(', ')');
                }
            } else if KEYWORDS.contains(&identifier.as_str()) {
                // An operator or aggregation: not a selector.
            } else if next.is_some_and(|position| chars[position] == '(') {
                // A function call.
            } else {
                names.insert(identifier);
            }
        } else {
            index += 1;
        }
    }
    names
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn next_non_space(chars: &[char], mut index: usize) -> Option<usize> {
    while index < chars.len() && chars[index].is_whitespace() {
        index += 1;
    }
    (index < chars.len()).then_some(index)
}

fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut index = start + 1;
    while index < chars.len() {
        match chars[index] {
            '\\' if quote != '`' => index += 2,
            c if c == quote => return index + 1,
            _ => index += 1,
        }
    }
    panic!(
        "unterminated string in {}",
        chars.iter().collect::<String>()
    );
}

fn skip_group(chars: &[char], start: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    let mut index = start;
    while index < chars.len() {
        let c = chars[index];
        if c == '"' || c == '\'' || c == '`' {
            index = skip_string(chars, index);
            continue;
        }
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return index + 1;
            }
        }
        index += 1;
    }
    panic!(
        "unbalanced {open}{close} in {}",
        chars.iter().collect::<String>()
    );
}

/// The `expr:` values of a Prometheus rule file, single-line or block scalars (`|`, `>`).
pub fn rule_file_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        index += 1;
        let Some(value) = trimmed.strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if ["|", "|-", ">", ">-"].contains(&value) {
            let mut block = Vec::new();
            while index < lines.len() {
                let next = lines[index];
                let next_indent = next.len() - next.trim_start().len();
                if !next.trim().is_empty() && next_indent <= indent {
                    break;
                }
                block.push(next.trim());
                index += 1;
            }
            exprs.push(block.join("\n"));
        } else {
            exprs.push(value.to_string());
        }
    }
    exprs
}

/// The `record:` names of a Prometheus rule file.
pub fn recorded_names(yaml: &str) -> BTreeSet<String> {
    yaml.lines()
        .filter_map(|line| {
            line.trim_start()
                .trim_start_matches("- ")
                .strip_prefix("record:")
                .map(|name| name.trim().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn selectors_inside_functions_and_aggregations_are_found() {
        assert_eq!(
            names(
                r#"histogram_quantile(0.95, sum by (le) (rate(vllm:ttft_bucket{model_name=~"$model_name"}[$__rate_interval])))"#
            ),
            vec!["vllm:ttft_bucket"]
        );
        assert_eq!(
            names("sum(rate(a_total[5m])) / sum(rate(b_total[5m]))"),
            vec!["a_total", "b_total"]
        );
        assert_eq!(
            names("x > on () group_left () tokenmill:slo offset 5m"),
            vec!["tokenmill:slo", "x"]
        );
        assert_eq!(names(r#"up{job="a}b"} == 1e3"#), vec!["up"]);
    }
}
