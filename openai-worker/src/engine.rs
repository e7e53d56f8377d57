//! The engine process: spawning it in its own process group, reaping it,
//! stopping the whole group, and naming the cause when it dies.
//!
//! The engine (vLLM's API server with its EngineCore child, llama-server,
//! or the `docker run` client of a container) runs in a process group of
//! its own, so one signal reaches everything it started and the test for
//! "no orphan" is one `kill(-pgid, 0)`. The worker is a child subreaper:
//! processes of the group orphaned by the engine's death are reparented to
//! it and reaped here, so a finished group really is empty instead of
//! holding zombies nobody waits for.
//!
//! The engine gets `PR_SET_PDEATHSIG=SIGKILL`, so it dies with the worker
//! even when the worker is killed with SIGKILL (the daemon's last resort).
//! Its own children do not (vLLM's EngineCore sets no parent-death signal),
//! so the worker's parent-death signal is SIGUSR2, caught to SIGKILL the
//! engine's whole group before the worker exits (`worker::run`).
//! The kernel ties that signal to the *thread* that forked: the engine is
//! spawned from the thread that runs `main` (see `worker::run`), which
//! lives as long as the process.

use crate::cli::Container;
use crate::output::{self, OutputScan, Sink};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tt_worker_contract::subprocess;

/// The engine's process group, for the parent watch's last act (it kills
/// the group before the worker `_exit`s); 0 before the spawn.
static ENGINE_GROUP: AtomicI32 = AtomicI32::new(0);

/// The container the engine runs, for the same last act.
static CONTAINER: std::sync::OnceLock<Container> = std::sync::OnceLock::new();

/// The engine runs in a container: removing it takes a process spawned,
/// which a signal handler cannot do.
static IN_CONTAINER: AtomicBool = AtomicBool::new(false);

/// For the parent-death signal's handler, with async-signal-safe calls
/// only: SIGKILL to the engine's whole group (vLLM's API server and its
/// EngineCore, which has no parent-death signal of its own). True when
/// nothing is left to do; false when a container still needs removing
/// (the parent watch does that).
pub fn kill_group_from_signal_handler() -> bool {
    let group = ENGINE_GROUP.load(Ordering::Acquire);
    if group > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
    !IN_CONTAINER.load(Ordering::Acquire)
}

/// The last act of a worker whose daemon is gone, from any thread: SIGKILL
/// to the engine's group and `<runtime> rm -f` of its container (started
/// and left to finish on its own, as the worker is about to `_exit`).
pub fn emergency_stop() {
    let group = ENGINE_GROUP.load(Ordering::Acquire);
    if group != 0 {
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
    if let Some(c) = CONTAINER.get() {
        // Twice: see remove_container.
        let _ = Command::new("/bin/sh")
            .args(["-c", "\"$0\" rm -f \"$1\" || \"$0\" rm -f \"$1\""])
            .args([&c.runtime, &c.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

/// How long the group may take to empty after its leader exited before
/// the stragglers get SIGKILL.
const STRAGGLER_GRACE: Duration = Duration::from_secs(2);

/// A running engine.
pub struct Engine {
    /// Its pid, which is also its process group id.
    pid: i32,
    /// The program, for messages.
    program: String,
    /// Its exit status, once reaped.
    exit: watch::Receiver<Option<ExitStatus>>,
    /// What its output said.
    pub output: Arc<OutputScan>,
    /// Whether the worker signalled the group (so a death by signal was
    /// asked for).
    signalled: AtomicBool,
    /// The container it runs, if any.
    container: Option<Container>,
}

/// How a requested stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The group exited within the grace after SIGTERM.
    Clean,
    /// It did not: the group got SIGKILL.
    Killed,
}

/// Why an engine could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the engine `{program}`: {source}; check the command after `--` in the model's `worker` (is it installed and on PATH?)")]
pub struct SpawnError {
    /// The program.
    pub program: String,
    /// The OS error.
    pub source: std::io::Error,
}

impl Engine {
    /// Starts `argv` with the worker's environment plus `env`.
    pub fn spawn(
        argv: &[String],
        env: &[(String, String)],
        container: Option<Container>,
    ) -> Result<Engine, SpawnError> {
        let program = argv.first().cloned().unwrap_or_default();
        let error = |source| SpawnError {
            program: program.clone(),
            source,
        };
        if let Some(c) = &container {
            IN_CONTAINER.store(true, Ordering::Release);
            let _ = CONTAINER.set(c.clone());
            remove_container(c);
        }
        let mut command = Command::new(&program);
        command
            .args(&argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // Spawned from the thread that runs `main` (see `worker::run`):
        // the kernel ties the signal to it.
        subprocess::die_with_parent(&mut command, libc::SIGKILL);
        let mut child = command.spawn().map_err(error)?;
        let pid = child.id() as i32;
        ENGINE_GROUP.store(pid, Ordering::Release);
        let output = Arc::new(OutputScan::default());
        if let Some(stdout) = child.stdout.take() {
            output::forward(stdout, Sink::Stdout, output.clone()).map_err(error)?;
        }
        if let Some(stderr) = child.stderr.take() {
            output::forward(stderr, Sink::Stderr, output.clone()).map_err(error)?;
        }
        // The reaper owns the waiting; `child` is never waited on through
        // std (dropping it does not wait or kill).
        drop(child);
        let (tx, exit) = watch::channel(None);
        std::thread::Builder::new()
            .name("engine-reaper".into())
            .spawn(move || reap(pid, tx))
            .map_err(error)?;
        Ok(Engine {
            pid,
            program,
            exit,
            output,
            signalled: AtomicBool::new(false),
            container,
        })
    }

    /// The engine's pid (and process group).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the engine's main process to exit.
    pub async fn wait(&self) -> ExitStatus {
        let mut rx = self.exit.clone();
        let status = rx.wait_for(Option::is_some).await.map(|s| *s);
        match status {
            Ok(status) => status.unwrap_or_else(|| ExitStatus::from_raw(0)),
            // The reaper ended without a status: it cannot wait any more,
            // so neither can we.
            Err(_) => std::future::pending().await,
        }
    }

    /// The exit status, if the main process has exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Whether any process of the engine's group is still alive.
    pub fn group_alive(&self) -> bool {
        group_alive(self.pid)
    }

    fn signal(&self, signal: Signal) {
        self.signalled.store(true, Ordering::Release);
        if let Err(e) = killpg(Pid::from_raw(self.pid), signal) {
            tracing::debug!(pgid = self.pid, %e, ?signal, "signal to the engine group failed (already gone?)");
        }
    }

    /// Waits until the main process exited and the group is empty.
    async fn gone(&self) {
        self.wait().await;
        while self.group_alive() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM to the group (and `<runtime> stop` for a container), then,
    /// after `grace`, SIGKILL to whatever is left.
    pub async fn stop(&self, grace: Duration) -> Stopped {
        let started = Instant::now();
        tracing::info!(
            pgid = self.pid,
            grace_secs = grace.as_secs(),
            "stopping the engine: SIGTERM to its process group"
        );
        self.signal(Signal::SIGTERM);
        if let Some(c) = self.container.clone() {
            let secs = grace.as_secs().to_string();
            tokio::task::spawn_blocking(move || {
                container_command(&c, &["stop", "-t", &secs]);
            });
        }
        if tokio::time::timeout(grace, self.gone()).await.is_ok() {
            tracing::info!(
                after_ms = started.elapsed().as_millis() as u64,
                "the engine stopped"
            );
            self.remove_container().await;
            return Stopped::Clean;
        }
        tracing::warn!(
            pgid = self.pid,
            grace_secs = grace.as_secs(),
            "the engine ignored SIGTERM; sending SIGKILL to its process group"
        );
        self.kill().await;
        Stopped::Killed
    }

    /// SIGKILL to the whole group, the container removed, and a bounded
    /// wait for both: for the end of every path, including an engine that
    /// died and left children behind (vLLM's EngineCore, say).
    pub async fn kill(&self) {
        self.signal(Signal::SIGKILL);
        self.kill_wait().await;
    }

    /// The bounded wait after a SIGKILL to the group, then the container's
    /// removal.
    async fn kill_wait(&self) {
        if tokio::time::timeout(STRAGGLER_GRACE, self.gone())
            .await
            .is_err()
        {
            tracing::error!(
                pgid = self.pid,
                "processes of the engine's group survive SIGKILL (stuck in the kernel?)"
            );
        }
        self.remove_container().await;
    }

    /// After the main process exited by itself: whatever is left of its
    /// group (children it did not take along) gets a moment, then SIGKILL.
    pub async fn reap_stragglers(&self) {
        if tokio::time::timeout(STRAGGLER_GRACE, self.gone())
            .await
            .is_err()
        {
            tracing::warn!(
                pgid = self.pid,
                "processes of the engine's group outlived it; sending SIGKILL"
            );
            // Not through `signal`: the main process already died, and
            // what killed it is judged by whether the worker signalled it.
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
            self.kill_wait().await;
        } else {
            self.remove_container().await;
        }
    }

    async fn remove_container(&self) {
        if let Some(c) = self.container.clone() {
            let _ = tokio::task::spawn_blocking(move || remove_container(&c)).await;
        }
    }

    /// Why the engine's exit was not asked for: the sentence for the log
    /// and the worker's exit status (128 + signal for a death by signal,
    /// as a shell reports it, so the daemon's classification keeps it).
    pub fn death(&self, status: ExitStatus) -> (i32, String) {
        let who = format!("the engine `{}` (pid {})", self.program, self.pid);
        let signalled = self.signalled.load(Ordering::Acquire);
        let core = self.output.subprocess_death();
        let (code, message) = match (status.code(), status.signal()) {
            (_, Some(signal)) => {
                let name = signal_name(signal);
                let mut m = format!("{who} was killed by {name} (signal {signal})");
                if signal == libc::SIGKILL && !signalled {
                    // No claim of OOM without evidence: the daemon reads the
                    // slot's OOM counter (memory.events) and says so when it
                    // moved.
                    m.push_str(", which the worker did not send (the kernel's OOM killer sends SIGKILL, and so does `kill -9`; `journalctl -k | grep -i oom` tells)");
                }
                (128 + signal, m)
            }
            (Some(0), _) if core.is_some() => (1, format!("{who} then exited with status 0")),
            (Some(0), _) => (
                1,
                format!("{who} exited with status 0 although the worker did not ask it to stop"),
            ),
            (Some(code), _) => (code, format!("{who} exited with status {code}")),
            (None, None) => (1, format!("{who} ended with an unknown status")),
        };
        match core {
            Some(gone) => (code, format!("{}; {message}", self.core_gone_reason(&gone))),
            None => (code, self.with_errors(message)),
        }
    }

    /// The sentence for vLLM's engine core being gone, with the engine's
    /// last error lines: the cause is in them, or nowhere in the output.
    pub fn core_gone_reason(&self, gone: &output::CoreGone) -> String {
        let said = match gone.when {
            output::CoreWhen::Startup => format!(
                "vLLM's engine core failed to start (it printed `{}`, which vLLM prints for any start-up failure, so it is no sign of a signal)",
                gone.line
            ),
            output::CoreWhen::Runtime => format!(
                "vLLM's EngineCore died under its API server while serving (it printed `{}`)",
                gone.line
            ),
        };
        self.with_errors(said)
    }

    /// `message`, followed by the engine's last error lines when it printed any.
    fn with_errors(&self, message: String) -> String {
        let errors = self.output.last_errors();
        if errors.is_empty() {
            message
        } else {
            format!(
                "{message}; its last error lines: {}",
                errors
                    .iter()
                    .map(|e| format!("`{e}`"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        }
    }
}

/// Reaps the engine's group: the main process (whose status is published)
/// and, since the worker is a subreaper, any member orphaned by its death.
/// Ends once the main process is reaped and the group is empty.
fn reap(pgid: i32, tx: watch::Sender<Option<ExitStatus>>) {
    let mut leader_done = false;
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer to an int.
        let pid = unsafe { libc::waitpid(-pgid, &mut status, 0) };
        if pid == pgid {
            leader_done = true;
            let _ = tx.send(Some(ExitStatus::from_raw(status)));
            continue;
        }
        if pid > 0 {
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // No child of ours in the group right now; orphans may still
            // be reparented to us when their parent dies.
            _ => {
                if leader_done && !group_alive(pgid) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Whether any process of group `pgid` is alive.
pub fn group_alive(pgid: i32) -> bool {
    // Signal 0 checks existence and permission only. EPERM still means a
    // process is there.
    !matches!(
        killpg(Pid::from_raw(pgid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// `SIGKILL` for 9, `signal 77` for what nix does not know.
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {signal}"))
}

/// `<runtime> rm -f NAME`, quietly: a container left by an earlier run (or
/// this one) would keep its cards. Tried three times: after its monitor
/// was killed (a worker killed outright), podman 4.3's first `rm -f` fails
/// ("timed out waiting for file /run/libpod/exits/<id>", status 125) and
/// the second removes it; "no such container" is success.
pub fn remove_container(c: &Container) {
    for _ in 0..3 {
        match container_command(c, &["rm", "-f"]) {
            Some(true) | None => return,
            Some(false) => {}
        }
    }
    tracing::warn!(runtime = %c.runtime, container = %c.name, "the container runtime could not remove the engine's container; the next start removes it by name");
}

/// Run `<runtime> VERB... NAME`: Some(true) when it succeeded or the
/// container does not exist, None when the runtime cannot be run.
fn container_command(c: &Container, verb: &[&str]) -> Option<bool> {
    let out = Command::new(&c.runtime)
        .args(verb)
        .arg(&c.name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match out {
        Err(e) => {
            tracing::warn!(runtime = %c.runtime, container = %c.name, %e, "cannot run the container runtime");
            None
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            Some(out.status.success() || err.contains("no such container"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_have_their_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(200), "signal 200");
    }
}
