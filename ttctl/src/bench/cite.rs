//! `ttctl bench cite DOC RECORDS...`: every measured number in a
//! document's tables must cite the record it came from, and match it.
//!
//! A table is the run of lines starting with `|`. The line before it
//! (blank lines aside) says what it is: `<!-- measured -->` (every number
//! after the first column cites `{r:ID.FIELD}`, checked against the
//! records) or `<!-- not-cited: why -->` (an explicit exemption, e.g. for
//! figures from before these records). A table with numbers and neither is
//! a problem too. Numbers are digit runs not glued to a word (`Q4_1`,
//! `x8`, `TP=2` are names, not figures) and not in a `code span`; the
//! header row is not checked.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

/// One problem, with the document line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the document (0: about the records).
    pub line: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Loads records (JSON lines with an `id`) from `files`.
pub fn load_records(files: &[impl AsRef<Path>]) -> Result<HashMap<String, Value>, String> {
    let mut records = HashMap::new();
    for file in files {
        let file = file.as_ref();
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read records {}: {e}", file.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: not a JSON record: {e}", file.display(), i + 1))?;
            if let Some(id) = v.get("id").and_then(Value::as_str) {
                records.insert(id.to_string(), v);
            }
        }
    }
    Ok(records)
}

/// A figure in a cell: its text and where it ends.
struct Number {
    text: String,
}

/// A citation: record id and field path.
struct Citation {
    id: String,
    field: String,
}

/// Splits a cell into its figures and its citations, in order.
fn scan(cell: &str) -> (Vec<Number>, Vec<Citation>, Vec<String>) {
    let mut numbers = Vec::new();
    let mut citations = Vec::new();
    let mut bad = Vec::new();
    let chars: Vec<char> = cell.chars().collect();
    let mut i = 0;
    let mut in_code = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '`' {
            in_code = !in_code;
            i += 1;
            continue;
        }
        if in_code {
            i += 1;
            continue;
        }
        if c == '{' && chars[i + 1..].starts_with(&['r', ':']) {
            let end = chars[i..].iter().position(|&c| c == '}').map(|p| i + p);
            let Some(end) = end else {
                bad.push(format!("unclosed citation in {cell:?}"));
                break;
            };
            let body: String = chars[i + 3..end].iter().collect();
            match body.split_once('.') {
                Some((id, field)) if !id.is_empty() && !field.is_empty() => {
                    citations.push(Citation {
                        id: id.to_string(),
                        field: field.to_string(),
                    })
                }
                _ => bad.push(format!(
                    "citation {{r:{body}}} must be {{r:RECORD_ID.FIELD}}"
                )),
            }
            i = end + 1;
            continue;
        }
        let glued = i > 0 && {
            let p = chars[i - 1];
            p.is_alphanumeric() || p == '_' || p == '.' || p == '='
        };
        if c.is_ascii_digit() && !glued {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            // `1,234`: a thousands separator continues the figure.
            while i + 3 < chars.len() + 1
                && i < chars.len()
                && chars[i] == ','
                && chars[i + 1..].iter().take(3).all(char::is_ascii_digit)
                && chars.get(i + 4).is_none_or(|c| !c.is_ascii_digit())
            {
                i += 4;
            }
            numbers.push(Number {
                text: chars[start..i].iter().collect(),
            });
            continue;
        }
        // Skip the rest of a word (so `x8` and `Q4_1` stay names).
        if c.is_alphanumeric() || c == '_' {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    (numbers, citations, bad)
}

/// The value at a dotted path of a record.
fn field<'a>(record: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(record, |v, key| match v {
        Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => v.get(key),
    })
}

/// Whether `shown` is `value` rounded to the decimals `shown` has.
fn matches(shown: &str, value: f64) -> bool {
    let clean = shown.replace(',', "");
    let Ok(n) = clean.parse::<f64>() else {
        return false;
    };
    let decimals = clean.split_once('.').map_or(0, |(_, d)| d.len());
    let half = 0.5 * 10f64.powi(-(decimals as i32));
    (n - value).abs() <= half * (1.0 + 1e-9) + 1e-12
}

/// Checks `doc` against `records`.
pub fn check(doc: &str, records: &HashMap<String, Value>) -> Vec<Problem> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut problems = Vec::new();
    let mut i = 0;
    let mut in_fence = false;
    while i < lines.len() {
        if lines[i].trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        if in_fence || !lines[i].trim_start().starts_with('|') {
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && lines[i].trim_start().starts_with('|') {
            i += 1;
        }
        let marker = lines[..start]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim())
            .unwrap_or("");
        let measured = marker == "<!-- measured -->";
        let exempt = marker
            .strip_prefix("<!-- not-cited:")
            .and_then(|r| r.strip_suffix("-->"))
            .is_some_and(|why| !why.trim().is_empty());
        let mut has_numbers = false;
        // Row 0 is the header, row 1 the `|---|` rule.
        for (row, line_no) in (start..i).enumerate().skip(2) {
            let cells: Vec<&str> = lines[line_no]
                .trim()
                .trim_matches('|')
                .split('|')
                .skip(1)
                .collect();
            for cell in cells {
                let (numbers, citations, bad) = scan(cell);
                has_numbers |= !numbers.is_empty();
                if !measured {
                    continue;
                }
                let _ = row;
                for b in bad {
                    problems.push(Problem {
                        line: line_no + 1,
                        message: b,
                    });
                }
                if numbers.len() != citations.len() {
                    problems.push(Problem {
                        line: line_no + 1,
                        message: format!(
                            "cell {:?} has {} number(s) and {} citation(s): follow each number with {{r:RECORD_ID.FIELD}}",
                            cell.trim(),
                            numbers.len(),
                            citations.len()
                        ),
                    });
                    continue;
                }
                for (n, c) in numbers.iter().zip(&citations) {
                    let Some(record) = records.get(&c.id) else {
                        problems.push(Problem {
                            line: line_no + 1,
                            message: format!(
                                "{} cites record {} which is in none of the record files",
                                n.text, c.id
                            ),
                        });
                        continue;
                    };
                    match field(record, &c.field).and_then(Value::as_f64) {
                        Some(v) if matches(&n.text, v) => {}
                        Some(v) => problems.push(Problem {
                            line: line_no + 1,
                            message: format!(
                                "{} does not match {}.{} = {v} (rounded to the digits shown)",
                                n.text, c.id, c.field
                            ),
                        }),
                        None => problems.push(Problem {
                            line: line_no + 1,
                            message: format!("record {} has no number at {}", c.id, c.field),
                        }),
                    }
                }
                if record_invalid(records, &citations) {
                    problems.push(Problem {
                        line: line_no + 1,
                        message: format!(
                            "cell {:?} cites a record marked invalid (see its invalid_reasons)",
                            cell.trim()
                        ),
                    });
                }
            }
        }
        if has_numbers && !measured && !exempt {
            problems.push(Problem {
                line: start + 1,
                message: "a table with numbers needs `<!-- measured -->` (and a citation for each) or `<!-- not-cited: why -->` on the line before it".into(),
            });
        }
    }
    problems
}

fn record_invalid(records: &HashMap<String, Value>, citations: &[Citation]) -> bool {
    citations.iter().any(|c| {
        records
            .get(&c.id)
            .and_then(|r| r.get("valid"))
            .and_then(Value::as_bool)
            == Some(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn records() -> HashMap<String, Value> {
        let mut m = HashMap::new();
        m.insert(
            "r1-b1-p128".to_string(),
            json!({"id": "r1-b1-p128", "valid": true, "ttft_ms": {"p50": 14.136}, "aggregate_tok_s": {"median": 316.72}}),
        );
        m.insert(
            "bad".to_string(),
            json!({"id": "bad", "valid": false, "ttft_ms": {"p50": 1.0}}),
        );
        m
    }

    #[test]
    fn cited_numbers_that_match_pass() {
        let doc = "text\n\n<!-- measured -->\n| measure | TP=1 |\n|---|---|\n| TTFT (Q4_1) | 14.1 ms {r:r1-b1-p128.ttft_ms.p50} |\n| tok/s | 317 {r:r1-b1-p128.aggregate_tok_s.median} `x8` |\n";
        assert_eq!(check(doc, &records()), vec![]);
    }

    #[test]
    fn uncited_mismatched_missing_and_invalid_are_named() {
        let doc = "<!-- measured -->\n| a | b |\n|---|---|\n| x | 14.1 |\n| y | 14.2 {r:r1-b1-p128.ttft_ms.p50} |\n| z | 3 {r:nope.ttft_ms.p50} |\n| w | 1.0 {r:bad.ttft_ms.p50} |\n";
        let p = check(doc, &records());
        let lines: Vec<usize> = p.iter().map(|p| p.line).collect();
        assert_eq!(lines, vec![4, 5, 6, 7], "{p:?}");
        assert!(p[0].message.contains("1 number(s) and 0 citation(s)"));
        assert!(p[1].message.contains("does not match"));
        assert!(p[2].message.contains("in none of the record files"));
        assert!(p[3].message.contains("invalid"));
    }

    #[test]
    fn a_table_of_numbers_needs_a_marker_and_an_exemption_needs_a_reason() {
        let plain = "| a | b |\n|---|---|\n| x | 12 |\n";
        assert_eq!(check(plain, &records()).len(), 1);
        let exempt = "<!-- not-cited: from bench/engine/results.jsonl run 20261129T192934Z -->\n| a | b |\n|---|---|\n| x | 12 |\n";
        assert!(check(exempt, &records()).is_empty());
        let no_reason = "<!-- not-cited: -->\n| a | b |\n|---|---|\n| x | 12 |\n";
        assert_eq!(check(no_reason, &records()).len(), 1);
        let names_only = "| a | b |\n|---|---|\n| TP=2 | Q4_1x8 `58c74ac` |\n";
        assert!(check(names_only, &records()).is_empty());
    }

    #[test]
    fn rounding_follows_the_digits_shown() {
        assert!(matches("14.1", 14.136));
        assert!(!matches("14.2", 14.136));
        assert!(matches("14", 14.136));
        assert!(matches("1,234", 1234.4));
        assert!(!matches("1,234", 1234.6));
    }
}
