//! The JSON-lines records `ttctl bench` (and `ttctl ab`) append: every
//! figure with what produced it, so a number in a document can be traced
//! to the engine, checkpoint, cache variant, cards, flags and banners it
//! was measured with, and checked by `ttctl bench cite`.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use tt_serving_proto::v1::StatusResponse;

/// One slot of the model as it was during the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SlotIdentity {
    /// Slot name.
    pub slot: String,
    /// Its cards (rank order).
    pub cards: Vec<String>,
    /// `engine_version` from its worker's Engine.Info.
    pub engine: String,
    /// The worker's pid and start count (a change means a restart).
    pub worker_pid: u32,
    /// Start attempts since configured.
    pub starts: u64,
    /// Cache variant key (model, checkpoint identity, cache flags).
    pub cache_variant: String,
    /// `warm` or `cold`.
    pub cache_mode: String,
    /// The definition's feature flags.
    pub flags: BTreeMap<String, String>,
    /// The context its engine declared, tokens.
    pub context_length: u32,
    /// Requests it serves at once (`max_in_flight`; match the engine's
    /// batch, e.g. vLLM's `--max-num-seqs`, which is in the command).
    pub max_in_flight: u32,
    /// The worker's command line (the engine's options move the numbers).
    pub worker_command: Vec<String>,
}

/// One card the model runs on.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CardIdentity {
    /// PCI address.
    pub bdf: String,
    /// Board type (absent on simulated hardware).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card_type: Option<String>,
    /// Firmware bundle (absent on simulated hardware).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
}

/// Where a run happened: read from `Status` before it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Identity {
    /// Host name.
    pub host: String,
    /// tt-servingd's version.
    pub daemon_version: String,
    /// ttctl's version.
    pub ttctl_version: String,
    /// `cards`, or `simulated: ...` when the daemon's hardware roots are
    /// not the host's (a fake root): then no card type, firmware or driver
    /// is claimed.
    pub hardware: String,
    /// Kernel driver version (absent on simulated hardware).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The model's Ready slots.
    pub slots: Vec<SlotIdentity>,
    /// Their cards.
    pub cards: Vec<CardIdentity>,
    /// What went into each slot's cache variant key, by key: the
    /// checkpoint's identity (path, size, mtime; a directory's files), the
    /// worker binary's (path, size, mtime), TP and the cache flags.
    pub variants: BTreeMap<String, BTreeMap<String, String>>,
}

impl Identity {
    /// The model's Ready slots and their cards in `status`.
    pub fn of(status: &StatusResponse, model: &str) -> Identity {
        use tt_serving_proto::v1::SlotState;
        let slots: Vec<SlotIdentity> = status
            .slots
            .iter()
            .filter(|s| s.model == model && s.state == SlotState::Ready as i32)
            .map(|s| SlotIdentity {
                slot: s.name.clone(),
                cards: s.cards.clone(),
                engine: s.engine_version.clone(),
                worker_pid: s.worker_pid,
                starts: s.starts,
                cache_variant: s.cache_variant.clone(),
                cache_mode: s.cache_mode.clone(),
                flags: s.flags.clone().into_iter().collect(),
                context_length: s.context_length,
                max_in_flight: s.max_in_flight,
                worker_command: s.worker_command.clone(),
            })
            .collect();
        let daemon = status.daemon.clone().unwrap_or_default();
        // A daemon before the field said nothing: it ran on its host's roots.
        let hardware = if daemon.hardware.is_empty() {
            "cards".to_string()
        } else {
            daemon.hardware.clone()
        };
        let real = hardware == "cards";
        let claim = |v: &String| real.then(|| v.clone());
        let cards = status
            .cards
            .iter()
            .filter(|c| slots.iter().any(|s| s.cards.contains(&c.bdf)))
            .map(|c| CardIdentity {
                bdf: c.bdf.clone(),
                card_type: claim(&c.card_type),
                firmware: claim(&c.fw_bundle_version),
            })
            .collect();
        Identity {
            host: hostname(),
            daemon_version: daemon.version,
            ttctl_version: env!("CARGO_PKG_VERSION").to_string(),
            driver: claim(&daemon.driver_version),
            hardware,
            slots,
            cards,
            variants: BTreeMap::new(),
        }
    }

    /// Adds the inputs of the slots' cache variants from `ttctl cache ls`'s
    /// answer.
    pub fn with_variants(mut self, cache: &tt_serving_proto::v1::ListCacheResponse) -> Identity {
        for v in &cache.variants {
            if self.slots.iter().any(|s| s.cache_variant == v.key) {
                self.variants
                    .insert(v.key.clone(), v.inputs.clone().into_iter().collect());
            }
        }
        self
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// A run's id: the time and the process, short enough to cite.
pub fn run_id(unix_ms: u64) -> String {
    format!("{:x}{:04x}", unix_ms / 1000, std::process::id() & 0xffff)
}

/// The default records file: `$XDG_STATE_HOME/tt-serving/bench.jsonl`, else
/// `~/.local/state/tt-serving/bench.jsonl` (the user's state dir: ttctl
/// runs as an operator, not as the daemon).
pub fn default_path() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("tt-serving").join("bench.jsonl"))
}

/// Where records go: `out` when given, else [`default_path`] (and then
/// whether its directory may be created).
pub fn path(out: Option<&Path>) -> Result<(PathBuf, bool), String> {
    match out {
        Some(p) => Ok((p.to_path_buf(), false)),
        None => Ok((
            default_path().ok_or(
                "no place for the records: neither XDG_STATE_HOME nor HOME is set; give --out FILE",
            )?,
            true,
        )),
    }
}

/// Appends `records` as JSON lines to `path`, creating it (and, for the
/// default path, its directory). A symlink at `path` is refused, not
/// followed.
pub fn append(path: &Path, records: &[Value], create_dir: bool) -> Result<(), String> {
    if create_dir {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                format!(
                    "{} is a symbolic link; records are not written through links (give --out a regular file)",
                    path.display()
                )
            } else {
                format!("cannot open {} for the records: {e}", path.display())
            }
        })?;
    let mut text = String::new();
    for r in records {
        text.push_str(&r.to_string());
        text.push('\n');
    }
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write the records to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_lines_and_refuses_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/r.jsonl");
        append(&path, &[serde_json::json!({"id": "a"})], true).unwrap();
        append(&path, &[serde_json::json!({"id": "b"})], false).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
        let target = dir.path().join("victim");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = append(&link, &[serde_json::json!({})], false).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
