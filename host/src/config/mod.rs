//! The daemon's configuration: one TOML file, parsed strictly and validated as
//! a whole so that every problem is reported at once with its key path and a
//! fix (`tt-servingd check-config FILE`).
//!
//! Checking happens in three steps. Serde (with `deny_unknown_fields`) turns
//! each section into typed structs; `serde_path_to_error` gives the key path
//! of a type error, and every unknown key is named, not just the first. Then
//! [`validate`] checks the rules that span fields: TP against the number of
//! cards, a card in two models, names that must be valid environment
//! variables, timeouts that are zero or absurd. Both need only the text
//! (what a Nix build sandbox can run). What the daemon will meet on this
//! host (files, programs, groups, cards) is checked above this module, by
//! the `preflight` module, which uses the daemon's own readers for each rule.

pub mod diff;
mod problem;
mod read;
mod schema;
pub(crate) mod validate;

pub use problem::Problem;
pub use schema::*;
pub use validate::{parse_bdf, MAX_MODEL_NAME_BYTES, RESERVED_ENV};

use std::path::Path;

/// A commented example that passes `check-config`; printed by
/// `tt-servingd print-example-config`.
pub const EXAMPLE_CONFIG: &str = include_str!("example.toml");

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but has problems; each names its key.
    #[error("{} problem(s) in {path}:\n{}", problems.len(), render_problems(problems))]
    Invalid {
        /// The file (or `<string>`).
        path: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The problems, when the config was readable.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Read { .. } => &[],
            ConfigError::Invalid { problems, .. } => problems,
        }
    }
}

fn render_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every problem of a config built in memory (a trial's definition), by
/// the same rules as a file's.
pub fn problems_of(config: &Config) -> Vec<Problem> {
    validate::check(config)
}

/// Read, parse and validate a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text).map_err(|problems| ConfigError::Invalid {
        path: path.display().to_string(),
        problems,
    })
}

/// Parse and validate config text (the text alone); every problem is
/// returned, not just the first.
pub fn parse(text: &str) -> Result<Config, Vec<Problem>> {
    let checked = check(text);
    match checked.config {
        Some(config) if checked.problems.is_empty() => Ok(config),
        _ => Err(checked.problems),
    }
}

/// The outcome of checking config text.
#[derive(Debug)]
pub struct Checked {
    /// The config as far as it could be typed; None when the text is not TOML.
    pub config: Option<Config>,
    /// Every problem found.
    pub problems: Vec<Problem>,
    /// Sections whose text could not be typed (the config holds defaults
    /// there, so checks of the host must skip them).
    pub untyped: std::collections::BTreeSet<String>,
}

/// Check config text: syntax, types, every unknown key, ranges and the
/// cross-field rules, collecting every problem. Gives the same answer on
/// every machine.
pub fn check(text: &str) -> Checked {
    let parsed = match read::deserialize(text) {
        Ok(parsed) => parsed,
        Err(problems) => {
            return Checked {
                config: None,
                problems,
                untyped: Default::default(),
            }
        }
    };
    let mut problems = parsed.problems;
    problems.extend(validate::check(&parsed.config));
    Checked {
        config: Some(parsed.config),
        problems,
        untyped: parsed.untyped,
    }
}

#[cfg(test)]
mod tests;
