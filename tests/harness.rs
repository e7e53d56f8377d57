//! The integration-test harness: a fake hardware root with its firmware
//! running, the real `tt-servingd` binary started on it, and `ttctl` run
//! against it. Everything is a real process talking over real sockets; only
//! the hardware is fake.
//!
//! Synchronisation is by polling a condition with a deadline
//! ([`wait_until`]), never by sleeping a fixed time and hoping.

pub mod chaos_support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tt_fakehw::{FakeRoot, FirmwareThread};

/// How long any awaited condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Path of a binary built by this workspace (`cargo test --workspace`
/// builds every package's binaries alongside the test executables).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    // Tests live in target/<profile>/deps/, benchmark drivers in
    // target/<profile>/; the binaries are in target/<profile>/.
    let mut dir = exe.parent().expect("executable has a directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("deps has a parent");
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing; run the tests with `cargo test --workspace` so every binary is built",
        path.display()
    );
    path
}

/// Whether the tests run as root (tests that switch users need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Return early, saying SKIPPED, from a test that switches users when not
/// run as root.
#[macro_export]
macro_rules! needs_root {
    () => {
        if !$crate::is_root() {
            eprintln!("SKIPPED: this test switches users and needs root");
            return;
        }
    };
}

/// Poll `condition` until it returns Some or the deadline passes.
pub fn wait_until<T>(what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = condition() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fake hardware root with N cards and its firmware loop running.
pub struct FakeHw {
    /// The root's handle (faults, pids, tt-smi log).
    pub root: FakeRoot,
    firmware: Option<FirmwareThread>,
    _dir: tempfile::TempDir,
}

impl FakeHw {
    /// Lay out `cards` cards and start their firmware.
    pub fn new(cards: usize) -> FakeHw {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = FakeRoot::create(&dir.path().join("hw"), cards, &bin("tt-fakehw"))
            .expect("create fake root");
        let firmware = Some(root.spawn_firmware_thread(Duration::from_millis(20)));
        FakeHw {
            root,
            firmware,
            _dir: dir,
        }
    }

    /// Lay out `cards` cards playing tt-kmd `driver` and tt-smi `tt_smi`,
    /// and start their firmware.
    pub fn with_versions(cards: usize, driver: &str, tt_smi: &str) -> FakeHw {
        let mut opts = tt_fakehw::CreateOptions::new(cards, &bin("tt-fakehw"));
        opts.driver_version = driver.to_string();
        opts.tt_smi_version = tt_smi.to_string();
        FakeHw::with_options(opts)
    }

    /// Lay out `cards` cards whose device nodes are character devices
    /// (what a container runtime's `--device` takes; root only).
    pub fn with_char_dev_nodes(cards: usize) -> FakeHw {
        let mut opts = tt_fakehw::CreateOptions::new(cards, &bin("tt-fakehw"));
        opts.char_dev_nodes = true;
        FakeHw::with_options(opts)
    }

    fn with_options(opts: tt_fakehw::CreateOptions) -> FakeHw {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = FakeRoot::create_with(&dir.path().join("hw"), &opts).expect("create fake root");
        let firmware = Some(root.spawn_firmware_thread(Duration::from_millis(20)));
        FakeHw {
            root,
            firmware,
            _dir: dir,
        }
    }

    /// The BDF of the card created at `index`.
    pub fn bdf(index: usize) -> String {
        FakeRoot::bdf(index)
    }

    /// The cards each tt-smi call so far actually reset.
    pub fn smi_resets(&self) -> Vec<Vec<String>> {
        self.root
            .tt_smi_log()
            .expect("read tt-smi log")
            .into_iter()
            .filter(|i| i.args.iter().any(|a| a == "-r"))
            .map(|i| i.reset_bdfs)
            .collect()
    }

    /// A process that uses card `index` as an engine does (tt-umd's
    /// CHIP_IN_USE lock taken, a real robust mutex in tt-umd's file; the
    /// node open twice), until dropped.
    pub fn chip_holder(&self, index: u32) -> CardUser {
        CardUser::start(&self.root, "hold-chip", index)
    }

    /// A process that only watches card `index` (the node open, no chip
    /// lock), as a monitoring tool does, until dropped.
    pub fn watcher(&self, index: u32) -> CardUser {
        CardUser::start(&self.root, "watch", index)
    }

    /// tt-smi invocations so far, as argument strings joined by spaces,
    /// leaving out the daemon's version checks (`-v` at startup).
    pub fn smi_calls(&self) -> Vec<String> {
        self.root
            .tt_smi_log()
            .expect("read tt-smi log")
            .into_iter()
            .filter(|i| i.args != ["-v"])
            .map(|i| i.args.join(" "))
            .collect()
    }
}

/// A `tt-fakehw hold-chip` or `watch` process; ended (SIGTERM) when dropped.
pub struct CardUser {
    child: Child,
}

impl CardUser {
    fn start(root: &FakeRoot, what: &str, index: u32) -> CardUser {
        let mut child = Command::new(bin("tt-fakehw"))
            .args([what, "--card", &index.to_string(), "--root"])
            .arg(root.root())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start tt-fakehw");
        // It says so once it is listed (and holds the lock).
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read tt-fakehw's line");
        assert!(
            line.contains(&format!("/dev/tenstorrent/{index}")),
            "{what}: {line}"
        );
        CardUser { child }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for CardUser {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Drop for FakeHw {
    fn drop(&mut self) {
        if let Some(fw) = self.firmware.take() {
            let _ = fw.stop();
        }
    }
}

/// A running `tt-servingd run` on a fake root, with its own state, lock and
/// socket paths under a temp dir.
pub struct Daemon {
    child: Option<Child>,
    /// Holds config, state, locks, socket and the daemon's log.
    pub dir: PathBuf,
    /// The config file.
    pub config: PathBuf,
    /// The control socket.
    pub socket: PathBuf,
    /// The lock dir.
    pub lock_dir: PathBuf,
    /// Where the daemon's stderr goes.
    pub log: PathBuf,
    /// The tt-servingd binary it runs.
    binary: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// Settings tests vary; everything else is fast test defaults.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// `reset.policy`.
    pub policy: &'static str,
    /// `reset.attempts`.
    pub attempts: u32,
    /// `reset.come_back_timeout_secs`.
    pub come_back_secs: u64,
    /// Extra TOML appended (model tables).
    pub extra: String,
    /// Extra lines inside the `[daemon]` table.
    pub daemon_extra: String,
    /// Extra environment for the daemon process.
    pub env: Vec<(String, String)>,
    /// `daemon.tick_ms`: 100 makes tests quick; benchmarks measuring the
    /// daemon's idle cost use the default, 1000.
    pub tick_ms: u64,
    /// Another tt-servingd binary to run (a baseline build, for benchmarks
    /// side by side); None: this tree's.
    pub binary: Option<PathBuf>,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            policy: "never",
            attempts: 1,
            come_back_secs: 3,
            extra: String::new(),
            daemon_extra: String::new(),
            env: Vec::new(),
            tick_ms: 100,
            binary: None,
        }
    }
}

impl Daemon {
    /// Write a config for `hw` and start the daemon; returns once the control
    /// socket answers.
    pub fn start(hw: &FakeHw, opts: DaemonOptions) -> Daemon {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().to_path_buf();
        let mut daemon = Daemon::configure(hw, &dir, &opts);
        daemon._tmp = Some(tmp);
        daemon.spawn(&opts.env);
        daemon
    }

    /// Write the config into `dir` without starting.
    pub fn configure(hw: &FakeHw, dir: &Path, opts: &DaemonOptions) -> Daemon {
        let socket = dir.join("control.sock");
        let lock_dir = dir.join("locks");
        let config = dir.join("config.toml");
        let text = format!(
            r#"[daemon]
listen = "127.0.0.1:0"
control_socket = "{socket}"
state_dir = "{state}"
cache_dir = "{cache}"
lock_dir = "{locks}"
tick_ms = {tick_ms}
{daemon_extra}

[hardware]
dev_root = "{dev}"
sys_root = "{sys}"
proc_root = "{proc}"
tt_smi = "{smi}"

[metrics]
listen = "127.0.0.1:0"

[reset]
policy = "{policy}"
come_back_timeout_secs = {come_back}
heartbeat_interval_ms = 100
attempts = {attempts}
backoff_ms = 50
{extra}
"#,
            socket = socket.display(),
            state = dir.join("state").display(),
            cache = dir.join("cache").display(),
            locks = lock_dir.display(),
            dev = hw.root.dev_root().display(),
            sys = hw.root.sys_root().display(),
            proc = hw.root.proc_root().display(),
            smi = hw.root.tt_smi().display(),
            policy = opts.policy,
            tick_ms = opts.tick_ms,
            come_back = opts.come_back_secs,
            attempts = opts.attempts,
            extra = opts.extra,
            daemon_extra = opts.daemon_extra,
        );
        std::fs::write(&config, text).expect("write config");
        Daemon {
            child: None,
            log: dir.join("daemon.log"),
            binary: opts.binary.clone().unwrap_or_else(|| bin("tt-servingd")),
            dir: dir.to_path_buf(),
            config,
            socket,
            lock_dir,
            _tmp: None,
        }
    }

    /// Start (or restart) the daemon process on this config.
    pub fn spawn(&mut self, env: &[(String, String)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open daemon log");
        let child = Command::new(&self.binary)
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start tt-servingd");
        self.child = Some(child);
        let pid = self.pid();
        wait_until("the control socket to answer", || {
            self.assert_alive();
            let out = self.ttctl(&["status", "--json"]);
            let status: Value = serde_json::from_slice(&out.stdout).ok()?;
            (status["daemon"]["pid"].as_u64() == Some(pid.into())).then_some(())
        });
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).expect("daemon running")
    }

    fn assert_alive(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "tt-servingd exited with {status}; its log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
        }
    }

    /// Run ttctl against this daemon.
    pub fn ttctl(&self, args: &[&str]) -> Output {
        Command::new(bin("ttctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ttctl")
    }

    /// Run ttctl against this daemon as another user (the test runs as
    /// root): `uid` and primary group `gid`, no supplementary groups.
    pub fn ttctl_as(&self, uid: u32, gid: u32, args: &[&str]) -> Output {
        use std::os::unix::process::CommandExt;
        Command::new(bin("ttctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .output()
            .expect("run ttctl as another user")
    }

    /// `ttctl status --json`, parsed.
    pub fn status(&self) -> Value {
        let out = self.ttctl(&["status", "--json"]);
        assert!(
            out.status.success(),
            "ttctl status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("ttctl status --json prints JSON")
    }

    /// The status entry of the card with this BDF.
    pub fn card(&self, bdf: &str) -> Value {
        self.status()["cards"]
            .as_array()
            .and_then(|cards| cards.iter().find(|c| c["bdf"] == bdf).cloned())
            .unwrap_or(Value::Null)
    }

    /// Wait until the card with this BDF is in `state`.
    pub fn wait_card_state(&self, bdf: &str, state: &str) -> Value {
        wait_until(&format!("card {bdf} to be {state}"), || {
            let card = self.card(bdf);
            (card["state"] == state).then_some(card)
        })
    }

    /// Wait until the daemon has logged `needle`.
    pub fn wait_log(&self, needle: &str) {
        wait_until(&format!("the daemon to log `{needle}`"), || {
            std::fs::read_to_string(&self.log)
                .ok()?
                .contains(needle)
                .then_some(())
        });
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stop the daemon, give it `extra` as its model tables, start it again.
    pub fn restart_with(&mut self, hw: &FakeHw, extra: String) {
        self.terminate();
        let opts = DaemonOptions {
            extra,
            ..Default::default()
        };
        self.rewrite_config(hw, &opts);
        self.spawn(&[]);
    }

    /// Write a new config in place (for reload tests); the daemon reads it
    /// at its next reload.
    pub fn rewrite_config(&self, hw: &FakeHw, opts: &DaemonOptions) {
        let rewritten = Daemon::configure(hw, &self.dir, opts);
        assert_eq!(rewritten.config, self.config);
    }

    /// Send the daemon a signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal tt-servingd");
    }

    /// SIGKILL the daemon and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM the daemon and wait for it to exit; returns its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = wait_until("tt-servingd to exit after SIGTERM", || {
            child.try_wait().ok().flatten()
        });
        status.code()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Text of an Output's stdout and stderr together.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run `tt-servingd run` on `config`, expecting it to exit by itself (a
/// refused start); returns its output.
pub fn run_to_exit(config: &Path) -> String {
    let mut child = Command::new(bin("tt-servingd"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_until("tt-servingd to refuse to start", || {
        child.try_wait().ok().flatten()
    });
    let out = child.wait_with_output().unwrap();
    assert!(
        !status.success(),
        "the daemon started: {}",
        output_text(&out)
    );
    output_text(&out)
}

/// Write the tiny deterministic test model (a few layers, random weights)
/// with `tt-worker make-test-model` and return its path.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    let out = Command::new(bin("tt-worker"))
        .arg("make-test-model")
        .arg("--out")
        .arg(&path)
        .output()
        .expect("run tt-worker make-test-model");
    assert!(
        out.status.success(),
        "make-test-model failed: {}",
        output_text(&out)
    );
    path
}

/// A `[models.NAME]` table served by the real `tt-worker` on the given fake
/// cards, with fast test timeouts. `extra` lines go inside the table.
pub fn model_table(name: &str, tp: u32, cards: &[usize], checkpoint: &Path, extra: &str) -> String {
    let cards: Vec<String> = cards
        .iter()
        .map(|i| format!("\"{}\"", FakeHw::bdf(*i)))
        .collect();
    format!(
        r#"
[models.{name}]
tp = {tp}
cards = [{cards}]
checkpoint = "{checkpoint}"
worker = ["{worker}"]
drain_timeout_secs = 5
{extra}
"#,
        cards = cards.join(", "),
        checkpoint = checkpoint.display(),
        worker = bin("tt-worker").display(),
    )
}

impl Daemon {
    /// `host:port` of the public inference port.
    pub fn inference_address(&self) -> String {
        self.status()["daemon"]["inference_address"]
            .as_str()
            .expect("inference address in status")
            .to_string()
    }

    /// The status entry of a slot.
    pub fn slot(&self, name: &str) -> Value {
        self.status()["slots"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == name).cloned())
            .unwrap_or(Value::Null)
    }

    /// Wait until a slot is in `state`; fails early with the slot's reason
    /// if it lands in a state from `unexpected`.
    pub fn wait_slot_state(&self, name: &str, state: &str) -> Value {
        wait_until(&format!("slot {name} to be {state}"), || {
            let slot = self.slot(name);
            (slot["state"] == state).then_some(slot)
        })
    }

    /// Waits up to `limit` (longer than the usual deadline: a real engine
    /// such as vLLM takes 30-100 s to start here) until a slot is Ready.
    pub fn wait_slot_ready_within(&self, name: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let slot = self.slot(name);
            if slot["state"] == "ready" {
                return slot;
            }
            assert!(
                Instant::now() < deadline,
                "the slot is not ready after {limit:?}: {slot:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Path of a slot worker's engine socket.
    pub fn worker_socket(&self, slot: &str) -> PathBuf {
        self.dir
            .join("workers")
            .join(format!("{}.sock", slot.replace('/', "_")))
    }
}

/// What one streamed generation produced.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The text, deltas joined.
    pub text: String,
    /// Token ids in order.
    pub tokens: Vec<u32>,
    /// The final chunk.
    pub last: tt_serving_proto::v1::GenerationFinal,
}

/// Greedy generation through the daemon's public port.
pub async fn generate(
    address: &str,
    model: &str,
    prompt: &str,
    max_tokens: u32,
) -> Result<Generated, tonic::Status> {
    use tt_serving_proto::v1::generate_response::Chunk;
    use tt_serving_proto::v1::inference_client::InferenceClient;
    use tt_serving_proto::v1::{generate_request::Input, GenerateRequest};
    let mut client = InferenceClient::connect(format!("http://{address}"))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    let mut stream = client
        .generate(GenerateRequest {
            model: model.into(),
            input: Some(Input::Prompt(prompt.into())),
            max_tokens,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut last = None;
    while let Some(chunk) = stream.message().await? {
        match chunk.chunk {
            Some(Chunk::Delta(d)) => {
                text.push_str(&d.text);
                tokens.extend(d.token_ids);
            }
            Some(Chunk::Final(f)) => last = Some(f),
            Some(Chunk::PromptLogprobs(_)) | None => {}
        }
    }
    let last = last.ok_or_else(|| tonic::Status::internal("stream ended without a final chunk"))?;
    Ok(Generated { text, tokens, last })
}

/// A Python with the `openai` SDK: `TT_GRPCIO_PYTHON` (CI sets it from
/// `scripts/grpcio-python.sh`, which installs grpcio and openai), else that
/// script's venv under ~/.cache/tt-serving. CI requires it; elsewhere a
/// missing SDK skips loudly (None).
pub fn sdk_python() -> Option<PathBuf> {
    let candidates = std::env::var_os("TT_GRPCIO_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/tt-serving/grpcio-venv/bin/python")),
        );
    for python in candidates {
        let ok = Command::new(&python)
            .args(["-c", "import openai"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(python);
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("CI must provide the openai SDK: .ci/run exports TT_GRPCIO_PYTHON=$(scripts/grpcio-python.sh)");
    }
    eprintln!("SKIPPED: no Python with the openai SDK; run `export TT_GRPCIO_PYTHON=$(scripts/grpcio-python.sh)`");
    None
}

/// The real llama-server and SmolLM2 GGUF (`TT_LLAMA_SERVER`,
/// `TT_SMOLLM2_GGUF`), or None: skipped loudly; CI requires them.
pub fn real_llama_server() -> Option<(PathBuf, PathBuf)> {
    let server = std::env::var_os("TT_LLAMA_SERVER").filter(|s| !s.is_empty());
    let model = std::env::var_os("TT_SMOLLM2_GGUF").filter(|s| !s.is_empty());
    match (server, model) {
        (Some(s), Some(m)) => Some((s.into(), m.into())),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI must set TT_LLAMA_SERVER (scripts/llama-server.sh) and TT_SMOLLM2_GGUF")
        }
        _ => {
            eprintln!("SKIPPED: set TT_LLAMA_SERVER=$(scripts/llama-server.sh) and TT_SMOLLM2_GGUF=$(scripts/fetch-smollm2.sh)");
            None
        }
    }
}

/// lm-evaluation-harness's `lm_eval` (`TT_LM_EVAL`), SmolLM2's Hugging
/// Face tokenizer (the directory `TT_VLLM_MODEL` names) and its GGUF
/// (`TT_SMOLLM2_GGUF`), or None: skipped loudly; CI requires them.
pub fn real_lm_eval() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let var = |name| std::env::var_os(name).filter(|s| !s.is_empty());
    match (var("TT_LM_EVAL"), var("TT_VLLM_MODEL"), var("TT_SMOLLM2_GGUF")) {
        (Some(e), Some(t), Some(m)) => Some((e.into(), t.into(), m.into())),
        _ if std::env::var_os("CI").is_some() => panic!(
            "CI must set TT_LM_EVAL=$(scripts/lm-eval.sh), TT_VLLM_MODEL=$(scripts/vllm.sh --model-dir) and TT_SMOLLM2_GGUF"
        ),
        _ => {
            eprintln!("SKIPPED: set TT_LM_EVAL=$(scripts/lm-eval.sh), TT_VLLM_MODEL=$(scripts/vllm.sh --model-dir) and TT_SMOLLM2_GGUF=$(scripts/fetch-smollm2.sh)");
            None
        }
    }
}

/// The real SmolLM2-135M-Instruct, from `scripts/fetch-smollm2.sh`, or
/// None: skipped loudly; CI sets TT_SMOLLM2_GGUF and requires it.
pub fn real_smollm2() -> Option<PathBuf> {
    match std::env::var_os("TT_SMOLLM2_GGUF") {
        Some(p) if !p.is_empty() => Some(p.into()),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI must set TT_SMOLLM2_GGUF (scripts/fetch-smollm2.sh)")
        }
        _ => {
            eprintln!("SKIPPED: TT_SMOLLM2_GGUF is not set; run `export TT_SMOLLM2_GGUF=$(scripts/fetch-smollm2.sh)`");
            None
        }
    }
}

/// A directory to put on the engine's PYTHONPATH so that `import ttnn`
/// works where the real ttnn cannot be installed (it has no wheel for the
/// vLLM venv's Python): vllm-tt-plugin's platform, and the stand-ins'
/// TT side, are active only when ttnn imports.
pub fn ttnn_importable() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/vllm_tt_plugin/ttnn_importable")
}

/// The vLLM stand-in (`tests/engines/vllm_standin.py`).
pub fn standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/vllm_standin.py")
}

/// The Python of the real ttnn 0.81.1 and tt-umd 0.9.14 (`TT_TTNN_PYTHON`,
/// from `scripts/ttnn.sh`), or None: skipped loudly; CI requires it.
pub fn real_ttnn() -> Option<PathBuf> {
    match std::env::var_os("TT_TTNN_PYTHON") {
        Some(p) if !p.is_empty() => Some(p.into()),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI must set TT_TTNN_PYTHON (scripts/ttnn.sh)")
        }
        _ => {
            eprintln!("SKIPPED: TT_TTNN_PYTHON is not set; run `export TT_TTNN_PYTHON=$(scripts/ttnn.sh)`");
            None
        }
    }
}

/// The real vLLM: `TT_VLLM_PYTHON` (the venv's python) and
/// `TT_VLLM_MODEL` (SmolLM2 as a Hugging Face directory), or None: skipped
/// loudly; CI requires them.
pub fn real_vllm() -> Option<(PathBuf, PathBuf)> {
    let python = std::env::var_os("TT_VLLM_PYTHON").filter(|s| !s.is_empty());
    let model = std::env::var_os("TT_VLLM_MODEL").filter(|s| !s.is_empty());
    match (python, model) {
        (Some(p), Some(m)) => Some((p.into(), m.into())),
        _ if std::env::var_os("CI").is_some() => panic!(
            "CI must set TT_VLLM_PYTHON=$(scripts/vllm.sh) and TT_VLLM_MODEL=$(scripts/vllm.sh --model-dir)"
        ),
        _ => {
            eprintln!("SKIPPED: set TT_VLLM_PYTHON=$(scripts/vllm.sh) and TT_VLLM_MODEL=$(scripts/vllm.sh --model-dir)");
            None
        }
    }
}

/// One HTTP exchange as curl made it.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Header lines, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl Answer {
    /// The first header of `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// The OpenAI error object.
    pub fn error(&self) -> serde_json::Value {
        let body = self.json();
        assert!(body["error"].is_object(), "not an OpenAI error: {body}");
        body["error"].clone()
    }
}

/// `curl -sS -N -i` with a bearer token (when given) and a JSON body from a
/// file (when given), on HTTP/1.1.
pub fn curl(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> Answer {
    curl_with(method, url, token, body, &[])
}

/// [`curl`] with extra request headers (`name`, `value`).
pub fn curl_with(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new("curl");
    // `Expect:` off: curl's `100 Continue` for big bodies would come first.
    cmd.args([
        "-sS",
        "-N",
        "-i",
        "--http1.1",
        "--max-time",
        "60",
        "-X",
        method,
    ]);
    cmd.args(["-H", "Expect:"]);
    if let Some(token) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    for (name, value) in headers {
        cmd.args(["-H", &format!("{name}: {value}")]);
    }
    if let Some(body) = body {
        let file = dir.path().join("body.json");
        std::fs::write(&file, body).expect("write body");
        cmd.args(["-H", "Content-Type: application/json"]);
        cmd.arg("--data-binary").arg(format!("@{}", file.display()));
    }
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    assert!(out.status.success(), "curl {url}: {}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A Python with grpcio: `TT_GRPCIO_PYTHON` (CI sets it from
/// `scripts/grpcio-python.sh`), else the venv that script makes, else
/// `python3`, that runs `imports` (e.g. `import grpc`). CI requires it;
/// elsewhere a missing one skips loudly.
pub fn grpcio_python(imports: &str) -> Option<std::path::PathBuf> {
    let imports_all = |python: &std::path::Path| {
        Command::new(python)
            .args(["-c", imports])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if let Some(python) = std::env::var_os("TT_GRPCIO_PYTHON").filter(|p| !p.is_empty()) {
        let python = std::path::PathBuf::from(python);
        assert!(
            imports_all(&python),
            "TT_GRPCIO_PYTHON={} cannot run `{imports}`; run `export TT_GRPCIO_PYTHON=$(scripts/grpcio-python.sh)`",
            python.display()
        );
        return Some(python);
    }
    let venv = std::env::var_os("HOME")
        .map(|home| std::path::Path::new(&home).join(".cache/tt-serving/grpcio-venv/bin/python"));
    if let Some(python) = venv
        .into_iter()
        .chain([std::path::PathBuf::from("python3")])
        .find(|p| imports_all(p))
    {
        return Some(python);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "CI must provide grpcio: .ci/run exports TT_GRPCIO_PYTHON=$(scripts/grpcio-python.sh)"
        );
    }
    eprintln!(
        "SKIPPED: no Python with grpcio; run `export TT_GRPCIO_PYTHON=$(scripts/grpcio-python.sh)`"
    );
    None
}

/// A real OTLP/gRPC trace receiver (`clients/otlp_receiver.py`: the
/// OpenTelemetry protocol's own Python package behind grpcio), writing
/// every span it receives as a JSON line; killed on drop.
pub struct OtlpReceiver {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    out: PathBuf,
}

impl OtlpReceiver {
    /// A Python that can run the receiver (None: skipped, see
    /// [`grpcio_python`]).
    pub fn python() -> Option<PathBuf> {
        grpcio_python("import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc")
    }

    /// `[tracing]` pointing at this receiver, for a daemon's config.
    pub fn tracing_section(&self) -> String {
        format!(
            "[tracing]\notlp_endpoint = \"http://127.0.0.1:{}\"\n",
            self.port
        )
    }

    /// The names of a span's events, in order.
    pub fn event_names(span: &Value) -> Vec<String> {
        span["events"]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter_map(|e| e["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Starts it, its spans going to `dir`/spans.jsonl.
    pub fn start(python: &Path, dir: &Path) -> OtlpReceiver {
        let out = dir.join("spans.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/otlp_receiver.py");
        let mut child = Command::new(python)
            .arg(&script)
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OTLP receiver");
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("receiver stdout"));
        std::io::BufRead::read_line(&mut stdout, &mut line).expect("read the receiver's port");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the receiver said {line:?}, not PORT <n>"));
        OtlpReceiver { child, port, out }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON span per line"))
            .collect()
    }

    /// Waits for a span that `matches`.
    pub fn wait_for(&self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        wait_until(what, || self.spans().into_iter().find(|s| matches(s)))
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
