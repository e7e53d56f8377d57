//! `ttctl cache ls|verify|rm`: the variants on disk, the verdict on the
//! next start, what was freed.

use tt_serving_proto::v1::{CacheVariant, ListCacheResponse, RemoveCacheResponse};

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
    }
    table.render()
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

/// Judge whether `model`'s next start will be warm: the variant its slots'
/// current config selects (the one with `used_by` set) must be on disk and
/// warm. A variant no slot uses is left over from an older config (or
/// worker) and does not count. A name the config does not have is an
/// error naming the models it has, not a promise of a cold start.
pub fn cache_verdict(model: &str, cache: &ListCacheResponse) -> CacheVerdict {
    let variants: Vec<&CacheVariant> = cache.variants.iter().filter(|v| v.model == model).collect();
    let configured = cache.models.iter().any(|m| m == model);
    if !configured && variants.is_empty() {
        return CacheVerdict {
            listing: String::new(),
            outcome: Err(format!(
                "unknown model `{model}`; the config names {}",
                if cache.models.is_empty() {
                    "no models".to_string()
                } else {
                    format!("these models: {}", cache.models.join(", "))
                }
            )),
        };
    }
    if variants.is_empty() {
        return CacheVerdict {
            listing: String::new(),
            outcome: Err(format!(
                "no cache for {model} yet: the next start builds it cold"
            )),
        };
    }
    let mut table = Table::new(&["VARIANT", "STATE", "SIZE", "FILES", "USED BY"]);
    for v in &variants {
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
    let used: Vec<&&CacheVariant> = variants.iter().filter(|v| !v.used_by.is_empty()).collect();
    let outcome = if !configured {
        Err(format!(
            "{model} is not a model of the config in force, which names {}; its {} cache \
             variant(s) on disk are left from an earlier config: `ttctl cache rm VARIANT` \
             removes one",
            if cache.models.is_empty() {
                "no models".to_string()
            } else {
                cache.models.join(", ")
            },
            variants.len()
        ))
    } else if used.is_empty() {
        Err(format!(
            "{model}: none of its {} cache variant(s) on disk is the one its current config \
             selects (no slot uses them): a cold build will happen at the next start",
            variants.len()
        ))
    } else if let Some(bad) = used.iter().find(|v| v.state != "warm") {
        let slots = bad.used_by.join(", ");
        Err(match bad.state.as_str() {
            "cold" => format!(
                "{model}: variant {} (used by {slots}) is cold, its build never completed: \
                 a cold build will happen at the next start",
                bad.key
            ),
            "incomplete" => format!(
                "{model}: variant {} (used by {slots}) is incomplete: {}; \
                 a cold build will happen at the next start",
                bad.key,
                or_dash(&one_line(&bad.reason))
            ),
            other => format!(
                "{model}: variant {} (used by {slots}) is {}, not warm: \
                 a cold build will happen at the next start",
                bad.key,
                if other.is_empty() {
                    "in an unknown state"
                } else {
                    other
                }
            ),
        })
    } else {
        let keys: Vec<&str> = used.iter().map(|v| v.key.as_str()).collect();
        let slots: Vec<&str> = used
            .iter()
            .flat_map(|v| v.used_by.iter().map(String::as_str))
            .collect();
        Ok(format!(
            "{model}: variant {} is warm: the next start of {} is warm",
            keys.join(", "),
            slots.join(", ")
        ))
    };
    CacheVerdict {
        listing: table.render(),
        outcome,
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
