//! Device hangs caught the way tt-metal reports them, through the daemon:
//! the vLLM stand-in (tests/engines/vllm_standin.py) plays tt-metal's
//! dispatch timeout as the runtime does it (docs/ENGINES.md, "Device
//! hangs": `Timeout detected`, the command in
//! TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE run through `/bin/sh -c`
//! inside the engine, then `TIMEOUT: device timeout ...` and vLLM's
//! EngineCore death), and a hang with no line at all while `/health`
//! answers 200.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tt_serving_tests::{bin, generate, standin, wait_until, Daemon, DaemonOptions, FakeHw};

/// Slot `m` on card 0 running the stand-in with `env` (TOML inline-table
/// entries) and `extra` tables after it.
fn table(checkpoint: &Path, env: &str, extra: &str) -> String {
    format!(
        "\n[models.m]\ntp = 1\ncards = [\"{card}\"]\ncheckpoint = \"{checkpoint}\"\nworker = [\"{worker}\", \"--\", \"python3\", \"{standin}\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"--max-model-len\", \"4096\"]\ndrain_timeout_secs = 2\nenv = {{ {env} }}\n[models.m.restart]\nbackoff_ms = 50\n{extra}",
        card = FakeHw::bdf(0),
        checkpoint = checkpoint.display(),
        worker = bin("tt-worker-openai").display(),
        standin = standin().display(),
    )
}

fn start(hw: &FakeHw, extra: String) -> Daemon {
    Daemon::start(
        hw,
        DaemonOptions {
            extra,
            ..Default::default()
        },
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// The daemon's /metrics text.
fn scrape(daemon: &Daemon) -> String {
    let address = daemon.status()["daemon"]["metrics_address"]
        .as_str()
        .expect("metrics address in status")
        .to_string();
    let mut stream = TcpStream::connect(&address).expect("connect to the metrics endpoint");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn restarts(daemon: &Daemon, cause: &str) -> f64 {
    scrape(daemon)
        .lines()
        .filter(|l| {
            l.starts_with("tt_serving_worker_restarts_total{")
                && l.contains("slot=\"m\"")
                && l.contains(&format!("cause=\"{cause}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The capture files of slot `m`.
fn captures(daemon: &Daemon) -> Vec<PathBuf> {
    let dir = daemon.dir.join("state/captures/m");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    files
}

fn mtime_ms(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(|t| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u64
        })
        .unwrap_or(0)
}

/// After readiness, a request hangs the device: tt-metal's timeout fires
/// inside the engine, runs the daemon's capture there, and the engine dies
/// as EngineCore does. The death is a device hang with its capture, the
/// cards are reset only after the capture was written, and the slot
/// comes back.
#[test]
fn a_device_timeout_is_a_device_hang_with_its_capture_then_a_reset_and_the_slot_is_back() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model");
    std::fs::write(&ckpt, "weights").unwrap();
    let daemon = start(
        &hw,
        table(
            &ckpt,
            "STANDIN_HANG = \"device-timeout\", STANDIN_ENGINE_CORE = \"1\"",
            "[models.m.hang]\noperation_timeout_secs = 1\ncapture_timeout_secs = 30\n",
        ),
    );
    let first = daemon.wait_slot_state("m", "ready");
    let resets_before = hw.smi_resets().len();
    let answer = runtime().block_on(generate(&daemon.inference_address(), "m", "Hello", 50));
    assert!(
        answer.is_err(),
        "the hung request cannot finish: {answer:?}"
    );

    let reason = wait_until("the device hang to be named", || {
        let slot = daemon.slot("m");
        let said = slot["last_error"].as_str().unwrap_or("").to_string();
        said.contains("device hang").then_some(said)
    });
    assert!(
        reason.contains("TIMEOUT: device timeout") || reason.contains("Timeout detected"),
        "the runtime's own line: {reason}"
    );
    let files = captures(&daemon);
    assert_eq!(files.len(), 1, "one capture: {files:?}");
    assert!(
        reason.contains(&format!("capture {}", files[0].display())),
        "{reason}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.starts_with("tt-serving hang capture: slot m"),
        "{text}"
    );
    assert!(text.contains("tt-metal's dispatch timeout fired"), "{text}");
    assert!(
        text.contains("== processes") && text.contains("== cards"),
        "{text}"
    );
    assert!(text.contains(&format!("card {}", FakeHw::bdf(0))), "{text}");

    // Back, on a new worker, after a reset that came after the capture.
    let back = wait_until("the slot to serve again", || {
        let slot = daemon.slot("m");
        (slot["state"] == "ready" && slot["worker_pid"] != first["worker_pid"]).then_some(slot)
    });
    assert_eq!(back["state"], "ready");
    let log = hw.root.tt_smi_log().unwrap();
    let resets: Vec<_> = log
        .iter()
        .filter(|i| i.args.iter().any(|a| a == "-r"))
        .collect();
    assert!(resets.len() > resets_before, "the cards were reset");
    let reset_at = resets[resets_before].unix_ms;
    assert!(
        mtime_ms(&files[0]) <= reset_at,
        "the capture ({}) was finished before the reset ({reset_at})",
        mtime_ms(&files[0])
    );
    assert_eq!(restarts(&daemon, "device_hang"), 1.0);
    let logs = daemon.ttctl(&["logs", "m", "--lines", "400"]);
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.contains("tt-servingd: device hang capture:"),
        "ttctl logs names the capture: {logs}"
    );
}

/// A hang with no timeout line while `/health` answers 200: the progress
/// watchdog stops it within the stall limit, after capturing it, and the
/// slot comes back.
#[test]
fn a_silent_hang_is_stalled_captured_reset_and_back() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model");
    std::fs::write(&ckpt, "weights").unwrap();
    let daemon = start(
        &hw,
        table(
            &ckpt,
            "STANDIN_HANG = \"silent-hang\"",
            "stall_timeout_secs = 2\nmin_prefill_tokens_per_sec = 0\n",
        ),
    );
    let first = daemon.wait_slot_state("m", "ready");
    let answer = runtime().block_on(generate(&daemon.inference_address(), "m", "Hello", 50));
    assert!(answer.is_err(), "{answer:?}");
    let reason = wait_until("the stall to be named", || {
        let said = daemon.slot("m")["last_error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        said.contains("stalled: ").then_some(said)
    });
    let files = captures(&daemon);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(reason.contains("capture "), "{reason}");
    assert!(
        reason.contains("the engine's counters stayed at vllm:generation_tokens_total"),
        "vLLM's own counters, frozen: {reason}"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.contains(&format!("pid {}", first["worker_pid"])),
        "the worker's tree: {text}"
    );
    wait_until("the slot to serve again", || {
        let slot = daemon.slot("m");
        (slot["state"] == "ready" && slot["worker_pid"] != first["worker_pid"]).then_some(())
    });
    assert_eq!(restarts(&daemon, "stalled"), 1.0);
    assert_eq!(restarts(&daemon, "device_hang"), 0.0);
}
