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

// The OpenAI door against a local user who opens many connections, sends
// nothing or a byte at a time, and reads /health for what it gives away.

/// A daemon with the OpenAI door on a free port, its `[openai]` settings
/// `openai` (lines of the table) and the models `models`.
fn openai_door(hw: &FakeHw, openai: &str, models: String) -> Daemon {
    Daemon::start(
        hw,
        DaemonOptions {
            extra: format!("[openai]\nlisten = \"127.0.0.1:0\"\n{openai}\n{models}"),
            ..Default::default()
        },
    )
}

/// `host:port` of the OpenAI door, from `ttctl status`.
fn door_address(daemon: &Daemon) -> String {
    let address = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!address.is_empty(), "no openai_address in status");
    address
}

/// One HTTP/1.1 request on `stream` (kept alive); the answer's head and
/// body (read by its Content-Length).
fn exchange(stream: &mut std::net::TcpStream, method: &str, path: &str) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: door\r\n\r\n").unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    format!("{head}\r\n{}", String::from_utf8_lossy(&body))
}

/// Whether the server closed `stream` (end of file or a reset) before
/// `deadline`; whatever it sent first is skipped.
fn closed_before(stream: &mut std::net::TcpStream, deadline: std::time::Instant) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(e) => panic!("reading a held connection: {e}"),
        }
    }
}

#[test]
fn idle_and_trickling_connections_to_the_openai_door_are_closed_while_others_are_served() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // Small timeouts, and room for every connection: the timeouts alone
    // must free the door.
    let daemon = openai_door(
        &hw,
        "header_read_timeout_secs = 2\nidle_timeout_secs = 2\nmax_connections_per_peer = 1000\n",
        model_table("m", 1, &[0], &model, ""),
    );
    daemon.wait_slot_state("m", "ready");
    let address = door_address(&daemon);
    let timeout = Duration::from_secs(2);

    let opened = Instant::now();
    // 180 connections that send nothing, 20 that send a header byte a
    // second and never finish.
    let mut held: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(&address).expect("connect"))
        .collect();
    let tricklers: Vec<TcpStream> = held[180..].iter().map(|s| s.try_clone().unwrap()).collect();
    let trickling = std::thread::spawn(move || {
        let head = b"GET /health HTTP/1.1\r\nHost: door\r\nX-Slow: ".repeat(4);
        for byte in head.iter().take(12) {
            for mut s in &tricklers {
                let _ = s.write_all(&[*byte]);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    // A kept-alive connection that made one request, then went quiet.
    let mut kept = TcpStream::connect(&address).unwrap();
    let first = exchange(&mut kept, "GET", "/v1/models");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // A prompt still arriving (a long body, a byte at a time) on its own
    // connection: a request in progress, which holds up no other.
    let mut slow_body = TcpStream::connect(&address).unwrap();
    write!(
        slow_body,
        "POST /v1/completions HTTP/1.1\r\nHost: door\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"model\":\"m\",\"prompt\":\""
    )
    .unwrap();

    // Another client is served, and in time, while all of that is open.
    let asked = Instant::now();
    let served = tt_serving_tests::curl(
        "POST",
        &format!("http://{address}/v1/completions"),
        None,
        Some(r#"{"model":"m","prompt":"hello","max_tokens":4}"#),
    );
    assert_eq!(served.status, 200, "{served:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "served after {:?}",
        asked.elapsed()
    );

    // Every held connection is closed by the door within 4 times its
    // timeout: the head's for the 200, the idle one for the kept one.
    let bound = opened + 4 * timeout;
    let open: Vec<usize> = held
        .iter_mut()
        .enumerate()
        .filter_map(|(i, s)| (!closed_before(s, bound)).then_some(i))
        .collect();
    assert!(
        open.is_empty(),
        "{} of 200 connections still open {:?} after they were opened: {open:?}",
        open.len(),
        opened.elapsed()
    );
    let quiet_since = Instant::now();
    assert!(
        closed_before(&mut kept, quiet_since + 4 * timeout),
        "the idle kept-alive connection is still open"
    );
    trickling.join().unwrap();
    // The body still arriving was not cut as idle.
    slow_body
        .write_all(b"a")
        .expect("the slow body's connection is open");
    // And the door serves new clients as before.
    let mut fresh = TcpStream::connect(&address).unwrap();
    let after = exchange(&mut fresh, "GET", "/health");
    assert!(after.starts_with("HTTP/1.1 200"), "{after}");
}

#[test]
fn connections_past_the_openai_doors_per_peer_cap_are_refused_and_the_first_keep_working() {
    use std::net::TcpStream;
    let hw = FakeHw::new(1);
    let daemon = openai_door(
        &hw,
        "max_connections_per_peer = 4\nheader_read_timeout_secs = 60\nidle_timeout_secs = 60\n",
        String::new(),
    );
    let address = door_address(&daemon);
    let mut first: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&address).expect("connect"))
        .collect();
    // Connections are accepted in the order they were made: the fifth
    // from 127.0.0.1 is over the cap.
    let mut extra = TcpStream::connect(&address).expect("connect");
    let refused = exchange(&mut extra, "GET", "/v1/models");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("too_many_connections"), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    daemon.wait_log("refused connections over openai.max_connections");
    assert_eq!(
        tt_serving_tests::chaos_support::scrape(&daemon).sum(
            "tt_serving_openai_connections_refused_total",
            &[("cap", "max_connections_per_peer")]
        ),
        1.0
    );
    // The first four still work, kept alive.
    for s in &mut first {
        for _ in 0..2 {
            let answer = exchange(s, "GET", "/v1/models");
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
    }
    // A place freed is a place taken again.
    drop(first.pop());
    let again = wait_until("a freed place to be taken again", || {
        let answer = exchange(&mut TcpStream::connect(&address).ok()?, "GET", "/v1/models");
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    });
    assert!(again.contains("\"object\":\"list\""), "{again}");
}

#[test]
fn health_and_503s_without_credentials_say_the_state_and_no_internals() {
    let hw = FakeHw::new(1);
    // The checkpoint does not exist: the slot fails with its path in the
    // reason.
    let daemon = openai_door(
        &hw,
        "",
        model_table(
            "broken",
            1,
            &[0],
            Path::new("/nonexistent/secret-dir/b.gguf"),
            "",
        ),
    );
    let slot = wait_until("the slot to fail naming the checkpoint", || {
        let slot = daemon.slot("broken");
        slot["reason"]
            .as_str()?
            .contains("/nonexistent/secret-dir")
            .then_some(slot)
    });
    let address = door_address(&daemon);
    let url = |path: &str| format!("http://{address}{path}");
    let leaks = |body: &str| {
        ["/", "secret-dir", "tt-smi", "ttctl", "journalctl"]
            .into_iter()
            .filter(|needle| body.contains(needle))
            .collect::<Vec<_>>()
    };
    for path in ["/health", "/health?model=broken"] {
        let health = tt_serving_tests::curl("GET", &url(path), None, None);
        assert_eq!(health.status, 503, "{health:?}");
        let body = health.json();
        assert_eq!(body["status"], "unavailable", "{body}");
        let reason = body["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("slot broken is"), "{body}");
        assert!(leaks(&health.body).is_empty(), "{path}: {}", health.body);
        assert!(health.body.len() < 256, "{path}: {}", health.body);
    }
    let refused = tt_serving_tests::curl(
        "POST",
        &url("/v1/completions"),
        None,
        Some(r#"{"model":"broken","prompt":"x"}"#),
    );
    assert_eq!(refused.status, 503, "{refused:?}");
    let message = refused.error()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("broken"), "{message}");
    assert!(leaks(&message).is_empty(), "{message}");
    // The public gRPC port says the states only, too.
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(tt_serving_tests::generate(
            &daemon.inference_address(),
            "broken",
            "x",
            2,
        ))
        .expect_err("no slot is ready");
    assert!(
        err.message()
            .contains("has no ready slot (slot broken is Failed for"),
        "{err:?}"
    );
    assert!(!err.message().contains("secret-dir"), "{err:?}");
    // The detail is still the operator's, on the control socket.
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(table.contains("/nonexistent/secret-dir"), "{table}\n{slot}");
}

#[test]
fn a_stream_that_outlasts_the_openai_doors_timeouts_is_not_cut_as_idle() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // The worker stops after 8 tokens (the readiness ping takes 4; one
    // place, so readiness sends one ping at a time): the stream stays
    // open, silent, far past both timeouts.
    let daemon = openai_door(
        &hw,
        "header_read_timeout_secs = 1\nidle_timeout_secs = 1\n",
        model_table(
            "m",
            1,
            &[0],
            &model,
            "max_in_flight = 1\nenv = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"8\" }\n",
        ),
    );
    daemon.wait_slot_state("m", "ready");
    let address = door_address(&daemon);
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    let body = r#"{"model":"m","prompt":"hello","max_tokens":50,"stream":true}"#;
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: door\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut first = [0u8; 64];
    let n = stream.read(&mut first).unwrap();
    let head = String::from_utf8_lossy(&first[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !closed_before(&mut stream, Instant::now() + Duration::from_secs(4)),
        "a stream in progress was closed as idle"
    );
}
