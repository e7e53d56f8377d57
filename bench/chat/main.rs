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
use report::{Counters, Round, Summary};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use tt_card_lock::procs;
use tt_serving_tests::{bin, Daemon, DaemonOptions, FakeHw};
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
    /// One more llama-server flag after the usual ones (repeatable; each
    /// value one argument, e.g. `--llama-arg=-kvu`): to see how another
    /// setting changes the picture. Recorded with the arm's flags.
    #[arg(long, allow_hyphen_values = true)]
    llama_arg: Vec<String>,
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
struct Arm<'a> {
    /// Its key in the record (a citation's path goes through it).
    key: &'static str,
    /// Its name in the table.
    name: &'static str,
    /// Where its requests go.
    target: Target,
    /// The daemon serving it, if one does (its metrics and slots).
    daemon: Option<&'a BenchDaemon>,
    /// Its configuration, for the record.
    config: Value,
}

impl Arm<'_> {
    /// The arm's slots in its daemon's status: name, worker pid (a change
    /// means a restart during the run; `ttctl status --json` leaves the
    /// start count out), engine, flags and requests served (how the
    /// replicas shared the work).
    fn slots(&self) -> Vec<Value> {
        let Some(daemon) = self.daemon else {
            return Vec::new();
        };
        daemon.daemon.status()["slots"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["model"] == self.target.model.as_str())
            .map(|s| {
                json!({
                    "slot": s["name"], "state": s["state"], "worker_pid": s["worker_pid"],
                    "engine_version": s["engine_version"],
                    "flags": s["flags"], "requests_served": s["requests_served"],
                    "generated_tokens": s["generated_tokens"],
                })
            })
            .collect()
    }
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
static LOAD_AT_START: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();

fn main() {
    let args = Args::parse();
    LOAD_AT_START.get_or_init(procs::loadavg);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let (model, _) = tt_bench::host::model(args.model.as_deref(), work.path());
    let client: HttpClient = tt_bench::http::client();
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
    let daemon_arm = |key, name, model: &str, cache| Arm {
        key,
        name,
        target: Target {
            base: daemon.openai.clone(),
            model: model.into(),
        },
        daemon: Some(&daemon),
        config: worker_config(cache),
    };
    let mut arms = vec![daemon_arm("daemon", "daemon", "chat", "1")];
    // Started on this (the main) thread: llama-server dies with it.
    let llama = match &args.llama_server {
        Some(binary) => Some(
            llama::LlamaServer::start(
                client,
                binary,
                model,
                args.llama_threads,
                &args.llama_arg,
                &work.join("llama-server.log"),
            )
            .await,
        ),
        None => None,
    };
    if let Some(server) = &llama {
        arms.push(Arm {
            key: "llama_server",
            name: "llama-server",
            target: Target {
                base: server.base.clone(),
                model: "chat".into(),
            },
            daemon: None,
            config: json!({
                "engine": "llama-server", "version": server.version,
                "flags": server.flags, "threads": args.llama_threads,
                "per_slot_context": LLAMA_SLOT_CONTEXT,
            }),
        });
    }
    arms.push(daemon_arm(
        "daemon_nocache",
        "daemon, no prefix cache",
        "chat-nocache",
        "0",
    ));

    let run = run_arms(client, &arms, shape, args.rounds).await;
    let find = |key: &str| run.summaries.iter().find(|s| s.key == key);
    let on = find("daemon").expect("the daemon arm");
    let off = find("daemon_nocache").expect("the no-cache arm");
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
    let mut problems = Vec::new();
    if let Some(base) = find("llama_server") {
        let ttft = on.later_p50() / base.later_p50();
        let tok_s = on.tok_s_median() / base.tok_s_median();
        ratios["ttft_later_p50_daemon_over_llama"] = json!(ttft);
        ratios["tok_s_daemon_over_llama"] = json!(tok_s);
        ratios["targets"] = json!({
            "ttft_later_p50_daemon_over_llama": "<= 1.0", "tok_s_daemon_over_llama": "> 1.0",
        });
        ratios["targets_met"] = json!({
            "ttft_later_p50_daemon_over_llama": ttft <= 1.0, "tok_s_daemon_over_llama": tok_s > 1.0,
        });
        lines.insert(
            0,
            format!(
                "daemon / llama-server: TTFT p50 turns 2-4 {ttft:.3} (target <= 1.0, {}), tok/s {tok_s:.3} (target > 1.0, {})",
                met(ttft <= 1.0),
                met(tok_s > 1.0)
            ),
        );
        // Beyond its slot's context llama-server would shift or refuse.
        let longest = base.prompt_tokens.1 + shape.max_tokens;
        if longest > LLAMA_SLOT_CONTEXT {
            problems.push(format!(
                "llama-server's longest turn needs {longest} tokens, more than its {LLAMA_SLOT_CONTEXT}-token slots"
            ));
        }
    }
    print_table("prefix reuse, multi-turn chat", &run.summaries, &lines);
    drop(llama);
    record(
        "chat_prefix_reuse",
        args,
        model,
        shape,
        &arms,
        run,
        ratios,
        problems,
    )
}

/// llama-server's context per slot: `-c 8192` over `-np 8`.
const LLAMA_SLOT_CONTEXT: u32 = 8192 / 8;

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
    let arms = vec![
        replica_arm(
            "affinity_on",
            "affinity on",
            &with,
            true,
            args.replica_threads,
        ),
        replica_arm(
            "affinity_off",
            "affinity off",
            &without,
            false,
            args.replica_threads,
        ),
    ];
    let run = run_arms(client, &arms, shape, args.rounds).await;
    let (on, off) = (&run.summaries[0], &run.summaries[1]);
    let (ttft, tok_s) = (
        on.later_p50() / off.later_p50(),
        on.tok_s_median() / off.tok_s_median(),
    );
    let ratios = json!({ "ttft_later_p50_on_over_off": ttft, "tok_s_on_over_off": tok_s });
    let lines = vec![format!(
        "affinity on / off: TTFT p50 turns 2-4 {ttft:.3}, tok/s {tok_s:.3}"
    )];
    print_table("prefix affinity, two replicas", &run.summaries, &lines);
    for s in &run.summaries {
        if let Some(m) = &s.metrics {
            println!(
                "{}: routed by affinity {} (affine) / {} (fallback); prompt tokens by slot {:?}",
                s.name, m.affine, m.fallback, m.queries
            );
        }
    }
    record(
        "chat_prefix_affinity",
        args,
        model,
        shape,
        &arms,
        run,
        ratios,
        Vec::new(),
    )
}

/// An arm of comparison 2: `daemon`'s two replicas of `chat`.
fn replica_arm<'a>(
    key: &'static str,
    name: &'static str,
    daemon: &'a BenchDaemon,
    affinity: bool,
    threads: u32,
) -> Arm<'a> {
    Arm {
        key,
        name,
        target: Target {
            base: daemon.openai.clone(),
            model: "chat".into(),
        },
        daemon: Some(daemon),
        config: json!({
            "engine": "tt-worker", "tp": 1, "replicas": 2, "prefix_affinity": affinity,
            "max_in_flight_per_replica": 8, "TT_WORKER_MAX_BATCH": 8,
            "TTW_PREFIX_CACHE": "default (on)", "threads_per_replica": threads,
        }),
    }
}

/// What [`run_arms`] measured.
struct Run {
    /// The system prompt's length per arm (key to tokens).
    system_tokens: serde_json::Map<String, Value>,
    /// The counted rounds' arms, in the order they ran.
    order: Vec<&'static str>,
    /// Each arm's figures, in the arms' order.
    summaries: Vec<Summary>,
    /// Each arm's slots before the first round and after the last.
    slots: Vec<(Vec<Value>, Vec<Value>)>,
}

/// The arms' rounds: one warm-up each, then `rounds` each in a rotating
/// order (A B C, C B A, A B C, ...) so the machine's drift hits every arm
/// alike.
async fn run_arms(client: &HttpClient, arms: &[Arm<'_>], shape: Shape, rounds: usize) -> Run {
    let system_tokens = system_prompt_tokens(client, arms).await;
    let slots_before: Vec<Vec<Value>> = arms.iter().map(Arm::slots).collect();
    let order = rotation(arms.len(), rounds);
    let mut counted: Vec<Vec<Round>> = arms.iter().map(|_| Vec::new()).collect();
    for (position, &i) in order.iter().enumerate() {
        // Round ids start at 1; the token count probe used 0.
        let id = position + 1;
        let arm = &arms[i];
        let before = counters(client, arm).await;
        let sample = run_round(client, &arm.target, shape, id).await;
        let after = counters(client, arm).await;
        let metrics = before.zip(after).map(|(b, a)| b.delta(&a));
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
    Run {
        system_tokens,
        order: order[arms.len()..].iter().map(|&i| arms[i].key).collect(),
        summaries: arms
            .iter()
            .zip(&counted)
            .map(|(arm, rounds)| Summary::of(arm.key, arm.name, rounds))
            .collect(),
        slots: slots_before
            .into_iter()
            .zip(arms.iter().map(Arm::slots))
            .collect(),
    }
}

/// The order rounds run in: one warm-up per arm (0, 1, ..., n-1), then
/// `rounds` blocks of every arm, every other block reversed.
fn rotation(arms: usize, rounds: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..arms).collect();
    for block in 0..rounds {
        let mut arms_in_block: Vec<usize> = (0..arms).collect();
        if block % 2 == 1 {
            arms_in_block.reverse();
        }
        order.extend(arms_in_block);
    }
    order
}

/// The arm's daemon's counters for its model, when its metrics have the
/// prefix cache's.
async fn counters(client: &HttpClient, arm: &Arm<'_>) -> Option<Counters> {
    let url = format!("{}/metrics", arm.daemon?.metrics);
    let (_, text) = get(client, &url).await?;
    parse_counters(&text, &arm.target.model)
}

/// `model`'s counters in a Prometheus text exposition; None when the
/// daemon has no prefix cache counters at all (a series appears with its
/// first request; the `# TYPE` line says the daemon has the metric).
fn parse_counters(text: &str, model: &str) -> Option<Counters> {
    if !text.contains("# TYPE tt_serving_prefix_cache_hits counter") {
        return None;
    }
    let model = format!("model=\"{model}\"");
    let mut counters = Counters::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        if !labels.contains(&model) {
            continue;
        }
        let value = value.parse::<f64>().unwrap_or(0.0) as u64;
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches(['"', '}']).to_string())
        };
        match name {
            "tt_serving_prefix_cache_hits_total" => counters.hits += value,
            "tt_serving_prefix_cache_queries_total" => {
                *counters
                    .queries
                    .entry(label("slot").unwrap_or_default())
                    .or_default() += value;
            }
            "tt_serving_affinity_routed_total" => match label("outcome").as_deref() {
                Some("affine") => counters.affine += value,
                _ => counters.fallback += value,
            },
            _ => {}
        }
    }
    Some(counters)
}

/// The system prompt's length in tokens as each arm's server counts it
/// (no chat template around it).
async fn system_prompt_tokens(
    client: &HttpClient,
    arms: &[Arm<'_>],
) -> serde_json::Map<String, Value> {
    let text = system_prompt(0);
    let mut counts = serde_json::Map::new();
    for arm in arms {
        let n = prompt_tokens(client, &arm.target, &text).await;
        println!("system prompt: {n} tokens ({})", arm.name);
        counts.insert(arm.key.into(), json!(n));
    }
    counts
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

/// Why a run's figures should not be trusted, beyond `found` (what the
/// comparison itself checked): answers of another length than asked, arms
/// whose servers count the workload's tokens differently, a daemon slot
/// that restarted during the run.
fn invalid_reasons(shape: Shape, arms: &[Arm<'_>], run: &Run, found: Vec<String>) -> Vec<String> {
    let mut reasons = found;
    for s in &run.summaries {
        if s.completion_tokens != (shape.max_tokens, shape.max_tokens) {
            reasons.push(format!(
                "{}: answers of {}-{} tokens, not {} each",
                s.key, s.completion_tokens.0, s.completion_tokens.1, shape.max_tokens
            ));
        }
    }
    let counts: Vec<u64> = run
        .system_tokens
        .values()
        .filter_map(Value::as_u64)
        .collect();
    let (low, high) = (counts.iter().min(), counts.iter().max());
    if let (Some(&low), Some(&high)) = (low, high) {
        if high as f64 > low as f64 * 1.05 {
            reasons.push(format!(
                "the arms count the system prompt as {low}-{high} tokens (more than 5% apart)"
            ));
        }
    }
    for (arm, (before, after)) in arms.iter().zip(&run.slots) {
        let identity = |slots: &[Value]| -> Vec<(Value, Value, Value)> {
            slots
                .iter()
                .map(|s| {
                    (
                        s["slot"].clone(),
                        s["worker_pid"].clone(),
                        s["starts"].clone(),
                    )
                })
                .collect()
        };
        if identity(before) != identity(after) {
            reasons.push(format!(
                "{}: a slot restarted during the run (its worker pid changed)",
                arm.key
            ));
        }
    }
    reasons
}

/// The comparison's JSON line.
#[allow(clippy::too_many_arguments)]
fn record(
    bench: &str,
    args: &Args,
    model: &Path,
    shape: Shape,
    arms: &[Arm<'_>],
    run: Run,
    ratios: Value,
    problems: Vec<String>,
) -> Value {
    let reasons = invalid_reasons(shape, arms, &run, problems);
    for reason in &reasons {
        println!("INVALID: {reason}");
    }
    let per_arm: serde_json::Map<String, Value> = run
        .summaries
        .iter()
        .map(|s| (s.key.clone(), s.json()))
        .collect();
    let configs: serde_json::Map<String, Value> = arms
        .iter()
        .zip(&run.slots)
        .map(|(a, (before, after))| {
            let mut config = a.config.clone();
            config["name"] = json!(a.name);
            if a.daemon.is_some() {
                config["slots_before"] = json!(before);
                config["slots_after"] = json!(after);
            }
            (a.key.to_string(), config)
        })
        .collect();
    let unix_ms = tt_serving_proto::time::unix_ms(std::time::SystemTime::now());
    let id = format!(
        "{:x}{:04x}-{}",
        unix_ms / 1000,
        std::process::id() & 0xffff,
        if args.replicas { "affinity" } else { "chat" }
    );
    println!("record {id}");
    json!({
        "id": id,
        "bench": bench,
        "valid": reasons.is_empty(),
        "invalid_reasons": reasons,
        "model": model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "workload": {
            "conversations": shape.conversations, "turns": shape.turns,
            "max_tokens": shape.max_tokens, "ignore_eos": true, "temperature": 0,
            "stream": true, "include_usage": true,
            "system_prompt_tokens": run.system_tokens,
            "system_prompt_unique_per_round": true,
        },
        "arms": configs,
        "rounds_per_arm": args.rounds,
        "warmup_rounds_per_arm": 1,
        "order": run.order,
        "results": per_arm,
        "ratios": ratios,
        "percentiles": "nearest rank over every request of the counted rounds; tok/s: median of rounds",
        "host": host(),
        "commit": commit(),
        "daemon_version": env!("CARGO_PKG_VERSION"),
        "unix_ms": unix_ms,
    })
}

/// The machine, for the record: CPU model, cores, load averages at the
/// start and now.
fn host() -> Value {
    let mut host = tt_bench::host::record();
    host["loadavg_at_start"] = json!(LOAD_AT_START.get().cloned().unwrap_or_default());
    host
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_rotate_so_none_always_runs_first() {
        assert_eq!(rotation(3, 2), vec![0, 1, 2, 0, 1, 2, 2, 1, 0]);
        assert_eq!(rotation(2, 3), vec![0, 1, 0, 1, 1, 0, 0, 1]);
    }

    #[test]
    fn counters_are_read_for_the_model_only() {
        let text = "# TYPE tt_serving_prefix_cache_hits counter\n\
            tt_serving_prefix_cache_hits_total{slot=\"chat/0\",model=\"chat\"} 500\n\
            tt_serving_prefix_cache_hits_total{slot=\"chat/1\",model=\"chat\"} 20\n\
            tt_serving_prefix_cache_hits_total{slot=\"other\",model=\"other\"} 7\n\
            tt_serving_prefix_cache_queries_total{slot=\"chat/0\",model=\"chat\"} 600\n\
            tt_serving_prefix_cache_queries_total{slot=\"chat/1\",model=\"chat\"} 550\n\
            tt_serving_affinity_routed_total{slot=\"chat/0\",model=\"chat\",outcome=\"affine\"} 3\n\
            tt_serving_affinity_routed_total{slot=\"chat/1\",model=\"chat\",outcome=\"fallback\"} 1\n";
        let c = parse_counters(text, "chat").unwrap();
        assert_eq!((c.hits, c.affine, c.fallback), (520, 3, 1));
        assert_eq!(c.queries["chat/0"], 600);
        assert_eq!(c.queries["chat/1"], 550);
        assert_eq!(
            parse_counters("# TYPE tt_serving_requests counter\n", "chat"),
            None
        );
    }
}
