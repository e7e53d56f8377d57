//! Per-slot containment end to end: a worker that starts a grandchild in
//! its own session (it leaves the worker's process group, as an engine's
//! child may) and then becomes the real `tt-worker`. Whatever ends the
//! worker (an operator restart, the daemon's SIGTERM, the watchdog's kill,
//! the daemon killed outright and started again) ends the grandchild too,
//! and the slot's memory counts it. Each scenario runs in the containment
//! this host gives (`auto`: a cgroup v2 where one is writable) and in the
//! process tree (`process-tree`), which every host can run.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use tt_serving_tests::{bin, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// What `auto` picks on this host.
    Auto,
    /// `daemon.containment = "process-tree"`.
    Tree,
}

/// A slot `m` whose worker is a shell script: it starts `grandchild` (a
/// command line) in its own session, appending its pid to `pids`, then
/// execs `tt-worker`.
struct Setup {
    hw: FakeHw,
    dir: tempfile::TempDir,
    pids: PathBuf,
}

impl Setup {
    fn new(grandchild: &str) -> Setup {
        let hw = FakeHw::new(1);
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("grandchildren");
        let script = dir.path().join("worker.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n\
                 # The identity step (TT_WORKER_IDENTIFY) goes straight to the worker.\n\
                 [ \"$TT_WORKER_IDENTIFY\" = 1 ] && exec '{worker}' \"$@\"\n\
                 # Leaves the process group: setsid, in the background.\n\
                 setsid sh -c 'echo $$ >> \"$0\"; exec {grandchild}' '{pids}' &\n\
                 exec '{worker}' \"$@\"\n",
                pids = pids.display(),
                worker = bin("tt-worker").display(),
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Setup { hw, dir, pids }
    }

    fn options(&self, mode: Mode, extra: &str) -> DaemonOptions {
        let model = tiny_model(self.dir.path());
        DaemonOptions {
            daemon_extra: match mode {
                Mode::Auto => String::new(),
                Mode::Tree => "containment = \"process-tree\"".into(),
            },
            extra: format!(
                "\n[models.m]\ntp = 1\ncards = [\"{card}\"]\ncheckpoint = \"{checkpoint}\"\nworker = [\"{script}\"]\ndrain_timeout_secs = 5\n{extra}\n[models.m.restart]\nbackoff_ms = 50\nstall_timeout_secs = 600\n",
                card = FakeHw::bdf(0),
                checkpoint = model.display(),
                script = self.dir.path().join("worker.sh").display(),
            ),
            ..Default::default()
        }
    }

    fn start(&self, mode: Mode, extra: &str) -> Daemon {
        Daemon::start(&self.hw, self.options(mode, extra))
    }

    /// Pids of the grandchildren started so far, in order.
    fn grandchildren(&self) -> Vec<u32> {
        std::fs::read_to_string(&self.pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The pid of grandchild number `n` (0-based), once it has started.
    fn grandchild(&self, n: usize) -> u32 {
        wait_until(&format!("grandchild {n} to start"), || {
            self.grandchildren().get(n).copied()
        })
    }
}

impl Drop for Setup {
    /// A test that fails, or ends by killing its daemon outright, leaves
    /// grandchildren running (that is the point): end them.
    fn drop(&mut self) {
        for pid in self.grandchildren() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "sleep" || comm.starts_with("python") {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// Whether `pid` runs `comm` and has not exited (a zombie waiting for a
/// reaper has).
fn alive(pid: u32, comm: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((name, rest)) = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')) else {
        return false;
    };
    name == comm && !rest.trim_start().starts_with('Z')
}

fn wait_gone(pid: u32, comm: &str, what: &str) {
    wait_until(&format!("{what} (pid {pid}) to be gone"), || {
        (!alive(pid, comm)).then_some(())
    });
}

/// The containment status names, checked against the mode asked for;
/// the slot cgroup's directory when it is a cgroup.
fn containment(daemon: &Daemon, mode: Mode) -> Option<PathBuf> {
    let status = daemon.status();
    let words = status["daemon"]["containment"].as_str().unwrap_or("");
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(
        table.contains(&format!("slots contained by: {words}")),
        "{table}"
    );
    match mode {
        Mode::Tree => {
            assert_eq!(
                words,
                "process tree (daemon.containment = \"process-tree\")"
            );
            None
        }
        Mode::Auto => {
            if let Some(rest) = words.strip_prefix("cgroup v2 at ") {
                let root = rest.split(" (").next().unwrap_or_default();
                Some(Path::new(root).join("slot-m"))
            } else {
                assert!(
                    words.starts_with("process tree (no writable cgroup v2: "),
                    "{words}"
                );
                eprintln!("this host gives no writable cgroup v2: {words}");
                None
            }
        }
    }
}

/// The cgroup v2 path of a process (`0::` line).
fn cgroup_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}

fn worker_pid(slot: &Value) -> u32 {
    slot["worker_pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("worker pid")
}

fn restart_and_sigterm_end_the_grandchild(mode: Mode) {
    let setup = Setup::new("sleep 120");
    let mut daemon = setup.start(mode, "");
    let first = daemon.wait_slot_state("m", "ready");
    let slot_cgroup = containment(&daemon, mode);
    let escaped = setup.grandchild(0);
    assert!(alive(escaped, "sleep"));
    // It left the worker's process group and session.
    let worker = worker_pid(&first);
    assert_ne!(
        nix::unistd::getpgid(Some(Pid::from_raw(escaped as i32))).ok(),
        Some(Pid::from_raw(worker as i32))
    );
    if let Some(dir) = &slot_cgroup {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert!(
            cgroup_of(worker).ends_with(&format!("/{name}")),
            "{}",
            cgroup_of(worker)
        );
        assert_eq!(cgroup_of(escaped), cgroup_of(worker));
    }

    let out = daemon.ttctl(&["slot", "restart", "m"]);
    assert!(out.status.success(), "{}", output_text(&out));
    wait_gone(escaped, "sleep", "the first worker's grandchild");
    let slot = daemon.wait_slot_state("m", "ready");
    assert_ne!(slot["worker_pid"], first["worker_pid"]);
    let error = slot["last_error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!(
            "left 1 process(es) running in its slot, killed: pid {escaped} (sleep)"
        )),
        "{slot:#}"
    );
    // It ran in the slot: the cards were reset as after any engine killed.
    assert!(setup
        .hw
        .smi_calls()
        .iter()
        .any(|c| c == "--no_reinit -r 0000:01:00.0"));

    let second = setup.grandchild(1);
    assert!(alive(second, "sleep"));
    let pid = daemon.pid();
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log_text());
    assert!(
        !alive(second, "sleep"),
        "the daemon stopped, the grandchild runs"
    );
    if let Some(dir) = slot_cgroup {
        assert!(!dir.exists(), "{} left behind", dir.display());
        if let Some(root) = dir.parent() {
            if root.ends_with(format!("tt-servingd-{pid}")) {
                assert!(!root.exists(), "{} left behind", root.display());
            }
        }
    }
}

#[test]
fn restart_and_sigterm_end_the_grandchild_auto() {
    restart_and_sigterm_end_the_grandchild(Mode::Auto);
}

#[test]
fn restart_and_sigterm_end_the_grandchild_process_tree() {
    restart_and_sigterm_end_the_grandchild(Mode::Tree);
}

fn the_watchdogs_kill_ends_the_grandchild(mode: Mode) {
    let setup = Setup::new("sleep 120");
    let daemon = setup.start(mode, "");
    let first = daemon.wait_slot_state("m", "ready");
    containment(&daemon, mode);
    let escaped = setup.grandchild(0);
    kill(Pid::from_raw(worker_pid(&first) as i32), Signal::SIGSTOP).unwrap();
    wait_gone(escaped, "sleep", "the frozen worker's grandchild");
    let slot = wait_until("a new worker", || {
        let slot = daemon.slot("m");
        (slot["state"] == "ready" && slot["worker_pid"] != first["worker_pid"]).then_some(slot)
    });
    assert!(
        slot["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("Health polls in a row unanswered")),
        "{slot:#}"
    );
}

#[test]
fn the_watchdogs_kill_ends_the_grandchild_auto() {
    the_watchdogs_kill_ends_the_grandchild(Mode::Auto);
}

#[test]
fn the_watchdogs_kill_ends_the_grandchild_process_tree() {
    the_watchdogs_kill_ends_the_grandchild(Mode::Tree);
}

fn a_daemon_killed_outright_leaves_a_stray_the_next_one_ends(mode: Mode) {
    let setup = Setup::new("sleep 120");
    let mut daemon = setup.start(mode, "");
    let first = daemon.wait_slot_state("m", "ready");
    containment(&daemon, mode);
    let escaped = setup.grandchild(0);
    let worker = worker_pid(&first);
    daemon.kill9();
    // The worker dies with the daemon (parent-death signal); its grandchild
    // outlives both until a daemon starts again.
    wait_gone(worker, "tt-worker", "the worker");
    assert!(alive(escaped, "sleep"), "nothing ended the stray yet");
    daemon.spawn(&[]);
    wait_gone(escaped, "sleep", "the stray grandchild");
    daemon.wait_slot_state("m", "ready");
    assert!(
        daemon.log_text().contains("previous daemon"),
        "{}",
        daemon.log_text()
    );
}

#[test]
fn a_daemon_killed_outright_leaves_a_stray_the_next_one_ends_auto() {
    a_daemon_killed_outright_leaves_a_stray_the_next_one_ends(Mode::Auto);
}

#[test]
fn a_daemon_killed_outright_leaves_a_stray_the_next_one_ends_process_tree() {
    a_daemon_killed_outright_leaves_a_stray_the_next_one_ends(Mode::Tree);
}

/// The real interpreter behind `python3` (a pyenv shim needs more of the
/// environment than a worker gets).
fn python() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !path.is_empty()).then_some(path)
}

fn the_slots_memory_counts_the_grandchild(mode: Mode) {
    let Some(python) = python() else {
        eprintln!("SKIPPED: no python3 to hold memory");
        return;
    };
    // 200 MiB the grandchild writes to, so that it is resident.
    let setup = Setup::new(&format!(
        "{python} -c \"import time; b = bytes([1]) * (200 << 20); time.sleep(120)\""
    ));
    let daemon = setup.start(mode, "");
    let first = daemon.wait_slot_state("m", "ready");
    containment(&daemon, mode);
    let holder = setup.grandchild(0);
    let worker = worker_pid(&first);
    let own = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 4096
    };
    let slot = wait_until(
        "the slot's memory to count the grandchild's 200 MiB",
        || {
            let slot = daemon.slot("m");
            (slot["worker_rss_bytes"].as_u64()? >= 200 << 20).then_some(slot)
        },
    );
    let total = slot["worker_rss_bytes"].as_u64().unwrap_or(0);
    let worker_alone = own(worker);
    assert!(
        worker_alone + (150 << 20) < total,
        "the worker alone has {worker_alone} bytes, the slot {total}: the grandchild is not counted"
    );
    assert!(slot["worker_memory_peak_bytes"].as_u64().unwrap_or(0) >= total);
    assert!(alive(holder, "python3") || own(holder) > 0);
}

#[test]
fn the_slots_memory_counts_the_grandchild_auto() {
    the_slots_memory_counts_the_grandchild(Mode::Auto);
}

#[test]
fn the_slots_memory_counts_the_grandchild_process_tree() {
    the_slots_memory_counts_the_grandchild(Mode::Tree);
}

#[test]
fn a_memory_limit_the_process_tree_cannot_enforce_fails_the_start() {
    let setup = Setup::new("sleep 120");
    let daemon = setup.start(Mode::Tree, "memory_max_mib = 4096\n");
    let slot = wait_until("the start to fail", || {
        let slot = daemon.slot("m");
        let error = slot["last_error"].as_str()?.to_string();
        (!error.is_empty()).then_some(error)
    });
    assert!(
        slot.contains("models.m.memory_max_mib = 4096 cannot be enforced")
            && slot.contains("Delegate=yes"),
        "{slot}"
    );
    assert!(setup.grandchildren().is_empty(), "a worker was started");
}

/// A SIGKILL from outside is not blamed on the OOM killer when its
/// counter did not move (the slot's own where memory is accounted, else
/// the host's).
fn an_outside_sigkill_is_told_apart_from_the_oom_killer(mode: Mode) {
    let setup = Setup::new("sleep 120");
    let daemon = setup.start(mode, "");
    let first = daemon.wait_slot_state("m", "ready");
    containment(&daemon, mode);
    let escaped = setup.grandchild(0);
    kill(Pid::from_raw(worker_pid(&first) as i32), Signal::SIGKILL).unwrap();
    wait_gone(escaped, "sleep", "the killed worker's grandchild");
    let error = wait_until("the failure to be recorded", || {
        let error = daemon.slot("m")["last_error"].as_str()?.to_string();
        (!error.is_empty()).then_some(error)
    });
    assert!(error.contains("killed by SIGKILL"), "{error}");
    assert!(
        error.contains("oom_kill"),
        "no OOM evidence either way: {error}"
    );
    assert!(
        error.contains(&format!("killed: pid {escaped} (sleep)")),
        "{error}"
    );
}

#[test]
fn an_outside_sigkill_is_told_apart_from_the_oom_killer_auto() {
    an_outside_sigkill_is_told_apart_from_the_oom_killer(Mode::Auto);
}

#[test]
fn an_outside_sigkill_is_told_apart_from_the_oom_killer_process_tree() {
    an_outside_sigkill_is_told_apart_from_the_oom_killer(Mode::Tree);
}

/// `daemon.containment = "cgroup"` where the daemon may not write its
/// cgroup (here: run as `nobody`, in a cgroup owned by root): it refuses
/// to start, naming why and the fix.
#[test]
fn cgroup_containment_that_cannot_be_had_stops_the_daemon_naming_the_fix() {
    use std::os::unix::process::CommandExt;
    tt_serving_tests::needs_root!();
    const NOBODY: u32 = 65534;
    const NOGROUP: u32 = 65534;
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::configure(
        &hw,
        dir.path(),
        &DaemonOptions {
            daemon_extra: "containment = \"cgroup\"".into(),
            ..Default::default()
        },
    );
    let owner = (
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(nix::unistd::Gid::from_raw(NOGROUP)),
    );
    nix::unistd::chown(dir.path(), owner.0, owner.1).unwrap();
    nix::unistd::chown(&daemon.config, owner.0, owner.1).unwrap();
    let mut child = Command::new(bin("tt-servingd"))
        .arg("run")
        .arg("--config")
        .arg(&daemon.config)
        .uid(NOBODY)
        .gid(NOGROUP)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_until("tt-servingd to refuse to start", || {
        child.try_wait().ok().flatten()
    });
    let text = output_text(&child.wait_with_output().unwrap());
    assert!(!status.success(), "{text}");
    assert!(
        text.contains(
            "daemon.containment = \"cgroup\", but no writable cgroup v2 can hold the slots"
        ) && text.contains("Delegate=yes")
            && text.contains("\"process-tree\""),
        "{text}"
    );
}

/// The cgroup2 mount point, where the mount shows the whole hierarchy.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (fields, fs) = l.split_once(" - ")?;
        (fs.split_whitespace().next()? == "cgroup2").then_some(())?;
        let fields: Vec<&str> = fields.split_whitespace().collect();
        (*fields.get(3)? == "/").then_some(())?;
        fields.get(4).map(PathBuf::from)
    })
}

/// A grandchild that does what `podman run --cgroups=split` does in a
/// slot: the "container" (itself) goes into `libpod-payload-<pid>/`, every
/// other process of the slot's cgroup (the worker too) into `runtime/`,
/// and the slot's own `cgroup.procs` is left empty.
fn split_like_podman(dir: &Path, mount: &Path) -> PathBuf {
    let script = dir.join("split.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             cg=\"{mount}$(sed -n 's/^0:://p' /proc/self/cgroup)\"\n\
             case \"$cg\" in */slot-m)\n\
             \x20 mkdir \"$cg/runtime\" \"$cg/libpod-payload-$$\" || exit 1\n\
             \x20 echo $$ > \"$cg/libpod-payload-$$/cgroup.procs\"\n\
             \x20 for p in $(cat \"$cg/cgroup.procs\"); do echo $p 2>/dev/null > \"$cg/runtime/cgroup.procs\"; done\n\
             esac\n\
             exec sleep 120\n",
            mount = mount.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Wait until the worker is in `runtime/` below the slot and `grandchild`
/// in its payload cgroup, with nothing in the slot's own `cgroup.procs`.
fn wait_split(dir: &Path, worker: u32, grandchild: u32) {
    let payload = format!("/slot-m/libpod-payload-{grandchild}");
    wait_until(
        "the worker and its grandchild to move below the slot",
        || {
            (cgroup_of(worker).ends_with("/slot-m/runtime")
                && cgroup_of(grandchild).ends_with(&payload)
                && alive(grandchild, "sleep"))
            .then_some(())
        },
    );
    let own = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    assert!(own.trim().is_empty(), "in the slot's own cgroup: {own}");
}

/// A worker whose engine runs under `podman run --cgroups=split` leaves
/// the slot's own `cgroup.procs` empty: everything runs in cgroups below
/// it. A restart, a daemon killed outright and a stop end it all the
/// same, and remove those cgroups.
#[test]
fn what_runs_in_cgroups_below_the_slot_ends_with_it() {
    let Some(mount) = cgroup2_mount() else {
        eprintln!("SKIPPED: no cgroup2 mount showing the whole hierarchy");
        return;
    };
    let scripts = tempfile::tempdir().unwrap();
    let setup = Setup::new(
        &split_like_podman(scripts.path(), &mount)
            .display()
            .to_string(),
    );
    let mut daemon = setup.start(Mode::Auto, "");
    let first = daemon.wait_slot_state("m", "ready");
    let Some(dir) = containment(&daemon, Mode::Auto) else {
        return;
    };
    let escaped = setup.grandchild(0);
    wait_split(&dir, worker_pid(&first), escaped);

    let out = daemon.ttctl(&["slot", "restart", "m"]);
    assert!(out.status.success(), "{}", output_text(&out));
    wait_gone(escaped, "sleep", "the first worker's grandchild");
    let second = daemon.wait_slot_state("m", "ready");
    let error = second["last_error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("killed: pid {escaped} (sleep)")),
        "{second:#}"
    );
    // The next worker made `runtime/` again: the first one's was removed.
    let grandchild = setup.grandchild(1);
    wait_split(&dir, worker_pid(&second), grandchild);
    assert!(!dir.join(format!("libpod-payload-{escaped}")).exists());

    // Killed outright: the next daemon ends the slot and removes the
    // cgroups the dead one made.
    let pid = daemon.pid();
    daemon.kill9();
    wait_gone(worker_pid(&second), "tt-worker", "the worker");
    assert!(alive(grandchild, "sleep"), "nothing ended the stray yet");
    daemon.spawn(&[]);
    wait_gone(grandchild, "sleep", "the stray grandchild");
    let third = daemon.wait_slot_state("m", "ready");
    let old_root = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    if old_root.ends_with(format!("tt-servingd-{pid}")) {
        assert!(!old_root.exists(), "{} left behind", old_root.display());
    }

    let dir = containment(&daemon, Mode::Auto).expect("a cgroup again");
    let grandchild = setup.grandchild(2);
    wait_split(&dir, worker_pid(&third), grandchild);
    let pid = daemon.pid();
    assert_eq!(daemon.terminate(), Some(0), "{}", daemon.log_text());
    assert!(
        !alive(grandchild, "sleep"),
        "the daemon stopped, the grandchild runs"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
    if let Some(root) = dir.parent() {
        if root.ends_with(format!("tt-servingd-{pid}")) {
            assert!(!root.exists(), "{} left behind", root.display());
        }
    }
}
