//! `ttctl cache ls|verify|rm`: the variants on disk, the verdict on the
//! next start, what was freed.

use tt_serving_proto::v1::{CacheVariant, ListCacheResponse, RemoveCacheResponse};

use super::super::cache::{CacheCheck, NextStart};
use super::{bytes_words, one_line, or_dash, Table};

/// `ttctl cache ls`: one row per variant (MODEL, VARIANT, STATE, SIZE,
/// FILES, USED BY), with the reason under incomplete ones.
pub fn cache_table(cache: &ListCacheResponse) -> String {
    if cache.variants.is_empty() {
        return format!("no cache variants in {}\n", or_dash(&cache.cache_dir));
    }
    let mut table = Table::new(&["MODEL", "VARIANT", "STATE", "SIZE", "FILES", "USED BY"]);
    for variant in &cache.variants {
        table.row(vec![
            variant.model.clone(),
            variant.key.clone(),
            or_dash(&variant.state).to_string(),
            bytes_words(variant.bytes),
            files_words(variant),
            used_by_words(variant),
        ]);
        if variant.state == "incomplete" {
            table.note(format!("reason: {}", or_dash(&one_line(&variant.reason))));
        }
        if let Some(words) = built_with_words(variant) {
            table.note(format!("built with: {words}"));
        }
    }
    table.render()
}

/// The engine, cards and mesh a variant was built for, from its key's
/// inputs (the worker's identity-step answer is under `engine ...`); None
/// for a variant from before the identity step.
fn built_with_words(variant: &CacheVariant) -> Option<String> {
    let inputs = &variant.inputs;
    let mut words: Vec<String> = inputs
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("engine ")?, v)))
        // The builds' sizes and times are for the key, not for people.
        .filter(|(k, _)| !k.ends_with("build"))
        .map(|(k, v)| match k {
            "worker" | "engine" => v.clone(),
            _ => format!("{} {v}", k.strip_prefix("python ").unwrap_or(k)),
        })
        .collect();
    if words.is_empty() && !inputs.contains_key("cards") {
        return None;
    }
    if let Some(cards) = inputs.get("cards") {
        words.push(format!(
            "cards {cards} {}",
            inputs.get("mesh").map(String::as_str).unwrap_or("")
        ));
    }
    Some(one_line(words.join(", ").trim()))
}

/// The marker's file count, known only for a warm variant.
fn files_words(variant: &CacheVariant) -> String {
    if variant.files == 0 && variant.state != "warm" {
        "-".to_string()
    } else {
        variant.files.to_string()
    }
}

fn used_by_words(variant: &CacheVariant) -> String {
    if variant.used_by.is_empty() {
        "-".to_string()
    } else {
        variant.used_by.join(",")
    }
}

/// What `ttctl cache verify MODEL` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheVerdict {
    /// The model's variants, as a table for stdout; empty when it has none.
    pub listing: String,
    /// `Ok`: the line saying the next start is warm (stdout, exit 0).
    /// `Err`: why it will be cold, or that no configured model has that
    /// name (the failure message, exit 1).
    pub outcome: Result<String, String>,
}

/// The verdict of `ttctl cache verify MODEL`, in words: the model's
/// variants as a table (the one its config selects marked), then why its
/// next start is warm or cold.
pub fn cache_verdict(model: &str, check: &CacheCheck) -> CacheVerdict {
    let listing = if check.variants.is_empty() {
        String::new()
    } else {
        verify_table(&check.variants)
    };
    let count = check.variants.len();
    let outcome = match &check.next_start {
        NextStart::UnknownModel { models } => Err(format!(
            "unknown model `{model}`; the config names {}",
            if models.is_empty() {
                "no models".to_string()
            } else {
                format!("these models: {}", models.join(", "))
            }
        )),
        NextStart::NoCache => Err(format!(
            "no cache for {model} yet: the next start builds it cold"
        )),
        NextStart::LeftOver { models } => Err(format!(
            "{model} is not a model of the config in force, which names {}; its {count} cache \
             variant(s) on disk are left from an earlier config: `ttctl cache rm VARIANT` \
             removes one",
            if models.is_empty() {
                "no models".to_string()
            } else {
                models.join(", ")
            },
        )),
        NextStart::NoneSelected => Err(format!(
            "{model}: none of its {count} cache variant(s) on disk is the one its current config \
             selects (no slot uses them): a cold build will happen at the next start"
        )),
        NextStart::NotWarm(bad) => Err(not_warm_line(model, bad)),
        NextStart::Warm(selected) => {
            let keys: Vec<&str> = selected.iter().map(|v| v.key.as_str()).collect();
            let slots: Vec<&str> = selected
                .iter()
                .flat_map(|v| v.used_by.iter().map(String::as_str))
                .collect();
            Ok(format!(
                "{model}: variant {} is warm: the next start of {} is warm",
                keys.join(", "),
                slots.join(", ")
            ))
        }
    };
    CacheVerdict { listing, outcome }
}

/// The model's variants, without the MODEL column `cache ls` has.
fn verify_table(variants: &[&CacheVariant]) -> String {
    let mut table = Table::new(&["VARIANT", "STATE", "SIZE", "FILES", "USED BY"]);
    for v in variants {
        table.row(vec![
            v.key.clone(),
            or_dash(&v.state).to_string(),
            bytes_words(v.bytes),
            files_words(v),
            if v.used_by.is_empty() {
                "- (not selected by the current config)".to_string()
            } else {
                v.used_by.join(",")
            },
        ]);
        if v.state == "incomplete" {
            table.note(format!("reason: {}", or_dash(&one_line(&v.reason))));
        }
    }
    table.render()
}

/// Why the selected variant `bad` will not give a warm start.
fn not_warm_line(model: &str, bad: &CacheVariant) -> String {
    let slots = bad.used_by.join(", ");
    let key = &bad.key;
    match bad.state.as_str() {
        "cold" => format!(
            "{model}: variant {key} (used by {slots}) is cold, its build never completed: \
             a cold build will happen at the next start"
        ),
        "incomplete" => format!(
            "{model}: variant {key} (used by {slots}) is incomplete: {}; \
             a cold build will happen at the next start",
            or_dash(&one_line(&bad.reason))
        ),
        other => format!(
            "{model}: variant {key} (used by {slots}) is {}, not warm: \
             a cold build will happen at the next start",
            if other.is_empty() {
                "in an unknown state"
            } else {
                other
            }
        ),
    }
}

/// What `ttctl cache rm` prints: `removed /var/cache/tt-serving/qwen/3f2a...:
/// freed 10.5 GiB (11274289152 bytes)`.
pub fn cache_removed_line(removed: &RemoveCacheResponse) -> String {
    let freed = if removed.bytes == 0 {
        "0 bytes".to_string()
    } else {
        format!("{} ({} bytes)", bytes_words(removed.bytes), removed.bytes)
    };
    format!("removed {}: freed {freed}", removed.path)
}
