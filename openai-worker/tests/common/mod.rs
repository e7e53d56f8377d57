//! Test harness: real `tt-worker-openai` processes running a real engine
//! process (the vLLM stand-in in tests/engines/, or llama-server), talked
//! to over engine.proto on the worker's unix socket (tt-worker-contract's
//! `testing` harness).
#![allow(dead_code, unused_imports)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
pub use tt_worker_contract::testing::{
    chat_request, connect, prompt_request, run, shutdown, wait_active, Launch, Output, Worker,
};
use tt_worker_contract::testing::{contract_command, ContractEnv};

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

/// The cache variant's directory inside a worker's directory.
pub fn variant_dir(dir: &Path) -> PathBuf {
    dir.join("cache").join("model").join("variant1")
}

/// The worker's command: a cleared environment with the contract, as the
/// daemon starts it.
pub fn command(o: &Opts, dir: &Path) -> Command {
    let mut c = contract_command(
        Path::new(env!("CARGO_BIN_EXE_tt-worker-openai")),
        &ContractEnv {
            socket: &dir.join(Worker::SOCKET),
            model: o.checkpoint.as_ref(),
            tp: 1,
            cache_dir: &variant_dir(dir),
            cache_mode: o.mode,
        },
    );
    c.env(tt_worker_contract::names::MESH_DEVICE, "(1,1)");
    for (k, v) in &o.env {
        c.env(k, v);
    }
    c.args(&o.args).arg("--").args(&o.engine);
    c
}

impl Launch for Opts {
    fn command(&self, dir: &Path) -> Command {
        command(self, dir)
    }
}

/// What the stand-in's output says about its processes.
pub trait StandinOutput {
    /// The stand-in's API server pid (uvicorn's `Started server process`).
    fn engine_pid(&self) -> i32;
    /// The stand-in's EngineCore pid.
    fn core_pid(&self) -> i32;
    /// The engine's port (uvicorn's `Uvicorn running on http://0.0.0.0:`).
    fn engine_port(&self) -> u16;
    /// The worker's cache variant directory.
    fn cache_dir(&self) -> PathBuf;
}

impl StandinOutput for Worker {
    fn engine_pid(&self) -> i32 {
        self.number_after("Started server process [") as i32
    }
    fn core_pid(&self) -> i32 {
        self.number_after("(EngineCore_DP0 pid=") as i32
    }
    fn engine_port(&self) -> u16 {
        self.number_after("Uvicorn running on http://0.0.0.0:") as u16
    }
    fn cache_dir(&self) -> PathBuf {
        variant_dir(self.dir.path())
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
