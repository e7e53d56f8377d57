//! The daemon's configuration: one TOML file, parsed strictly and validated as
//! a whole so that every problem is reported at once with its key path and a
//! fix (`tt-servingd check-config FILE`).
//!
//! Parsing happens in two steps. Serde (with `deny_unknown_fields`) turns each
//! section into typed structs; `serde_path_to_error` gives the key path of a
//! type error. Then [`validate`] checks the rules that span fields: TP against
//! the number of cards, a card in two models, names that must be valid
//! environment variables, timeouts that are zero or absurd.

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

/// Parse and validate config text; every problem is returned, not just the
/// first.
pub fn parse(text: &str) -> Result<Config, Vec<Problem>> {
    let config = validate::deserialize(text)?;
    let problems = validate::check(&config);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests;
