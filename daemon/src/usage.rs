//! Usage per API key: the name a request is counted under.
//!
//! Every token in `inference.tokens_file` has a name (its own, or one
//! derived from its digest: see `api::tokens`); the public port's check
//! attaches the name of the token a request carried to the request, and
//! the router counts the request and its tokens under it. Requests without
//! a token (no tokens file, or the control socket's Generate) count under
//! [`KeyName::anonymous`]. Names, never tokens, appear in counters, logs
//! and files.
//!
//! Each request is counted once, where it ends ([`request`], by the router
//! or by a door that refused it before routing) and, when it finished,
//! with its final usage ([`tokens`]): in the Prometheus counters
//! `tt_serving_key_requests_total` and `tt_serving_key_tokens_total`, and
//! in an in-memory sum per (key, model) that the daemon flushes to the
//! ledger every [`FLUSH_EVERY`] and at a clean stop ([`Ledger::flush`]).
//!
//! The ledger: `<daemon.state_dir>/usage.jsonl`, one JSON object per
//! (key, model) per flush with that window's counts (`from`, `to`: unix
//! ms), appended through [`hostfs::open_append`] (mode 0600). A crash loses
//! at most the window not yet flushed; nothing is counted twice, as a
//! window is taken out of the sum when it is written. Past [`ROTATE_AT`]
//! bytes the file becomes `usage.jsonl.1` (one old file kept). Reading
//! ([`Ledger::sum`]) adds up both files, skipping (and counting) malformed
//! lines, such as one cut short by a crash.

use crate::hostfs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use tt_serving_proto::time::now_unix_ms;

/// The ledger's file name under `daemon.state_dir`.
pub const FILE: &str = "usage.jsonl";

/// How often the sums are written: the most a crash loses.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// The ledger's size past which it is rotated.
pub const ROTATE_AT: u64 = 16 << 20;

/// The counts of one key and model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests that ended, whatever their outcome.
    pub requests: u64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: u64,
    /// Of those, the ones the prefix cache supplied.
    pub cached_prompt_tokens: u64,
    /// Generated tokens of finished requests.
    pub completion_tokens: u64,
    /// Requests refused before generating (invalid, unknown model, queue
    /// full, unavailable, overloaded, over the key's `max_in_flight`).
    pub refused: u64,
    /// Requests that failed (the worker's error, the deadline).
    pub errors: u64,
    /// Requests cut because their client took nothing of the stream for
    /// the door's `write_timeout_secs` (absent from older lines: 0).
    #[serde(default)]
    pub stalled: u64,
}

impl Counts {
    /// Add `other`.
    pub fn add(&mut self, other: &Counts) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.cached_prompt_tokens = self
            .cached_prompt_tokens
            .saturating_add(other.cached_prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.refused = self.refused.saturating_add(other.refused);
        self.errors = self.errors.saturating_add(other.errors);
        self.stalled = self.stalled.saturating_add(other.stalled);
    }
}

/// One line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// The window's start, unix ms.
    pub from: u64,
    /// Its end, unix ms.
    pub to: u64,
    /// The key's name.
    pub key: String,
    /// The model.
    pub model: String,
    /// What the window counted.
    #[serde(flatten)]
    pub counts: Counts,
}

/// The sums not yet written, and when their window began.
struct Pending {
    from: u64,
    sums: BTreeMap<(KeyName, String), Counts>,
}

static PENDING: LazyLock<Mutex<Pending>> = LazyLock::new(|| {
    Mutex::new(Pending {
        from: now_unix_ms(),
        sums: BTreeMap::new(),
    })
});

fn count(key: &KeyName, model: &str, f: impl FnOnce(&mut Counts)) {
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    f(pending
        .sums
        .entry((key.clone(), model.to_string()))
        .or_default());
}

/// A request of `key` for `model` ended with `outcome` (the label of
/// `tt_serving_requests_total`): counted there, in the key's counter and
/// in its usage, once. Every place a request ends calls this: the router
/// (refused, finished, cut short) and a door that refused a request
/// before routing (a body that is not a request, a bad deadline header, a
/// message over the size limit, a connection with too many streams).
/// `model`: see [`model_label`].
pub fn request(key: &KeyName, model: &str, outcome: &str) {
    crate::metrics::get().request(model, outcome);
    crate::metrics::get().key_request(key.as_str(), model, outcome);
    count(key, model, |c| {
        c.requests += 1;
        match outcome {
            "invalid" | "unknown_model" | "queue_full" | "unavailable" | "overloaded"
            | "key_limit" => c.refused += 1,
            "deadline" | "worker_error" => c.errors += 1,
            "client_stalled" => c.stalled += 1,
            _ => {}
        }
    });
}

/// The model a request is counted under: its name when it is a configured
/// model, else `""`, so that clients cannot grow the labels without bound.
pub fn model_label<'a>(config: &crate::config::Config, model: &'a str) -> &'a str {
    if config.models.contains_key(model) {
        model
    } else {
        ""
    }
}

/// A request of `key` for `model` finished with this usage.
pub fn tokens(key: &KeyName, model: &str, prompt: u32, cached: u32, completion: u32) {
    crate::metrics::get().key_tokens(key.as_str(), model, prompt, cached, completion);
    count(key, model, |c| {
        c.prompt_tokens += u64::from(prompt);
        c.cached_prompt_tokens += u64::from(cached);
        c.completion_tokens += u64::from(completion);
    });
}

/// Take the pending sums out as ledger lines (empty: nothing happened).
fn take() -> Vec<Line> {
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let to = now_unix_ms();
    let from = std::mem::replace(&mut pending.from, to);
    std::mem::take(&mut pending.sums)
        .into_iter()
        .map(|((key, model), counts)| Line {
            from,
            to,
            key: key.to_string(),
            model,
            counts,
        })
        .collect()
}

/// What [`Ledger::sum`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sum {
    /// Per (key, model).
    pub by_key: BTreeMap<(String, String), Counts>,
    /// Lines that could not be read.
    pub skipped: usize,
}

/// The ledger's files.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    old: PathBuf,
    rotate_at: u64,
}

impl Ledger {
    /// The ledger under `state_dir`.
    pub fn new(state_dir: &Path) -> Ledger {
        Ledger {
            path: state_dir.join(FILE),
            old: state_dir.join(format!("{FILE}.1")),
            rotate_at: ROTATE_AT,
        }
    }

    /// The current file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write the sums counted since the last flush. A failure is logged
    /// and the window's counts are lost (the counters still have them).
    pub fn flush(&self) {
        let lines = take();
        if lines.is_empty() {
            return;
        }
        if let Err(e) = self.append(&lines) {
            tracing::error!(path = %self.path.display(), error = %e, lost = lines.len(), "could not write the usage ledger; check daemon.state_dir");
            return;
        }
        if let Err(e) = self.rotate() {
            tracing::error!(path = %self.path.display(), error = %e, "could not rotate the usage ledger; it keeps growing until it can");
        }
    }

    fn append(&self, lines: &[Line]) -> io::Result<()> {
        let mut text = String::new();
        for line in lines {
            text.push_str(&serde_json::to_string(line).map_err(io::Error::other)?);
            text.push('\n');
        }
        let mut file = hostfs::open_append(&self.path, 0o600)?;
        file.write_all(text.as_bytes())
    }

    /// Past [`ROTATE_AT`], the file becomes `.1` (replacing the old one).
    fn rotate(&self) -> io::Result<()> {
        let size = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if size >= self.rotate_at {
            // rename(2) moves the entry itself, never a link's target.
            std::fs::rename(&self.path, &self.old)?;
        }
        Ok(())
    }

    /// The sums of the windows that ended at or after `since_unix_ms`, of
    /// `key` only when given. Missing files are empty.
    pub fn sum(&self, since_unix_ms: u64, key: Option<&str>) -> io::Result<Sum> {
        let mut sum = Sum::default();
        for path in [&self.old, &self.path] {
            let bytes = match hostfs::read(path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            sum_lines(
                &String::from_utf8_lossy(&bytes),
                since_unix_ms,
                key,
                &mut sum,
            );
        }
        Ok(sum)
    }
}

/// Flush `ledger` every [`FLUSH_EVERY`], until aborted (the daemon's stop
/// then flushes once more).
pub async fn flush_every(ledger: Arc<Ledger>) {
    let mut every = tokio::time::interval(FLUSH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let ledger = ledger.clone();
        // A small append, off the runtime's threads all the same.
        let _ = tokio::task::spawn_blocking(move || ledger.flush()).await;
    }
}

fn sum_lines(text: &str, since_unix_ms: u64, key: Option<&str>, sum: &mut Sum) {
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Line>(line) {
            Ok(l) if l.to >= since_unix_ms && key.is_none_or(|k| k == l.key) => {
                sum.by_key
                    .entry((l.key, l.model))
                    .or_default()
                    .add(&l.counts);
            }
            Ok(_) => {}
            Err(_) => sum.skipped += 1,
        }
    }
}

/// The name every request without a token is counted under.
pub const ANONYMOUS: &str = "anonymous";

/// A key's name: `[A-Za-z0-9_.-]{1,64}`, with the most urgent priority the
/// key may ask (its `min_priority` in the tokens file, #45; default 0).
/// Two keys are the same key when their names are: the limit travels with
/// the name, it does not tell keys apart.
#[derive(Clone, Debug)]
pub struct KeyName {
    /// The name.
    name: Arc<str>,
    /// The lowest (most urgent) `priority` this key's requests may ask.
    min_priority: i32,
    /// Its `max_in_flight` and the requests it has admitted now, shared by
    /// every request of the key; None: no cap.
    cap: Option<Arc<InFlightCap>>,
}

/// A key's cap on requests admitted at once (`max_in_flight=<N>` in the
/// tokens file) and its count; the router takes and frees places.
#[derive(Debug)]
pub struct InFlightCap {
    /// The cap.
    pub max: u32,
    /// Requests of the key admitted and not yet ended.
    pub now: std::sync::atomic::AtomicU32,
}

impl PartialEq for KeyName {
    fn eq(&self, other: &KeyName) -> bool {
        self.name == other.name
    }
}

impl Eq for KeyName {}

impl std::hash::Hash for KeyName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl PartialOrd for KeyName {
    fn partial_cmp(&self, other: &KeyName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KeyName {
    fn cmp(&self, other: &KeyName) -> std::cmp::Ordering {
        self.name.cmp(&other.name)
    }
}

/// The most urgent priority a key may ask unless the tokens file says
/// otherwise: normal (vLLM's default), so only a key granted it jumps
/// ahead of others.
pub const DEFAULT_MIN_PRIORITY: i32 = 0;

impl KeyName {
    /// `name` when it is a valid key name, with the default limit.
    pub fn new(name: &str) -> Option<KeyName> {
        valid(name).then(|| KeyName {
            name: name.into(),
            min_priority: DEFAULT_MIN_PRIORITY,
            cap: None,
        })
    }

    /// The key of requests without a token.
    pub fn anonymous() -> KeyName {
        KeyName {
            name: ANONYMOUS.into(),
            min_priority: DEFAULT_MIN_PRIORITY,
            cap: None,
        }
    }

    /// The same key allowed priorities down to `min_priority`.
    pub fn with_min_priority(mut self, min_priority: i32) -> KeyName {
        self.min_priority = min_priority;
        self
    }

    /// The same key with this cap (shared with its other clones).
    pub fn with_cap(mut self, cap: Option<Arc<InFlightCap>>) -> KeyName {
        self.cap = cap;
        self
    }

    /// Its cap on requests admitted at once, if it has one.
    pub fn cap(&self) -> Option<&Arc<InFlightCap>> {
        self.cap.as_ref()
    }

    /// The lowest (most urgent) priority this key may ask.
    pub fn min_priority(&self) -> i32 {
        self.min_priority
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.name
    }
}

impl Default for KeyName {
    fn default() -> KeyName {
        KeyName::anonymous()
    }
}

impl std::fmt::Display for KeyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// Whether `name` is a key name: 1 to 64 of `A-Z a-z 0-9 _ . -` (safe in a
/// label, a log line and a command line without quoting).
pub fn valid(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_plain_words() {
        assert!(KeyName::new("team-a.prod_1").is_some());
        assert!(KeyName::new(&"x".repeat(64)).is_some());
        for bad in ["", "has space", "a:b", "é", &"x".repeat(65)] {
            assert!(KeyName::new(bad).is_none(), "{bad}");
        }
        assert_eq!(KeyName::default().as_str(), "anonymous");
    }

    fn key(name: &str) -> KeyName {
        KeyName::new(name).unwrap()
    }

    #[test]
    fn a_link_planted_at_the_ledger_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "not the daemon's\n").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(FILE)).unwrap();
        let ledger = Ledger::new(dir.path());
        assert!(
            ledger.append(&[]).is_err(),
            "a planted link must be refused"
        );
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "not the daemon's\n"
        );
    }

    // One test touches the process-wide sums, so no other test's counts
    // land in its windows.
    #[test]
    fn flushes_sum_rotate_and_skip_malformed_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::new(dir.path());
        request(&key("ledger-a"), "m", "ok");
        tokens(&key("ledger-a"), "m", 10, 4, 7);
        request(&key("ledger-a"), "m", "queue_full");
        request(&key("ledger-b"), "m", "worker_error");
        ledger.flush();
        // Nothing new: nothing written, nothing counted twice.
        ledger.flush();
        let sum = ledger.sum(0, None).unwrap();
        let a = sum.by_key[&("ledger-a".to_string(), "m".to_string())];
        assert_eq!(
            a,
            Counts {
                requests: 2,
                prompt_tokens: 10,
                cached_prompt_tokens: 4,
                completion_tokens: 7,
                refused: 1,
                errors: 0,
                stalled: 0,
            }
        );
        assert_eq!(
            sum.by_key[&("ledger-b".to_string(), "m".to_string())].errors,
            1
        );
        assert_eq!(ledger.sum(0, Some("ledger-b")).unwrap().by_key.len(), 1);
        assert!(ledger.sum(u64::MAX, None).unwrap().by_key.is_empty());

        // A line cut short by a crash is skipped and counted.
        let mut f = hostfs::open_append(&dir.path().join(FILE), 0o600).unwrap();
        f.write_all(b"{\"from\":1,\"to\n").unwrap();
        drop(f);
        // Past the size, the file moves to .1 and both are read.
        ledger.rotate_at = 1;
        request(&key("ledger-a"), "m", "ok");
        ledger.flush();
        assert!(dir.path().join(format!("{FILE}.1")).exists());
        assert!(!dir.path().join(FILE).exists());
        request(&key("ledger-a"), "m", "ok");
        ledger.rotate_at = ROTATE_AT;
        ledger.flush();
        let sum = ledger.sum(0, Some("ledger-a")).unwrap();
        assert_eq!(sum.skipped, 1);
        assert_eq!(
            sum.by_key[&("ledger-a".to_string(), "m".to_string())].requests,
            4
        );
    }
}
