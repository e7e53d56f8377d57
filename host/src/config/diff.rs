//! What differs between two model definitions, key by key: the reload
//! plan's comparison and the "outdated" note on a slot that runs an older
//! definition than the one in force share it. Secret-bearing keys (`env`,
//! `cold_env`, `warm_env`) are named, never shown.

use super::ModelConfig;

/// Model keys the daemon applies without touching the worker.
pub const LIVE_KEYS: &[&str] = &[
    "max_queue",
    "max_in_flight",
    "recovery_wait_secs",
    "max_queue_wait_secs",
    "rollback_on_failure",
    "prefix_affinity",
];

/// Whether a changed key (dotted) is applied without touching the worker:
/// the [`LIVE_KEYS`] and the accuracy gates (read by `ttctl eval` only).
pub fn is_live(key: &str) -> bool {
    LIVE_KEYS.contains(&key) || key == "accuracy" || key.starts_with("accuracy.")
}

/// Model keys whose values may be secrets: their changes are named, never
/// shown.
const SECRET_KEYS: &[&str] = &["env", "cold_env", "warm_env"];

/// The keys (dotted) in which a slot's running definition differs from the
/// one in force, leaving out where it runs (`cards`, `replicas`) and the
/// limits a reload applies live. Non-empty: the slot runs an outdated
/// definition.
pub fn outdated_keys(running: &ModelConfig, in_force: &ModelConfig) -> Vec<String> {
    let settings = |m: &ModelConfig| {
        let mut v = to_value(m);
        if let toml::Value::Table(t) = &mut v {
            t.remove("cards");
            t.remove("replicas");
        }
        v
    };
    changed_keys(&settings(running), &settings(in_force))
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| !is_live(key))
        .collect()
}

/// A config value as a TOML tree, for comparing.
pub fn to_value<T: serde::Serialize>(value: &T) -> toml::Value {
    // Config types serialise to TOML tables by construction (they were
    // parsed from TOML); an empty table keeps the diff total anyway.
    toml::Value::try_from(value).unwrap_or_else(|_| toml::Value::Table(toml::Table::new()))
}

/// (dotted key, "old → new") for every leaf that differs. Tables recurse;
/// other values compare whole.
pub fn changed_keys(old: &toml::Value, new: &toml::Value) -> Vec<(String, String)> {
    changed_keys_shown(old, new, true)
}

/// [`changed_keys`], with `values` false saying only `added`, `removed`
/// or `changed` (for a reader who may not see the config's values).
pub fn changed_keys_shown(
    old: &toml::Value,
    new: &toml::Value,
    values: bool,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk("", old, new, values, &mut out);
    out
}

fn walk(
    prefix: &str,
    old: &toml::Value,
    new: &toml::Value,
    values: bool,
    out: &mut Vec<(String, String)>,
) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    let secret = SECRET_KEYS
        .iter()
        .any(|s| prefix == *s || prefix.starts_with(&format!("{s}.")));
    match (old, new) {
        (toml::Value::Table(o), toml::Value::Table(n)) => {
            for (k, ov) in o {
                match n.get(k) {
                    Some(nv) => walk(&join(k), ov, nv, values, out),
                    None => out.push((join(k), "removed".into())),
                }
            }
            for (k, nv) in n {
                if !o.contains_key(k) {
                    let shown = if !values || secret || SECRET_KEYS.contains(&join(k).as_str()) {
                        "added".to_string()
                    } else {
                        format!("added ({})", short(nv))
                    };
                    out.push((join(k), shown));
                }
            }
        }
        (o, n) if o != n => {
            let shown = if !values {
                "changed".to_string()
            } else if secret || SECRET_KEYS.contains(&prefix) {
                "changed (value hidden)".to_string()
            } else {
                format!("{} → {}", short(o), short(n))
            };
            out.push((prefix.to_string(), shown));
        }
        _ => {}
    }
}

fn short(v: &toml::Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 60 {
        let cut: String = text.chars().take(57).collect();
        format!("{cut}...")
    } else {
        text
    }
}
