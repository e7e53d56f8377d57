//! The OpenAI front door against the gRPC port of the same daemon, side by
//! side in one run: the same greedy requests, alternating arm by arm
//! (A B A B ...) so the machine's drift hits both, at 1 stream and at 8
//! concurrent streams. Measured at the client: tokens per second (tokens
//! from each answer's usage over wall time) and time to first token (the
//! first chunk with text).
//!
//! Prints the ratios HTTP / gRPC and the TTFT difference, and appends one
//! JSON line per streams setting, with the configuration, to `--out`.

use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;
use tt_serving_tests::{model_table, tiny_model, Daemon, DaemonOptions, FakeHw};

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
}

/// One request as its client saw it.
#[derive(Clone, Copy)]
struct Sample {
    tokens: u32,
    ttft: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    Grpc,
    Http,
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn grpc_once(address: &str, prompt: &str, tokens: u32) -> Sample {
    let mut client = pb::inference_client::InferenceClient::connect(format!("http://{address}"))
        .await
        .expect("inference port");
    let start = Instant::now();
    let mut stream = client
        .generate(pb::GenerateRequest {
            model: "m".into(),
            input: Some(pb::generate_request::Input::Prompt(prompt.into())),
            max_tokens: tokens,
            ..Default::default()
        })
        .await
        .expect("gRPC generate")
        .into_inner();
    let mut ttft = None;
    let mut generated = 0;
    while let Some(chunk) = stream.message().await.expect("gRPC stream") {
        match chunk.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) if !d.text.is_empty() => {
                ttft.get_or_insert_with(|| start.elapsed());
            }
            Some(pb::generate_response::Chunk::Final(f)) => {
                generated = f.usage.map(|u| u.completion_tokens).unwrap_or(0);
            }
            _ => {}
        }
    }
    Sample {
        tokens: generated,
        ttft: ttft.unwrap_or_else(|| start.elapsed()),
    }
}

/// A streamed `/v1/completions` as an OpenAI client makes it (a new
/// connection per request, as the gRPC arm makes one).
async fn http_once(client: &HttpClient, base: &str, prompt: &str, tokens: u32) -> Sample {
    let body = json!({
        "model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true},
    })
    .to_string();
    let request = hyper::Request::post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .header("connection", "close")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let start = Instant::now();
    let response = client.request(request).await.expect("HTTP request");
    assert_eq!(response.status(), 200, "HTTP status");
    let mut body = response.into_body();
    let (mut pending, mut ttft, mut generated) = (Vec::new(), None, 0);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("HTTP body").into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        // Whole events only: `data: {...}\n\n`.
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let payload = event.strip_prefix(b"data: ").unwrap_or(&event);
            let Ok(chunk) = serde_json::from_slice::<serde_json::Value>(payload) else {
                continue; // [DONE]
            };
            if chunk["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                ttft.get_or_insert_with(|| start.elapsed());
            }
            if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
                generated = n as u32;
            }
        }
    }
    Sample {
        tokens: generated,
        ttft: ttft.unwrap_or_else(|| start.elapsed()),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let model = args
        .model
        .clone()
        .or_else(|| std::env::var_os("TT_SMOLLM2_GGUF").map(PathBuf::from))
        .unwrap_or_else(|| tiny_model(work.path()));
    let model_name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n{}",
                model_table("m", 1, &[0], &model, "max_in_flight = 8\n")
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let grpc = daemon.inference_address();
    let http = format!(
        "http://{}",
        daemon.status()["daemon"]["openai_address"]
            .as_str()
            .unwrap_or_default()
    );
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
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
            grpc_once(&grpc, "warm up", 8).await;
            http_once(&client, &http, "warm up", 8).await;
            for round in 0..2 * args.rounds {
                let arm = if round % 2 == 0 { Arm::Grpc } else { Arm::Http };
                let start = Instant::now();
                let mut tasks = Vec::new();
                for i in 0..streams {
                    let (grpc, http, client) = (grpc.clone(), http.clone(), client.clone());
                    let tokens = args.tokens;
                    let prompt = format!("Round {} stream {i}: tell me about the sea", round / 2);
                    tasks.push(tokio::spawn(async move {
                        match arm {
                            Arm::Grpc => grpc_once(&grpc, &prompt, tokens).await,
                            Arm::Http => http_once(&client, &http, &prompt, tokens).await,
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
        let (grpc_tok_s, http_tok_s) = (median(&mut tok_s[0]), median(&mut tok_s[1]));
        let (grpc_ttft, http_ttft) = (median(&mut ttft_ms[0]), median(&mut ttft_ms[1]));
        let ratio = http_tok_s / grpc_tok_s;
        println!(
            "{streams} stream(s): gRPC {grpc_tok_s:.1} tok/s, HTTP {http_tok_s:.1} tok/s, HTTP/gRPC {ratio:.3}; TTFT p50 gRPC {grpc_ttft:.1} ms, HTTP {http_ttft:.1} ms ({:+.2} ms)",
            http_ttft - grpc_ttft
        );
        let line = json!({
            "bench": "openai_vs_grpc", "streams": streams, "rounds_per_arm": args.rounds,
            "tokens": args.tokens, "order": "alternating, gRPC first", "model": model_name,
            "grpc_tok_s_rounds": tok_s[0], "http_tok_s_rounds": tok_s[1],
            "grpc_tok_s_median": grpc_tok_s, "http_tok_s_median": http_tok_s, "ratio": ratio,
            "ttft_p50_grpc_ms": grpc_ttft, "ttft_p50_http_ms": http_ttft,
            "ttft_p50_delta_ms": http_ttft - grpc_ttft,
            "daemon_version": env!("CARGO_PKG_VERSION"),
            "unix_ms": tt_servingd::clock::unix_ms(std::time::SystemTime::now()),
        });
        writeln!(out, "{line}").expect("write result");
    }
}
