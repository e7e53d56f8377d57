//! Accuracy, judged the same way everywhere: the pass-mark syntax of the
//! daemon's config (`[models.X.accuracy.TASK] pass_mark`) and `ttctl eval
//! --pass-mark`, the built-in exact-match task format that both `ttctl
//! eval` and the daemon's readiness check (`readiness.accuracy`) run, and
//! the rule that says whether a score passes a gate.

use std::path::Path;

/// `(N, M)` of a pass mark written `N/M` (at least N correct of exactly M
/// samples), with M above 0 and N at most M; None for anything else.
pub fn pass_mark(text: &str) -> Option<(u32, u32)> {
    let (n, m) = text.split_once('/')?;
    let (n, m) = (n.trim().parse::<u32>().ok()?, m.trim().parse::<u32>().ok()?);
    (m > 0 && n <= m).then_some((n, m))
}

/// What a score must reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gate {
    /// At least `reference - tolerance`.
    Reference {
        /// The reference score, 0 to 1.
        reference: f64,
        /// How far below it a score may fall.
        tolerance: f64,
    },
    /// At least `need` correct of exactly `of` samples.
    PassMark {
        /// Correct answers needed.
        need: u32,
        /// Samples the mark is written for.
        of: u32,
    },
}

impl Gate {
    /// Whether `score` over `samples` passes.
    pub fn passes(&self, score: f64, samples: u64) -> bool {
        match *self {
            Gate::Reference {
                reference,
                tolerance,
            } => score >= reference - tolerance,
            Gate::PassMark { need, of } => {
                samples == u64::from(of) && correct_of(score, samples) >= u64::from(need)
            }
        }
    }

    /// The gate in words: `reference R with tolerance T`, `the pass mark
    /// N/M`.
    pub fn describe(&self) -> String {
        match *self {
            Gate::Reference {
                reference,
                tolerance,
            } => format!("reference {reference} with tolerance {tolerance}"),
            Gate::PassMark { need, of } => format!("the pass mark {need}/{of}"),
        }
    }
}

/// The correct answers a 0/1 mean `score` over `samples` stands for.
pub fn correct_of(score: f64, samples: u64) -> u64 {
    (score * samples as f64).round() as u64
}

/// The standard error of a mean of 0/1 scores (the sample standard
/// deviation over the square root of n, as lm-eval computes it).
pub fn binary_stderr(correct: u64, n: u64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let p = correct as f64 / n as f64;
    (p * (1.0 - p) / (n - 1) as f64).sqrt()
}

/// One question of a built-in exact-match task (a line of its JSON-lines
/// file).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The prompt, sent as is (no chat template).
    pub prompt: String,
    /// The correct answer.
    #[serde(default)]
    answer: Option<String>,
    /// Several correct answers.
    #[serde(default)]
    answers: Vec<String>,
    /// Tokens the answer may take (default 16).
    #[serde(default)]
    max_tokens: Option<u32>,
    /// Where the answer ends (default: the end of its line).
    #[serde(default)]
    stop: Option<Vec<String>>,
}

impl Question {
    /// Tokens to generate for it.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or(16)
    }

    /// Its stop strings.
    pub fn stop(&self) -> Vec<String> {
        self.stop.clone().unwrap_or_else(|| vec!["\n".into()])
    }

    /// Whether `output`'s first non-empty line is one of the answers
    /// (case, surrounding punctuation and spacing aside).
    pub fn is_answered_by(&self, output: &str) -> bool {
        let first = normalize(output.lines().find(|l| !l.trim().is_empty()).unwrap_or(""));
        self.answer
            .iter()
            .chain(&self.answers)
            .any(|a| normalize(a) == first)
    }
}

/// Lowercase, without surrounding whitespace and punctuation, inner
/// whitespace collapsed.
fn normalize(text: &str) -> String {
    let trimmed = text.trim_matches(|c: char| c.is_whitespace() || c.is_ascii_punctuation());
    trimmed
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Reads a built-in task file; the error names the file, the line and the
/// expected shape.
pub fn read_task(path: &Path) -> Result<Vec<Question>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the task file {}: {e} (a built-in task is a JSON-lines file of {{\"prompt\": ..., \"answer\": ...}})",
            path.display()
        )
    })?;
    let mut all = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line).map_err(|e| {
            format!(
                "{} line {}: {e}; each line is {{\"prompt\": ..., \"answer\": ...}} (or \"answers\": [...]), optionally \"max_tokens\" and \"stop\"",
                path.display(),
                i + 1
            )
        })?;
        if q.answer.is_none() && q.answers.is_empty() {
            return Err(format!(
                "{} line {}: no \"answer\" or \"answers\"",
                path.display(),
                i + 1
            ));
        }
        all.push(q);
    }
    if all.is_empty() {
        return Err(format!("{} has no questions", path.display()));
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_mark_is_n_of_m() {
        assert_eq!(pass_mark("55/60"), Some((55, 60)));
        assert_eq!(pass_mark(" 0 / 1 "), Some((0, 1)));
        for bad in ["61/60", "5/0", "55", "a/60", "-1/60", ""] {
            assert_eq!(pass_mark(bad), None, "{bad}");
        }
    }

    fn question(line: &str) -> Question {
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn answers_match_by_their_first_line_case_and_punctuation_aside() {
        let paris = question(r#"{"prompt": "p", "answer": "Paris"}"#);
        assert!(paris.is_answered_by(" Paris."));
        assert!(paris.is_answered_by("\n  paris \nThe city of light"));
        assert!(!paris.is_answered_by(" The capital is Paris."));
        assert!(!paris.is_answered_by(""));
        let two = question(r#"{"prompt": "p", "answers": ["New York", "NYC"]}"#);
        assert!(two.is_answered_by("new  york!"));
        assert!(two.is_answered_by("NYC"));
        assert_eq!((two.max_tokens(), two.stop()), (16, vec!["\n".to_string()]));
    }

    #[test]
    fn the_standard_error_is_lm_evals() {
        // 7 of 10: sample std sqrt(10/9 * 0.21), over sqrt(10).
        assert!((binary_stderr(7, 10) - (0.21f64 / 9.0).sqrt()).abs() < 1e-12);
        assert_eq!(binary_stderr(1, 1), 0.0);
    }

    #[test]
    fn gates_pass_at_their_bound_and_a_pass_mark_needs_its_sample_count() {
        let r = Gate::Reference {
            reference: 0.65,
            tolerance: 0.1,
        };
        assert!(r.passes(0.55, 40));
        assert!(!r.passes(0.5, 40));
        assert_eq!(r.describe(), "reference 0.65 with tolerance 0.1");
        let m = Gate::PassMark { need: 3, of: 4 };
        assert!(m.passes(0.75, 4));
        assert_eq!(m.describe(), "the pass mark 3/4");
        assert!(!m.passes(0.5, 4));
        assert!(
            !m.passes(1.0, 3),
            "three samples cannot meet a mark of four"
        );
    }

    #[test]
    fn bad_task_files_name_the_line_and_the_shape() {
        let dir = std::env::temp_dir().join(format!("tt-accuracy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        std::fs::write(
            &path,
            "{\"prompt\": \"a\", \"answer\": \"b\"}\n\n{\"prompt\": \"c\"}\n",
        )
        .unwrap();
        let e = read_task(&path).unwrap_err();
        assert!(e.contains("line 3") && e.contains("no \"answer\""), "{e}");
        std::fs::write(&path, "{\"prompt\": \"a\", \"anwser\": \"b\"}\n").unwrap();
        let e = read_task(&path).unwrap_err();
        assert!(e.contains("line 1") && e.contains("anwser"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_task(&path).unwrap_err().contains("no questions"));
        let e = read_task(&dir.join("absent.jsonl")).unwrap_err();
        assert!(e.contains("cannot read the task file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
