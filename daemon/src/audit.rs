//! The audit trail: one record per action on the control socket that
//! changes something (every destructive `Operation` of `api::auth`: card
//! reset, borrow, cache build, verify and removal, slot restart, stop
//! and start, reload, trials), refused ones included.
//!
//! A record says who (the uid and pid the kernel reported for the
//! connection, the user's name, and why the admin rule let them in: `root`
//! or `group <name>`), what (the operation as the ttctl command, and its
//! arguments, client text quoted with [`echo`]), when (`at`, RFC 3339 UTC,
//! when the request was admitted or refused, and `took_ms`) and the
//! outcome: `ok`, `failed`, `refused`, or `ended` when the call ended
//! before its outcome was known (a stream whose client went away, a daemon
//! stopping).
//!
//! Where: `<daemon.state_dir>/audit.jsonl`, one JSON object per line,
//! appended, never rewritten, mode 0600. Each append opens the file with
//! [`hostfs::open_append`]: a planted link, a hard link or a file someone
//! else owns there is refused and the refusal logged as an error; the
//! action itself goes on (the trail records, it does not gate), and the
//! same record still reaches the log as the `tt_servingd::audit` event
//! with its fields.
//!
//! The log: each record is the event `audit: control action: <what>
//! by <who>: <outcome>` of target [`TARGET`], one field per record field.
//! Under systemd it reaches the journal as one entry with native fields
//! (`TT_AUDIT_OPERATION`, `TT_AUDIT_UID`, `TT_AUDIT_OUTCOME`, ...:
//! `crate::logging`), elsewhere as a line on stderr.
//!
//! Records are written once the outcome is known, before the call's last
//! reply where there is one, so a client that saw its answer finds the
//! record with `ttctl audit`.

use crate::echo::echo;
use crate::hostfs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tt_serving_proto::time::{now_unix_ms, parse_rfc3339, rfc3339};

/// The trail's file name under `daemon.state_dir`.
pub const FILE: &str = "audit.jsonl";

/// The target of a record's log event, and of nothing else: under
/// systemd, `crate::logging` sends the events of this target, and only
/// them, to the journal as native fields ([`is_record`]).
pub const TARGET: &str = "tt_servingd::audit";

/// The target of what the daemon logs about the trail's file itself (an
/// append refused, lines that cannot be read): a prefix of it is
/// [`TARGET`], so `RUST_LOG=tt_servingd::audit=...` still names both.
pub const FILE_TARGET: &str = "tt_servingd::audit::file";

/// Whether `meta` is a record's log event (target [`TARGET`] exactly).
pub fn is_record(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event() && meta.target() == TARGET
}

/// A detail longer than this is cut (a cache verification lists a verdict
/// per variant): the trail is for who did what, the log has the rest.
const MAX_DETAIL: usize = 4096;

/// How an action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It did what was asked.
    Ok,
    /// It was tried and did not succeed (or was refused by the state of
    /// things: an unknown card, a slot in use).
    Failed,
    /// The admin rule refused the caller; nothing was tried.
    Refused,
    /// The call ended before its outcome was known.
    Ended,
}

impl Outcome {
    /// The word in the record.
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Refused => "refused",
            Outcome::Ended => "ended",
        }
    }
}

/// One line of the trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// When the request was admitted or refused, RFC 3339 UTC.
    pub at: String,
    /// The caller's uid; None when the kernel would not say.
    pub uid: Option<u32>,
    /// The uid's user name, when it has one.
    pub user: Option<String>,
    /// The caller's pid, when visible in the daemon's pid namespace.
    pub pid: Option<i32>,
    /// Why the admin rule let the caller in: `root`, `group <name>`; or
    /// `refused`.
    pub admitted: String,
    /// The operation, as the ttctl command that asks for it.
    pub operation: String,
    /// The request's arguments (client text quoted and bounded).
    pub args: BTreeMap<String, String>,
    /// How it ended.
    pub outcome: Outcome,
    /// The final message or error.
    pub detail: String,
    /// From admission to the outcome, in milliseconds.
    pub took_ms: u64,
}

impl Record {
    /// A record of `operation` asked now by `uid`/`pid`, admitted as
    /// `admitted`; its outcome is filled in by [`Action::finish`].
    pub fn new(uid: Option<u32>, pid: Option<i32>, admitted: &str, operation: &str) -> Record {
        let user = uid.and_then(|uid| {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|u| u.name)
        });
        Record {
            at: rfc3339(now_unix_ms()),
            uid,
            user,
            pid,
            admitted: admitted.to_string(),
            operation: operation.to_string(),
            args: BTreeMap::new(),
            outcome: Outcome::Ended,
            detail: String::new(),
            took_ms: 0,
        }
    }

    /// The record as its line in the file, newline included.
    pub fn line(&self) -> String {
        // A struct of strings and numbers always serializes.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    /// Who did what and how it ended, in words (the record's log message;
    /// no client text: the operation is a ttctl command, the user a name
    /// from the password database).
    pub fn summary(&self) -> String {
        let who = match (self.uid, self.user.as_deref()) {
            (Some(uid), Some(user)) => format!("uid {uid} ({user})"),
            (Some(uid), None) => format!("uid {uid}"),
            (None, _) => "an unknown uid".to_string(),
        };
        format!(
            "audit: control action: {} by {who}: {}",
            self.operation,
            self.outcome.word()
        )
    }

    /// One line of the file read back; None for a malformed or partly
    /// written line, or one whose time cannot be read.
    pub fn parse(line: &str) -> Option<(u64, Record)> {
        let record: Record = serde_json::from_str(line).ok()?;
        let at = parse_rfc3339(&record.at)?;
        Some((at, record))
    }
}

/// What reading the trail found.
#[derive(Debug, Default)]
pub struct Reading {
    /// The records asked for, oldest first, each with its time in Unix
    /// milliseconds.
    pub records: Vec<(u64, Record)>,
    /// Lines that could not be read (malformed, or cut short by a crash
    /// mid-write).
    pub skipped: usize,
}

/// The trail file and the lock that keeps appends whole.
#[derive(Debug)]
pub struct Trail {
    /// `<state_dir>/audit.jsonl`.
    path: PathBuf,
    /// One append at a time: two records' bytes never interleave.
    writing: Mutex<()>,
}

impl Trail {
    /// The trail under `state_dir` (created at the first record).
    pub fn new(state_dir: &Path) -> Trail {
        Trail {
            path: state_dir.join(FILE),
            writing: Mutex::new(()),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record `record` in the journal and append it to the file. A file
    /// that cannot be written (a planted link, a full disk) is logged as
    /// an error; the caller's action is not held up by it.
    pub fn append(&self, record: &Record) {
        let args = serde_json::to_string(&record.args).unwrap_or_default();
        // Each field a field of its own (a journal field under systemd:
        // `TT_AUDIT_UID`, ...; `crate::logging`); `uid` and `pid` are left
        // out when unknown.
        tracing::info!(
            target: TARGET,
            uid = record.uid,
            user = record.user.as_deref().unwrap_or(""),
            pid = record.pid,
            admitted = %record.admitted,
            operation = %record.operation,
            args = %args,
            outcome = record.outcome.word(),
            detail = %record.detail,
            took_ms = record.took_ms,
            "{}",
            record.summary()
        );
        let line = record.line();
        // A poisoned lock only means another append panicked; the file
        // holds whole lines either way.
        let _turn = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let written =
            hostfs::open_append(&self.path, 0o600).and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            tracing::error!(
                target: FILE_TARGET,
                path = %self.path.display(),
                error = %e,
                operation = %record.operation,
                "cannot append to the audit trail; the action was not held up, and the log entry before this one is its record"
            );
        }
    }

    /// The records at or after `since_unix_ms`, the newest `limit` of them
    /// (0: all). A missing file is an empty trail.
    pub fn read(&self, since_unix_ms: u64, limit: usize) -> io::Result<Reading> {
        let bytes = match hostfs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Reading::default()),
            Err(e) => return Err(e),
        };
        Ok(read_lines(
            &String::from_utf8_lossy(&bytes),
            since_unix_ms,
            limit,
        ))
    }
}

/// [`Trail::read`] over the file's text.
fn read_lines(text: &str, since_unix_ms: u64, limit: usize) -> Reading {
    let mut reading = Reading::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match Record::parse(line) {
            Some((at, record)) if at >= since_unix_ms => reading.records.push((at, record)),
            Some(_) => {}
            None => reading.skipped += 1,
        }
    }
    if limit > 0 && reading.records.len() > limit {
        reading.records.drain(..reading.records.len() - limit);
    }
    reading
}

/// One admitted (or refused) action on its way to its outcome. Exactly one
/// record is written per action: by [`Action::finish`], or, for an action
/// dropped unfinished (a stream whose client went away), as `ended`. An
/// action of a read-only operation records nothing.
#[derive(Debug)]
pub struct Action {
    /// Where the record goes.
    trail: Arc<Trail>,
    /// The record until it is written; None for read-only operations and
    /// once written.
    record: Option<Record>,
    /// When it was admitted.
    started: Instant,
}

impl Action {
    /// An action to be recorded in `trail` as `record`.
    pub fn new(trail: Arc<Trail>, record: Record) -> Action {
        Action {
            trail,
            record: Some(record),
            started: Instant::now(),
        }
    }

    /// An action that records nothing (a read-only operation).
    pub fn unrecorded(trail: Arc<Trail>) -> Action {
        Action {
            trail,
            record: None,
            started: Instant::now(),
        }
    }

    /// Add an argument; client text is quoted and bounded.
    pub fn arg(&mut self, key: &str, value: &str) {
        if let Some(record) = self.record.as_mut() {
            record.args.insert(key.to_string(), echo(value));
        }
    }

    /// Write the record with its outcome (once; later calls do nothing).
    pub fn finish(&mut self, outcome: Outcome, detail: &str) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        record.outcome = outcome;
        record.detail = bounded(detail);
        record.took_ms = self.started.elapsed().as_millis() as u64;
        self.trail.append(&record);
    }
}

impl Drop for Action {
    fn drop(&mut self) {
        self.finish(
            Outcome::Ended,
            "the call ended before its outcome was known (the client went away, or the daemon stopped)",
        );
    }
}

/// `detail` cut at [`MAX_DETAIL`] bytes, on a character boundary.
fn bounded(detail: &str) -> String {
    if detail.len() <= MAX_DETAIL {
        return detail.to_string();
    }
    let mut end = MAX_DETAIL;
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &detail[..end], detail.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            at: "2026-12-05T15:25:03.042Z".into(),
            uid: Some(0),
            user: Some("root".into()),
            pid: Some(4242),
            admitted: "root".into(),
            operation: "ttctl card reset".into(),
            args: BTreeMap::from([("card".into(), "0".into())]),
            outcome: Outcome::Ok,
            detail: "card 0000:01:00.0 is proven back as /dev/tenstorrent/0".into(),
            took_ms: 1200,
        }
    }

    #[test]
    fn a_record_is_one_json_line_with_the_fields_scripts_read() {
        let line = sample().line();
        assert!(line.ends_with('\n'));
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(
            line,
            concat!(
                r#"{"at":"2026-12-05T15:25:03.042Z","uid":0,"user":"root","pid":4242,"#,
                r#""admitted":"root","operation":"ttctl card reset","args":{"card":"0"},"#,
                r#""outcome":"ok","detail":"card 0000:01:00.0 is proven back as /dev/tenstorrent/0","#,
                r#""took_ms":1200}"#,
                "\n"
            )
        );
        assert_eq!(Record::parse(&line), Some((1_796_484_303_042, sample())));
    }

    #[test]
    fn the_summary_says_who_did_what_and_how_it_ended() {
        assert_eq!(
            sample().summary(),
            "audit: control action: ttctl card reset by uid 0 (root): ok"
        );
        let mut nameless = sample();
        nameless.uid = Some(1234);
        nameless.user = None;
        nameless.outcome = Outcome::Refused;
        assert_eq!(
            nameless.summary(),
            "audit: control action: ttctl card reset by uid 1234: refused"
        );
        nameless.uid = None;
        assert_eq!(
            nameless.summary(),
            "audit: control action: ttctl card reset by an unknown uid: refused"
        );
    }

    #[test]
    fn malformed_and_torn_lines_are_skipped_and_counted() {
        let good = sample().line();
        let torn = &good[..good.len() / 2];
        let text = format!("{good}not json\n{{\"at\":\"yesterday\"}}\n\n{good}{torn}");
        let reading = read_lines(&text, 0, 0);
        assert_eq!(reading.records.len(), 2);
        assert_eq!(reading.skipped, 3);
    }

    #[test]
    fn since_and_limit_keep_the_newest() {
        let mut later = sample();
        later.at = "2026-12-05T16:00:00Z".into();
        later.detail = "later".into();
        let text = format!("{}{}", sample().line(), later.line());
        let since = parse_rfc3339("2026-12-05T15:30:00Z").unwrap();
        let reading = read_lines(&text, since, 0);
        assert_eq!(reading.records.len(), 1);
        assert_eq!(reading.records[0].1.detail, "later");
        let reading = read_lines(&text, 0, 1);
        assert_eq!(reading.records[0].1.detail, "later");
    }

    #[test]
    fn an_action_dropped_unfinished_is_recorded_as_ended_once() {
        let dir = tempfile::tempdir().unwrap();
        let trail = Arc::new(Trail::new(dir.path()));
        let mut finished = Action::new(trail.clone(), Record::new(Some(0), None, "root", "x"));
        finished.arg("card", "0\n1");
        finished.finish(Outcome::Failed, "no such card");
        drop(finished);
        drop(Action::new(
            trail.clone(),
            Record::new(Some(0), None, "root", "y"),
        ));
        drop(Action::unrecorded(trail.clone()));
        let reading = trail.read(0, 0).unwrap();
        let outcomes: Vec<_> = reading
            .records
            .iter()
            .map(|(_, r)| (r.operation.as_str(), r.outcome))
            .collect();
        assert_eq!(outcomes, [("x", Outcome::Failed), ("y", Outcome::Ended)]);
        assert_eq!(reading.records[0].1.args["card"], echo("0\n1"));
        use std::os::unix::fs::MetadataExt;
        let mode = std::fs::metadata(trail.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_planted_link_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(FILE)).unwrap();
        let trail = Arc::new(Trail::new(dir.path()));
        Action::new(trail.clone(), Record::new(Some(0), None, "root", "x")).finish(Outcome::Ok, "");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(trail.read(0, 0).is_err());
    }

    #[test]
    fn long_details_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_DETAIL);
        let cut = bounded(&long);
        assert!(cut.len() < long.len());
        assert!(cut.ends_with(&format!("... ({} bytes)", long.len())));
    }
}
