//! The README's "Try it without cards" section, pasted into a fresh shell:
//! every command must work as written. The test runs its `sh` blocks in
//! `bash` with an empty environment (only `PATH` and `HOME`), changing only
//! what a test machine needs: `/tmp/tt` becomes a temp dir, the two ports
//! become free ones (`127.0.0.1:0`), and `target/release` the directory of
//! the binaries under test.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tt_serving_tests::bin;

/// The `sh` code blocks of the README section titled `heading`.
fn section_blocks(readme: &str, heading: &str) -> Vec<String> {
    let start = readme
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README has no `## {heading}` section"));
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    let mut blocks = Vec::new();
    let mut lines = rest[..end].lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```sh" {
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            blocks.push(block.join("\n"));
        }
    }
    blocks
}

/// `text` with `from` replaced by `to`, which must occur.
fn substitute(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the README section no longer contains `{from}`; update this test's substitutions"
    );
    text.replace(from, to)
}

/// Whether `pid` has exited (a zombie nobody reaped yet counts).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

#[test]
fn the_no_cards_section_works_pasted_into_a_fresh_shell() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("read README.md");
    let blocks = section_blocks(&readme, "Try it without cards");
    assert_eq!(blocks.len(), 2, "expected the commands and the stop block");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tt");
    let bin_dir = bin("tt-servingd").parent().unwrap().display().to_string();
    let mut script = blocks.join("\n");
    script = substitute(&script, "/tmp/tt", &root.display().to_string());
    script = substitute(&script, "127.0.0.1:50051", "127.0.0.1:0");
    script = substitute(&script, "127.0.0.1:9464", "127.0.0.1:0");
    script = substitute(&script, "B=$PWD/target/release", &format!("B={bin_dir}"));

    let mut shell = Command::new("bash")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", tmp.path())
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        // Its own group, so whatever it leaves running can be ended below.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bash");
    let group = nix::unistd::Pid::from_raw(shell.id() as i32);
    shell
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while shell.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let out = shell.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        Instant::now() < deadline,
        "the section did not finish within 120 s:\n{text}\n{script}"
    );

    let firmware_pid: u32 = text
        .split("firmware runs in the background as pid ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("tt-fakehw firmware --detach did not start:\n{text}"));
    for needle in [
        "config.toml: valid (0 model(s), 0 slot(s))",
        "0000:01:00.0",
        "0000:02:00.0",
        "never-returns on",
        "quarantined",
    ] {
        assert!(text.contains(needle), "no `{needle}` in:\n{text}");
    }
    // Removing the root (the stop block) stops the detached firmware.
    let gone = Instant::now() + Duration::from_secs(10);
    while !process_gone(firmware_pid) {
        assert!(
            Instant::now() < gone,
            "the firmware (pid {firmware_pid}) still runs after its root was removed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
