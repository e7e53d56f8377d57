//! Test harness: real `tt-worker` processes, real gRPC over real unix
//! sockets (tt-worker-contract's `testing` harness), and the two models
//! (the tiny generated one and SmolLM2).
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tt_serving_proto::v1 as pb;
pub use tt_worker_contract::testing::{
    bdfs, connect, greedy, prompt_request, run, shutdown, wait_active, with, Launch, Output, Worker,
};
use tt_worker_contract::testing::{contract_command, ContractEnv};

/// The tiny model, generated once per test binary.
pub fn tiny_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tt-worker-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny-llama.gguf");
        tt_worker::testmodel::write_tiny_llama(&path, 1).unwrap();
        path
    })
    .clone()
}

/// The real SmolLM2 checkpoint, from `TT_SMOLLM2_GGUF`.
pub fn real_model() -> PathBuf {
    match std::env::var_os("TT_SMOLLM2_GGUF") {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "TT_SMOLLM2_GGUF={} is not a file; run scripts/fetch-smollm2.sh and export TT_SMOLLM2_GGUF=\"$(scripts/fetch-smollm2.sh)\"",
                p.display()
            );
            p
        }
        None => panic!(
            "TT_SMOLLM2_GGUF is not set: this test needs the real SmolLM2-135M-Instruct GGUF. \
             Run scripts/fetch-smollm2.sh and export TT_SMOLLM2_GGUF=\"$(scripts/fetch-smollm2.sh)\""
        ),
    }
}

/// How to start a worker.
#[derive(Clone, Debug)]
pub struct Opts {
    pub model: PathBuf,
    pub tp: usize,
    pub cache_dir: PathBuf,
    pub mode: &'static str,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
}

impl Opts {
    pub fn new(model: &Path, tp: usize, cache_dir: &Path, mode: &'static str) -> Self {
        Self {
            model: model.to_path_buf(),
            tp,
            cache_dir: cache_dir.to_path_buf(),
            mode,
            env: Vec::new(),
            args: Vec::new(),
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
}

/// tt-worker with `o`'s contract, serving on `socket`.
pub fn command(o: &Opts, socket: &Path) -> Command {
    let mut c = contract_command(
        Path::new(env!("CARGO_BIN_EXE_tt-worker")),
        &ContractEnv {
            socket,
            model: o.model.as_os_str(),
            tp: o.tp,
            cache_dir: &o.cache_dir,
            cache_mode: o.mode,
        },
    );
    for (k, v) in &o.env {
        c.env(k, v);
    }
    c.args(&o.args);
    c
}

impl Launch for Opts {
    fn command(&self, dir: &Path) -> Command {
        command(self, &dir.join(Worker::SOCKET))
    }

    fn ready_timeout(&self) -> Duration {
        // A cold start of the real model on a loaded two-core machine.
        Duration::from_secs(300)
    }
}

/// A raw-prompt request changed by `f` (to set the optional parameters).
pub fn request_with(
    prompt: &str,
    max_tokens: u32,
    f: impl FnOnce(&mut pb::GenerateRequest),
) -> pb::EngineGenerateRequest {
    with(prompt_request(prompt, max_tokens), f)
}

/// A one-turn chat request changed by `f`.
pub fn chat_request(
    user: &str,
    max_tokens: u32,
    f: impl FnOnce(&mut pb::GenerateRequest),
) -> pb::EngineGenerateRequest {
    with(
        tt_worker_contract::testing::chat_request(&[("user", user)], max_tokens),
        f,
    )
}
