//! The Jinja globals and filters Hugging Face chat templates rely on beyond core Jinja:
//! `raise_exception`, `strftime_now` and a `tojson` that writes what Python's `json.dumps` does.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `raise_exception(message)`: templates call it to reject a conversation.
pub fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time, formatted like Python's `strftime`.
pub fn strftime_now(format: String) -> Result<Value, Error> {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(strftime(
        &format,
        i64::try_from(seconds).unwrap_or(0),
    )))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date from days since 1970-01-01 (proleptic Gregorian), per Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// Python-style `strftime` for a UTC Unix timestamp. Supports the directives chat templates use
/// (`%Y %y %m %d %e %H %I %M %S %p %B %b %h %A %a %j %%`, and glibc's `%-d`-style no-padding).
pub fn strftime(format: &str, unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let second_of_day = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (
        second_of_day / 3600,
        (second_of_day / 60) % 60,
        second_of_day % 60,
    );
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let day_of_year =
        cumulative[(month - 1) as usize] + day + u32::from(month > 2 && is_leap(year));
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut directive = chars.next();
        let unpadded = directive == Some('-');
        if unpadded {
            directive = chars.next();
        }
        let number = |out: &mut String, value: i64, width: usize| {
            let _ = if unpadded {
                write!(out, "{value}")
            } else {
                write!(out, "{value:0width$}")
            };
        };
        match directive {
            Some('Y') => number(&mut out, year, 4),
            Some('y') => number(&mut out, year.rem_euclid(100), 2),
            Some('m') => number(&mut out, i64::from(month), 2),
            Some('d') => number(&mut out, i64::from(day), 2),
            Some('e') => {
                let _ = write!(out, "{day:>2}");
            }
            Some('H') => number(&mut out, hour, 2),
            Some('I') => number(&mut out, hour12, 2),
            Some('M') => number(&mut out, minute, 2),
            Some('S') => number(&mut out, second, 2),
            Some('j') => number(&mut out, i64::from(day_of_year), 3),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday_name),
            Some('a') => out.push_str(&weekday_name[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`. Unlike minijinja's built-in it writes Python's
/// spacing (`", "`, `": "`) and does not HTML-escape, so prompts match vLLM's byte for byte.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => {
                let width = usize::try_from(n).unwrap_or(0);
                if width > crate::chat_template::MAX_INDENT_WIDTH {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "tojson indent over the limit of {}",
                            crate::chat_template::MAX_INDENT_WIDTH
                        ),
                    ));
                }
                Some(" ".repeat(width))
            }
            None => Some(v.as_str().unwrap_or_default().to_string()),
        },
    };
    let (item_separator, key_separator) = match separators {
        Some(pair) if !pair.is_none() => {
            let item = pair.get_item_by_index(0)?;
            let key = pair.get_item_by_index(1)?;
            (
                item.as_str().unwrap_or(",").to_string(),
                key.as_str().unwrap_or(":").to_string(),
            )
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let style = JsonStyle {
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonStyle {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, level: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value),
            ValueKind::String => self.write_string(out, value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (index, key) in keys.iter().enumerate() {
                    if index > 0 {
                        out.push_str(&self.item_separator);
                    }
                    self.newline(out, level + 1);
                    match key.as_str() {
                        Some(text) => self.write_string(out, text),
                        None => self.write_string(out, &key.to_string()),
                    }
                    out.push_str(&self.key_separator);
                    self.write(out, &value.get_item(key)?, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push_str(&self.item_separator);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            _ => self.write_string(out, &value.to_string()),
        }
        Ok(())
    }

    fn write_string(&self, out: &mut String, text: &str) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Integers as integers; floats the way Python's `repr` writes them for ordinary magnitudes.
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if float.is_nan() {
        out.push_str("NaN");
    } else if float.is_infinite() {
        out.push_str(if float > 0.0 { "Infinity" } else { "-Infinity" });
    } else if float.fract() == 0.0 && float.abs() < 1e16 {
        let _ = write!(out, "{float:.1}");
    } else {
        let _ = write!(out, "{float}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, context: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, context).unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let context = Value::from_serialize(serde_json::json!({
            "x": {"b": 1, "a": [1.5, 2.0, true, null], "s": "é \"q\" <tag>\n\u{1}", "e": {}, "l": []}
        }));
        assert_eq!(
            render("{{ x | tojson }}", context.clone()),
            r#"{"b": 1, "a": [1.5, 2.0, true, null], "s": "é \"q\" <tag>\n\u0001", "e": {}, "l": []}"#
        );
        assert_eq!(
            render("{{ x.a | tojson(indent=2) }}", context.clone()),
            "[\n  1.5,\n  2.0,\n  true,\n  null\n]"
        );
        assert_eq!(
            render("{{ x.a | tojson(separators=(',', ':')) }}", context.clone()),
            "[1.5,2.0,true,null]"
        );
        assert_eq!(
            render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", context),
            r#"{"a": 2, "b": 1}"#
        );
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let timestamp = 1_709_211_909;
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S", timestamp),
            "2024-02-29 13:05:09"
        );
        assert_eq!(strftime("%d %b %Y", timestamp), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %I %p, day %j, %%", timestamp),
            "Thursday February 29, 01 PM, day 060, %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
    }

    #[test]
    fn raise_exception_is_an_error_with_the_message() {
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", raise_exception);
        let error = env
            .render_str("{{ raise_exception('bad role') }}", ())
            .unwrap_err();
        assert!(error.to_string().contains("bad role"), "{error}");
    }
}
