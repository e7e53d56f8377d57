//! The one test harness of worker processes (feature `testing`): a real
//! worker binary started with the contract's environment as the daemon
//! sets it, real gRPC over its real unix socket, and the requests and
//! stream reading every worker test needs. Test code: it panics with the
//! worker's output on anything unexpected.

use crate::names;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// `tp` made-up PCI addresses, comma-separated.
pub fn bdfs(tp: usize) -> String {
    (0..tp)
        .map(|i| format!("0000:0{}:00.0", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// The contract's environment for one worker, on a cleared environment
/// (PATH and HOME kept), as the daemon starts workers.
pub struct ContractEnv<'a> {
    /// The socket.
    pub socket: &'a Path,
    /// The checkpoint.
    pub model: &'a std::ffi::OsStr,
    /// TP degree (that many made-up cards).
    pub tp: usize,
    /// The cache variant's directory.
    pub cache_dir: &'a Path,
    /// `warm` or `cold` (or anything, to test refusals).
    pub cache_mode: &'a str,
}

/// `program` with `env`'s contract and `TT_WORKER_LOG=info`.
pub fn contract_command(program: &Path, env: &ContractEnv) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(names::SOCKET, env.socket)
        .env(names::MODEL, env.model)
        .env(names::TP, env.tp.to_string())
        .env(names::CACHE_DIR, env.cache_dir)
        .env(names::CACHE_MODE, env.cache_mode)
        .env(names::VISIBLE_DEVICES, bdfs(env.tp))
        .env(names::LOG, "info");
    if let Some(home) = std::env::var_os("HOME") {
        c.env("HOME", home);
    }
    c
}

/// How a test starts its worker.
pub trait Launch {
    /// The worker's command, its socket at `dir/worker.sock`
    /// ([`Worker::SOCKET`]); `dir` is the worker's own temporary
    /// directory.
    fn command(&self, dir: &Path) -> Command;

    /// How long [`Worker::start`] waits for Ready.
    fn ready_timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
}

/// A running worker, its stdout and stderr in files; killed on drop.
pub struct Worker {
    /// The process.
    pub child: Child,
    /// Its socket.
    pub socket: PathBuf,
    /// Its temporary directory (the socket, the output files, and whatever
    /// the launch put there).
    pub dir: tempfile::TempDir,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Worker {
    /// The socket's name in the worker's directory.
    pub const SOCKET: &'static str = "worker.sock";

    /// Starts a worker without waiting for it.
    pub fn spawn(launch: &impl Launch) -> Worker {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stdout = dir.path().join("stdout");
        let stderr = dir.path().join("stderr");
        let file = |p: &Path| Stdio::from(std::fs::File::create(p).expect("an output file"));
        let child = launch
            .command(dir.path())
            .stdout(file(&stdout))
            .stderr(file(&stderr))
            .spawn()
            .expect("the worker binary starts");
        Worker {
            child,
            socket: dir.path().join(Self::SOCKET),
            dir,
            stdout,
            stderr,
        }
    }

    /// Starts a worker and waits until it reports Ready.
    pub async fn start(launch: &impl Launch) -> Worker {
        let mut w = Self::spawn(launch);
        w.wait_ready(launch.ready_timeout()).await;
        w
    }

    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// What it printed on stderr so far.
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

    /// A client on its socket.
    pub async fn client(&self) -> EngineClient<Channel> {
        connect(&self.socket)
            .await
            .unwrap_or_else(|e| panic!("cannot connect: {e}\n{}", self.output()))
    }

    /// Its Info, when it answers.
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

    /// Waits until Info says Ready; panics if it exits first or the time is
    /// up.
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
                "worker not ready within {timeout:?}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until its socket exists (it is bound before the load).
    pub async fn wait_socket(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "no socket within {timeout:?}\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("waitpid") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {timeout:?}\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to 20 s) for a number its output gives after `marker`.
    pub fn number_after(&self, marker: &str) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let all = format!("{}\n{}", self.stdout(), self.stderr());
            if let Some(n) = number_after(&all, marker) {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "no `{marker}<number>` in the output\n{}",
                self.output()
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

/// The number `text` gives right after the first `marker`, if any.
pub fn number_after(text: &str, marker: &str) -> Option<u32> {
    let at = text.find(marker)?;
    let digits: String = text[at + marker.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// An engine.proto client on a unix socket.
pub async fn connect(socket: &Path) -> Result<EngineClient<Channel>, tonic::transport::Error> {
    Ok(EngineClient::new(
        tt_serving_proto::uds::channel(socket).await?,
    ))
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The text.
    pub text: String,
    /// The token ids the deltas carried.
    pub ids: Vec<u32>,
    /// Deltas received.
    pub deltas: usize,
    /// One per id when the request asked for logprobs.
    pub logprobs: Vec<pb::TokenLogprob>,
    /// The prompt's, when the request asked for prompt logprobs.
    pub prompt_logprobs: Option<Vec<pb::TokenLogprob>>,
    /// The final chunk.
    pub final_: pb::GenerationFinal,
}

/// A raw-prompt request.
pub fn prompt_request(prompt: &str, max_tokens: u32) -> pb::EngineGenerateRequest {
    pb::EngineGenerateRequest {
        request: Some(pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Prompt(prompt.into())),
            max_tokens,
            ..Default::default()
        }),
        request_id: format!("test-{prompt}"),
    }
}

/// A chat request of `(role, content)` turns.
pub fn chat_request(turns: &[(&str, &str)], max_tokens: u32) -> pb::EngineGenerateRequest {
    with(prompt_request("", max_tokens), |g| {
        g.input = Some(pb::generate_request::Input::Chat(pb::ChatMessages {
            messages: turns
                .iter()
                .map(|(role, content)| pb::ChatMessage {
                    role: role.to_string(),
                    content: content.to_string(),
                })
                .collect(),
        }));
    })
}

/// `request` changed by `f` (to set the optional parameters).
pub fn with(
    mut request: pb::EngineGenerateRequest,
    f: impl FnOnce(&mut pb::GenerateRequest),
) -> pb::EngineGenerateRequest {
    if let Some(g) = request.request.as_mut() {
        f(g);
    }
    request
}

/// Runs a generation to its final chunk; panics on chunks after it or a
/// stream that ends without one.
pub async fn run(
    c: &mut EngineClient<Channel>,
    req: pb::EngineGenerateRequest,
) -> Result<Output, tonic::Status> {
    let mut stream = c.generate(req).await?.into_inner();
    let mut out = Output {
        text: String::new(),
        ids: Vec::new(),
        deltas: 0,
        logprobs: Vec::new(),
        prompt_logprobs: None,
        final_: Default::default(),
    };
    while let Some(msg) = stream.message().await? {
        match msg.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => {
                out.text.push_str(&d.text);
                out.ids.extend(d.token_ids);
                out.logprobs.extend(d.logprobs);
                out.deltas += 1;
            }
            Some(pb::generate_response::Chunk::PromptLogprobs(p)) => {
                assert!(
                    out.prompt_logprobs.is_none() && out.deltas == 0,
                    "prompt logprobs twice, or after a delta"
                );
                out.prompt_logprobs = Some(p.tokens);
            }
            Some(pb::generate_response::Chunk::Final(f)) => {
                assert!(
                    stream.message().await?.is_none(),
                    "chunks after the final one"
                );
                out.final_ = f;
                return Ok(out);
            }
            None => panic!("empty chunk"),
        }
    }
    panic!("stream ended without a final chunk")
}

/// A greedy generation of `prompt`, which must succeed.
pub async fn greedy(c: &mut EngineClient<Channel>, prompt: &str, max_tokens: u32) -> Output {
    run(c, prompt_request(prompt, max_tokens))
        .await
        .unwrap_or_else(|e| panic!("generation of {prompt:?} failed: {e}"))
}

/// Waits (up to 10 s) until Health shows `n` sequences in the batch.
pub async fn wait_active(c: &mut EngineClient<Channel>, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let health = c
            .health(pb::HealthRequest {})
            .await
            .unwrap_or_else(|e| panic!("Health failed: {e}"))
            .into_inner();
        if health.active_sequences == n {
            return;
        }
        assert!(Instant::now() < deadline, "never {n} active: {health:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A Shutdown call granting `drain_ms` to what is running; its report.
pub async fn shutdown(c: &mut EngineClient<Channel>, drain_ms: u32) -> pb::ShutdownResponse {
    c.shutdown(pb::ShutdownRequest {
        drain_timeout_ms: drain_ms,
    })
    .await
    .unwrap_or_else(|e| panic!("Shutdown failed: {e}"))
    .into_inner()
}
