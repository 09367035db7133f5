//! GBNF (llama.cpp's grammar format, the `root ::= ...` form vLLM's docs show) to the Lark
//! dialect llguidance compiles.
//!
//! The translation is token by token: a rule starts at `name ::=` and runs to the next rule
//! (so continuation lines need no parentheses); names become `r_<name>` (Lark reserves upper
//! case for terminals, and `-` is not a name character), `start` points at `root`; string
//! literals are decoded and re-quoted as JSON strings (Lark's literal syntax); character
//! classes and `.` become regexes; groups, `|`, `*`, `+`, `?` and `{m,n}` are the same in both.

/// Lark text for a GBNF grammar, or what is wrong with it.
pub(crate) fn gbnf_to_lark(gbnf: &str) -> Result<String, String> {
    let tokens = tokenize(gbnf)?;
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut index = 0;
    while index < tokens.len() {
        let starts_rule = matches!(
            (&tokens[index], tokens.get(index + 1)),
            (Token::Name(_), Some(Token::Defines))
        );
        if starts_rule {
            if let Token::Name(name) = &tokens[index] {
                rules.push((rule_name(name), Vec::new()));
            }
            index += 2;
            continue;
        }
        let Some((_, body)) = rules.last_mut() else {
            return Err("GBNF grammar must start with a rule (`name ::= ...`)".into());
        };
        let text = match &tokens[index] {
            Token::Name(name) => rule_name(name),
            Token::Defines => return Err("`::=` without a rule name before it".into()),
            Token::Other(text) => text.clone(),
        };
        // A postfix operator stays attached to what it repeats.
        match body.last_mut() {
            Some(last) if text.starts_with(['*', '+', '?', '{']) => last.push_str(&text),
            _ => body.push(text),
        }
        index += 1;
    }
    if !rules.iter().any(|(name, _)| name == "r_root") {
        return Err("GBNF grammar has no `root` rule".into());
    }
    let mut lark = String::from("start: r_root\n");
    for (name, body) in rules {
        if body.is_empty() {
            return Err(format!("GBNF rule `{}` is empty", &name[2..]));
        }
        lark.push_str(&format!("{name}: {}\n", body.join(" ")));
    }
    Ok(lark)
}

#[derive(Debug)]
enum Token {
    Name(String),
    Defines,
    /// Already in Lark form.
    Other(String),
}

fn rule_name(name: &str) -> String {
    format!("r_{}", name.to_lowercase().replace('-', "_"))
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut at = 0;
    while let Some(&c) = chars.get(at) {
        match c {
            _ if c.is_whitespace() => at += 1,
            '#' => {
                while chars.get(at).is_some_and(|&c| c != '\n') {
                    at += 1;
                }
            }
            ':' if chars.get(at + 1..at + 3) == Some(&[':', '=']) => {
                tokens.push(Token::Defines);
                at += 3;
            }
            '"' => {
                let (literal, end) = string_literal(&chars, at + 1)?;
                tokens.push(Token::Other(
                    serde_json::Value::from(literal.as_str()).to_string(),
                ));
                at = end;
            }
            '[' => {
                let (class, end) = char_class(&chars, at + 1)?;
                tokens.push(Token::Other(format!("/{class}/")));
                at = end;
            }
            '.' => {
                tokens.push(Token::Other("/(?s:.)/".into()));
                at += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                tokens.push(Token::Other(c.to_string()));
                at += 1;
            }
            '{' => {
                let end = (at..chars.len())
                    .find(|&i| chars[i] == '}')
                    .ok_or("unterminated `{` repetition in GBNF grammar")?;
                let inner: String = chars[at + 1..end].iter().collect();
                if !inner
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == ',' || c == ' ')
                {
                    return Err(format!("invalid GBNF repetition `{{{inner}}}`"));
                }
                tokens.push(Token::Other(format!("{{{}}}", inner.replace(' ', ""))));
                at = end + 1;
            }
            _ if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = at;
                while chars
                    .get(at)
                    .is_some_and(|&c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    at += 1;
                }
                tokens.push(Token::Name(chars[start..at].iter().collect()));
            }
            _ => return Err(format!("unexpected character {c:?} in GBNF grammar")),
        }
    }
    Ok(tokens)
}

/// The escape at `chars[at]` (just after a backslash): the character and where it ends.
fn escape(chars: &[char], at: usize) -> Result<(char, usize), String> {
    let hex = |digits: usize| -> Result<(char, usize), String> {
        let text: String = chars
            .get(at + 1..at + 1 + digits)
            .unwrap_or(&[])
            .iter()
            .collect();
        u32::from_str_radix(&text, 16)
            .ok()
            .filter(|_| text.len() == digits)
            .and_then(char::from_u32)
            .map(|c| (c, at + 1 + digits))
            .ok_or_else(|| format!("invalid escape `\\{}{text}` in GBNF grammar", chars[at]))
    };
    match chars.get(at) {
        Some('n') => Ok(('\n', at + 1)),
        Some('r') => Ok(('\r', at + 1)),
        Some('t') => Ok(('\t', at + 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&c) => Ok((c, at + 1)),
        None => Err("GBNF grammar ends inside an escape".into()),
    }
}

/// A `"..."` literal starting after its opening quote: its text and the index past it.
fn string_literal(chars: &[char], mut at: usize) -> Result<(String, usize), String> {
    let mut literal = String::new();
    loop {
        match chars.get(at) {
            None => return Err("unterminated string literal in GBNF grammar".into()),
            Some('"') => return Ok((literal, at + 1)),
            Some('\\') => {
                let (c, end) = escape(chars, at + 1)?;
                literal.push(c);
                at = end;
            }
            Some(&c) => {
                literal.push(c);
                at += 1;
            }
        }
    }
}

/// A `[...]` class starting after its `[`, as a regex class, and the index past it.
fn char_class(chars: &[char], mut at: usize) -> Result<(String, usize), String> {
    let mut class = String::from("[");
    if chars.get(at) == Some(&'^') {
        class.push('^');
        at += 1;
    }
    loop {
        let c = match chars.get(at) {
            None => return Err("unterminated character class in GBNF grammar".into()),
            Some(']') => {
                class.push(']');
                return Ok((class, at + 1));
            }
            Some('-') => {
                class.push('-');
                at += 1;
                continue;
            }
            Some('\\') => {
                let (c, end) = escape(chars, at + 1)?;
                at = end;
                c
            }
            Some(&c) => {
                at += 1;
                c
            }
        };
        // Written as an escape so regex class syntax (`[`, `&&`, `~~`, `^`) and the Lark
        // regex delimiter `/` cannot be misread.
        class.push_str(&format!("\\x{{{:x}}}", c as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_rules_literals_classes_and_repetitions() {
        let lark = gbnf_to_lark(
            "# a comment\nroot ::= answer ws-tail\nanswer ::= (\"yes\" | \"no\\n\")\n  [a-z0-9]{1,3} .\nws-tail ::= [^\"\\\\]*",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: r_root\n\
             r_root: r_answer r_ws_tail\n\
             r_answer: ( \"yes\" | \"no\\n\" ) /[\\x{61}-\\x{7a}\\x{30}-\\x{39}]/{1,3} /(?s:.)/\n\
             r_ws_tail: /[^\\x{22}\\x{5c}]/*\n"
        );
    }

    #[test]
    fn refuses_what_is_not_gbnf() {
        assert!(gbnf_to_lark("answer ::= \"x\"")
            .unwrap_err()
            .contains("root"));
        assert!(gbnf_to_lark("root ::= \"x")
            .unwrap_err()
            .contains("unterminated"));
        assert!(gbnf_to_lark("\"x\" root ::= \"x\"").is_err());
        assert!(gbnf_to_lark("root ::= [a-").is_err());
    }
}
