//! Engine benchmark: drives real `tt-worker` processes over engine.proto and
//! prints one JSON line per measurement (see bench/engine/README.md).
//!
//! Usage: bench_engine --worker PATH --model GGUF [--tokens N] [--repeats R] [--tp N]
//!                     [--streams 1,4,8] [--prefill 512,2048] [--honour-eos]

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;
use tt_worker_contract::names;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "The quick brown fox",
    "In 1969, the first man on the moon was",
    "The best way to learn a language is",
];

static HONOUR_EOS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct Worker {
    child: Child,
    socket: PathBuf,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn connect(socket: &Path) -> anyhow::Result<EngineClient<Channel>> {
    Ok(EngineClient::new(
        tt_serving_proto::uds::channel(socket).await?,
    ))
}

async fn start(
    worker: &Path,
    model: &Path,
    tp: usize,
    cache: &Path,
    mode: &str,
    dir: &Path,
    env: &[(String, String)],
) -> anyhow::Result<(Worker, pb::InfoResponse)> {
    let socket = dir.join(format!("w-{tp}-{mode}.sock"));
    let bdfs: Vec<String> = (0..tp).map(|i| format!("0000:0{}:00.0", i + 1)).collect();
    let child = Command::new(worker)
        .env(names::SOCKET, &socket)
        .env(names::MODEL, model)
        .env(names::TP, tp.to_string())
        .env(names::CACHE_DIR, cache)
        .env(names::CACHE_MODE, mode)
        .env(names::VISIBLE_DEVICES, bdfs.join(","))
        .env("TT_WORKER_MAX_SEQ_LEN", "4096")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let w = Worker { child, socket };
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Ok(mut c) = connect(&w.socket).await {
            if let Ok(info) = c.info(pb::InfoRequest {}).await {
                let info = info.into_inner();
                if info.state == pb::WorkerState::Ready as i32 {
                    return Ok((w, info));
                }
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "worker not ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Words of a long prompt: common ones, mostly a token each with their
/// leading space, in an order that repeats only every few hundred words (a
/// repeated sentence would make the prefix cache's work trivially small).
const WORDS: [&str; 32] = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
];

/// A prompt of about `words` tokens, different for each `nonce` from its
/// first word on (so nothing of it is in the prefix cache).
fn long_prompt(words: usize, nonce: u64) -> String {
    let mut out = format!("Note {nonce}:");
    let mut x = nonce
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for _ in 0..words {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push(' ');
        out.push_str(WORDS[(x >> 59) as usize]);
    }
    out
}

fn req(prompt: &str, n: u32) -> pb::EngineGenerateRequest {
    pb::EngineGenerateRequest {
        request: Some(pb::GenerateRequest {
            model: String::new(),
            input: Some(pb::generate_request::Input::Prompt(prompt.into())),
            max_tokens: n,
            sampling: None,
            stop: Vec::new(),
            // Every stream decodes all `n` tokens, as the peer's do
            // (bench/engine/llama_server_peer.py asks the same), unless
            // `--honour-eos`: then streams end as clients get them.
            ignore_eos: !HONOUR_EOS.load(std::sync::atomic::Ordering::Relaxed),
            ..Default::default()
        }),
        request_id: "bench".into(),
    }
}

/// Runs one stream; returns (tokens, final).
async fn stream(
    socket: PathBuf,
    prompt: &'static str,
    n: u32,
) -> anyhow::Result<(u32, pb::GenerationFinal)> {
    let mut c = connect(&socket).await?;
    let mut s = c.generate(req(prompt, n)).await?.into_inner();
    let mut toks = 0;
    while let Some(m) = s.message().await? {
        match m.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => toks += d.token_ids.len() as u32,
            Some(pb::generate_response::Chunk::Final(f)) => return Ok((toks, f)),
            Some(pb::generate_response::Chunk::PromptLogprobs(_)) | None => {}
        }
    }
    anyhow::bail!("no final chunk")
}

fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.to_string())
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let worker = PathBuf::from(get("--worker").ok_or_else(|| anyhow::anyhow!("--worker PATH"))?);
    let model = PathBuf::from(get("--model").ok_or_else(|| anyhow::anyhow!("--model GGUF"))?);
    let tokens: u32 = get("--tokens").map_or(Ok(128), |v| v.parse())?;
    let repeats: usize = get("--repeats").map_or(Ok(3), |v| v.parse())?;
    // `--tp N` measures one degree only (for profiling); both by default.
    let tps: Vec<usize> = match get("--tp") {
        Some(v) => vec![v.parse()?],
        None => vec![1, 2],
    };
    // `--streams 1,4,8`: the aggregate measurements (`--streams ""` skips them).
    let stream_counts: Vec<usize> = match get("--streams") {
        Some(v) => v
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?,
        None => vec![1, 4, 8],
    };
    // `--prefill 512,2048`: time to first token of prompts of about that
    // many tokens, unique and then repeated (`--prefill ""` skips them).
    let prefill_lens: Vec<usize> = match get("--prefill") {
        Some(v) => v
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "--prefill {v}: expected prompt lengths in words, like 512,2048"
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        None => vec![512, 2048],
    };
    HONOUR_EOS.store(
        args.iter().any(|a| a == "--honour-eos"),
        std::sync::atomic::Ordering::Relaxed,
    );
    // `--env K=V` (repeatable): worker settings, e.g. the example config's
    // `TTW_KV_F16=1`; recorded with every line.
    let env: Vec<(String, String)> = args
        .windows(2)
        .filter(|w| w[0] == "--env")
        .map(|w| {
            w[1].split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--env {}: expected KEY=VALUE", w[1]))
        })
        .collect::<anyhow::Result<_>>()?;
    let gguf_bytes = std::fs::metadata(&model)?.len();
    let dir = tempfile::tempdir()?;
    let base = json!({"engine": "tt-worker", "model": model.file_name().map(|f| f.to_string_lossy().to_string()), "max_tokens": tokens,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "worker_env": env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>()});
    let emit = |v: serde_json::Value| {
        let mut o = base.clone();
        if let (Some(o), Some(v)) = (o.as_object_mut(), v.as_object()) {
            o.extend(v.clone());
        }
        println!("{o}");
    };
    for tp in tps {
        let cache = dir.path().join(format!("cache-tp{tp}"));
        for rep in 0..repeats {
            let _ = std::fs::remove_dir_all(&cache);
            let (w, cold) = start(&worker, &model, tp, &cache, "cold", dir.path(), &env).await?;
            drop(w);
            let (w, warm) = start(&worker, &model, tp, &cache, "warm", dir.path(), &env).await?;
            drop(w);
            emit(
                json!({"metric": "load_ms", "tp": tp, "rep": rep, "cold_ms": cold.load_time_ms, "warm_ms": warm.load_time_ms,
                "cold_over_warm": cold.load_time_ms as f64 / warm.load_time_ms.max(1) as f64}),
            );
        }
        let (w, info) = start(&worker, &model, tp, &cache, "warm", dir.path(), &env).await?;
        let kv_budget_mb = info
            .kv_cache
            .map_or(0.0, |k| k.budget_bytes as f64 / 1048576.0);
        // Warm-up: first-request effects are not what we measure.
        stream(w.socket.clone(), PROMPTS[0], 8).await?;
        for rep in 0..repeats {
            let (n, f) = stream(w.socket.clone(), PROMPTS[0], tokens).await?;
            let t = f.timings.unwrap_or_default();
            emit(
                json!({"metric": "single_stream", "tp": tp, "rep": rep, "tokens": n,
                "decode_tok_s": (n.saturating_sub(1)) as f64 / (t.decode_us.max(1) as f64 / 1e6),
                "ttft_ms": t.time_to_first_token_us as f64 / 1e3}),
            );
        }
        for &streams in &stream_counts {
            for rep in 0..repeats {
                let t0 = Instant::now();
                let tasks: Vec<_> = (0..streams)
                    .map(|i| {
                        tokio::spawn(stream(w.socket.clone(), PROMPTS[i % PROMPTS.len()], tokens))
                    })
                    .collect();
                let mut total = 0;
                for t in tasks {
                    total += t.await??.0;
                }
                let wall = t0.elapsed().as_secs_f64();
                emit(
                    json!({"metric": "aggregate", "tp": tp, "streams": streams, "rep": rep, "tokens": total, "wall_s": wall,
                    "tok_s": total as f64 / wall}),
                );
            }
        }
        // Prefill: a unique prompt (nothing cached), then the same prompt
        // again (all but its tail from the prefix cache), one token out.
        for &len in &prefill_lens {
            for rep in 0..repeats {
                let nonce = 1000 * len as u64 + rep as u64 + 7919 * tp as u64;
                let prompt: &'static str = Box::leak(long_prompt(len, nonce).into_boxed_str());
                for (phase, expect_cached) in [("unique", false), ("repeated", true)] {
                    let t0 = Instant::now();
                    let (_, f) = stream(w.socket.clone(), prompt, 1).await?;
                    let wall = t0.elapsed().as_secs_f64();
                    let t = f.timings.unwrap_or_default();
                    let prompt_tokens = f.usage.map_or(0, |u| u.prompt_tokens);
                    let ttft_s = t.time_to_first_token_us as f64 / 1e6;
                    emit(
                        json!({"metric": "prefill", "tp": tp, "rep": rep, "prompt_words": len,
                        "phase": phase, "prompt_tokens": prompt_tokens,
                        "cached_tokens": t.cached_prompt_tokens, "expect_cached": expect_cached,
                        "ttft_ms": ttft_s * 1e3, "request_ms": wall * 1e3,
                        "prefill_tok_s": prompt_tokens as f64 / ttft_s.max(1e-9)}),
                    );
                }
            }
        }
        let rss = peak_rss_kb(w.child.id());
        emit(
            json!({"metric": "peak_rss", "tp": tp, "peak_rss_mb": rss as f64 / 1024.0, "gguf_mb": gguf_bytes as f64 / 1048576.0,
            "rss_over_gguf": rss as f64 * 1024.0 / gguf_bytes as f64, "kv_budget_mb": kv_budget_mb}),
        );
    }
    Ok(())
}
