//! `ttctl status`: one snapshot, or every change with `--watch`.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use tt_serving_proto::v1::StatusResponse;

use super::args::StatusArgs;
use super::client::Daemon;
use super::outcome::{ctrl_c_pressed, emit, Failure};
use super::render::{json_text, status_table};

/// Clear the screen and move the cursor home, so a watched table (or `ttctl
/// top`'s frame) redraws in place instead of scrolling.
pub(super) const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

/// Print one snapshot.
pub(super) async fn once(
    daemon: &mut Daemon,
    args: StatusArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let response = daemon.status().await?;
    let text = if args.json {
        json_text(&response, true, "the status")?
    } else {
        status_table(&response, now_unix_ms())
    };
    emit(out, &text)
}

/// Print every snapshot the daemon streams until Ctrl-C (exit 0) or the
/// daemon goes away (exit 3).
pub(super) async fn watch(
    daemon: &mut Daemon,
    args: StatusArgs,
    out: &mut (dyn Write + Send),
    is_tty: bool,
) -> Result<(), Failure> {
    let mut stream = daemon.watch_status().await?;
    // Registered once, before the first wait, so a Ctrl-C between two
    // snapshots is not lost.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut frames = Frames::new(args.json, is_tty);
    loop {
        let next = tokio::select! {
            signal = &mut ctrl_c => return ctrl_c_pressed(signal),
            next = stream.next() => next?,
        };
        let Some(snapshot) = next else {
            return Err(stream.ended("the status stream; it is probably stopping"));
        };
        if let Some(text) = frames.next(&snapshot, now_unix_ms())? {
            emit(out, &text)?;
        }
    }
}

/// Turns watched snapshots into output: a JSON line each; or the table,
/// redrawn in place on a terminal and separated by a blank line otherwise
/// (a log file or a pipe keeps every snapshot).
///
/// The daemon sends a snapshot on every change of its state, including
/// ones the table does not show (a heartbeat counter ticking), so a
/// snapshot that would print exactly what the last one printed is skipped.
pub(super) struct Frames {
    /// JSON lines instead of tables.
    json: bool,
    /// Redraw in place instead of appending.
    is_tty: bool,
    /// What the last printed snapshot rendered to, before decoration.
    last: Option<String>,
}

impl Frames {
    pub(super) fn new(json: bool, is_tty: bool) -> Self {
        Frames {
            json,
            is_tty,
            last: None,
        }
    }

    /// The text to print for `snapshot`, or None when nothing visible
    /// changed.
    pub(super) fn next(
        &mut self,
        snapshot: &StatusResponse,
        now_unix_ms: u64,
    ) -> Result<Option<String>, Failure> {
        let body = if self.json {
            json_text(snapshot, false, "the status")?
        } else {
            status_table(snapshot, now_unix_ms)
        };
        if self.last.as_ref() == Some(&body) {
            return Ok(None);
        }
        let text = match (self.json, self.is_tty, self.last.is_some()) {
            (true, _, _) | (false, false, false) => body.clone(),
            (false, true, _) => format!("{CLEAR_SCREEN}{body}"),
            (false, false, true) => format!("\n{body}"),
        };
        self.last = Some(body);
        Ok(Some(text))
    }
}

pub(super) fn now_unix_ms() -> u64 {
    // A clock before 1970 only makes "ago" columns odd; not worth failing.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
