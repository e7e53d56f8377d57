//! Model worker processes: spawning with an explicit environment, capturing
//! their output, stopping them, and saying why they exited.
//!
//! A worker runs in its own process group so a stop reaches everything it
//! started, and it gets a parent-death signal so it dies with the daemon:
//! an engine left running after its supervisor is gone would hold the cards
//! with nobody to reset them. Killing a live engine can wedge the cards, so
//! every exit that was not a requested clean stop marks the cards dirty (the
//! supervisor resets them before the next start).

pub mod banners;
pub mod env_file;
pub mod logs;

use logs::{LogLine, LogRing, Stream};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// Environment variables passed through from the daemon (everything else is
/// cleared so a worker's behaviour depends only on the config).
const PASSTHROUGH_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "HOME", "RUST_LOG"];

/// What to start.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Slot name, for logs.
    pub slot: String,
    /// argv; the first element is the program.
    pub command: Vec<String>,
    /// The complete environment on top of the passthrough variables.
    pub env: BTreeMap<String, String>,
    /// The unix socket the worker must serve engine.proto on.
    pub socket: PathBuf,
}

/// Why a worker exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitCause {
    /// The daemon asked it to stop and it exited 0.
    RequestedStop,
    /// It exited by itself with this status code.
    Code(i32),
    /// A signal ended it; `requested` when the daemon sent it.
    Signal {
        /// Signal number.
        signal: i32,
        /// Whether the daemon sent a signal to it.
        requested: bool,
    },
}

impl ExitCause {
    /// The restart cause for the metrics: `exit_code` or `signal`.
    pub fn metric_cause(&self) -> &'static str {
        match self {
            ExitCause::RequestedStop => "requested",
            ExitCause::Code(_) => "exit_code",
            ExitCause::Signal { .. } => "signal",
        }
    }

    /// Classify an exit status given whether a stop was requested.
    pub fn classify(status: ExitStatus, stop_requested: bool, signalled: bool) -> ExitCause {
        match (status.code(), status.signal()) {
            (Some(0), _) if stop_requested => ExitCause::RequestedStop,
            (Some(code), _) => ExitCause::Code(code),
            (None, Some(signal)) => ExitCause::Signal {
                signal,
                requested: signalled,
            },
            (None, None) => ExitCause::Code(-1),
        }
    }

    /// Whether the cards may be in a bad state afterwards. Only a clean,
    /// requested stop leaves them clean.
    pub fn leaves_cards_dirty(&self) -> bool {
        *self != ExitCause::RequestedStop
    }

    /// A sentence for status and logs, naming the likely cause.
    pub fn describe(&self) -> String {
        match self {
            ExitCause::RequestedStop => "stopped on request".into(),
            ExitCause::Code(code) => format!("exited with status {code}"),
            ExitCause::Signal {
                signal: 9,
                requested: false,
            } => "killed by SIGKILL that the daemon did not send: most likely the kernel OOM killer (check `journalctl -k | grep -i oom`); the worker's RSS is tracked in `ttctl status`".into(),
            ExitCause::Signal { signal, requested } => {
                let name = nix::sys::signal::Signal::try_from(*signal)
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_else(|_| format!("signal {signal}"));
                if *requested {
                    format!("ended by {name} sent by the daemon")
                } else {
                    format!("killed by {name}")
                }
            }
        }
    }
}

/// A running worker.
pub struct Worker {
    child: Child,
    pid: u32,
    /// Output lines, for `ttctl logs`.
    pub logs: Arc<LogRing>,
    engaged: Arc<Mutex<BTreeSet<String>>>,
    signalled: bool,
    stop_requested: bool,
}

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start worker `{program}` for slot {slot}: {source}; check models.<name>.worker in the config")]
pub struct SpawnError {
    /// The slot.
    pub slot: String,
    /// The program.
    pub program: String,
    /// The OS error.
    pub source: std::io::Error,
}

/// The default worker: `tt-worker` installed next to the running daemon.
pub fn default_worker_command() -> Vec<String> {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    vec![dir.join("tt-worker").display().to_string()]
}

/// The worker command a model runs: its own, or the default.
pub fn command_for(m: &crate::config::ModelConfig) -> Vec<String> {
    if m.worker.is_empty() {
        default_worker_command()
    } else {
        m.worker.clone()
    }
}

impl Worker {
    /// Start a worker in its own process group, with a cleared environment
    /// and the parent-death signal set, capturing its output into `logs`.
    pub fn spawn(spec: &WorkerSpec, logs: Arc<LogRing>) -> Result<Worker, SpawnError> {
        let (program, args) = match spec.command.split_first() {
            Some(split) => split,
            None => {
                return Err(SpawnError {
                    slot: spec.slot.clone(),
                    program: String::new(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
                })
            }
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(
                PASSTHROUGH_ENV
                    .iter()
                    .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))),
            )
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        // PDEATHSIG fires when the spawning thread exits; tokio's worker
        // threads live as long as the runtime, which is the daemon's life.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| SpawnError {
            slot: spec.slot.clone(),
            program: program.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let engaged = Arc::new(Mutex::new(BTreeSet::new()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(capture(
                out,
                Stream::Stdout,
                spec.slot.clone(),
                logs.clone(),
                engaged.clone(),
            ));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(capture(
                err,
                Stream::Stderr,
                spec.slot.clone(),
                logs.clone(),
                engaged.clone(),
            ));
        }
        tracing::info!(slot = %spec.slot, pid, command = %spec.command.join(" "), "worker started");
        Ok(Worker {
            child,
            pid,
            logs,
            engaged,
            signalled: false,
            stop_requested: false,
        })
    }

    /// Process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Flags whose `<FLAG> engaged` banner the worker has printed so far.
    pub fn engaged(&self) -> BTreeSet<String> {
        self.engaged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record that a stop was asked for (a clean exit then counts as
    /// requested).
    pub fn mark_stop_requested(&mut self) {
        self.stop_requested = true;
    }

    /// Wait for the worker to exit.
    pub async fn wait(&mut self) -> ExitCause {
        match self.child.wait().await {
            Ok(status) => ExitCause::classify(status, self.stop_requested, self.signalled),
            Err(e) => {
                tracing::error!(pid = self.pid, error = %e, "cannot wait for worker");
                ExitCause::Code(-1)
            }
        }
    }

    /// Whether it has exited, without waiting.
    pub fn try_exit(&mut self) -> Option<ExitCause> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(ExitCause::classify(
            status,
            self.stop_requested,
            self.signalled,
        ))
    }

    /// Send a signal to the whole process group.
    pub fn signal(&mut self, signal: nix::sys::signal::Signal) {
        self.signalled = true;
        let group = nix::unistd::Pid::from_raw(self.pid as i32);
        if let Err(e) = nix::sys::signal::killpg(group, signal) {
            tracing::debug!(pid = self.pid, error = %e, "signal to worker group failed (already gone?)");
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; returns how it exited.
    pub async fn terminate(&mut self, grace: Duration) -> ExitCause {
        self.mark_stop_requested();
        self.signal(nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => ExitCause::classify(status, true, true),
            _ => {
                tracing::warn!(
                    pid = self.pid,
                    grace_secs = grace.as_secs(),
                    "worker ignored SIGTERM; sending SIGKILL"
                );
                self.signal(nix::sys::signal::Signal::SIGKILL);
                self.wait().await
            }
        }
    }

    /// Resident memory of the worker in bytes, from the real /proc (workers
    /// are real processes even on a fake hardware root).
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.pid)
    }
}

/// Resident set size of a process in bytes (0 when unreadable).
pub fn rss_bytes(pid: u32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/statm")) else {
        return 0;
    };
    let pages: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

async fn capture(
    pipe: impl AsyncRead + Unpin,
    stream: Stream,
    slot: String,
    logs: Arc<LogRing>,
    engaged: Arc<Mutex<BTreeSet<String>>>,
) {
    let mut lines = BufReader::new(pipe).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(text)) => {
                if let Some(flag) = banners::banner_in_line(&text) {
                    let mut set = engaged.lock().unwrap_or_else(|e| e.into_inner());
                    if set.insert(flag.to_string()) {
                        tracing::info!(slot = %slot, flag, "banner seen");
                    }
                }
                // Engines log to stderr as a matter of course; the stream is
                // a field, not a severity.
                let stream_name = match stream {
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                tracing::info!(slot = %slot, stream = stream_name, "worker: {text}");
                logs.push(LogLine {
                    unix_ms: crate::clock::unix_ms(std::time::SystemTime::now()),
                    stream,
                    text,
                });
            }
            Ok(None) => return,
            Err(e) => {
                // Invalid UTF-8 or a read error: note it and stop capturing
                // this stream rather than spin.
                tracing::warn!(slot = %slot, error = %e, "cannot read worker output");
                return;
            }
        }
    }
}
