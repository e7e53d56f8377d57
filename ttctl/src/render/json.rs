//! ttctl's JSON: `status --json` (and `--watch --json`), `reload --json`,
//! `cache ls --json`.
//!
//! The JSON is the protocol message itself, serialized through the serde
//! derives that `proto/build.rs` adds (the rules, and the fields left out,
//! are in `tt_serving_proto::json`). ttctl once kept a mirror struct per
//! message and a copy function per mirror; every field added to
//! control.proto then had to be added three times, and the JSON silently
//! lacked the ones that were not.
//!
//! One mirror is left, [`CacheJson`], because that JSON deliberately
//! differs from its message: it begins with `cache_dir`, and it leaves out
//! `models` (the configured model names that `cache verify` reads), which
//! says nothing about what is on disk. The variants in it are the
//! messages.
//!
//! `tests/json.rs` pins the exact text on samples: scripts parse it.

use serde::Serialize;
use tt_serving_proto::v1::{CacheVariant, ListCacheResponse};

use super::super::outcome::Failure;

/// `ttctl cache ls --json`: `{"cache_dir": ..., "variants": [...]}`.
#[derive(Debug, Serialize)]
pub struct CacheJson<'a> {
    /// The cache root.
    pub cache_dir: &'a str,
    /// Every variant on disk, sorted by model, then key.
    pub variants: &'a [CacheVariant],
}

/// The JSON form of a cache listing.
pub fn cache_json(cache: &ListCacheResponse) -> CacheJson<'_> {
    CacheJson {
        cache_dir: &cache.cache_dir,
        variants: &cache.variants,
    }
}

/// `value` as JSON ending in a newline: indented for one answer, on one
/// line for each snapshot of a watch. `what` names it in the error.
pub(crate) fn json_text(
    value: &impl Serialize,
    pretty: bool,
    what: &str,
) -> Result<String, Failure> {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    match text {
        Ok(text) => Ok(text + "\n"),
        Err(err) => Err(Failure::Failed(format!(
            "cannot encode {what} as JSON: {err}"
        ))),
    }
}
