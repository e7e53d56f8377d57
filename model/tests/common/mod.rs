//! Test harness: real `tt-worker` processes, real gRPC over real unix
//! sockets, and the two models (the tiny generated one and SmolLM2).
#![allow(dead_code)]

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint, Uri};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

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

/// BDFs for `tp` fake cards.
pub fn bdfs(tp: usize) -> String {
    (0..tp)
        .map(|i| format!("0000:0{}:00.0", i + 1))
        .collect::<Vec<_>>()
        .join(",")
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

/// A running worker; killed on drop.
pub struct Worker {
    pub child: Child,
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
    stdout: PathBuf,
    stderr: PathBuf,
}

pub fn command(o: &Opts, socket: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tt-worker"));
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TT_WORKER_SOCKET", socket)
        .env("TT_WORKER_MODEL", &o.model)
        .env("TT_WORKER_TP", o.tp.to_string())
        .env("TT_CACHE_DIR", &o.cache_dir)
        .env("TT_CACHE_MODE", o.mode)
        .env("TT_VISIBLE_DEVICES", bdfs(o.tp))
        .env("TT_WORKER_LOG", "info");
    for (k, v) in &o.env {
        c.env(k, v);
    }
    c.args(&o.args);
    c
}

impl Worker {
    /// Starts a worker without waiting for it.
    pub fn spawn(o: &Opts) -> Worker {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("worker.sock");
        let stdout = dir.path().join("stdout");
        let stderr = dir.path().join("stderr");
        let child = command(o, &socket)
            .stdout(Stdio::from(std::fs::File::create(&stdout).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
            .spawn()
            .unwrap();
        Worker {
            child,
            socket,
            _dir: dir,
            stdout,
            stderr,
        }
    }

    /// Starts a worker and waits until it reports READY.
    pub async fn start(o: &Opts) -> Worker {
        let mut w = Self::spawn(o);
        w.wait_ready(Duration::from_secs(300)).await;
        w
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub async fn client(&self) -> EngineClient<Channel> {
        connect(&self.socket).await.unwrap()
    }

    pub async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("worker exited early with {st}; stderr:\n{}", self.stderr());
            }
            if self.socket.exists() {
                if let Ok(mut c) = connect(&self.socket).await {
                    if let Ok(info) = c.info(pb::InfoRequest {}).await {
                        if info.get_ref().state == pb::WorkerState::Ready as i32 {
                            return;
                        }
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "worker not ready in time; stderr:\n{}",
                self.stderr()
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
                "worker did not exit; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    /// One per id when the request asked for logprobs.
    pub logprobs: Vec<pb::TokenLogprob>,
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

pub async fn run(
    c: &mut EngineClient<Channel>,
    req: pb::EngineGenerateRequest,
) -> Result<Output, tonic::Status> {
    let mut stream = c.generate(req).await?.into_inner();
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut logprobs = Vec::new();
    while let Some(msg) = stream.message().await? {
        match msg.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => {
                text.push_str(&d.text);
                ids.extend(d.token_ids);
                logprobs.extend(d.logprobs);
            }
            Some(pb::generate_response::Chunk::Final(f)) => {
                assert!(
                    stream.message().await?.is_none(),
                    "chunks after the final one"
                );
                return Ok(Output {
                    text,
                    ids,
                    logprobs,
                    final_: f,
                });
            }
            None => panic!("empty chunk"),
        }
    }
    panic!("stream ended without a final chunk")
}

/// A raw-prompt request changed by `f` (to set the optional parameters).
pub fn request_with(
    prompt: &str,
    max_tokens: u32,
    f: impl FnOnce(&mut pb::GenerateRequest),
) -> pb::EngineGenerateRequest {
    let mut r = prompt_request(prompt, max_tokens);
    if let Some(g) = r.request.as_mut() {
        f(g);
    }
    r
}

/// A one-turn chat request changed by `f`.
pub fn chat_request(
    user: &str,
    max_tokens: u32,
    f: impl FnOnce(&mut pb::GenerateRequest),
) -> pb::EngineGenerateRequest {
    request_with("", max_tokens, |g| {
        g.input = Some(pb::generate_request::Input::Chat(pb::ChatMessages {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: user.into(),
            }],
        }));
        f(g)
    })
}

pub async fn greedy(c: &mut EngineClient<Channel>, prompt: &str, max_tokens: u32) -> Output {
    run(c, prompt_request(prompt, max_tokens)).await.unwrap()
}
