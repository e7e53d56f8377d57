//! The daemon's unit under real systemd: a Debian guest booted by qemu
//! (`scripts/guest.sh`, cgroup v2 with the memory controller) installs the
//! unit, config, tmpfiles rules and users exactly as `module.nix` renders
//! them for `tests/guest/host.nix` (tests/nix/run.sh holds the files in
//! tests/guest/ to that rendering), the binaries this build made, the real
//! model on the real tt-worker and fake cards; then
//! `tests/guest/scenario.sh` drives systemd: start at READY, reloads that
//! fail `systemctl reload` when the daemon refuses them, a real
//! memory-cgroup OOM kill told apart from an outside SIGKILL, the watchdog
//! replacing a stopped daemon, the hardening's paths, a clean stop.
//!
//! Needs `TT_GUEST_DIR` (the built guest: `scripts/guest.sh` prints it),
//! `TT_SMOLLM2_GGUF` and qemu-system-x86_64; says SKIPPED without them,
//! and fails in CI. One boot runs every check (about 4 minutes under
//! software emulation); each check's line is printed, and any `FAIL` fails
//! the test.

use std::path::{Path, PathBuf};
use std::process::Command;
use tt_serving_tests::bin;

/// What the scenario needs from the host, or None (SKIPPED outside CI).
fn inputs() -> Option<(PathBuf, PathBuf)> {
    let guest = std::env::var_os("TT_GUEST_DIR").filter(|s| !s.is_empty());
    let model = std::env::var_os("TT_SMOLLM2_GGUF").filter(|s| !s.is_empty());
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    match (guest, model) {
        (Some(g), Some(m)) if qemu => Some((PathBuf::from(g), PathBuf::from(m))),
        _ if std::env::var_os("CI").is_some() => panic!(
            "CI must install qemu-system-x86 and set TT_GUEST_DIR=$(scripts/guest.sh) and TT_SMOLLM2_GGUF=$(scripts/fetch-smollm2.sh)"
        ),
        _ => {
            eprintln!(
                "SKIPPED: the systemd guest needs qemu-system-x86_64 (apt-get install qemu-system-x86), TT_GUEST_DIR=$(scripts/guest.sh) and TT_SMOLLM2_GGUF"
            );
            None
        }
    }
}

/// A hard link where the file system allows one (the binaries are
/// hundreds of MB), else a copy.
fn place(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
}

/// The guest's share: the binaries, the model, the module's files and the
/// scenario.
fn stage(share: &Path, model: &Path) {
    let bin_dir = share.join("bin");
    std::fs::create_dir_all(&bin_dir).expect("create the share's bin/");
    for name in ["tt-servingd", "ttctl", "tt-worker", "tt-fakehw"] {
        place(&bin(name), &bin_dir.join(name));
    }
    place(model, &share.join("model.gguf"));
    let guest = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest");
    for name in [
        "tenstorrent-serving.service",
        "config.toml",
        "tmpfiles.conf",
        "sysusers.conf",
        "scenario.sh",
    ] {
        std::fs::copy(guest.join(name), share.join(name))
            .unwrap_or_else(|e| panic!("copy tests/guest/{name}: {e}"));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn the_module_unit_under_real_systemd() {
    let Some((guest, model)) = inputs() else {
        return;
    };
    // Under target/, beside the binaries, so they can be hard-linked.
    let share = tempfile::Builder::new()
        .prefix("systemd-guest-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("create the share");
    stage(share.path(), &model);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/guest.sh");
    let boot = Command::new("bash")
        .arg(&script)
        .arg("boot")
        .arg(share.path())
        .arg("1500")
        .env("TT_GUEST_DIR", &guest)
        .output()
        .expect("run scripts/guest.sh boot");
    let out = share.path().join("out");
    let results = read(&out.join("results"));
    eprintln!(
        "--- guest: {}",
        read(&out.join("versions")).replace('\n', ", ")
    );
    eprintln!("--- checks\n{results}");
    eprintln!("--- timings (s)\n{}", read(&out.join("timings")));
    let failed: Vec<&str> = results.lines().filter(|l| l.starts_with("FAIL")).collect();
    let finished = results.lines().any(|l| l == "done");
    if !failed.is_empty() || !finished || !boot.status.success() {
        let journal = read(&out.join("journal.txt"));
        let tail: Vec<&str> = journal.lines().rev().take(60).collect();
        eprintln!(
            "--- guest.sh: {}{}",
            String::from_utf8_lossy(&boot.stdout),
            String::from_utf8_lossy(&boot.stderr)
        );
        eprintln!("--- scenario.log\n{}", read(&out.join("scenario.log")));
        eprintln!(
            "--- journal, last 60 lines\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        let kept = share.keep();
        panic!(
            "the systemd guest scenario {}: {} failed check(s){}; everything the guest wrote is in {}",
            if finished { "finished" } else { "did not finish" },
            failed.len(),
            if boot.status.success() {
                String::new()
            } else {
                format!(", guest.sh exited {:?}", boot.status.code())
            },
            kept.join("out").display()
        );
    }
    let checks = results.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(
        checks >= 30,
        "only {checks} checks ran in the guest; the scenario stopped early"
    );
}

/// `scripts/guest.sh` replaces only a guest it built: pointed at any other
/// directory it refuses, names it, and leaves every file there.
#[test]
fn the_guest_script_refuses_to_replace_a_directory_it_did_not_build() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kept = dir.path().join("notes.txt");
    std::fs::write(&kept, "mine").expect("write a file");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/guest.sh");
    let run = Command::new("bash")
        .arg(&script)
        .env("TT_GUEST_DIR", dir.path())
        .output()
        .expect("run scripts/guest.sh");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not a guest this script built") && stderr.contains("refusing"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&kept).ok().as_deref(), Some("mine"));
}
