//! Prefix reuse on a multi-turn chat workload, side by side in one run.
//!
//! The workload (`workload.rs`): a ~500-token system prompt shared by 8
//! conversations of 4 turns each, every turn resending the whole history,
//! streamed `/v1/chat/completions`, greedy, 32 tokens per answer
//! (`ignore_eos`). A round is the workload once, with a system prompt no
//! other round uses; arms take rounds in turn (A B C C B A ...), one arm at
//! a time, after one uncounted warm-up round each.
//!
//! - Comparison 1 (`--llama-server PATH`): the daemon's OpenAI port on
//!   `tt-worker` with its prefix cache, llama.cpp's `llama-server` on its
//!   own port with its prompt cache, and the daemon on `tt-worker` with
//!   `TTW_PREFIX_CACHE=0` (what the cache itself buys). Without
//!   `--llama-server` the daemon's two arms run alone.
//! - Comparison 2 (`--replicas`): two daemons, each with two TP=1
//!   replicas of the model, `prefix_affinity = true` against `false`.
//!
//! Layout: `workload.rs` (what is sent, one round), `client.rs` (the
//! streamed chat turn), `llama.rs` (llama-server as a child process),
//! `report.rs` (the figures). Prints a table and appends one JSON line per
//! comparison to `--out`.

mod client;
mod llama;
mod report;
mod workload;

use clap::Parser;
use client::{get, prompt_tokens, HttpClient};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use report::{CounterDelta, Round, Summary};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use tt_serving_tests::{bin, tiny_model, Daemon, DaemonOptions, FakeHw};
use workload::{run_round, system_prompt, Shape, Target};

#[derive(Parser)]
struct Args {
    /// The GGUF to serve (default: $TT_SMOLLM2_GGUF, else the tiny test model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Comparison 1 against llama.cpp's llama-server (this binary).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// llama-server's compute threads (`-t`); tt-worker takes both cores of
    /// this 2-core machine by default, and so does llama-server with 2.
    #[arg(long, default_value_t = 2)]
    llama_threads: u32,
    /// Run comparison 2 (two replicas, prefix affinity on against off)
    /// instead of comparison 1.
    #[arg(long)]
    replicas: bool,
    /// Compute threads per replica in comparison 2 (`CANDLE_NUM_THREADS`):
    /// 1 splits a 2-core machine between the two replicas.
    #[arg(long, default_value_t = 1)]
    replica_threads: u32,
    /// Counted rounds per arm (each arm also runs one warm-up round).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Concurrent conversations per round.
    #[arg(long, default_value_t = 8)]
    conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Tokens per answer (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// JSON-lines file to append results to.
    #[arg(long, default_value = "bench/chat/results.jsonl")]
    out: PathBuf,
}

/// One side of a comparison.
struct Arm {
    /// Its name in the table and the record.
    name: &'static str,
    /// Where its requests go.
    target: Target,
    /// A daemon's metrics endpoint, for the cached-token counters.
    metrics: Option<String>,
    /// Its configuration, for the record.
    config: Value,
}

/// A daemon started for the bench, with its fake cards.
struct BenchDaemon {
    daemon: Daemon,
    _hw: FakeHw,
    /// `http://` address of its OpenAI port.
    openai: String,
    /// `http://` address of its metrics port.
    metrics: String,
}

impl BenchDaemon {
    /// A daemon on `cards` fake cards serving `tables`; returns once every
    /// slot in `slots` is Ready.
    fn start(cards: usize, tables: &str, slots: &[String]) -> BenchDaemon {
        let hw = FakeHw::new(cards);
        let daemon = Daemon::start(
            &hw,
            DaemonOptions {
                extra: format!("[openai]\nlisten = \"127.0.0.1:0\"\n{tables}"),
                ..Default::default()
            },
        );
        for slot in slots {
            daemon.wait_slot_state(slot, "ready");
        }
        let status = daemon.status();
        let address = |key: &str| {
            format!(
                "http://{}",
                status["daemon"][key].as_str().unwrap_or_default()
            )
        };
        BenchDaemon {
            openai: address("openai_address"),
            metrics: address("metrics_address"),
            daemon,
            _hw: hw,
        }
    }
}

/// A `[models.NAME]` table for `tt-worker` on the given replicas (one fake
/// card each, TP=1); `extra` lines go inside the table.
fn tt_worker_table(name: &str, model: &Path, replicas: &[usize], extra: &str) -> String {
    let cards = if let [card] = replicas {
        format!("cards = [\"{}\"]", FakeHw::bdf(*card))
    } else {
        let sets: Vec<String> = replicas
            .iter()
            .map(|c| format!("[\"{}\"]", FakeHw::bdf(*c)))
            .collect();
        format!("replicas = [{}]", sets.join(", "))
    };
    format!(
        "\n[models.{name}]\ntp = 1\n{cards}\ncheckpoint = \"{}\"\nworker = [\"{}\"]\nmax_in_flight = 8\n{extra}\n",
        model.display(),
        bin("tt-worker").display(),
    )
}

/// The load average when the driver started (the machine is shared).
static LOAD_AT_START: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

fn loadavg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.trim().to_string())
}

fn main() {
    let args = Args::parse();
    LOAD_AT_START.get_or_init(loadavg);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let model = args
        .model
        .clone()
        .or_else(|| std::env::var_os("TT_SMOLLM2_GGUF").map(PathBuf::from))
        .unwrap_or_else(|| tiny_model(work.path()));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let shape = Shape {
        conversations: args.conversations,
        turns: args.turns,
        max_tokens: args.max_tokens,
    };
    let record = if args.replicas {
        rt.block_on(compare_affinity(&args, &client, &model, shape))
    } else {
        rt.block_on(compare_engines(&args, &client, &model, shape, work.path()))
    };
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .expect("results file");
    writeln!(out, "{record}").expect("write result");
    println!("appended to {}", args.out.display());
}

/// Comparison 1: the daemon with the prefix cache, llama-server, the
/// daemon without the prefix cache.
async fn compare_engines(
    args: &Args,
    client: &HttpClient,
    model: &Path,
    shape: Shape,
    work: &Path,
) -> Value {
    let worker_env = "env = { TT_WORKER_MAX_BATCH = \"8\" }";
    let tables = format!(
        "{}{}",
        tt_worker_table(
            "chat",
            model,
            &[0],
            &format!("flags = {{ TTW_PREFIX_CACHE = \"1\" }}\n{worker_env}")
        ),
        tt_worker_table(
            "chat-nocache",
            model,
            &[1],
            &format!("flags = {{ TTW_PREFIX_CACHE = \"0\" }}\n{worker_env}")
        ),
    );
    let daemon = BenchDaemon::start(2, &tables, &["chat".into(), "chat-nocache".into()]);
    let worker_config = |cache: &str| {
        json!({
            "engine": "tt-worker", "tp": 1, "cards": 1, "max_in_flight": 8,
            "TT_WORKER_MAX_BATCH": 8, "TTW_PREFIX_CACHE": cache,
            "TTW_KV_BUDGET_MIB": "default (512)", "threads": "default (all cores)",
        })
    };
    let mut arms = vec![Arm {
        name: "daemon",
        target: Target {
            base: daemon.openai.clone(),
            model: "chat".into(),
        },
        metrics: Some(daemon.metrics.clone()),
        config: worker_config("1"),
    }];
    // Started on this (the main) thread: llama-server dies with it.
    let llama = match &args.llama_server {
        Some(binary) => Some(
            llama::LlamaServer::start(
                client,
                binary,
                model,
                args.llama_threads,
                &work.join("llama-server.log"),
            )
            .await,
        ),
        None => None,
    };
    if let Some(server) = &llama {
        arms.push(Arm {
            name: "llama-server",
            target: Target {
                base: server.base.clone(),
                model: "chat".into(),
            },
            metrics: None,
            config: json!({
                "engine": "llama-server", "version": server.version,
                "flags": server.flags, "threads": args.llama_threads,
            }),
        });
    }
    arms.push(Arm {
        name: "daemon, no prefix cache",
        target: Target {
            base: daemon.openai.clone(),
            model: "chat-nocache".into(),
        },
        metrics: Some(daemon.metrics.clone()),
        config: worker_config("0"),
    });

    let system_tokens = system_prompt_tokens(client, &arms).await;
    let (order, summaries) = run_arms(client, &arms, shape, args.rounds).await;
    let find = |name: &str| summaries.iter().find(|s| s.name == name);
    let on = find("daemon").expect("the daemon arm");
    let off = find("daemon, no prefix cache").expect("the no-cache arm");
    let (cache_ttft, cache_tok_s) = (
        on.later_p50() / off.later_p50(),
        on.tok_s_median() / off.tok_s_median(),
    );
    let mut ratios = json!({
        "ttft_later_p50_cache_on_over_off": cache_ttft,
        "tok_s_cache_on_over_off": cache_tok_s,
    });
    let mut lines = vec![format!(
        "daemon, prefix cache on / off: TTFT p50 turns 2-4 {cache_ttft:.3}, tok/s {cache_tok_s:.3}"
    )];
    if let Some(base) = find("llama-server") {
        let ttft = on.later_p50() / base.later_p50();
        let tok_s = on.tok_s_median() / base.tok_s_median();
        ratios["ttft_later_p50_daemon_over_llama"] = json!(ttft);
        ratios["tok_s_daemon_over_llama"] = json!(tok_s);
        ratios["targets_met"] =
            json!({ "ttft_later_p50_le_1": ttft <= 1.0, "tok_s_gt_1": tok_s > 1.0 });
        lines.insert(
            0,
            format!(
                "daemon / llama-server: TTFT p50 turns 2-4 {ttft:.3} (target <= 1.0, {}), tok/s {tok_s:.3} (target > 1.0, {})",
                met(ttft <= 1.0),
                met(tok_s > 1.0)
            ),
        );
    }
    print_table("prefix reuse, multi-turn chat", &summaries, &lines);
    drop(llama);
    record(
        "chat_prefix_reuse",
        args,
        model,
        shape,
        &arms,
        &order,
        &summaries,
        ratios,
        system_tokens,
    )
}

/// Comparison 2: two replicas with prefix affinity against two without.
async fn compare_affinity(args: &Args, client: &HttpClient, model: &Path, shape: Shape) -> Value {
    let start = |affinity: bool| {
        let extra = format!(
            "prefix_affinity = {affinity}\nenv = {{ TT_WORKER_MAX_BATCH = \"8\", CANDLE_NUM_THREADS = \"{}\" }}",
            args.replica_threads
        );
        BenchDaemon::start(
            2,
            &tt_worker_table("chat", model, &[0, 1], &extra),
            &["chat/0".into(), "chat/1".into()],
        )
    };
    let (with, without) = (start(true), start(false));
    let arm = |name, daemon: &BenchDaemon, affinity: bool| Arm {
        name,
        target: Target {
            base: daemon.openai.clone(),
            model: "chat".into(),
        },
        metrics: Some(daemon.metrics.clone()),
        config: json!({
            "engine": "tt-worker", "tp": 1, "replicas": 2, "prefix_affinity": affinity,
            "max_in_flight_per_replica": 8, "TT_WORKER_MAX_BATCH": 8,
            "TTW_PREFIX_CACHE": "default (on)", "threads_per_replica": args.replica_threads,
        }),
    };
    let arms = vec![
        arm("affinity on", &with, true),
        arm("affinity off", &without, false),
    ];
    let system_tokens = system_prompt_tokens(client, &arms).await;
    let (order, summaries) = run_arms(client, &arms, shape, args.rounds).await;
    let (on, off) = (&summaries[0], &summaries[1]);
    let (ttft, tok_s) = (
        on.later_p50() / off.later_p50(),
        on.tok_s_median() / off.tok_s_median(),
    );
    let ratios = json!({ "ttft_later_p50_on_over_off": ttft, "tok_s_on_over_off": tok_s });
    let lines = vec![format!(
        "affinity on / off: TTFT p50 turns 2-4 {ttft:.3}, tok/s {tok_s:.3}"
    )];
    print_table("prefix affinity, two replicas", &summaries, &lines);
    for (daemon, name) in [(&with, "affinity on"), (&without, "affinity off")] {
        let slots: Vec<String> = daemon.daemon.status()["slots"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| format!("{} {}", s["name"], s["state"]))
            .collect();
        println!("{name}: slots {}", slots.join(", "));
    }
    record(
        "chat_prefix_affinity",
        args,
        model,
        shape,
        &arms,
        &order,
        &summaries,
        ratios,
        system_tokens,
    )
}

/// The arms' rounds: one warm-up each, then `rounds` each in a rotating
/// order (A B C, C B A, A B C, ...) so the machine's drift hits every arm
/// alike. Returns the order of the counted rounds and each arm's summary.
async fn run_arms(
    client: &HttpClient,
    arms: &[Arm],
    shape: Shape,
    rounds: usize,
) -> (Vec<&'static str>, Vec<Summary>) {
    let mut order: Vec<usize> = (0..arms.len()).collect();
    for block in 0..rounds {
        let mut arms_in_block: Vec<usize> = (0..arms.len()).collect();
        if block % 2 == 1 {
            arms_in_block.reverse();
        }
        order.extend(arms_in_block);
    }
    let mut counted: Vec<Vec<Round>> = arms.iter().map(|_| Vec::new()).collect();
    for (position, &i) in order.iter().enumerate() {
        // Round ids start at 1; the token count probe used 0.
        let id = position + 1;
        let arm = &arms[i];
        let before = prompt_counters(client, arm).await;
        let sample = run_round(client, &arm.target, shape, id).await;
        let after = prompt_counters(client, arm).await;
        let metrics = before
            .zip(after)
            .map(|((c0, p0), (c1, p1))| (c1 - c0, p1 - p0));
        let warm_up = position < arms.len();
        eprintln!(
            "round {id:>2} {:<24} {:>6.2} s{}",
            arm.name,
            sample.wall.as_secs_f64(),
            if warm_up { " (warm-up)" } else { "" }
        );
        if !warm_up {
            counted[i].push(Round {
                id,
                position,
                sample,
                metrics,
            });
        }
    }
    let names = order[arms.len()..].iter().map(|&i| arms[i].name).collect();
    let summaries = arms
        .iter()
        .zip(&counted)
        .map(|(arm, rounds)| Summary::of(arm.name, rounds))
        .collect();
    (names, summaries)
}

/// A daemon's prompt-token counters for the arm's model: (cached, all),
/// when its metrics have a cached-prompt-token counter.
async fn prompt_counters(client: &HttpClient, arm: &Arm) -> CounterDelta {
    let (_, text) = get(client, &format!("{}/metrics", arm.metrics.as_ref()?)).await?;
    let label = format!("model=\"{}\"", arm.target.model);
    let (mut cached, mut all) = (None::<u64>, 0u64);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = name.split('{').next().unwrap_or_default();
        if !metric.ends_with("prompt_tokens_total") || !name.contains(&label) {
            continue;
        }
        let value = value.parse::<f64>().unwrap_or(0.0) as u64;
        if metric.contains("cached") {
            *cached.get_or_insert(0) += value;
        } else {
            all += value;
        }
    }
    cached.map(|c| (c, all))
}

/// The system prompt's length in tokens as each arm's server counts it
/// (no chat template around it).
async fn system_prompt_tokens(client: &HttpClient, arms: &[Arm]) -> Value {
    let text = system_prompt(0);
    let mut counts = serde_json::Map::new();
    for arm in arms {
        let n = prompt_tokens(client, &arm.target, &text).await;
        println!("system prompt: {n} tokens ({})", arm.name);
        counts.insert(arm.name.into(), json!(n));
    }
    Value::Object(counts)
}

fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "missed"
    }
}

fn print_table(title: &str, summaries: &[Summary], ratios: &[String]) {
    println!("\n{title}\n{}", report::header());
    for s in summaries {
        println!("{}", s.row());
    }
    for line in ratios {
        println!("{line}");
    }
}

/// The comparison's JSON line.
#[allow(clippy::too_many_arguments)]
fn record(
    bench: &str,
    args: &Args,
    model: &Path,
    shape: Shape,
    arms: &[Arm],
    order: &[&str],
    summaries: &[Summary],
    ratios: Value,
    system_tokens: Value,
) -> Value {
    let per_arm: serde_json::Map<String, Value> = summaries
        .iter()
        .map(|s| (s.name.clone(), s.json()))
        .collect();
    let configs: serde_json::Map<String, Value> = arms
        .iter()
        .map(|a| (a.name.to_string(), a.config.clone()))
        .collect();
    json!({
        "bench": bench,
        "model": model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "workload": {
            "conversations": shape.conversations, "turns": shape.turns,
            "max_tokens": shape.max_tokens, "ignore_eos": true, "temperature": 0,
            "stream": true, "include_usage": true,
            "system_prompt_tokens": system_tokens,
            "system_prompt_unique_per_round": true,
        },
        "arms": configs,
        "rounds_per_arm": args.rounds,
        "warmup_rounds_per_arm": 1,
        "order": order,
        "results": per_arm,
        "ratios": ratios,
        "percentiles": "nearest rank over every request of the counted rounds; tok/s: median of rounds",
        "host": host(),
        "commit": commit(),
        "daemon_version": env!("CARGO_PKG_VERSION"),
        "unix_ms": tt_servingd::clock::unix_ms(std::time::SystemTime::now()),
    })
}

/// The machine, for the record: CPU model, cores, load average.
fn host() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "loadavg_at_start": LOAD_AT_START.get().cloned().flatten(),
        "loadavg_at_end": loadavg(),
    })
}

/// `git describe --always --dirty` of the working tree, if there is one.
fn commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
