//! The engine's output: passed through to the worker's own stdout and
//! stderr line by line, and read on the way.
//!
//! Passing it through keeps the daemon's log capture and banner rule
//! working unchanged (`<FLAG> engaged` lines reach the daemon as the engine
//! printed them). Reading it gives the load progress (lines seen, the last
//! one), the engine's last error lines, and vLLM's words when its
//! EngineCore is gone: at start-up `Engine core initialization failed. ...
//! Failed core proc(s): {...}`, printed for *any* start-up failure (the set
//! is often empty for a plain Python exception: vLLM issues 19002, 23176;
//! it is no sign of a signal or of the OOM killer); at run time
//! `MPClient: engine core exited unexpectedly` (vLLM 0.32 prefixes it with
//! `[shutdown]`) or, in older releases, `Engine core proc EngineCore_DP0
//! died unexpectedly`.
//!
//! Whole lines are written with one call under the stream's lock, so the
//! worker's own log lines never land in the middle of an engine line (which
//! would hide a banner from the daemon).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// A line longer than this is passed on in pieces.
const MAX_LINE: usize = 64 << 10;
/// The last line is kept this long for the load progress message.
const LAST_LINE_CHARS: usize = 160;

/// What the worker learned from the engine's output.
#[derive(Debug)]
pub struct OutputScan {
    /// Lines seen (a carriage return ends a line too: progress bars redraw
    /// with `\r`, and each redraw is progress).
    lines: AtomicU32,
    /// The last non-empty line, cut.
    last: Mutex<String>,
    /// Flags whose `<FLAG> engaged` banner was seen.
    banners: Mutex<BTreeSet<String>>,
    /// The line that said the engine core is gone, and when.
    subprocess_death: watch::Sender<Option<CoreGone>>,
    /// The last few error lines, for a failure's reason.
    errors: Mutex<std::collections::VecDeque<String>>,
    /// Streams (stdout, stderr) that reached their end.
    closed: watch::Sender<u8>,
    /// vllm-tt-plugin's model runner said it started ([`TT_RUNNER_LINE`]).
    tt_runner: std::sync::atomic::AtomicBool,
}

/// What vllm-tt-plugin's model runner logs (INFO) when it starts, on the
/// TT platform only (`model_runner.py:164-170` at e3fc849:
/// `TTModelRunner: trace_mode=%s, sample_on_device_mode=%s,
/// enable_model_warmup=%s`). Without it vLLM chose another platform: the
/// plugin's platform is active only when `ttnn` imports
/// (`entrypoints.py:50-59`), and vLLM falls back to its own without a
/// word at the default log level.
pub const TT_RUNNER_LINE: &str = "TTModelRunner: trace_mode=";

impl Default for OutputScan {
    fn default() -> Self {
        Self {
            lines: AtomicU32::new(0),
            last: Mutex::new(String::new()),
            banners: Mutex::new(BTreeSet::new()),
            subprocess_death: watch::Sender::new(None),
            errors: Mutex::new(std::collections::VecDeque::new()),
            closed: watch::Sender::new(0),
            tt_runner: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl OutputScan {
    /// Lines seen so far.
    pub fn lines(&self) -> u32 {
        self.lines.load(Ordering::Acquire)
    }

    /// The last non-empty line.
    pub fn last_line(&self) -> String {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Flags whose banner was seen, sorted.
    pub fn banners(&self) -> Vec<String> {
        let banners = self.banners.lock().unwrap_or_else(|e| e.into_inner());
        banners.iter().cloned().collect()
    }

    /// Whether vllm-tt-plugin's model runner said it started.
    pub fn tt_runner_started(&self) -> bool {
        self.tt_runner.load(Ordering::Acquire)
    }

    /// The line that said the engine core is gone, if one did.
    pub fn subprocess_death(&self) -> Option<CoreGone> {
        self.subprocess_death.borrow().clone()
    }

    /// The engine's last error lines (at most [`ERROR_LINES`]), oldest first.
    pub fn last_errors(&self) -> Vec<String> {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        errors.iter().cloned().collect()
    }

    /// Waits until a line says the engine core is gone.
    pub async fn subprocess_died(&self) -> CoreGone {
        let mut rx = self.subprocess_death.subscribe();
        let line = rx.wait_for(Option::is_some).await.map(|l| l.clone());
        match line {
            Ok(Some(gone)) => gone,
            // The sender lives as long as `self`: unreachable, but never
            // resolve on it.
            _ => std::future::pending().await,
        }
    }

    /// Waits until both output streams reached their end (the engine and
    /// every process that inherited them are gone).
    pub async fn closed(&self) {
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|n| *n >= 2).await;
    }

    /// Reads one line as the engine wrote it (without its `\n`).
    pub fn observe(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        for segment in text.split('\r') {
            let segment = segment.trim();
            if segment.is_empty() {
                continue;
            }
            self.lines.fetch_add(1, Ordering::AcqRel);
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
                segment.chars().take(LAST_LINE_CHARS).collect();
        }
        if let Some(flag) = tt_worker_contract::banner::flag_in_line(&text) {
            let mut banners = self.banners.lock().unwrap_or_else(|e| e.into_inner());
            banners.insert(flag.to_string());
        }
        if text.contains(TT_RUNNER_LINE) {
            self.tt_runner.store(true, Ordering::Release);
        }
        let line = || text.trim().chars().take(500).collect::<String>();
        if let Some(when) = core_gone(&text) {
            if self.subprocess_death.borrow().is_none() {
                self.subprocess_death
                    .send_replace(Some(CoreGone { when, line: line() }));
            }
        } else if is_error_line(&text) {
            let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
            if errors.len() == ERROR_LINES {
                errors.pop_front();
            }
            errors.push_back(line());
        }
    }

    fn stream_closed(&self) {
        self.closed.send_modify(|n| *n += 1);
    }
}

/// How many of the engine's last error lines are kept.
pub const ERROR_LINES: usize = 3;

/// When vLLM's engine core was found gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreWhen {
    /// It never came up: a start-up failure of any kind.
    Startup,
    /// It died while the engine served.
    Runtime,
}

/// vLLM's line saying its engine core is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreGone {
    /// At start-up or at run time.
    pub when: CoreWhen,
    /// The line, cut to 500 characters.
    pub line: String,
}

/// vLLM's words when its engine core is gone (vllm `v1/engine/core_client.py`,
/// `v1/engine/utils.py`): `Failed core proc(s)` / `Engine core
/// initialization failed` at start-up, `engine core exited unexpectedly` /
/// `Engine core proc ... died unexpectedly` at run time.
fn core_gone(line: &str) -> Option<CoreWhen> {
    if line.contains("Failed core proc(s)") || line.contains("Engine core initialization failed") {
        Some(CoreWhen::Startup)
    } else if line.contains("engine core exited unexpectedly")
        || (line.contains("Engine core proc") && line.contains("died unexpectedly"))
    {
        Some(CoreWhen::Runtime)
    } else {
        None
    }
}

/// A line worth quoting when the engine fails: a Python exception, an
/// error-level log line.
fn is_error_line(line: &str) -> bool {
    let line = line.trim();
    line.contains(" ERROR ")
        || line.starts_with("ERROR")
        || line
            .split(':')
            .next()
            .is_some_and(|head| head.ends_with("Error") || head.ends_with("Exception"))
}

/// Which of the worker's streams an engine stream goes to.
#[derive(Debug, Clone, Copy)]
pub enum Sink {
    /// The worker's stdout.
    Stdout,
    /// The worker's stderr.
    Stderr,
}

impl Sink {
    fn write_line(self, bytes: &[u8]) {
        // A daemon that went away leaves a closed pipe: the bytes are lost,
        // but the engine must keep being drained, or it blocks on a full
        // pipe.
        let _ = match self {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|_| out.flush())
            }
            Sink::Stderr => std::io::stderr().lock().write_all(bytes),
        };
    }
}

/// Passes `from` through to `to` line by line on a thread of its own,
/// reading each line into `scan`, until the stream ends.
pub fn forward(
    mut from: impl Read + Send + 'static,
    to: Sink,
    scan: Arc<OutputScan>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("engine-{to:?}").to_lowercase())
        .spawn(move || {
            let mut buf = vec![0u8; 16 << 10];
            let mut line = Vec::with_capacity(1024);
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                for &b in &buf[..n] {
                    line.push(b);
                    if b == b'\n' || line.len() >= MAX_LINE {
                        to.write_line(&line);
                        scan.observe(line.strip_suffix(b"\n").unwrap_or(&line));
                        line.clear();
                    }
                }
            }
            if !line.is_empty() {
                to.write_line(&line);
                scan.observe(&line);
            }
            scan.stream_closed();
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_progress_bar_redraws_count_as_progress() {
        let scan = OutputScan::default();
        scan.observe(b"INFO 01-04 21:58:20 [loader.py:12] Loading weights");
        scan.observe(b"Loading shards:  50%|#####     | 1/2\rLoading shards: 100%|##########| 2/2");
        scan.observe(b"");
        assert_eq!(scan.lines(), 3);
        assert_eq!(scan.last_line(), "Loading shards: 100%|##########| 2/2");
    }

    #[test]
    fn banners_are_collected_by_flag() {
        let scan = OutputScan::default();
        scan.observe(b"QWEN36_SDPA_STREAMING engaged");
        scan.observe(b"(EngineCore_DP0 pid=7) INFO [x.py:1] TT_FLAG_2 engaged \r");
        scan.observe(b"TT_FLAG_3 engaged: not a banner, the daemon would not count it");
        assert_eq!(scan.banners(), ["QWEN36_SDPA_STREAMING", "TT_FLAG_2"]);
    }

    #[test]
    fn vllm_core_death_lines_are_told_apart_by_when() {
        let scan = OutputScan::default();
        scan.observe(b"(EngineCore_DP0 pid=12) INFO 01-04 [core.py:1] EngineCore ready");
        assert_eq!(scan.subprocess_death(), None);
        scan.observe(b"ValueError: No model architecture found for bogus");
        scan.observe(b"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}");
        let gone = scan.subprocess_death().unwrap();
        assert_eq!(gone.when, CoreWhen::Startup);
        assert!(gone.line.contains("Failed core proc(s): {}"));
        assert_eq!(
            scan.last_errors(),
            ["ValueError: No model architecture found for bogus"]
        );
        for line in [
            &b"ERROR 01-04 21:58:22 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."[..],
            b"ERROR 12-01 [core_client.py:610] [shutdown] MPClient: engine core exited unexpectedly",
        ] {
            let scan = OutputScan::default();
            scan.observe(line);
            assert_eq!(scan.subprocess_death().unwrap().when, CoreWhen::Runtime);
        }
    }
}
