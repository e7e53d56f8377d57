//! Turning TOML text into a [`Config`], section by section, naming every
//! unknown key and wrong type by its key path (the cross-field rules are
//! `validate.rs`'s).

use super::problem::{problem, Problem};
use super::schema::*;
use serde_path_to_error::Segment;
use std::collections::BTreeSet;

const SECTIONS: &[&str] = &[
    "daemon",
    "hardware",
    "reset",
    "inference",
    "limits",
    "host",
    "metrics",
    "tracing",
    "openai",
    "models",
];

/// A config as far as it could be typed, with the problems found on the way.
pub(super) struct Parsed {
    /// Every section and model that could be typed; the others keep their
    /// defaults (a model that could not be typed is left out).
    pub config: Config,
    /// Unknown keys, wrong types, unknown sections.
    pub problems: Vec<Problem>,
    /// Key paths of the sections and models that could not be typed
    /// (`daemon`, `models.qwen`): checks that read them would be checking
    /// defaults, not the file.
    pub untyped: BTreeSet<String>,
}

/// Deserialize section by section so a type error in one section does not
/// hide the others, and so each error carries its key path. Fails only when
/// the text is not TOML at all.
pub(super) fn deserialize(text: &str) -> Result<Parsed, Vec<Problem>> {
    let table: toml::Table = toml::from_str(text).map_err(|e| vec![syntax_problem(text, &e)])?;
    let mut parsed = Parsed {
        config: Config::default(),
        problems: Vec::new(),
        untyped: BTreeSet::new(),
    };
    let config = &mut parsed.config;
    for (key, value) in &table {
        let typed_ok = match key.as_str() {
            "daemon" => section(key, value, &mut parsed.problems, &mut config.daemon),
            "hardware" => section(key, value, &mut parsed.problems, &mut config.hardware),
            "reset" => section(key, value, &mut parsed.problems, &mut config.reset),
            "inference" => section(key, value, &mut parsed.problems, &mut config.inference),
            "limits" => section(key, value, &mut parsed.problems, &mut config.limits),
            "host" => section(key, value, &mut parsed.problems, &mut config.host),
            "metrics" => section(key, value, &mut parsed.problems, &mut config.metrics),
            "tracing" => section(key, value, &mut parsed.problems, &mut config.tracing),
            "openai" => section(key, value, &mut parsed.problems, &mut config.openai),
            "models" => match value.as_table() {
                Some(models) => {
                    for (name, model) in models {
                        let key = format!("models.{name}");
                        match typed::<ModelConfig>(&key, model, &mut parsed.problems) {
                            Some(m) => {
                                config.models.insert(name.clone(), m);
                            }
                            None => {
                                parsed.untyped.insert(key);
                            }
                        }
                    }
                    true
                }
                None => {
                    parsed.problems.push(problem(
                        "models",
                        "must be a table of model tables, e.g. [models.qwen]",
                    ));
                    false
                }
            },
            other => {
                parsed.problems.push(problem(
                    other,
                    format!("unknown section; expected one of {}", SECTIONS.join(", ")),
                ));
                true
            }
        };
        if !typed_ok {
            parsed.untyped.insert(key.clone());
        }
    }
    Ok(parsed)
}

/// Types one section into `slot`; false when it could not be typed.
fn section<T: serde::de::DeserializeOwned>(
    key: &str,
    value: &toml::Value,
    problems: &mut Vec<Problem>,
    slot: &mut T,
) -> bool {
    match typed(key, value, problems) {
        Some(parsed) => {
            *slot = parsed;
            true
        }
        None => false,
    }
}

/// Types `value` (found at `key`), naming every unknown key in it: serde's
/// `deny_unknown_fields` stops at the first, so each one found is reported,
/// removed, and the rest typed again. Any other error ends the attempt.
fn typed<T: serde::de::DeserializeOwned>(
    key: &str,
    value: &toml::Value,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let mut value = value.clone();
    loop {
        let err = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(v) => return Some(v),
            Err(err) => err,
        };
        let mut segments: Vec<Segment> = err.path().iter().cloned().collect();
        let message = err.inner().to_string();
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string);
        // An unknown field is reported at its parent or at itself; make the
        // segments name the parent table.
        if let (Some(field), Some(Segment::Map { key: last })) = (&unknown, segments.last()) {
            if last == field {
                segments.pop();
            }
        }
        let mut path = key.to_string();
        for segment in &segments {
            match segment {
                Segment::Seq { index } => path.push_str(&format!("[{index}]")),
                Segment::Map { key } => path.push_str(&format!(".{key}")),
                Segment::Enum { variant } => path.push_str(&format!(".{variant}")),
                Segment::Unknown => path.push_str(".?"),
            }
        }
        if let Some(field) = &unknown {
            path.push_str(&format!(".{field}"));
        }
        problems.push(problem(path, message.trim().to_string()));
        // Progress is guaranteed: each round removes one key or gives up.
        let removed = unknown.is_some_and(|field| {
            table_at(&mut value, &segments)
                .and_then(|t| t.remove(&field))
                .is_some()
        });
        if !removed {
            return None;
        }
    }
}

/// The table at `segments` below `value`, if there is one.
fn table_at<'a>(value: &'a mut toml::Value, segments: &[Segment]) -> Option<&'a mut toml::Table> {
    let mut here = value;
    for segment in segments {
        here = match segment {
            Segment::Map { key } => here.as_table_mut()?.get_mut(key)?,
            Segment::Seq { index } => here.as_array_mut()?.get_mut(*index)?,
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    here.as_table_mut()
}

fn syntax_problem(text: &str, err: &toml::de::Error) -> Problem {
    let location = match err.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
            format!("line {line}, column {col}")
        }
        None => "<file>".to_string(),
    };
    problem(
        location,
        format!("not valid TOML: {}", err.message().trim()),
    )
}
