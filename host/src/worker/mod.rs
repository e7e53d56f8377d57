//! Model worker processes: spawning with an explicit environment, capturing
//! their output, stopping them, and saying why they exited.
//!
//! A worker runs in its own process group (SIGTERM reaches the engine it
//! leads) and in its slot's containment (`containment.rs`: a cgroup, or the
//! process tree), so that a kill, and the sweep after every exit, reach
//! everything it started, even children that left its process group. It
//! gets a parent-death signal so it dies with the daemon: an engine left
//! running after its supervisor is gone would hold the cards with nobody to
//! reset them. Killing a live engine can wedge the cards, so every exit
//! that was not a requested clean stop, and every exit that left processes
//! behind, marks the cards dirty (the supervisor resets them before the
//! next start).

pub mod banners;
pub mod containment;
pub mod env_file;
pub mod identity;
pub mod leftovers;
pub mod logs;

use containment::{Enclosure, Memory, OomEvidence};
use logs::{LogLine, LogRing, Stream};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tt_worker_contract::subprocess;

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
    /// The most memory the slot's processes may use, in bytes
    /// (`models.<name>.memory_max_mib`).
    pub memory_max: Option<u64>,
    /// The shared-memory files it may leave, removed after it exits
    /// (None: nothing to clean, as for the identity step).
    pub leftovers: Option<leftovers::Leftovers>,
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

/// How a worker's life ended: how its process exited, the OOM killer's
/// counter around its life, and what it left running in its slot (killed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// How the worker's own process exited.
    pub cause: ExitCause,
    /// The OOM kill counter from its start to its exit, where one could be
    /// read.
    pub oom: Option<OomEvidence>,
    /// Processes of its slot still running after it exited (`pid N
    /// (comm)`), which the daemon then killed.
    pub leftovers: Vec<String>,
    /// The slot's memory peak, in bytes, as it exited (0: unknown).
    pub memory_peak: u64,
}

impl Exit {
    /// An exit with no evidence and nothing left behind.
    #[cfg(test)]
    fn of(cause: ExitCause) -> Exit {
        Exit {
            cause,
            oom: None,
            leftovers: Vec::new(),
            memory_peak: 0,
        }
    }

    /// Whether the slot's own OOM counter says the OOM killer struck in it
    /// while the daemon had not asked the worker to stop.
    pub fn oom_in_slot(&self) -> Option<(u64, u64)> {
        match (self.oom?, &self.cause) {
            (_, ExitCause::RequestedStop) => None,
            (OomEvidence::Slot { before, after }, _) if after > before => Some((before, after)),
            _ => None,
        }
    }

    /// The restart cause for the metrics: `oom` (evidence from the slot's
    /// cgroup), `exit_code` or `signal`.
    pub fn metric_cause(&self) -> &'static str {
        if self.oom_in_slot().is_some() {
            "oom"
        } else {
            self.cause.metric_cause()
        }
    }

    /// Whether the cards may be in a bad state: any exit but a clean,
    /// requested stop, and any exit that left processes (an engine killed
    /// after its worker is a live engine killed).
    pub fn leaves_cards_dirty(&self) -> bool {
        self.cause.leaves_cards_dirty() || !self.leftovers.is_empty()
    }

    /// A sentence for status and logs: the cause, with the OOM evidence
    /// for or against, and what was left behind.
    pub fn describe(&self) -> String {
        let unrequested_kill = self.cause
            == ExitCause::Signal {
                signal: 9,
                requested: false,
            };
        let peak = if self.memory_peak > 0 {
            format!(
                "; the slot's memory peaked at {} MiB",
                self.memory_peak >> 20
            )
        } else {
            String::new()
        };
        let mut words = match (self.oom, unrequested_kill) {
            (Some(OomEvidence::Slot { before, after }), true) if after > before => format!(
                "killed by the OOM killer (the slot's memory.events oom_kill went from {before} to {after}{peak})"
            ),
            (Some(OomEvidence::Slot { before, .. }), true) => format!(
                "killed by SIGKILL that neither the daemon nor the OOM killer sent (the slot's memory.events oom_kill stayed at {before}): another process killed it"
            ),
            (Some(OomEvidence::Host { before, after }), true) if after > before => format!(
                "killed by SIGKILL that the daemon did not send: most likely the kernel OOM killer (the host's OOM kill count, /proc/vmstat oom_kill, went from {before} to {after} while it ran{peak}; check `journalctl -k | grep -i oom`)"
            ),
            (Some(OomEvidence::Host { before, .. }), true) => format!(
                "killed by SIGKILL that neither the daemon nor the OOM killer sent (the host's OOM kill count, /proc/vmstat oom_kill, stayed at {before} while it ran): another process killed it"
            ),
            _ => match self.oom_in_slot() {
                Some((before, after)) => format!(
                    "{}; the OOM killer killed a process of its slot (memory.events oom_kill went from {before} to {after}{peak})",
                    self.cause.describe()
                ),
                None => self.cause.describe(),
            },
        };
        if !self.leftovers.is_empty() {
            const SHOWN: usize = 5;
            let mut named = self.leftovers[..self.leftovers.len().min(SHOWN)].join(", ");
            if self.leftovers.len() > SHOWN {
                named.push_str(&format!(" and {} more", self.leftovers.len() - SHOWN));
            }
            words.push_str(&format!(
                "; it left {} process(es) running in its slot, killed: {named}",
                self.leftovers.len()
            ));
        }
        words
    }
}

/// A running worker.
pub struct Worker {
    child: Child,
    pid: u32,
    /// Output lines, for `ttctl logs`.
    pub logs: Arc<LogRing>,
    engaged: Arc<Mutex<BTreeSet<String>>>,
    /// The engine's own words that it (re)built a tensor cache file
    /// ([`crate::cache::REBUILD_LINES`]), first few.
    cache_rebuilds: Arc<Mutex<Vec<String>>>,
    /// The runtime's first word that the device hung ([`crate::hang`]).
    device_hang: Arc<Mutex<Option<String>>>,
    /// When it was started: captures made since are of this run.
    started_at: std::time::SystemTime,
    signalled: bool,
    stop_requested: bool,
    /// Its slot's containment.
    enclosure: Enclosure,
    /// How it ended, once it did and its slot was swept.
    exit: Option<Exit>,
    /// The tasks reading its stdout and stderr: its last line (the cause
    /// of its failure, as a worker prints it on exit) may still be in the
    /// pipe when the exit is seen.
    captures: Vec<tokio::task::JoinHandle<()>>,
    /// The program's file name: a worker's own failure line starts with
    /// it (`tt-worker-openai: ...`).
    program: String,
    /// What it may leave in shared memory, removed once it exited.
    leftovers: Option<leftovers::Leftovers>,
}

/// The newest of `lines` that starts with `<program>: `.
fn last_word_in(lines: &[String], program: &str) -> Option<String> {
    let prefix = format!("{program}: ");
    lines.iter().rev().find(|t| t.starts_with(&prefix)).cloned()
}

/// Cache rebuild lines kept per worker: enough that a warm start's
/// excused ones (a KV buffer per layer for a new scheduler shape, 2 x 64
/// layers on a 27B model) cannot crowd out a weights file's.
pub const MAX_CACHE_REBUILD_LINES: usize = 1024;

/// How long the output of an exited worker may take to be read to its end.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program could not be started.
    #[error("cannot start worker `{program}` for slot {slot}: {source}; check models.<name>.worker in the config{note}")]
    Exec {
        /// The slot.
        slot: String,
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
        /// What else could have failed between fork and exec.
        note: String,
    },
    /// The slot's containment could not be prepared.
    #[error("cannot contain the worker of slot {slot}: {why}")]
    Contain {
        /// The slot.
        slot: String,
        /// What failed.
        why: containment::ContainmentError,
    },
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
    /// Start a worker in its own process group and its slot's containment,
    /// with a cleared environment and the parent-death signal set,
    /// capturing its output into `logs`.
    pub fn spawn(spec: &WorkerSpec, logs: Arc<LogRing>) -> Result<Worker, SpawnError> {
        let (program, args) = match spec.command.split_first() {
            Some(split) => split,
            None => {
                return Err(SpawnError::Exec {
                    slot: spec.slot.clone(),
                    program: String::new(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
                    note: String::new(),
                })
            }
        };
        let enclosure = containment::get()
            .enclose(
                &spec.slot,
                &spec.socket.display().to_string(),
                spec.memory_max,
            )
            .map_err(|why| SpawnError::Contain {
                slot: spec.slot.clone(),
                why,
            })?;
        let join = enclosure.join_fd();
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
        // SAFETY: write is async-signal-safe and touches no memory of ours
        // but a static byte. Writing "0" to the slot's cgroup.procs (opened
        // before the fork, close-on-exec) moves the child itself into the
        // slot's cgroup before it runs any of the worker's code, so nothing
        // it starts is outside.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = join {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        // After the join (pre-exec steps run in order). PDEATHSIG fires
        // when the spawning thread exits; tokio's worker threads live as
        // long as the runtime, which is the daemon's life.
        subprocess::die_with_parent(cmd.as_std_mut(), libc::SIGKILL);
        // Before the spawn: its files are no older than this.
        let leftovers = spec
            .leftovers
            .clone()
            .map(|l| l.spawned_at(std::time::SystemTime::now()));
        let mut child = cmd.spawn().map_err(|source| SpawnError::Exec {
            slot: spec.slot.clone(),
            program: program.clone(),
            source,
            note: if join.is_some() {
                " (or the daemon's cgroup: the worker joins its slot's cgroup between fork and exec, and a refused write to its cgroup.procs ends the start the same way; `ttctl status` names the cgroup root)".into()
            } else {
                String::new()
            },
        })?;
        let pid = child.id().unwrap_or(0);
        enclosure.started(pid);
        let engaged = Arc::new(Mutex::new(BTreeSet::new()));
        let cache_rebuilds = Arc::new(Mutex::new(Vec::new()));
        let device_hang = Arc::new(Mutex::new(None));
        let mut captures = Vec::new();
        if let Some(out) = child.stdout.take() {
            captures.push(tokio::spawn(capture(
                out,
                Stream::Stdout,
                spec.slot.clone(),
                logs.clone(),
                engaged.clone(),
                cache_rebuilds.clone(),
                device_hang.clone(),
            )));
        }
        if let Some(err) = child.stderr.take() {
            captures.push(tokio::spawn(capture(
                err,
                Stream::Stderr,
                spec.slot.clone(),
                logs.clone(),
                engaged.clone(),
                cache_rebuilds.clone(),
                device_hang.clone(),
            )));
        }
        tracing::info!(slot = %spec.slot, pid, command = %spec.command.join(" "), "worker started");
        Ok(Worker {
            child,
            pid,
            logs,
            engaged,
            cache_rebuilds,
            device_hang,
            started_at: std::time::SystemTime::now(),
            signalled: false,
            stop_requested: false,
            enclosure,
            exit: None,
            captures,
            program: spec
                .command
                .first()
                .and_then(|p| std::path::Path::new(p).file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            leftovers,
        })
    }

    /// The worker's own last word: the newest of its last 64 lines that
    /// starts with `<program>: ` (how tt-worker and tt-worker-openai say
    /// why they exit). An engine's late output (vLLM's `resource_tracker`
    /// warnings, from processes that outlive its API server) can follow it.
    pub fn last_word(&self) -> Option<String> {
        if self.program.is_empty() {
            return None;
        }
        let lines: Vec<String> = self.logs.tail(64).into_iter().map(|l| l.text).collect();
        last_word_in(&lines, &self.program)
    }

    /// Process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The live set behind [`Self::engaged`], for status.
    pub fn engaged_handle(&self) -> Arc<Mutex<BTreeSet<String>>> {
        self.engaged.clone()
    }

    /// Flags whose `<FLAG> engaged` banner the worker has printed so far.
    pub fn engaged(&self) -> BTreeSet<String> {
        self.engaged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Lines in which the engine said it generated or failed to load a
    /// tensor cache file (ttnn's `Generating cache for ...`, `Failed to
    /// load cache ...`), oldest first, at most [`MAX_CACHE_REBUILD_LINES`].
    pub fn cache_rebuild_lines(&self) -> Vec<String> {
        self.cache_rebuilds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The runtime's first line saying the device hung (tt-metal's
    /// `Timeout detected`, `TIMEOUT: device timeout ...`), if it printed one.
    pub fn device_hang_line(&self) -> Option<String> {
        self.device_hang
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When the worker was started.
    pub fn started_at(&self) -> std::time::SystemTime {
        self.started_at
    }

    /// Record that a stop was asked for (a clean exit then counts as
    /// requested).
    pub fn mark_stop_requested(&mut self) {
        self.stop_requested = true;
    }

    /// Wait for the worker to exit, then sweep its slot: whatever it left
    /// running there is killed (and named in the exit). Cancel-safe: a
    /// wait dropped mid-sweep sweeps again at the next call.
    pub async fn wait(&mut self) -> Exit {
        if let Some(exit) = &self.exit {
            return exit.clone();
        }
        let cause = match self.child.wait().await {
            Ok(status) => ExitCause::classify(status, self.stop_requested, self.signalled),
            Err(e) => {
                tracing::error!(pid = self.pid, error = %e, "cannot wait for worker");
                ExitCause::Code(-1)
            }
        };
        // Read before the sweep kills what the worker left in the slot.
        let oom = self.enclosure.oom_evidence();
        let memory_peak = self.enclosure.memory().peak;
        let leftovers = self.enclosure.sweep().await;
        // With everything in the slot gone, the pipes close: read them to
        // the end, so the failure reasons built from the last lines see the
        // worker's own last word. Bounded: a process outside the slot may
        // still hold a pipe.
        let drain = futures_join_all(std::mem::take(&mut self.captures));
        let _ = tokio::time::timeout(OUTPUT_DRAIN, drain).await;
        // Nothing of the slot runs now: what it left in shared memory
        // (Open MPI's segments) is nobody's. It reads /proc; off the runtime.
        if let Some(leftovers) = self.leftovers.clone() {
            let _ = tokio::task::spawn_blocking(move || leftovers.clean()).await;
        }
        let exit = Exit {
            cause,
            oom,
            leftovers,
            memory_peak,
        };
        self.exit = Some(exit.clone());
        exit
    }

    /// Send a signal to the worker's process group; SIGKILL goes to its
    /// whole slot (everything it started, in its group or not).
    pub fn signal(&mut self, signal: nix::sys::signal::Signal) {
        self.signalled = true;
        if signal == nix::sys::signal::Signal::SIGKILL {
            let n = self.enclosure.kill();
            tracing::debug!(
                pid = self.pid,
                processes = n,
                "SIGKILL to the worker's slot"
            );
            return;
        }
        // Before the worker can exit and orphan its children: remember them.
        self.enclosure.members(false);
        let group = nix::unistd::Pid::from_raw(self.pid as i32);
        if let Err(e) = nix::sys::signal::killpg(group, signal) {
            tracing::debug!(pid = self.pid, error = %e, "signal to worker group failed (already gone?)");
        }
    }

    /// SIGTERM, then SIGKILL (to the whole slot) after `grace`; returns how
    /// it exited.
    pub async fn terminate(&mut self, grace: Duration) -> Exit {
        self.mark_stop_requested();
        self.signal(nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(_)) => self.wait().await,
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

    /// The memory of the worker's whole slot (everything it started), now
    /// and at its peak: from its cgroup, or summed over its process tree
    /// in the real /proc (workers are real processes even on a fake
    /// hardware root).
    pub fn memory(&self) -> Memory {
        self.enclosure.memory()
    }
}

impl Drop for Worker {
    /// A worker dropped without being waited for (its supervisor was
    /// aborted) takes its whole slot with it.
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.enclosure.kill();
        }
    }
}

/// Wait for every task, whatever each returns.
async fn futures_join_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        let _ = task.await;
    }
}

async fn capture(
    pipe: impl AsyncRead + Unpin,
    stream: Stream,
    slot: String,
    logs: Arc<LogRing>,
    engaged: Arc<Mutex<BTreeSet<String>>>,
    cache_rebuilds: Arc<Mutex<Vec<String>>>,
    device_hang: Arc<Mutex<Option<String>>>,
) {
    let mut lines = BufReader::new(pipe).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(text)) => {
                if let Some(flag) = tt_worker_contract::banner::flag_in_line(&text) {
                    let mut set = engaged.lock().unwrap_or_else(|e| e.into_inner());
                    if set.insert(flag.to_string()) {
                        tracing::info!(slot = %slot, flag, "banner seen");
                    }
                }
                if crate::hang::is_device_hang_line(&text) {
                    let mut first = device_hang.lock().unwrap_or_else(|e| e.into_inner());
                    if first.is_none() {
                        tracing::error!(slot = %slot, line = %text, "the runtime says the device hung");
                        *first = Some(text.clone());
                    }
                }
                if crate::cache::is_rebuild_line(&text) {
                    let mut seen = cache_rebuilds.lock().unwrap_or_else(|e| e.into_inner());
                    if seen.len() < MAX_CACHE_REBUILD_LINES {
                        seen.push(text.clone());
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
                    unix_ms: tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_last_word_is_found_under_its_engines_late_output() {
        let lines: Vec<String> = [
            "INFO engine starting",
            "tt-worker-openai: vLLM's engine core failed to start: ValueError",
            "resource_tracker: There appear to be 1 leaked semaphore objects",
            "warnings.warn('resource_tracker: ...')",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            last_word_in(&lines, "tt-worker-openai").as_deref(),
            Some("tt-worker-openai: vLLM's engine core failed to start: ValueError")
        );
        assert_eq!(last_word_in(&lines, "tt-worker"), None);
    }

    fn killed() -> ExitCause {
        ExitCause::Signal {
            signal: 9,
            requested: false,
        }
    }

    #[test]
    fn an_unrequested_sigkill_is_judged_by_the_oom_kill_counter() {
        let exit = |oom| Exit {
            oom: Some(oom),
            memory_peak: 3 << 30,
            ..Exit::of(killed())
        };
        let oom = exit(OomEvidence::Slot {
            before: 0,
            after: 1,
        });
        assert_eq!(
            oom.describe(),
            "killed by the OOM killer (the slot's memory.events oom_kill went from 0 to 1; the slot's memory peaked at 3072 MiB)"
        );
        assert_eq!(oom.metric_cause(), "oom");
        let not = exit(OomEvidence::Slot {
            before: 1,
            after: 1,
        });
        assert!(
            not.describe()
                .contains("neither the daemon nor the OOM killer")
                && not.describe().contains("stayed at 1"),
            "{}",
            not.describe()
        );
        assert_eq!(not.metric_cause(), "signal");
        let host = exit(OomEvidence::Host {
            before: 4,
            after: 5,
        });
        assert!(
            host.describe()
                .contains("most likely the kernel OOM killer")
                && host.describe().contains("went from 4 to 5"),
            "{}",
            host.describe()
        );
        // The host's counter is no proof for the metrics.
        assert_eq!(host.metric_cause(), "signal");
        // No counter at all: the old guess.
        assert!(Exit::of(killed())
            .describe()
            .contains("most likely the kernel OOM killer"));
    }

    #[test]
    fn an_oom_kill_inside_the_slot_is_named_whatever_the_worker_did() {
        let exit = Exit {
            oom: Some(OomEvidence::Slot {
                before: 0,
                after: 1,
            }),
            ..Exit::of(ExitCause::Code(1))
        };
        assert_eq!(
            exit.describe(),
            "exited with status 1; the OOM killer killed a process of its slot (memory.events oom_kill went from 0 to 1)"
        );
        assert_eq!(exit.metric_cause(), "oom");
        // A requested stop is not blamed on it.
        let stopped = Exit {
            cause: ExitCause::RequestedStop,
            ..exit
        };
        assert_eq!(stopped.describe(), "stopped on request");
        assert!(!stopped.leaves_cards_dirty());
    }

    #[test]
    fn processes_left_behind_are_named_and_dirty_the_cards() {
        let exit = Exit {
            leftovers: (1..=7).map(|p| format!("pid {p} (sleep)")).collect(),
            ..Exit::of(ExitCause::RequestedStop)
        };
        assert!(exit.leaves_cards_dirty());
        assert_eq!(
            exit.describe(),
            "stopped on request; it left 7 process(es) running in its slot, killed: pid 1 (sleep), pid 2 (sleep), pid 3 (sleep), pid 4 (sleep), pid 5 (sleep) and 2 more"
        );
    }
}
