//! Two comparisons, each side by side in one run: the same greedy
//! requests, alternating arm by arm (A B B A ...) so the machine's drift
//! hits both, each prompt unique so no engine's prompt cache favours an arm, at 1 stream and at 8 concurrent streams. Measured at the
//! client: tokens per second (tokens from each answer's usage over wall
//! time) and time to first token (the first chunk with text).
//!
//! - default: the daemon's OpenAI front door against its gRPC port, both
//!   serving `tt-worker` (does the HTTP door cost anything?);
//! - `--llama-server PATH`: llama.cpp's `llama-server` as a slot's engine
//!   under `tt-worker-openai`, asked directly on its own port against
//!   through the daemon's OpenAI port (what does the extra hop cost?);
//! - `--vllm PYTHON --vllm-model DIR`: the same with the real vLLM (the
//!   venv of `scripts/vllm.sh` and SmolLM2 as a Hugging Face directory).
//!
//! Prints the ratios and the TTFT difference, and appends one JSON line
//! per streams setting, with the configuration, to `--out`.

use clap::Parser;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tt_bench::http::{Connection, HttpClient};
use tt_bench::{grpc, host, http, stats};
use tt_serving_tests::{model_table, Daemon, DaemonOptions, FakeHw};

#[derive(Parser)]
struct Args {
    /// The GGUF to serve (default: $TT_SMOLLM2_GGUF, else the tiny test model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens per request (fixed: greedy, and the prompts do not end early
    /// on the tiny model; on SmolLM2 an early stop counts its own tokens).
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// Rounds per arm; a round is one request (1 stream) or 8 concurrent
    /// requests (8 streams).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// JSON-lines file to append results to.
    #[arg(long, default_value = "bench/openai/results.jsonl")]
    out: PathBuf,
    /// Compare llama-server's own port with the daemon in front of it
    /// (the engine under tt-worker-openai) instead of HTTP with gRPC.
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// llama-server's compute threads (`-t`): 2 takes both cores of a
    /// 2-core machine, so the daemon's hop competes with the engine; 1
    /// leaves a core free, as an engine on Tenstorrent cards does.
    #[arg(long, default_value_t = 2)]
    llama_threads: u32,
    /// Compare vLLM's own port with the daemon in front of it: the Python
    /// of a venv with vLLM (`scripts/vllm.sh` prints it).
    #[arg(long, requires = "vllm_model", conflicts_with = "llama_server")]
    vllm: Option<PathBuf>,
    /// The Hugging Face directory vLLM serves (`scripts/vllm.sh --model-dir`).
    #[arg(long, requires = "vllm")]
    vllm_model: Option<PathBuf>,
}

/// The engine behind the daemon, when the comparison is against its port.
enum Engine {
    LlamaServer,
    Vllm,
}

impl Engine {
    fn is_engine(&self, args: &[String]) -> bool {
        match self {
            Engine::LlamaServer => args.first().is_some_and(|a| a.ends_with("llama-server")),
            Engine::Vllm => args
                .iter()
                .any(|a| a == "vllm.entrypoints.openai.api_server"),
        }
    }
}

/// One request as its client saw it.
#[derive(Clone, Copy)]
struct Sample {
    tokens: u32,
    ttft: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    /// The daemon's gRPC port; or, with --llama-server, the engine's own
    /// port (the baseline).
    Base,
    /// The daemon's OpenAI port.
    Http,
}

/// A request on the daemon's gRPC port, a new connection each (as the
/// HTTP arms make one).
async fn grpc_once(address: &str, prompt: &str, tokens: u32) -> Sample {
    let channel = grpc::connect(address).await;
    let answer = grpc::generate(channel, grpc::prompt_request(prompt, tokens, true)).await;
    Sample {
        tokens: answer.completion_tokens,
        ttft: answer.ttft.unwrap_or(answer.total),
    }
}

/// A streamed `/v1/completions` as an OpenAI client makes it, with
/// `ignore_eos` so every answer is `tokens` long.
async fn http_once(client: &HttpClient, base: &str, prompt: &str, tokens: u32) -> Sample {
    let body = json!({
        "model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
    });
    let start = Instant::now();
    let answer = http::post(
        client,
        &format!("{base}/v1/completions"),
        &body,
        Connection::Close,
    )
    .await;
    let (mut ttft, mut generated, mut chunks) = (None, 0, 0);
    http::for_each_event(answer, |chunk| {
        if chunk["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
        {
            ttft.get_or_insert_with(|| start.elapsed());
            chunks += 1;
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            generated = n as u32;
        }
    })
    .await;
    Sample {
        // An engine that sends no usage: one token per text chunk.
        tokens: if generated > 0 { generated } else { chunks },
        ttft: ttft.unwrap_or_else(|| start.elapsed()),
    }
}

/// The engine's `--port` under the slot's worker.
fn engine_port(daemon: &Daemon, engine: &Engine) -> u16 {
    let worker = daemon.slot("m")["worker_pid"].as_u64().unwrap_or(0);
    let worker = u32::try_from(worker).unwrap_or(0);
    host::engine_port(worker, |args| engine.is_engine(args))
        .unwrap_or_else(|| panic!("no engine with a --port under worker {worker}"))
}

/// The median by nearest rank, ttctl's definition.
fn median(values: &mut [f64]) -> f64 {
    stats::quantile(values, 0.5)
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let (model, model_name) = tt_bench::host::model(args.model.as_deref(), work.path());
    let hw = FakeHw::new(1);
    let engine = match (&args.llama_server, &args.vllm) {
        (Some(_), _) => Some(Engine::LlamaServer),
        (None, Some(_)) => Some(Engine::Vllm),
        (None, None) => None,
    };
    let table = match (&args.llama_server, &args.vllm, &args.vllm_model) {
        (None, Some(python), Some(dir)) => format!(
            // vLLM-CPU as the tests run it (tests/engines.rs vllm_table):
            // offline, eager, its KV cache sized to the machine, served as
            // `m` so the direct arm's requests name it too.
            "[models.m]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\nmax_in_flight = 8\nworker = [\"{}\", \"--engine\", \"vllm\", \"--\", \"{}\", \"-m\", \"vllm.entrypoints.openai.api_server\", \"--model\", \"{{checkpoint}}\", \"--served-model-name\", \"m\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--enforce-eager\", \"--max-model-len\", \"2048\", \"--max-num-seqs\", \"8\", \"--disable-uvicorn-access-log\"]\nenv = {{ HF_HUB_OFFLINE = \"1\", TRANSFORMERS_OFFLINE = \"1\", VLLM_CPU_KVCACHE_SPACE = \"1\" }}\n[models.m.readiness]\ndeadline_secs = 600\n",
            FakeHw::bdf(0),
            dir.display(),
            tt_serving_tests::bin("tt-worker-openai").display(),
            python.display(),
        ),
        (None, _, _) => model_table("m", 1, &[0], &model, "max_in_flight = 8\n"),
        (Some(server), _, _) => format!(
            "[models.m]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\nmax_in_flight = 8\nworker = [\"{}\", \"--engine\", \"llama-server\", \"--\", \"{}\", \"-m\", \"{{checkpoint}}\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--metrics\", \"-np\", \"8\", \"-c\", \"8192\", \"-t\", \"{}\"]\n",
            FakeHw::bdf(0),
            model.display(),
            tt_serving_tests::bin("tt-worker-openai").display(),
            server.display(),
            args.llama_threads
        ),
    };
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!("[openai]\nlisten = \"127.0.0.1:0\"\n{table}"),
            ..Default::default()
        },
    );
    daemon.wait_slot_ready_within("m", Duration::from_secs(600));
    let grpc = daemon.inference_address();
    let direct = engine
        .as_ref()
        .map(|e| format!("http://127.0.0.1:{}", engine_port(&daemon, e)));
    let (base_name, comparison) = match engine {
        None => ("grpc", "openai_vs_grpc"),
        Some(Engine::LlamaServer) => ("llama_server_direct", "daemon_vs_llama_server"),
        Some(Engine::Vllm) => ("vllm_direct", "daemon_vs_vllm"),
    };
    let model_name = match &args.vllm_model {
        Some(dir) => dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        None => model_name,
    };
    let http = format!(
        "http://{}",
        daemon.status()["daemon"]["openai_address"]
            .as_str()
            .unwrap_or_default()
    );
    let client = http::client();
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .expect("results file");

    for streams in [1usize, 8] {
        // Per arm: tok/s of each round, TTFT of each request.
        let mut tok_s = [Vec::new(), Vec::new()];
        let mut ttft_ms = [Vec::new(), Vec::new()];
        rt.block_on(async {
            // Warm-up, both arms.
            match &direct {
                None => grpc_once(&grpc, "warm up", 8).await,
                Some(d) => http_once(&client, d, "warm up", 8).await,
            };
            http_once(&client, &http, "warm up", 8).await;
            for round in 0..2 * args.rounds {
                // A B B A ...: neither arm always runs first.
                let arm = if matches!(round % 4, 0 | 3) {
                    Arm::Base
                } else {
                    Arm::Http
                };
                let start = Instant::now();
                let mut tasks = Vec::new();
                for i in 0..streams {
                    let (grpc, http, client) = (grpc.clone(), http.clone(), client.clone());
                    let direct = direct.clone();
                    let tokens = args.tokens;
                    // A number no other request starts with: an engine's
                    // prompt cache (llama-server keeps the last prompt's
                    // KV) cannot favour either arm.
                    let prompt = format!("{}. Tell me about the sea", 1000 + round * 8 + i);
                    tasks.push(tokio::spawn(async move {
                        match (arm, direct) {
                            (Arm::Base, None) => grpc_once(&grpc, &prompt, tokens).await,
                            (Arm::Base, Some(d)) => http_once(&client, &d, &prompt, tokens).await,
                            (Arm::Http, _) => http_once(&client, &http, &prompt, tokens).await,
                        }
                    }));
                }
                let mut tokens = 0;
                for t in tasks {
                    let sample = t.await.expect("request task");
                    tokens += sample.tokens;
                    ttft_ms[arm as usize].push(sample.ttft.as_secs_f64() * 1e3);
                }
                tok_s[arm as usize].push(f64::from(tokens) / start.elapsed().as_secs_f64());
            }
        });
        let (base_tok_s, http_tok_s) = (median(&mut tok_s[0]), median(&mut tok_s[1]));
        let (base_ttft, http_ttft) = (median(&mut ttft_ms[0]), median(&mut ttft_ms[1]));
        let ratio = http_tok_s / base_tok_s;
        println!(
            "{streams} stream(s): {base_name} {base_tok_s:.1} tok/s, daemon HTTP {http_tok_s:.1} tok/s, ratio {ratio:.3}; TTFT p50 {base_name} {base_ttft:.1} ms, daemon HTTP {http_ttft:.1} ms ({:+.2} ms)",
            http_ttft - base_ttft
        );
        let line = json!({
            "bench": comparison, "streams": streams, "rounds_per_arm": args.rounds,
            "tokens": args.tokens, "order": format!("A B B A from {base_name}, prompts unique per request"), "model": model_name,
            "base_arm": base_name,
            "base_tok_s_rounds": tok_s[0], "http_tok_s_rounds": tok_s[1],
            "base_tok_s_median": base_tok_s, "http_tok_s_median": http_tok_s, "ratio": ratio,
            "ttft_p50_base_ms": base_ttft, "ttft_p50_http_ms": http_ttft,
            "ttft_p50_delta_ms": http_ttft - base_ttft,
            "ignore_eos": true,
            "llama_threads": args.llama_server.as_ref().map(|_| args.llama_threads),
            "engine_version": daemon.slot("m")["engine_version"].clone(),
            "host_at_end": host::record(),
            "daemon_version": env!("CARGO_PKG_VERSION"),
            "unix_ms": tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
        });
        writeln!(out, "{line}").expect("write result");
    }
}
