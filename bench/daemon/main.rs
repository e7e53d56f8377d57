//! Daemon benchmarks, each measured side by side in one run:
//!
//! - routing overhead: the same requests sent straight to a slot's worker
//!   socket and through the daemon, alternating, single stream and 8
//!   concurrent streams;
//! - recovery: `kill -9` of a worker until the slot is Ready again, split
//!   into detect, backoff, reset+proof, load and verify;
//! - startup: time to Ready for a cold start and then a warm start.
//!
//! Prints ratios and appends one JSON line per measurement, with the
//! configuration that produced it, to `--out`.

use clap::Parser;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use tt_bench::{grpc, stats};
use tt_serving_proto::v1 as pb;
use tt_serving_tests::{model_table, wait_until, Daemon, DaemonOptions, FakeHw};

#[derive(Parser)]
struct Args {
    /// The GGUF to serve (default: $TT_SMOLLM2_GGUF, else the tiny test model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens per request.
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// Requests per arm in the single-stream comparison.
    #[arg(long, default_value_t = 8)]
    requests: usize,
    /// Repeats of the recovery measurement.
    #[arg(long, default_value_t = 3)]
    recoveries: usize,
    /// JSON-lines file to append results to.
    #[arg(long, default_value = "bench/daemon/results.jsonl")]
    out: PathBuf,
}

/// One streamed request's client-side timings.
type Sample = grpc::Answer;

/// Straight to the worker's Engine service on its socket.
async fn stream_direct(socket: &std::path::Path, prompt: &str, tokens: u32) -> Sample {
    let channel = tt_serving_proto::uds::channel(socket)
        .await
        .expect("worker socket");
    let mut engine = pb::engine_client::EngineClient::new(channel);
    let request = pb::EngineGenerateRequest {
        request: Some(grpc::prompt_request(prompt, tokens, false)),
        request_id: "bench".into(),
    };
    let start = Instant::now();
    let stream = engine
        .generate(request)
        .await
        .expect("direct generate")
        .into_inner();
    grpc::read(stream, start).await
}

/// Through the daemon's public port, a new connection each.
async fn stream_routed(address: &str, prompt: &str, tokens: u32) -> Sample {
    let channel = grpc::connect(address).await;
    grpc::generate(channel, grpc::prompt_request(prompt, tokens, false)).await
}

/// The `p` quantile (0..=1) by nearest rank, ttctl's definition.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    stats::quantile(values, p)
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let (model, model_name) = tt_bench::host::model(args.model.as_deref(), work.path());
    let host = tt_card_lock::procs::cpu_model().unwrap_or_default();
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .expect("results file");
    let mut record = |value: serde_json::Value| {
        let mut line = value;
        line["model"] = json!(model_name);
        line["host_cpu"] = json!(host);
        line["unix_ms"] = json!(tt_serving_proto::time::unix_ms(std::time::SystemTime::now()));
        writeln!(out, "{line}").expect("write result");
    };

    // Startup: cold, then warm, on a fresh cache.
    let hw = FakeHw::new(1);
    let extra = "[models.m.restart]\nbackoff_ms = 1\n";
    let opts = DaemonOptions {
        extra: model_table("m", 1, &[0], &model, extra),
        ..Default::default()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut daemon = Daemon::configure(&hw, dir.path(), &opts);
    let t = Instant::now();
    daemon.spawn(&[]);
    daemon.wait_slot_state("m", "ready");
    let cold = t.elapsed();
    daemon.terminate();
    let t = Instant::now();
    daemon.spawn(&[]);
    let slot = daemon.wait_slot_state("m", "ready");
    let warm = t.elapsed();
    assert_eq!(slot["cache_mode"], "warm");
    println!(
        "startup: cold {:.0} ms, warm {:.0} ms, cold/warm {:.2}x",
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        cold.as_secs_f64() / warm.as_secs_f64()
    );
    record(
        json!({"bench": "startup", "cold_ms": cold.as_secs_f64() * 1e3, "warm_ms": warm.as_secs_f64() * 1e3, "ratio": cold.as_secs_f64() / warm.as_secs_f64()}),
    );

    // Routing overhead: alternate direct and routed on the same worker.
    let socket = daemon.worker_socket("m");
    let address = daemon.inference_address();
    let (mut direct, mut routed) = (Vec::new(), Vec::new());
    rt.block_on(async {
        // Warm-up: first requests compile nothing here, but fill caches.
        stream_direct(&socket, "warm up", 8).await;
        stream_routed(&address, "warm up", 8).await;
        for i in 0..args.requests {
            let prompt = format!("Request {i}: tell me about the sea");
            direct.push(stream_direct(&socket, &prompt, args.tokens).await);
            routed.push(stream_routed(&address, &prompt, args.tokens).await);
        }
    });
    let tps = |s: &[Sample]| {
        let tokens: usize = s.iter().map(|x| x.delta_tokens).sum();
        let secs: f64 = s.iter().map(|x| x.total.as_secs_f64()).sum();
        tokens as f64 / secs
    };
    let gaps = |s: &[Sample]| -> Vec<f64> {
        s.iter()
            .flat_map(|x| x.gaps.iter().map(|g| g.as_secs_f64() * 1e6))
            .collect()
    };
    let (mut gd, mut gr) = (gaps(&direct), gaps(&routed));
    let (d50, r50, d99, r99) = (
        percentile(&mut gd, 0.5),
        percentile(&mut gr, 0.5),
        percentile(&mut gd, 0.99),
        percentile(&mut gr, 0.99),
    );
    let ratio = tps(&routed) / tps(&direct);
    println!(
        "routing, 1 stream: direct {:.1} tok/s, routed {:.1} tok/s, ratio {:.3}; inter-token p50 {:.0} -> {:.0} us (+{:.0} us), p99 {:.0} -> {:.0} us",
        tps(&direct), tps(&routed), ratio, d50, r50, r50 - d50, d99, r99
    );
    record(
        json!({"bench": "routing", "streams": 1, "requests": args.requests, "tokens": args.tokens,
        "direct_tok_s": tps(&direct), "routed_tok_s": tps(&routed), "ratio": ratio,
        "itl_p50_direct_us": d50, "itl_p50_routed_us": r50, "itl_p99_direct_us": d99, "itl_p99_routed_us": r99}),
    );

    // 8 concurrent streams, direct then routed, twice (A B A B).
    let mut arms = [Vec::new(), Vec::new()];
    rt.block_on(async {
        for round in 0..4 {
            let routed_arm = round % 2 == 1;
            let start = Instant::now();
            let mut tasks = Vec::new();
            for i in 0..8 {
                let (socket, address) = (socket.clone(), address.clone());
                let tokens = args.tokens;
                tasks.push(tokio::spawn(async move {
                    let prompt = format!("Stream {i}: count the stars");
                    if routed_arm {
                        stream_routed(&address, &prompt, tokens).await
                    } else {
                        stream_direct(&socket, &prompt, tokens).await
                    }
                }));
            }
            let mut tokens = 0;
            for t in tasks {
                tokens += t.await.expect("stream task").delta_tokens;
            }
            arms[routed_arm as usize].push(tokens as f64 / start.elapsed().as_secs_f64());
        }
    });
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ratio8 = mean(&arms[1]) / mean(&arms[0]);
    println!(
        "routing, 8 streams: direct {:.1} tok/s, routed {:.1} tok/s, ratio {:.3}",
        mean(&arms[0]),
        mean(&arms[1]),
        ratio8
    );
    record(
        json!({"bench": "routing", "streams": 8, "tokens": args.tokens, "direct_tok_s": arms[0], "routed_tok_s": arms[1], "ratio": ratio8}),
    );

    // Recovery after kill -9, split by the slot's transitions.
    for _ in 0..args.recoveries {
        let (killed, seen) = rt.block_on(async {
            let channel = tt_serving_proto::uds::channel(&daemon.socket)
                .await
                .expect("control socket");
            let mut control = pb::control_client::ControlClient::new(channel);
            let mut watch = control
                .watch_status(pb::StatusRequest {})
                .await
                .expect("watch")
                .into_inner();
            let first = watch
                .message()
                .await
                .expect("first snapshot")
                .expect("a snapshot");
            // The worker serving now, from the same stream the transitions
            // come from.
            let pid = first.slots[0].worker_pid as i32;
            let killed = tt_serving_proto::time::unix_ms(std::time::SystemTime::now());
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("kill worker");
            let mut seen: Vec<(i32, u64)> = Vec::new();
            while let Ok(Some(status)) = watch.message().await {
                let slot = &status.slots[0];
                // Snapshots that still show the killed worker Ready are not
                // part of the recovery.
                if seen.is_empty() && slot.state == pb::SlotState::Ready as i32 {
                    continue;
                }
                if seen.last().map(|(s, _)| *s) != Some(slot.state) {
                    seen.push((slot.state, slot.since_unix_ms));
                }
                if slot.state == pb::SlotState::Ready as i32 && slot.worker_pid as i32 != pid {
                    break;
                }
            }
            (killed, seen)
        });
        // WatchStatus sends the latest snapshot, so a short state can be
        // skipped: a phase starts at the first state seen of its group.
        let at = |states: &[pb::SlotState]| {
            seen.iter()
                .find(|(s, _)| states.iter().any(|st| *st as i32 == *s))
                .map(|(_, t)| *t)
        };
        use pb::SlotState as S;
        let (failed, resetting, starting, verifying, ready) = (
            at(&[S::Failed]),
            at(&[S::Resetting, S::Probing]),
            at(&[S::Starting, S::Loading]),
            at(&[S::Verifying]),
            at(&[S::Ready]),
        );
        let span = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64,
            _ => f64::NAN,
        };
        let detect = span(Some(killed), failed);
        let backoff = span(failed, resetting);
        let reset = span(resetting, starting);
        let load = span(starting, verifying);
        let verify = span(verifying, ready);
        let total = span(Some(killed), ready);
        println!(
            "recovery: total {total:.0} ms = detect {detect:.0} + backoff {backoff:.0} + reset+proof {reset:.0} + load {load:.0} + verify {verify:.0}; daemon's share (detect + verify) {:.0} ms",
            detect + verify
        );
        record(
            json!({"bench": "recovery", "total_ms": total, "detect_ms": detect, "backoff_ms": backoff, "reset_proof_ms": reset, "load_ms": load, "verify_ms": verify, "fake_reset_delay_ms": 300, "heartbeat_interval_ms": 100}),
        );
        wait_until("slot ready", || {
            (daemon.slot("m")["state"] == "ready").then_some(())
        });
    }
    daemon.terminate();
}
