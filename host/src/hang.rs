//! Device hangs, caught the way tt-metal reports them, and the evidence
//! kept with the death.
//!
//! tt-metal gives up on a wait that sees no dispatch progress for
//! `TT_METAL_OPERATION_TIMEOUT_SECONDS` (default: never), logs `Timeout
//! detected`, runs `TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE` through
//! `/bin/sh -c` synchronously inside the engine, then throws `TIMEOUT:
//! device timeout, ...` and the engine dies (docs/ENGINES.md, "Device
//! hangs"). The daemon sets both per slot (`[models.X.hang]`): the command
//! is this binary's `hang-capture`, which records what the host can see of
//! the slot without touching another card (the engine's process tree and
//! kernel stacks, the cards' sysfs and PCIe link, the kernel's recent
//! messages about them, and Tenstorrent's `tt-triage` limited to the
//! slot's cards when installed), bounded in size and time, into
//! `<state_dir>/captures/<slot>/`. The stall watchdog runs the same capture
//! itself before it stops a worker that stopped progressing without a line.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};
use tt_worker_contract::subprocess::{self, Keep, RunError};

/// What the runtime prints when it gives up on a hung device: the log
/// line before the capture command runs, and the three exceptions
/// (tt-metal `metal_context.cpp` on_dispatch_timeout_detected,
/// `system_memory_manager.cpp`, `llrt.cpp`; all in ttnn 0.81.1's
/// libtt_metal.so).
pub const TIMEOUT_LINES: &[&str] = &[
    "Timeout detected",
    "TIMEOUT: device timeout",
    "waiting for physical cores to finish",
];

/// Whether an engine's output line is tt-metal's own word of a device hang.
pub fn is_device_hang_line(line: &str) -> bool {
    TIMEOUT_LINES.iter().any(|needle| line.contains(needle))
}

/// Captures kept per slot; older ones are removed when a new one is made.
const KEEP: usize = 16;
/// A capture being written (renamed to `.txt` when finished).
const PARTIAL: &str = ".partial";

/// What one capture records, and where.
#[derive(Debug, Clone)]
pub struct CaptureSpec {
    /// The slot, for the header.
    pub slot: String,
    /// `<state_dir>/captures/<slot>`.
    pub dir: PathBuf,
    /// The slot's cards by PCI address.
    pub cards: Vec<String>,
    /// The process whose tree to record (the engine, or the worker).
    pub pid: Option<u32>,
    /// Holds `bus/pci/devices` (the host's `/sys`, or a fake root's).
    pub sys_root: PathBuf,
    /// Why the capture runs (a line for the header).
    pub why: String,
    /// The whole capture's time budget.
    pub timeout: Duration,
    /// The file's size bound.
    pub max_bytes: usize,
    /// Tenstorrent's triage program and its arguments; run only when found
    /// on PATH, with `TT_VISIBLE_DEVICES` set to the slot's cards.
    pub triage: Vec<String>,
}

/// The directory of a slot's captures.
pub fn dir_for(state_dir: &Path, slot: &str) -> PathBuf {
    state_dir.join("captures").join(slot.replace('/', "_"))
}

/// Quote a word for `/bin/sh`.
fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The command line tt-metal runs on a timeout (through `/bin/sh -c`,
/// inside the engine, whose pid `$PPID` is then).
pub fn command_line(exe: &Path, spec: &CaptureSpec) -> String {
    let mut words = vec![
        sh_quote(&exe.display().to_string()),
        "hang-capture".into(),
        "--slot".into(),
        sh_quote(&spec.slot),
        "--dir".into(),
        sh_quote(&spec.dir.display().to_string()),
        "--sys-root".into(),
        sh_quote(&spec.sys_root.display().to_string()),
        "--timeout-secs".into(),
        spec.timeout.as_secs().to_string(),
        "--max-kib".into(),
        (spec.max_bytes / 1024).to_string(),
        "--pid".into(),
        "\"$PPID\"".into(),
    ];
    for card in &spec.cards {
        words.push("--card".into());
        words.push(sh_quote(card));
    }
    for word in &spec.triage {
        words.push("--triage".into());
        words.push(sh_quote(word));
    }
    words.join(" ")
}

/// The newest finished capture in `dir` made at or after `since`.
pub fn latest_since(dir: &Path, since: SystemTime) -> Option<PathBuf> {
    let mut found: Vec<(SystemTime, PathBuf)> = fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".txt"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            let modified = meta.modified().ok()?;
            (meta.is_file() && modified >= since).then(|| (modified, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// Whether a capture is being written in `dir` now.
pub fn in_progress(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(PARTIAL))
    })
}

/// Wait until no capture is being written in `dir`, at most `limit`:
/// a card is never reset while its triage reads it.
pub async fn wait_finished(dir: &Path, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while in_progress(dir) {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// The first `n` lines of a capture, for status and reasons.
pub fn head(path: &Path, n: usize) -> String {
    let mut text = String::new();
    if let Ok(f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        let _ = f.take(8192).read_to_string(&mut text);
    }
    text.lines().take(n).collect::<Vec<_>>().join(" | ")
}

/// Write one capture: `<dir>/hang-<unix ms>.txt`, written as `.partial`
/// and renamed when complete, never through a link; the oldest beyond
/// [`KEEP`] are removed. Returns the file.
pub fn capture(spec: &CaptureSpec) -> io::Result<PathBuf> {
    crate::hostfs::create_dir_all_no_follow(&spec.dir)?;
    let started = Instant::now();
    let deadline = started + spec.timeout;
    let stamp = tt_serving_proto::time::unix_ms(SystemTime::now());
    let path = spec.dir.join(format!("hang-{stamp}.txt"));
    let partial = spec.dir.join(format!("hang-{stamp}.txt{PARTIAL}"));
    let mut out = Bounded::new(spec.max_bytes);
    out.line(format!(
        "tt-serving hang capture: slot {} at unix ms {stamp}; {}",
        spec.slot, spec.why
    ));
    out.line(format!(
        "cards: {}; process: {}",
        spec.cards.join(", "),
        spec.pid.map_or("-".into(), |p| p.to_string())
    ));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&partial)?;
    out.section("processes");
    if let Some(pid) = spec.pid {
        processes(&mut out, pid);
    }
    out.section("cards");
    for bdf in &spec.cards {
        card(&mut out, &spec.sys_root, bdf);
    }
    out.section("kernel messages about the cards");
    kernel_messages(&mut out, &spec.cards);
    out.section("tt-triage");
    triage(&mut out, spec, deadline);
    out.line(format!("capture took {} ms", started.elapsed().as_millis()));
    file.write_all(out.text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    fs::rename(&partial, &path)?;
    prune(&spec.dir);
    Ok(path)
}

/// Text that stops growing at its bound, saying so once.
struct Bounded {
    text: String,
    max: usize,
    cut: bool,
}

impl Bounded {
    fn new(max: usize) -> Bounded {
        Bounded {
            text: String::new(),
            max,
            cut: false,
        }
    }

    fn line(&mut self, line: impl AsRef<str>) {
        if self.cut {
            return;
        }
        let line = line.as_ref();
        if self.text.len() + line.len() + 1 > self.max {
            self.text
                .push_str("... (capture cut at its size bound, hang.capture_max_kib)\n");
            self.cut = true;
            return;
        }
        self.text.push_str(line);
        self.text.push('\n');
    }

    fn section(&mut self, name: &str) {
        self.line(format!("== {name}"));
    }
}

/// A small file's text, trimmed; why not, when it cannot be read.
fn read_small(path: &Path) -> String {
    let mut text = String::new();
    match fs::File::open(path).and_then(|f| f.take(4096).read_to_string(&mut text)) {
        Ok(_) => text.trim().to_string(),
        Err(e) => format!("({e})"),
    }
}

/// The process, its ancestors and its descendants: state, wait channel,
/// command line and each thread's kernel stack (root only).
fn processes(out: &mut Bounded, pid: u32) {
    let all = tt_card_lock::procs::all();
    let mut ancestors = Vec::new();
    let mut at = Some(pid);
    while let Some(p) = at.filter(|p| *p > 1 && ancestors.len() < 16) {
        ancestors.push(p);
        at = all.iter().find(|s| s.pid == p).map(|s| s.ppid);
    }
    let mut family = vec![pid];
    let mut i = 0;
    while i < family.len() && family.len() < 256 {
        let parent = family[i];
        family.extend(all.iter().filter(|s| s.ppid == parent).map(|s| s.pid));
        i += 1;
    }
    for p in ancestors.iter().skip(1).rev().chain(family.iter()) {
        let dir = PathBuf::from(format!("/proc/{p}"));
        let stat = read_small(&dir.join("stat"));
        let cmdline = fs::read(dir.join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        out.line(format!(
            "pid {p}: {} wchan={} cmd={}",
            stat.chars().take(160).collect::<String>(),
            read_small(&dir.join("wchan")),
            cmdline.trim().chars().take(300).collect::<String>()
        ));
        let Ok(tasks) = fs::read_dir(dir.join("task")) else {
            continue;
        };
        for task in tasks.flatten().take(64) {
            let stack = read_small(&task.path().join("stack"));
            out.line(format!(
                "  task {}: {}",
                task.file_name().to_string_lossy(),
                stack.replace('\n', " <- ")
            ));
        }
    }
}

/// A card's PCIe link and the driver's attributes, read in a thread with
/// a deadline (a read can wait on the card's firmware).
fn card(out: &mut Bounded, sys_root: &Path, bdf: &str) {
    let dir = sys_root.join("bus/pci/devices").join(bdf);
    let (tx, rx) = std::sync::mpsc::channel();
    let reading = dir.clone();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for name in [
            "current_link_speed",
            "current_link_width",
            "max_link_speed",
            "max_link_width",
        ] {
            lines.push(format!("{name}: {}", read_small(&reading.join(name))));
        }
        // The class device sits under the PCI device: tenstorrent/tenstorrent!N.
        if let Ok(class) = fs::read_dir(reading.join("tenstorrent")) {
            for dev in class.flatten() {
                let mut names: Vec<_> = fs::read_dir(dev.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("tt_"))
                    .collect();
                names.sort();
                for name in names {
                    lines.push(format!(
                        "{}/{name}: {}",
                        dev.file_name().to_string_lossy(),
                        read_small(&dev.path().join(&name))
                    ));
                }
            }
        }
        let _ = tx.send(lines);
    });
    out.line(format!("card {bdf} ({})", dir.display()));
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(lines) => lines.into_iter().for_each(|l| out.line(format!("  {l}"))),
        Err(_) => out.line("  (its attributes did not answer within 5 s)"),
    }
}

/// The kernel's recent messages that name one of the cards or the
/// driver, from `/dev/kmsg` (read without waiting; needs CAP_SYSLOG).
fn kernel_messages(out: &mut Bounded, cards: &[String]) {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg");
    let mut file = match file {
        Ok(f) => f,
        Err(e) => return out.line(format!("(cannot read /dev/kmsg: {e})")),
    };
    let mut kept = std::collections::VecDeque::new();
    let mut buf = vec![0u8; 8192];
    for _ in 0..100_000 {
        // Each read is one record; EAGAIN at the end, EPIPE when one was
        // overwritten (go on).
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                let message = record.split_once(';').map_or(&*record, |(_, m)| m);
                let ours = message.contains("tenstorrent")
                    || cards.iter().any(|bdf| message.contains(bdf.as_str()));
                if ours {
                    if kept.len() == 100 {
                        kept.pop_front();
                    }
                    kept.push_back(message.lines().next().unwrap_or("").to_string());
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    if kept.is_empty() {
        out.line("(none)");
    }
    kept.into_iter().for_each(|l| out.line(l));
}

/// Tenstorrent's triage on the slot's cards only, when it is installed:
/// both pipes read as it prints (a triage printing more than a pipe holds
/// would otherwise stall until the deadline), what fits the capture kept.
fn triage(out: &mut Bounded, spec: &CaptureSpec, deadline: Instant) {
    let Some(program) = spec.triage.first() else {
        return out.line("(hang.triage_command is empty)");
    };
    let found = match subprocess::find_program(program) {
        Ok(found) => found,
        Err(why) => return out.line(format!("({program} is not installed: {why})")),
    };
    let mut cmd = Command::new(&found);
    cmd.args(&spec.triage[1..])
        .env("TT_VISIBLE_DEVICES", spec.cards.join(","));
    subprocess::die_with_parent(&mut cmd, libc::SIGKILL);
    let left = deadline.saturating_duration_since(Instant::now());
    let keep = Keep::First(spec.max_bytes);
    let (stdout, stderr) = match subprocess::run_blocking(cmd, left, keep) {
        Ok(done) => (done.stdout, done.stderr),
        Err(RunError::TimedOut { stdout, stderr, .. }) => {
            out.line(format!(
                "({} did not finish within hang.capture_timeout_secs; killed with its process group)",
                found.display()
            ));
            (stdout, stderr)
        }
        Err(e) => return out.line(format!("(cannot run {}: {e})", found.display())),
    };
    stdout.text().lines().for_each(|l| out.line(l));
    stderr
        .text()
        .lines()
        .for_each(|l| out.line(format!("stderr: {l}")));
}

/// Keep the newest [`KEEP`] captures.
fn prune(dir: &Path) {
    let mut captures: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("hang-"))
                && p.extension().is_some_and(|e| e == "txt")
        })
        .collect();
    captures.sort();
    let extra = captures.len().saturating_sub(KEEP);
    for old in captures.into_iter().take(extra) {
        let _ = crate::hostfs::remove_file(&old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tt_metals_own_hang_lines_are_recognised() {
        for line in [
            "2026-12-05 01:31:41.220 | error    |           Metal | Timeout detected (metal_context.cpp:809)",
            "RuntimeError: TIMEOUT: device timeout, potential hang detected, the device is unrecoverable",
            "TIMEOUT: device timeout in fetch queue wait, potential hang detected",
            "Device 0: Timeout (5000 ms) waiting for physical cores to finish: (x=1,y=2).",
        ] {
            assert!(is_device_hang_line(line), "{line}");
        }
        assert!(!is_device_hang_line("INFO Loading weights: layer 1/2"));
    }

    #[test]
    fn a_capture_is_bounded_finished_by_rename_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let pci = sys.join("bus/pci/devices/0000:01:00.0");
        fs::create_dir_all(pci.join("tenstorrent/tenstorrent!0")).unwrap();
        fs::write(pci.join("current_link_speed"), "32.0 GT/s PCIe\n").unwrap();
        fs::write(pci.join("tenstorrent/tenstorrent!0/tt_heartbeat"), "42\n").unwrap();
        let spec = CaptureSpec {
            slot: "m".into(),
            dir: dir.path().join("captures/m"),
            cards: vec!["0000:01:00.0".into()],
            pid: Some(std::process::id()),
            sys_root: sys,
            why: "a test".into(),
            timeout: Duration::from_secs(10),
            max_bytes: 64 * 1024,
            triage: vec!["no-such-triage-program".into()],
        };
        let before = SystemTime::now() - Duration::from_secs(1);
        let path = capture(&spec).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("tt-serving hang capture: slot m"),
            "{text}"
        );
        assert!(
            text.contains("current_link_speed: 32.0 GT/s PCIe"),
            "{text}"
        );
        assert!(text.contains("tenstorrent!0/tt_heartbeat: 42"), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(
            text.contains(
                "(no-such-triage-program is not installed: `no-such-triage-program` is not on PATH"
            ),
            "{text}"
        );
        assert!(!in_progress(&spec.dir));
        assert_eq!(latest_since(&spec.dir, before), Some(path.clone()));
        assert!(head(&path, 2).contains("cards: 0000:01:00.0"));

        let small = CaptureSpec {
            max_bytes: 200,
            ..spec.clone()
        };
        let cut = fs::read_to_string(capture(&small).unwrap()).unwrap();
        assert!(
            cut.len() <= 300 && cut.contains("cut at its size bound"),
            "{cut}"
        );

        for _ in 0..KEEP + 2 {
            std::thread::sleep(Duration::from_millis(2));
            capture(&small).unwrap();
        }
        let kept = fs::read_dir(&spec.dir).unwrap().count();
        assert_eq!(kept, KEEP);
    }

    #[test]
    fn a_triage_printing_a_mebibyte_ends_the_capture_at_once_bounded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let triage = dir.path().join("tt-triage");
        // 1 MiB in lines of 100, far more than a pipe holds.
        fs::write(
            &triage,
            "#!/bin/sh\necho \"triage of $TT_VISIBLE_DEVICES\"\nhead -c 1048576 /dev/zero | tr '\\0' x | fold -w 100\n",
        )
        .unwrap();
        fs::set_permissions(&triage, fs::Permissions::from_mode(0o755)).unwrap();
        let spec = CaptureSpec {
            slot: "m".into(),
            dir: dir.path().join("captures/m"),
            cards: vec!["0000:01:00.0".into()],
            pid: None,
            sys_root: dir.path().join("sys"),
            why: "a test".into(),
            timeout: Duration::from_secs(60),
            max_bytes: 64 * 1024,
            triage: vec![triage.display().to_string()],
        };
        let began = Instant::now();
        let text = fs::read_to_string(capture(&spec).unwrap()).unwrap();
        // Read only after its exit, the triage would block on a full pipe
        // and be killed at the 60 s deadline.
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "{:?}",
            began.elapsed()
        );
        assert!(!text.contains("did not finish"), "{text}");
        assert!(text.contains("triage of 0000:01:00.0\n"), "{text}");
        assert!(text.contains(&format!("{}\n", "x".repeat(100))));
        assert!(text.contains("cut at its size bound"));
        assert!(text.len() <= 64 * 1024 + 100, "{}", text.len());
    }

    #[test]
    fn the_command_line_quotes_every_path_and_names_the_engine_by_ppid() {
        let spec = CaptureSpec {
            slot: "it's".into(),
            dir: "/var/lib/tt serving/captures/x".into(),
            cards: vec!["0000:01:00.0".into()],
            pid: None,
            sys_root: "/sys".into(),
            why: String::new(),
            timeout: Duration::from_secs(60),
            max_bytes: 1 << 20,
            triage: vec!["tt-triage".into(), "--disable-progress".into()],
        };
        let line = command_line(Path::new("/usr/bin/tt-servingd"), &spec);
        assert_eq!(
            line,
            r#"'/usr/bin/tt-servingd' hang-capture --slot 'it'\''s' --dir '/var/lib/tt serving/captures/x' --sys-root '/sys' --timeout-secs 60 --max-kib 1024 --pid "$PPID" --card '0000:01:00.0' --triage 'tt-triage' --triage '--disable-progress'"#
        );
    }
}
