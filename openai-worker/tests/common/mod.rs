//! Test harness: real `tt-worker-openai` processes running a real engine
//! process (the vLLM stand-in in tests/engines/, or llama-server), talked
//! to over engine.proto on the worker's unix socket.
#![allow(dead_code)]

use hyper_util::rt::TokioIo;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint, Uri};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// The vLLM stand-in.
pub fn standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/engines/vllm_standin.py")
}

/// How to start a worker.
#[derive(Clone, Debug)]
pub struct Opts {
    /// `warm` or `cold`.
    pub mode: &'static str,
    /// The checkpoint (`{checkpoint}`).
    pub checkpoint: String,
    /// Extra environment for the worker (and so the engine).
    pub env: Vec<(String, String)>,
    /// Worker options before `--`.
    pub args: Vec<String>,
    /// The engine's command line after `--`.
    pub engine: Vec<String>,
}

impl Opts {
    /// The stand-in as vLLM, with `--max-model-len 34816`.
    pub fn vllm() -> Self {
        Self {
            mode: "warm",
            checkpoint: "standin-model".into(),
            env: Vec::new(),
            args: Vec::new(),
            engine: [
                "python3",
                &standin().display().to_string(),
                "serve",
                "{checkpoint}",
                "--port",
                "{port}",
                "--max-model-len",
                "34816",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        }
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn engine_arg(mut self, a: &str) -> Self {
        self.engine.push(a.into());
        self
    }
    pub fn mode(mut self, mode: &'static str) -> Self {
        self.mode = mode;
        self
    }
}

/// A running worker; it and its engine's group are killed on drop.
pub struct Worker {
    pub child: Child,
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub dir: tempfile::TempDir,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// The worker's command: a cleared environment with the contract, as the
/// daemon starts it.
pub fn command(o: &Opts, dir: &Path) -> Command {
    let socket = dir.join("worker.sock");
    let cache_dir = dir.join("cache").join("model").join("variant1");
    let mut c = Command::new(env!("CARGO_BIN_EXE_tt-worker-openai"));
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TT_WORKER_SOCKET", &socket)
        .env("TT_WORKER_MODEL", &o.checkpoint)
        .env("TT_WORKER_TP", "1")
        .env("TT_CACHE_DIR", &cache_dir)
        .env("TT_CACHE_MODE", o.mode)
        .env("TT_VISIBLE_DEVICES", "0000:01:00.0")
        .env("MESH_DEVICE", "(1,1)")
        .env("TT_WORKER_LOG", "info");
    if let Some(home) = std::env::var_os("HOME") {
        c.env("HOME", home);
    }
    for (k, v) in &o.env {
        c.env(k, v);
    }
    c.args(&o.args).arg("--").args(&o.engine);
    c
}

impl Worker {
    /// Starts a worker without waiting for it.
    pub fn spawn(o: &Opts) -> Worker {
        let dir = tempfile::tempdir().unwrap();
        let stdout = dir.path().join("stdout");
        let stderr = dir.path().join("stderr");
        let child = command(o, dir.path())
            .stdout(Stdio::from(std::fs::File::create(&stdout).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
            .spawn()
            .unwrap();
        Worker {
            child,
            socket: dir.path().join("worker.sock"),
            cache_dir: dir.path().join("cache").join("model").join("variant1"),
            dir,
            stdout,
            stderr,
        }
    }

    /// Starts a worker and waits until it reports READY.
    pub async fn start(o: &Opts) -> Worker {
        let mut w = Self::spawn(o);
        w.wait_ready(Duration::from_secs(60)).await;
        w
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
    /// Both, for assertion messages.
    pub fn output(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            self.stdout(),
            self.stderr()
        )
    }

    pub async fn client(&self) -> EngineClient<Channel> {
        connect(&self.socket).await.unwrap()
    }

    pub async fn info(&self) -> Option<pb::InfoResponse> {
        if !self.socket.exists() {
            return None;
        }
        let mut c = connect(&self.socket).await.ok()?;
        c.info(pb::InfoRequest {})
            .await
            .ok()
            .map(|r| r.into_inner())
    }

    pub async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("worker exited early with {st}\n{}", self.output());
            }
            if let Some(info) = self.info().await {
                if info.state == pb::WorkerState::Ready as i32 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "worker not ready in time\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a number the worker's output gives after `marker`.
    pub fn number_after(&self, marker: &str) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let all = format!("{}\n{}", self.stdout(), self.stderr());
            if let Some(at) = all.find(marker) {
                let digits: String = all[at + marker.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                if let Ok(n) = digits.parse() {
                    return n;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no `{marker}<number>` in the output\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stand-in's API server pid (uvicorn's `Started server process`).
    pub fn engine_pid(&self) -> i32 {
        self.number_after("Started server process [") as i32
    }
    /// The stand-in's EngineCore pid.
    pub fn core_pid(&self) -> i32 {
        self.number_after("(EngineCore_DP0 pid=") as i32
    }
    /// The engine's port (uvicorn's `Uvicorn running on http://0.0.0.0:`).
    pub fn engine_port(&self) -> u16 {
        self.number_after("Uvicorn running on http://0.0.0.0:") as u16
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a process is alive (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) S ...`: the state follows the last `)`.
    match stat.rfind(')') {
        Some(i) => !stat[i + 1..].trim_start().starts_with('Z'),
        None => false,
    }
}

/// Whether any process of group `pgid` is alive (zombies do not count).
pub fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            return false;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(i) = stat.rfind(')') else {
            return false;
        };
        let fields: Vec<&str> = stat[i + 1..].split_whitespace().collect();
        // fields[0] = state, [1] = ppid, [2] = pgrp
        fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z"
    })
}

/// Waits until `cond` holds.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to `pid`.
pub fn kill(pid: i32, signal: i32) {
    // SAFETY: kill only sends a signal.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// GET on the engine's port, straight (not through the worker).
pub fn engine_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// A gauge from the engine's `/metrics`.
pub fn engine_gauge(port: u16, name: &str) -> f64 {
    tt_worker_openai::metrics::gauge(&engine_get(port, "/metrics"), name).unwrap_or(-1.0)
}

pub async fn connect(socket: &Path) -> Result<EngineClient<Channel>, tonic::transport::Error> {
    let path = socket.to_path_buf();
    let channel = Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?;
    Ok(EngineClient::new(channel))
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub text: String,
    pub ids: Vec<u32>,
    pub deltas: usize,
    pub final_: pb::GenerationFinal,
}

pub fn prompt_request(prompt: &str, max_tokens: u32) -> pb::EngineGenerateRequest {
    pb::EngineGenerateRequest {
        request: Some(pb::GenerateRequest {
            model: String::new(),
            input: Some(pb::generate_request::Input::Prompt(prompt.into())),
            max_tokens,
            sampling: None,
            stop: Vec::new(),
            ..Default::default()
        }),
        request_id: format!("test-{prompt}"),
    }
}

pub fn chat_request(turns: &[(&str, &str)], max_tokens: u32) -> pb::EngineGenerateRequest {
    pb::EngineGenerateRequest {
        request: Some(pb::GenerateRequest {
            model: String::new(),
            input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages: turns
                    .iter()
                    .map(|(role, content)| pb::ChatMessage {
                        role: role.to_string(),
                        content: content.to_string(),
                    })
                    .collect(),
            })),
            max_tokens,
            sampling: None,
            stop: Vec::new(),
            ..Default::default()
        }),
        request_id: "test-chat".into(),
    }
}

pub async fn run(
    c: &mut EngineClient<Channel>,
    req: pb::EngineGenerateRequest,
) -> Result<Output, tonic::Status> {
    let mut stream = c.generate(req).await?.into_inner();
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut deltas = 0;
    while let Some(msg) = stream.message().await? {
        match msg.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => {
                text.push_str(&d.text);
                ids.extend(d.token_ids);
                deltas += 1;
            }
            Some(pb::generate_response::Chunk::Final(f)) => {
                assert!(
                    stream.message().await?.is_none(),
                    "chunks after the final one"
                );
                return Ok(Output {
                    text,
                    ids,
                    deltas,
                    final_: f,
                });
            }
            None => panic!("empty chunk"),
        }
    }
    panic!("stream ended without a final chunk")
}

/// The children of `pid` (every thread's), from /proc.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// The value after `flag` in a process's command line.
pub fn cmdline_value(pid: i32, flag: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}
