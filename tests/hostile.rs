//! A hostile local user against the daemon's files and cards: links planted
//! where the daemon writes, a file where its socket goes, directories
//! others can write into, lock files others could hold, and borrowed jobs
//! that outlive their lease. Real files, links, users and processes; the
//! tests that switch users need root (they say SKIPPED otherwise).

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tt_serving_tests::{
    bin, model_table, needs_root, output_text, run_to_exit, tiny_model, wait_until, Daemon,
    DaemonOptions, FakeHw,
};

/// `nobody`/`nogroup` on Debian-like systems.
const NOBODY: u32 = 65534;
const NOGROUP_GID: u32 = 65534;

/// A file an attacker would like the daemon to overwrite.
fn victim(dir: &Path) -> PathBuf {
    let path = dir.join("precious");
    std::fs::write(&path, "do not touch\n").unwrap();
    path
}

fn assert_untouched(victim: &Path) {
    assert_eq!(
        std::fs::read_to_string(victim).unwrap(),
        "do not touch\n",
        "the daemon wrote through a planted link"
    );
}

fn configured(hw: &FakeHw, dir: &Path, opts: &DaemonOptions) -> Daemon {
    Daemon::configure(hw, dir, opts)
}

/// Options for one TP=1 slot `tiny` on card 0 with the tiny model.
fn tiny_on_card_0(dir: &Path) -> DaemonOptions {
    let model = tiny_model(dir);
    DaemonOptions {
        extra: model_table("tiny", 1, &[0], &model, ""),
        ..Default::default()
    }
}

#[test]
fn a_regular_file_at_the_control_socket_path_is_refused_and_kept() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = configured(&hw, dir.path(), &DaemonOptions::default());
    std::fs::write(&daemon.socket, "someone's notes\n").unwrap();
    let text = run_to_exit(&daemon.config);
    assert!(
        text.contains("is a regular file, not a socket") && text.contains("daemon.control_socket"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&daemon.socket).unwrap(),
        "someone's notes\n"
    );
    // A directory is refused the same way.
    std::fs::remove_file(&daemon.socket).unwrap();
    std::fs::create_dir(&daemon.socket).unwrap();
    let text = run_to_exit(&daemon.config);
    assert!(text.contains("is a directory, not a socket"), "{text}");
    assert!(daemon.socket.is_dir());
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_refused() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = configured(&hw, dir.path(), &DaemonOptions::default());
    // A socket nobody listens on any more, as a killed daemon leaves it.
    drop(std::os::unix::net::UnixListener::bind(&daemon.socket).unwrap());
    daemon.spawn(&[]);
    // A second daemon on the same socket must not steal it.
    let text = run_to_exit(&daemon.config);
    assert!(
        text.contains("another tt-servingd is already serving"),
        "{text}"
    );
    assert!(daemon.status()["daemon"]["pid"].as_u64().is_some());
}

#[test]
fn a_link_planted_at_a_lock_path_is_refused_and_its_target_kept() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let target = victim(dir.path());
    let mut daemon = configured(&hw, dir.path(), &DaemonOptions::default());
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    let bdf = FakeHw::bdf(0);
    symlink(&target, daemon.lock_dir.join(format!("{bdf}.lock"))).unwrap();
    daemon.spawn(&[]);
    let card = wait_until("the card to show the planted link", || {
        let card = daemon.card(&bdf);
        card["state_reason"]
            .as_str()?
            .contains("is a symbolic link")
            .then_some(card)
    });
    assert_eq!(card["state"], "failed", "{card}");
    daemon.terminate();
    assert_untouched(&target);
}

#[test]
fn links_planted_in_the_state_dir_are_replaced_not_written_through() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let target = victim(dir.path());
    let bdf = FakeHw::bdf(0);
    let mut daemon = configured(&hw, dir.path(), &tiny_on_card_0(dir.path()));
    // The dirty-card record is written when the worker starts.
    let dirty = dir.path().join("state/dirty");
    std::fs::create_dir_all(&dirty).unwrap();
    symlink(&target, dirty.join(format!("{bdf}.dirty"))).unwrap();
    daemon.spawn(&[]);
    daemon.wait_slot_state("tiny", "ready");
    // The clean-shutdown record is written at stop.
    symlink(&target, dir.path().join("state/clean-shutdown")).unwrap();
    assert_eq!(daemon.terminate(), Some(0));
    assert_untouched(&target);
    let record = std::fs::symlink_metadata(dir.path().join("state/clean-shutdown")).unwrap();
    assert!(record.is_file(), "the record replaced the link");
}

#[test]
fn a_lock_dir_every_user_can_write_is_refused_with_the_fix() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = configured(&hw, dir.path(), &DaemonOptions::default());
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    std::fs::set_permissions(&daemon.lock_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let text = run_to_exit(&daemon.config);
    assert!(
        text.contains("daemon.lock_dir") && text.contains("writable by every user"),
        "{text}"
    );
    assert!(text.contains("chmod o-w"), "{text}");
    // Nothing was created or locked in it.
    assert_eq!(std::fs::read_dir(&daemon.lock_dir).unwrap().count(), 0);
}

#[test]
fn directories_other_users_or_groups_control_are_refused_naming_them() {
    needs_root!();
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = configured(&hw, dir.path(), &DaemonOptions::default());
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // Group-writable by a group that is not the admin group.
    nix::unistd::chown(&state, None, Some(nix::unistd::Gid::from_raw(NOGROUP_GID))).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o775)).unwrap();
    let text = run_to_exit(&daemon.config);
    assert!(
        text.contains("daemon.state_dir")
            && text.contains("writable by the members of group `nogroup`"),
        "{text}"
    );
    // Owned by another user.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    nix::unistd::chown(&state, Some(nix::unistd::Uid::from_raw(NOBODY)), None).unwrap();
    let text = run_to_exit(&daemon.config);
    assert!(text.contains("owned by nobody (uid 65534)"), "{text}");
}

#[test]
fn the_admin_group_may_share_the_lock_dir_and_holds_the_lock_files() {
    needs_root!();
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let opts = DaemonOptions {
        daemon_extra: "control_admin_group = \"nogroup\"\n".into(),
        ..Default::default()
    };
    let mut daemon = configured(&hw, dir.path(), &opts);
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    nix::unistd::chown(
        &daemon.lock_dir,
        None,
        Some(nix::unistd::Gid::from_raw(NOGROUP_GID)),
    )
    .unwrap();
    std::fs::set_permissions(&daemon.lock_dir, std::fs::Permissions::from_mode(0o2775)).unwrap();
    daemon.spawn(&[]);
    let bdf = FakeHw::bdf(0);
    daemon.wait_card_state(&bdf, "idle");
    let lock = std::fs::metadata(daemon.lock_dir.join(format!("{bdf}.lock"))).unwrap();
    assert_eq!(lock.mode() & 0o777, 0o660);
    assert_eq!(lock.gid(), NOGROUP_GID);
}

/// `flock -n LOCK true` as `uid`, who is in no group but its own.
fn flock_as(uid: u32, gid: u32, lock: &Path) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new("flock")
        .args(["-n", "-s"])
        .arg(lock)
        .arg("true")
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .output()
        .expect("flock(1) is part of util-linux")
}

#[test]
fn an_ordinary_user_cannot_hold_a_card_lock() {
    needs_root!();
    let hw = FakeHw::new(1);
    let mut daemon = Daemon::start(&hw, DaemonOptions::default());
    let bdf = FakeHw::bdf(0);
    daemon.wait_card_state(&bdf, "idle");
    std::fs::set_permissions(&daemon.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&daemon.lock_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lock = daemon.lock_dir.join(format!("{bdf}.lock"));
    assert_eq!(std::fs::metadata(&lock).unwrap().mode() & 0o777, 0o600);
    // Stop the daemon so the lock is free: a user who could open the file
    // would now take it and keep the next daemon away.
    daemon.terminate();
    let out = flock_as(NOBODY, NOGROUP_GID, &lock);
    assert!(!out.status.success(), "nobody took the card lock");
    assert!(
        output_text(&out).contains("Permission denied"),
        "{}",
        output_text(&out)
    );
}

#[test]
fn a_foreign_lock_holder_is_named_in_status_and_the_log() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let bdf = FakeHw::bdf(0);
    let mut daemon = configured(&hw, dir.path(), &tiny_on_card_0(dir.path()));
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    let lock = daemon.lock_dir.join(format!("{bdf}.lock"));
    // A benchmark script holding the card with flock(1) (its `sleep`
    // inherits the lock, so the script ends with its process group).
    let mut script = {
        use std::os::unix::process::CommandExt;
        Command::new("flock")
            .arg("-x")
            .arg(&lock)
            .args(["sleep", "60"])
            .process_group(0)
            .spawn()
            .unwrap()
    };
    wait_until("flock to take the lock", || {
        let held = Command::new("flock")
            .args(["-n"])
            .arg(&lock)
            .arg("true")
            .status()
            .ok()?;
        (!held.success()).then_some(())
    });
    daemon.spawn(&[]);
    let card = daemon.wait_card_state(&bdf, "held-elsewhere");
    let holder = &card["lock_holder"];
    assert_eq!(holder["pid"], script.id(), "{card}");
    assert!(
        holder["command"].as_str().unwrap().contains("sleep 60"),
        "{card}"
    );
    assert_eq!(holder["user"], "root", "{card}");
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(table.contains(&format!("pid {}", script.id())), "{table}");
    daemon.wait_log("a managed card's lock is held by another process");
    assert_eq!(daemon.slot("tiny")["state"], "locking");
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(script.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = script.wait();
    daemon.wait_slot_state("tiny", "ready");
}

fn borrow_daemon(dir: &Path, hw: &FakeHw) -> Daemon {
    let mut daemon = configured(hw, dir, &tiny_on_card_0(dir));
    daemon.spawn(&[]);
    daemon.wait_slot_state("tiny", "ready");
    daemon
}

fn process_alive(pid: u32) -> bool {
    // A zombie has no cmdline; it no longer holds anything.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

#[test]
fn a_killed_borrower_leaves_no_second_user_on_the_card() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = borrow_daemon(dir.path(), &hw);
    let bdf = FakeHw::bdf(0);
    let mut ttctl = Command::new(bin("ttctl"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["card", "borrow", "0", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The job runs once ttctl holds the lock.
    let job = wait_until("the borrowed job to hold the card", || {
        let card = daemon.card(&bdf);
        let holder = &card["lock_holder"];
        (holder["is_daemon"] == false && card["state_reason"].as_str()?.contains("lent to"))
            .then_some(())?;
        let out = Command::new("pgrep")
            .args(["-P", &ttctl.id().to_string(), "-x", "sleep"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u32>()
            .ok()
    });
    let resets_before = hw.smi_calls().len();
    ttctl.kill().unwrap();
    ttctl.wait().unwrap();
    // The job keeps the inherited lock: the daemon sees it as the holder
    // and neither resets the card nor starts a worker on it.
    let card = wait_until("the daemon to name the job as the holder", || {
        let card = daemon.card(&bdf);
        (card["lock_holder"]["pid"] == job).then_some(card)
    });
    assert_eq!(card["state"], "held-elsewhere", "{card}");
    assert!(
        card["lock_holder"]["command"]
            .as_str()
            .unwrap()
            .contains("sleep 60"),
        "{card}"
    );
    assert_ne!(daemon.slot("tiny")["state"], "ready");
    assert_eq!(
        hw.smi_calls().len(),
        resets_before,
        "reset under a live job"
    );
    // When the job ends, the card is reset and the slot comes back.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    daemon.wait_slot_state("tiny", "ready");
    assert!(
        hw.smi_calls().len() > resets_before,
        "no reset after the loan"
    );
}

#[test]
fn a_jobs_leftover_grandchild_ends_with_the_lease() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = borrow_daemon(dir.path(), &hw);
    let pid_file = dir.path().join("grandchild.pid");
    let script = format!("sleep 60 & echo $! > {}; exit 0", pid_file.display());
    let out = daemon.ttctl(&["card", "borrow", "0", "--", "sh", "-c", &script]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    let grandchild: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        text.contains("left 1 process(es) behind") && text.contains(&format!("pid {grandchild}")),
        "{text}"
    );
    assert!(
        !process_alive(grandchild),
        "the job's grandchild outlived the lease"
    );
    daemon.wait_slot_state("tiny", "ready");
}

#[test]
fn a_process_holding_the_chip_without_its_lock_keeps_the_slot_from_starting() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    // tt-umd's CHIP_IN_USE lock of /dev/tenstorrent/0 held, the node open
    // twice (so the driver lists it twice): an engine the daemon did not start.
    let stray = hw.chip_holder(0);
    let mut daemon = configured(&hw, dir.path(), &tiny_on_card_0(dir.path()));
    daemon.spawn(&[]);
    let slot = wait_until("the slot to name the stray process", || {
        let slot = daemon.slot("tiny");
        slot["reason"]
            .as_str()?
            .contains(&format!("pid {}", stray.pid()))
            .then_some(slot)
    });
    assert_eq!(slot["state"], "locking", "{slot}");
    assert!(
        slot["reason"].as_str().unwrap_or("").contains("chip lock"),
        "{slot}"
    );
    // Listed once although the driver lists it per open descriptor.
    let card = daemon.card(&FakeHw::bdf(0));
    let processes = card["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{card}");
    assert_eq!(processes[0]["holds_chip"], true, "{card}");
    drop(stray);
    daemon.wait_slot_state("tiny", "ready");
}

#[test]
fn a_monitoring_process_with_the_card_open_is_shown_but_does_not_block_the_slot() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    // The node open without the chip lock: a tt-smi display, an exporter.
    let watcher = hw.watcher(0);
    let mut daemon = configured(&hw, dir.path(), &tiny_on_card_0(dir.path()));
    daemon.spawn(&[]);
    daemon.wait_slot_state("tiny", "ready");
    let card = daemon.card(&FakeHw::bdf(0));
    let processes = card["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{card}");
    assert_eq!(processes[0]["pid"], watcher.pid(), "{card}");
    assert_eq!(processes[0]["holds_chip"], false, "{card}");
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(
        table.contains(&format!("pid {}", watcher.pid())) && table.contains("watching"),
        "{table}"
    );
}
