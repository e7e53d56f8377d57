//! The daemon's configuration: one TOML file, parsed strictly and validated as
//! a whole so that every problem is reported at once with its key path and a
//! fix (`tt-servingd check-config FILE`).
//!
//! Checking happens in three steps. Serde (with `deny_unknown_fields`) turns
//! each section into typed structs; `serde_path_to_error` gives the key path
//! of a type error, and every unknown key is named, not just the first. Then
//! [`validate`] checks the rules that span fields: TP against the number of
//! cards, a card in two models, names that must be valid environment
//! variables, timeouts that are zero or absurd. These two need only the text
//! ([`Scope::Offline`], what a Nix build sandbox can run). Last, [`host`]
//! checks what the daemon will meet on this host: the files, programs,
//! groups and cards the config names ([`Scope::Host`]).

mod host;
mod schema;
pub(crate) mod validate;

pub use schema::*;
pub use validate::{parse_bdf, Problem, MAX_MODEL_NAME_BYTES};

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

/// Parse and validate config text (offline: the text alone); every problem
/// is returned, not just the first.
pub fn parse(text: &str) -> Result<Config, Vec<Problem>> {
    let checked = check(text, Scope::Offline);
    match checked.config {
        Some(config) if checked.problems.is_empty() => Ok(config),
        _ => Err(checked.problems),
    }
}

/// What a check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The text alone: syntax, types, unknown keys, ranges, cross-field
    /// rules. Gives the same answer on every machine.
    Offline,
    /// Also this host: files, modes, groups, programs, the GGUF header and
    /// size, and the cards when the driver is loaded.
    Host,
}

/// The outcome of checking config text.
#[derive(Debug)]
pub struct Checked {
    /// The config as far as it could be typed; None when the text is not TOML.
    pub config: Option<Config>,
    /// Every problem found, offline ones first.
    pub problems: Vec<Problem>,
}

/// Check config text as `scope` says, collecting every problem.
pub fn check(text: &str, scope: Scope) -> Checked {
    let parsed = match validate::deserialize(text) {
        Ok(parsed) => parsed,
        Err(problems) => {
            return Checked {
                config: None,
                problems,
            }
        }
    };
    let mut problems = parsed.problems;
    problems.extend(validate::check(&parsed.config));
    if scope == Scope::Host {
        // A key already wrong in the text (a relative path, an empty
        // name) would only be reported again, less clearly.
        let offline: std::collections::BTreeSet<String> =
            problems.iter().map(|p| p.key.clone()).collect();
        let found = host::check(&parsed.config, &parsed.untyped);
        problems.extend(found.into_iter().filter(|p| !offline.contains(&p.key)));
    }
    Checked {
        config: Some(parsed.config),
        problems,
    }
}

#[cfg(test)]
mod tests;
