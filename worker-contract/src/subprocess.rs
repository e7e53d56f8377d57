//! Child processes, started and ended one way everywhere: commands run to
//! an end under a deadline ([`run`], [`run_blocking`]), the parent-death
//! signal of the long-lived ones ([`die_with_parent`]), and finding a
//! program on `PATH` ([`find_program`]).
//!
//! The rules, each from a failure:
//!
//! - Both pipes are read while the command runs, never after it exits. A
//!   pipe holds about 64 KiB; a command that prints more blocks on its
//!   write until someone reads, so a runner that reads only after the exit
//!   waits until the deadline and then cuts the output.
//! - What is kept is bounded ([`Keep`]); the rest is read and dropped, so
//!   the command never blocks and memory stays bounded.
//! - The command runs in its own process group, and at the deadline the
//!   whole group gets SIGKILL: what it started dies with it (`tt-smi -r`
//!   hangs, tt-smi issues 85 and 185). What outlives that (a process stuck
//!   in the kernel) is named rather than waited on.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tt_card_lock::procs;

/// How long a killed process group may take to be gone, and a command's
/// pipes to close after it exits.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

/// How often the end of a killed group is checked.
const POLL: Duration = Duration::from_millis(50);

/// Which part of a stream to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The first bytes (a listing, a capture).
    First(usize),
    /// The last bytes (a tool whose failure is in its last lines).
    Last(usize),
}

impl Keep {
    fn bytes(self) -> usize {
        match self {
            Keep::First(n) | Keep::Last(n) => n,
        }
    }
}

/// What one stream of a command delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The part kept, as [`Keep`] says.
    pub bytes: Vec<u8>,
    /// Every byte read, the dropped ones included.
    pub total: u64,
}

impl Captured {
    /// The kept bytes as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// Whether bytes were dropped.
    pub fn cut(&self) -> bool {
        self.total > self.bytes.len() as u64
    }
}

/// A command that ended before its deadline.
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: Captured,
    /// Its standard error.
    pub stderr: Captured,
}

/// Why a command gave no exit status.
#[derive(Debug)]
pub enum RunError {
    /// It could not be started.
    Spawn(io::Error),
    /// Waiting for it failed.
    Wait(io::Error),
    /// Still running at the deadline: its whole process group was killed.
    TimedOut {
        /// The deadline.
        after: Duration,
        /// What it printed on stdout before.
        stdout: Captured,
        /// What it printed on stderr before.
        stderr: Captured,
        /// What of its process group outlived SIGKILL, if anything.
        left: Option<String>,
    },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(e) => write!(f, "cannot start it: {e}"),
            RunError::Wait(e) => write!(f, "waiting for it failed: {e}"),
            RunError::TimedOut { after, left, .. } => {
                write!(
                    f,
                    "still running after {}s; killed it with its process group",
                    after.as_secs()
                )?;
                match left {
                    Some(left) => write!(f, "; {left}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for RunError {}

/// Run a command to its end in its own process group, stdin closed, both
/// pipes read as the output arrives and kept as `keep` says. At `deadline`
/// the whole group is killed (also when the future is dropped midway: a
/// daemon stopping kills what it ran).
pub async fn run(mut cmd: Command, deadline: Duration, keep: Keep) -> Result<Finished, RunError> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(RunError::Spawn)?;
    // process_group(0): the group's id is the child's pid.
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    // Armed until the command is over.
    let mut guard = GroupGuard(group);
    let mut stdout = Collector::start(child.stdout.take(), keep);
    let mut stderr = Collector::start(child.stderr.take(), keep);
    let finished = async {
        let status = child.wait().await;
        stdout.closed().await;
        stderr.closed().await;
        status
    };
    match tokio::time::timeout(deadline, finished).await {
        Ok(Err(e)) => Err(RunError::Wait(e)),
        Ok(Ok(status)) => {
            guard.0 = None;
            Ok(Finished {
                status,
                stdout: stdout.captured(),
                stderr: stderr.captured(),
            })
        }
        Err(_) => {
            let left = match guard.0.take() {
                Some(group) => kill_group(group, &program, &mut child).await,
                None => {
                    let _ = child.start_kill();
                    None
                }
            };
            // Killed, its pipes close: read what it printed last.
            let _ = tokio::time::timeout(KILL_GRACE, async {
                stdout.closed().await;
                stderr.closed().await;
            })
            .await;
            Err(RunError::TimedOut {
                after: deadline,
                stdout: stdout.captured(),
                stderr: stderr.captured(),
                left,
            })
        }
    }
}

/// [`run`] for code without a runtime (a hang capture, `tt-smi -v` in a
/// blocking task, a worker's identity step): the command runs on a
/// runtime of its own, on a thread of its own, so it works from any
/// thread, inside a runtime's blocking task or outside any.
pub fn run_blocking(
    cmd: std::process::Command,
    deadline: Duration,
    keep: Keep,
) -> Result<Finished, RunError> {
    std::thread::scope(|scope| {
        let runner = std::thread::Builder::new()
            .name("subprocess".into())
            .spawn_scoped(scope, move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(RunError::Spawn)?;
                runtime.block_on(run(Command::from(cmd), deadline, keep))
            })
            .map_err(RunError::Spawn)?;
        runner
            .join()
            .unwrap_or_else(|_| Err(RunError::Wait(io::Error::other("the runner panicked"))))
    })
}

/// Make the command's process get `signal` when this process dies, and
/// not start at all when this process died between the fork and the
/// prctl (no signal would come then). The kernel ties the signal to the
/// *thread* that forks: spawn from a thread that lives as long as the
/// process (the main thread, a runtime's worker threads), never from a
/// short-lived one. For the processes that must not outlive their parent:
/// a worker (its cards would stay busy under nobody), an engine.
pub fn die_with_parent(cmd: &mut std::process::Command, signal: libc::c_int) {
    let parent = std::process::id();
    // SAFETY: between fork and exec only async-signal-safe calls (prctl,
    // getppid, _exit), touching no memory of ours but copied integers.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The file `program` runs, found as execvp finds it: a name with a `/` is
/// a path, any other is looked up in this process's `PATH` (the one the
/// programs it starts inherit), the first runnable match winning. The
/// error is a clause the caller completes with the fix (e.g. "`/opt/w`
/// does not exist").
pub fn find_program(program: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        return runnable(Path::new(program)).map(|()| PathBuf::from(program));
    }
    let Some(path) = std::env::var_os("PATH") else {
        return Err(format!(
            "`{program}` is a bare name but PATH is not set, so it cannot be found"
        ));
    };
    // Remember why the others were skipped in case none is runnable.
    let mut skipped = None;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        if !candidate.exists() {
            continue;
        }
        match runnable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(why) => skipped = skipped.or(Some(why)),
        }
    }
    Err(match skipped {
        Some(why) => why,
        None => format!(
            "`{program}` is not on PATH ({})",
            std::env::join_paths(std::env::split_paths(&path))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
    })
}

/// Whether the file at `path` can be executed by this user.
fn runnable(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!("`{shown}` does not exist"))
        }
        Err(e) => return Err(format!("`{shown}` cannot be read ({e})")),
    };
    if !meta.is_file() {
        return Err(format!("`{shown}` is a directory, not a program"));
    }
    if nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_err() {
        return Err(format!(
            "`{shown}` is not executable (mode {:04o}; `chmod +x {shown}` if it is the right program)",
            meta.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

/// SIGKILL to the process group, before the leader is reaped (so the id
/// cannot name another group yet), then reap the leader and wait up to
/// [`KILL_GRACE`] until nothing of it runs. A process stuck in the kernel
/// (an ioctl in uninterruptible sleep) does not die even to SIGKILL: say so
/// rather than wait on it; dropping the child leaves it to tokio to reap.
async fn kill_group(
    group: i32,
    program: &str,
    child: &mut tokio::process::Child,
) -> Option<String> {
    // What runs of it, read before the kill, while parent links still lead
    // from the command to what it started; with start times, so that a
    // reused pid is not taken for one of them. Its process group cannot be
    // polled instead: an orphan's zombie stays in it until an init reaps
    // it, and some inits (in containers) take seconds or never do.
    let leader = u32::try_from(group).unwrap_or(0);
    let members: Vec<procs::Proc> = tokio::task::spawn_blocking(move || {
        procs::tree(leader)
            .into_iter()
            .filter_map(procs::stat)
            .collect()
    })
    .await
    .unwrap_or_default();
    kill(group);
    let began = Instant::now();
    let reaped = tokio::time::timeout(KILL_GRACE, child.wait()).await.is_ok();
    loop {
        let left: Vec<String> = members
            .iter()
            .filter(|p| still_runs(p))
            .map(procs::Proc::words)
            .collect();
        if reaped && left.is_empty() {
            return None;
        }
        if began.elapsed() >= KILL_GRACE {
            let who = if left.is_empty() {
                format!("{program} (pid {leader})")
            } else {
                left.join(", ")
            };
            return Some(format!(
                "{who} still ran {}s after SIGKILL to its process group: stuck in the kernel, which only a reboot ends",
                KILL_GRACE.as_secs()
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn kill(group: i32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(group),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Whether this process (the same one: same start time) still runs; a
/// zombie has ended.
fn still_runs(p: &procs::Proc) -> bool {
    procs::stat(p.pid).is_some_and(|now| now.start == p.start && !now.is_zombie())
}

/// Kills a process group with SIGKILL when dropped, unless disarmed.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            kill(group);
        }
    }
}

/// What a pipe delivered so far, read as it arrives: a command killed at
/// its deadline still shows what it printed.
struct Collector {
    kept: Arc<Mutex<Captured>>,
    keep: Keep,
    task: tokio::task::JoinHandle<()>,
    done: bool,
}

impl Collector {
    fn start(pipe: Option<impl AsyncRead + Unpin + Send + 'static>, keep: Keep) -> Collector {
        let kept = Arc::new(Mutex::new(Captured::default()));
        let sink = kept.clone();
        let task = tokio::spawn(async move {
            let Some(mut pipe) = pipe else {
                return;
            };
            let mut chunk = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
                let mut c = sink.lock().unwrap_or_else(|e| e.into_inner());
                c.total += n as u64;
                match keep {
                    Keep::First(limit) => {
                        let room = limit.saturating_sub(c.bytes.len()).min(n);
                        c.bytes.extend_from_slice(&chunk[..room]);
                    }
                    Keep::Last(limit) => {
                        c.bytes.extend_from_slice(&chunk[..n]);
                        // Trimmed in steps, not at every read.
                        if c.bytes.len() > 2 * limit {
                            let cut = c.bytes.len() - limit;
                            c.bytes.drain(..cut);
                        }
                    }
                }
            }
        });
        Collector {
            kept,
            keep,
            task,
            done: false,
        }
    }

    /// Returns once the pipe is closed (every holder of its write end
    /// gone).
    async fn closed(&mut self) {
        if !self.done {
            let _ = (&mut self.task).await;
            self.done = true;
        }
    }

    fn captured(&self) -> Captured {
        let mut c = self.kept.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let limit = self.keep.bytes();
        if c.bytes.len() > limit {
            let cut = c.bytes.len() - limit;
            c.bytes.drain(..cut);
        }
        c
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        // A pipe a stuck process still holds is never closed.
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A shell printing 1 MiB on stdout, then a line on stderr.
    fn loud() -> std::process::Command {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("head -c 1048576 /dev/zero | tr '\\0' x; echo done >&2");
        cmd
    }

    fn running(pid: u32) -> bool {
        procs::stat(pid).is_some_and(|p| !p.is_zombie())
    }

    #[tokio::test]
    async fn a_command_printing_a_mebibyte_ends_at_once_with_its_output_bounded() {
        let began = Instant::now();
        let done = run(
            Command::from(loud()),
            Duration::from_secs(30),
            Keep::Last(4096),
        )
        .await
        .unwrap();
        // A runner reading after the exit waits out the 30 s deadline.
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{:?}",
            began.elapsed()
        );
        assert!(done.status.success());
        assert_eq!(done.stdout.total, MIB);
        assert_eq!(done.stdout.bytes, vec![b'x'; 4096]);
        assert!(done.stdout.cut());
        assert_eq!(done.stderr.text(), "done\n");
        assert!(!done.stderr.cut());
    }

    #[test]
    fn the_blocking_runner_keeps_the_head_of_a_mebibyte_without_waiting() {
        let began = Instant::now();
        let done = run_blocking(loud(), Duration::from_secs(30), Keep::First(1000)).unwrap();
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(done.stdout.total, MIB);
        assert_eq!(done.stdout.bytes, vec![b'x'; 1000]);
        // Everything when the bound allows it.
        let all = run_blocking(loud(), Duration::from_secs(30), Keep::First(2 << 20)).unwrap();
        assert_eq!(all.stdout.bytes.len() as u64, MIB);
        assert!(!all.stdout.cut());
    }

    #[tokio::test]
    async fn the_blocking_runner_works_inside_a_runtimes_blocking_task() {
        let done = tokio::task::spawn_blocking(|| {
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.arg("-c").arg("echo out; echo err >&2; exit 3");
            run_blocking(cmd, Duration::from_secs(30), Keep::First(100))
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(done.status.code(), Some(3));
        assert_eq!(done.stdout.text(), "out\n");
        assert_eq!(done.stderr.text(), "err\n");
    }

    #[test]
    fn a_command_past_its_deadline_dies_with_everything_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        // Deaf to SIGTERM, as a process stuck in an ioctl is, with a child
        // that inherits that: only SIGKILL to the whole group ends both.
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(format!(
            "trap '' TERM INT HUP; sleep 600 & echo $! > {p}; echo $$ >> {p}; echo Resetting; wait",
            p = pids.display()
        ));
        let began = Instant::now();
        let err = run_blocking(cmd, Duration::from_secs(1), Keep::Last(100)).unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(1) + KILL_GRACE);
        let RunError::TimedOut { stdout, left, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(stdout.text(), "Resetting\n");
        assert_eq!(left, &None, "{err:?}");
        assert!(err.to_string().contains("killed it with its process group"));
        let text = std::fs::read_to_string(&pids).unwrap();
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert_eq!(pids.len(), 2, "{text}");
        for pid in pids {
            assert!(!running(pid), "pid {pid} outlived the deadline");
        }
    }

    #[test]
    fn a_command_that_cannot_start_says_why() {
        let cmd = std::process::Command::new("/nonexistent/tool");
        let err = run_blocking(cmd, Duration::from_secs(5), Keep::First(10)).unwrap_err();
        assert!(matches!(err, RunError::Spawn(_)), "{err:?}");
        assert!(err.to_string().starts_with("cannot start it: "), "{err}");
    }

    #[test]
    fn a_child_set_to_die_with_its_parent_dies_when_the_forking_thread_ends() {
        // The kernel's "parent" is the thread that forked: one that ends
        // at once shows the signal is set (and why the doc warns).
        let mut child = std::thread::spawn(|| {
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg("600");
            die_with_parent(&mut cmd, libc::SIGKILL);
            cmd.spawn()
        })
        .join()
        .unwrap()
        .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > until {
                let _ = child.kill();
                panic!("the child outlived the thread that started it");
            }
            std::thread::sleep(POLL);
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    #[test]
    fn paths_are_checked_for_existence_type_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let e = find_program(&missing.display().to_string()).unwrap_err();
        assert!(e.ends_with("does not exist"), "{e}");
        let e = find_program(&dir.path().display().to_string()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let script = dir.path().join("worker");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = find_program(&script.display().to_string()).unwrap_err();
        assert!(e.contains("not executable (mode 0644; `chmod +x"), "{e}");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_program(&script.display().to_string()).unwrap(), script);
    }

    #[test]
    fn bare_names_are_looked_up_in_path() {
        assert!(find_program("sh").is_ok(), "sh is on every PATH");
        let e = find_program("no-such-program-tt-serving").unwrap_err();
        assert!(e.contains("is not on PATH ("), "{e}");
    }
}
