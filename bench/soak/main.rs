//! Soak under chaos: a daemon with the tiny model on fake cards (a TP=1 and
//! a TP=2 slot), `--requests` requests at a fixed `--concurrency`, each with
//! a random length and deadline, some dropped by their client after a random
//! number of chunks, and a worker killed (SIGKILL) every `--kill-every`
//! requests. At the end every invariant of the chaos suite is checked (see
//! `tt_serving_tests::chaos_support`): every request ended, within its
//! deadline plus the stall timeout; the daemon's fds, threads and children
//! back to where they were; its RSS flat; no orphan worker; no stale lock; no
//! cache variant marked complete that is not; every request counted once in
//! the metrics; every kill visible as a restart.
//!
//! The clients do not retry and do not pace themselves: each of the
//! `--concurrency` clients sends its next request as soon as the previous
//! one ended, however it ended. Availability is the share of requests
//! answered in full among those whose client did not drop them on purpose
//! (`answered / (sent - client-cancelled)`); `answered_of_sent` is
//! `answered / sent`. `--recovery-wait-secs 0` runs the daemon without
//! waiting for recovering slots, for comparison.
//!
//! Prints a summary and appends one JSON line to `--out`. Exits 1 when an
//! invariant fails.

use clap::Parser;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tt_card_lock::procs;
use tt_serving_tests::chaos_support::{
    self as chaos, check_invariants, proc_counts, run_request, End, ProcCounts, RequestRecord,
    RequestSpec,
};
use tt_serving_tests::{model_table, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw};

#[derive(Parser)]
struct Args {
    /// Requests to send in all.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Kill a worker (alternating slots) every this many requests.
    #[arg(long, default_value_t = 300)]
    kill_every: usize,
    /// Share of requests the client drops mid-stream, in percent.
    #[arg(long, default_value_t = 15)]
    cancel_percent: u64,
    /// Shortest and longest random deadline, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    min_deadline_ms: u64,
    #[arg(long, default_value_t = 10000)]
    max_deadline_ms: u64,
    /// The model's restart.stall_timeout_secs.
    #[arg(long, default_value_t = 2)]
    stall_secs: u64,
    /// Random seed (the run is reproducible up to timing).
    #[arg(long, default_value_t = 6)]
    seed: u64,
    /// The models' recovery_wait_secs (0: requests do not wait for a
    /// recovering slot); unset: the daemon's default.
    #[arg(long)]
    recovery_wait_secs: Option<u64>,
    /// How long a card reset takes (the fake cards' `slow` fault), in
    /// milliseconds; unset: the fake root's default (300 ms). A longer reset
    /// makes each recovery longer, as on a busy machine or real cards.
    #[arg(long)]
    reset_delay_ms: Option<u64>,
    /// JSON-lines file to append the result to.
    #[arg(long, default_value = "bench/soak/results.jsonl")]
    out: PathBuf,
}

/// xorshift64*: enough randomness for load shapes, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

const MODELS: [&str; 2] = ["one", "two"];

fn counts_json(c: &ProcCounts) -> serde_json::Value {
    json!({"fds": c.fds, "threads": c.threads, "children": c.children, "rss_kib": c.rss_kib})
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let model = tiny_model(work.path());
    let hw = FakeHw::new(3);
    let restart = format!("backoff_ms = 50\nstall_timeout_secs = {}", args.stall_secs);
    let wait = args
        .recovery_wait_secs
        .map(|s| format!("recovery_wait_secs = {s}"))
        .unwrap_or_default();
    let section = |name: &str| format!("{wait}\n[models.{name}.restart]\n{restart}\n");
    if let Some(delay_ms) = args.reset_delay_ms {
        for card in 0..3 {
            hw.root
                .set_fault(&FakeHw::bdf(card), tt_fakehw::Fault::Slow { delay_ms })
                .expect("slow down the fake cards' resets");
        }
    }
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            // The reset has to fit within the come-back timeout.
            come_back_secs: 3 + args.reset_delay_ms.unwrap_or(0).div_ceil(1000),
            extra: model_table("one", 1, &[0], &model, &section("one"))
                + &model_table("two", 2, &[1, 2], &model, &section("two")),
            ..Default::default()
        },
    );
    for m in MODELS {
        daemon.wait_slot_state(m, "ready");
    }
    let base = chaos::baseline(&daemon);
    let start_counts = base.counts;
    let address = daemon.inference_address();
    let stall = Duration::from_secs(args.stall_secs);
    println!(
        "soak: {} requests, concurrency {}, a worker kill every {} requests, seed {}",
        args.requests, args.concurrency, args.kill_every, args.seed
    );

    let load_before = procs::loadavg();
    let issued = Arc::new(AtomicUsize::new(0));
    let records: Arc<Mutex<Vec<(String, RequestRecord)>>> = Arc::new(Mutex::new(Vec::new()));
    let began = Instant::now();
    let mut kills = Vec::new();
    let mut mid_counts = None;
    std::thread::scope(|scope| {
        // The load.
        let load = {
            let (issued, records, address) = (issued.clone(), records.clone(), address.clone());
            let (args, rt) = (&args, &rt);
            scope.spawn(move || {
                rt.block_on(async {
                    let mut tasks = Vec::new();
                    for task in 0..args.concurrency {
                        let (issued, records, address) =
                            (issued.clone(), records.clone(), address.clone());
                        let mut rng = Rng(args.seed.wrapping_mul(0x9e37_79b9) ^ (task as u64 + 1));
                        let (requests, cancel_percent) = (args.requests, args.cancel_percent);
                        let (lo, hi) = (args.min_deadline_ms, args.max_deadline_ms);
                        tasks.push(tokio::spawn(async move {
                            let mut channel = None;
                            while issued.fetch_add(1, Ordering::SeqCst) < requests {
                                let model = MODELS[(rng.next() % 2) as usize];
                                let cancel = rng.range(1, 100) <= cancel_percent;
                                let spec = RequestSpec {
                                    model: model.into(),
                                    prompt: format!("request {} of the soak", rng.next() % 1000),
                                    max_tokens: rng.range(4, 48) as u32,
                                    deadline: Duration::from_millis(rng.range(lo, hi)),
                                    cancel_after: cancel.then(|| rng.range(1, 8) as usize),
                                    guard: Duration::from_secs(60),
                                };
                                if channel.is_none() {
                                    channel = chaos::connect(&address).await.ok();
                                }
                                let record = match channel.clone() {
                                    Some(c) => run_request(c, &spec, None).await,
                                    None => RequestRecord {
                                        end: End::Errored {
                                            code: tonic::Code::Unavailable,
                                            message: "cannot connect".into(),
                                        },
                                        took: Duration::ZERO,
                                        deadline: spec.deadline,
                                    },
                                };
                                records
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push((model.to_string(), record));
                            }
                        }));
                    }
                    for t in tasks {
                        t.await.expect("load task");
                    }
                })
            })
        };
        // The chaos: a worker kill every `kill_every` requests; the daemon's
        // counts half way.
        let mut next_kill = args.kill_every;
        while !load.is_finished() {
            let done = records.lock().unwrap_or_else(|e| e.into_inner()).len();
            if mid_counts.is_none() && done >= args.requests / 2 {
                mid_counts = proc_counts(daemon.pid());
            }
            if done >= next_kill && next_kill < args.requests {
                let slot = MODELS[kills.len() % 2];
                let pid = daemon.slot(slot)["worker_pid"].as_u64().unwrap_or(0) as i32;
                if pid > 0
                    && nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .is_ok()
                {
                    println!("  after {done} requests: killed the worker of {slot} (pid {pid})");
                    kills.push((done, slot.to_string(), pid));
                }
                next_kill += args.kill_every;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        load.join().expect("load thread");
    });
    let load_secs = began.elapsed().as_secs_f64();
    let load_after = procs::loadavg();
    let records = Arc::try_unwrap(records)
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .unwrap_or_default();

    // Settle, then check every invariant.
    let mut failures = Vec::new();
    for m in MODELS {
        wait_until(&format!("slot {m} to be ready after the soak"), || {
            (daemon.slot(m)["state"] == "ready").then_some(())
        });
    }
    let report = check_invariants(&daemon, &base);
    let end_counts = report.counts;
    let metrics = &report.metrics;
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let (mut answered, mut errored, mut cancelled, mut hung) = (0, 0, 0, 0);
    let mut worst_over_deadline_ms = i64::MIN;
    let mut longest_ms = 0u128;
    let mut over_bound = 0;
    for (_, r) in &records {
        *by_kind.entry(r.kind()).or_default() += 1;
        match r.end {
            End::Answered { .. } => answered += 1,
            End::Errored { .. } => errored += 1,
            End::Cancelled { .. } => cancelled += 1,
            End::Hung => hung += 1,
        }
        worst_over_deadline_ms =
            worst_over_deadline_ms.max(r.took.as_millis() as i64 - r.deadline.as_millis() as i64);
        longest_ms = longest_ms.max(r.took.as_millis());
        if r.took > r.deadline + stall {
            over_bound += 1;
        }
    }
    if records.len() != args.requests {
        failures.push(format!(
            "{} requests recorded of {} sent",
            records.len(),
            args.requests
        ));
    }
    if hung > 0 {
        failures.push(format!("{hung} requests hung"));
    }
    if over_bound > 0 {
        failures.push(format!(
            "{over_bound} requests ended later than deadline + stall timeout"
        ));
    }
    let counted: f64 = MODELS
        .iter()
        .map(|m| metrics.sum("tt_serving_requests_total", &[("model", m)]))
        .sum();
    if counted != args.requests as f64 {
        failures.push(format!(
            "the metrics count {counted} requests, {} were sent",
            args.requests
        ));
    }
    // What the clients saw is what the metrics count.
    let outcome = |o: &str| metrics.sum("tt_serving_requests_total", &[("outcome", o)]);
    // A client that drops its stream while the final chunk is already in
    // the daemon's send buffer counts as answered there: the daemon handed
    // over the whole answer. So compare answered + cancelled together.
    if outcome("ok") < answered as f64 {
        failures.push(format!(
            "metrics count {} answered requests, clients read {answered} final chunks",
            outcome("ok")
        ));
    }
    for (counted, seen, what) in [
        (
            outcome("ok") + outcome("cancelled"),
            answered + cancelled,
            "ok or cancelled",
        ),
        (
            outcome("worker_error") + outcome("unavailable") + outcome("deadline"),
            errored,
            "errors",
        ),
    ] {
        if counted != seen as f64 {
            failures.push(format!(
                "metrics count {counted} requests ending {what}, clients saw {seen}"
            ));
        }
    }
    let restarts: f64 = MODELS
        .iter()
        .map(|m| metrics.sum("tt_serving_worker_restarts_total", &[("slot", m)]))
        .sum();
    if restarts < kills.len() as f64 {
        failures.push(format!(
            "{} kills but only {restarts} restarts in the metrics",
            kills.len()
        ));
    }
    let mid = mid_counts.unwrap_or(end_counts);
    // Flat: the second half of the soak grows RSS by less than 16 MiB.
    let rss_growth_kib = end_counts.rss_kib as i64 - mid.rss_kib as i64;
    if rss_growth_kib > 16 * 1024 {
        failures.push(format!(
            "daemon RSS grew {rss_growth_kib} KiB over the second half"
        ));
    }
    let orphans = chaos::orphan_workers(&daemon.dir, Some(daemon.pid())).len();
    let outcomes: BTreeMap<String, f64> = metrics
        .samples
        .iter()
        .filter(|(k, _)| k.starts_with("tt_serving_requests_total{"))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let restart_causes: BTreeMap<String, f64> = metrics
        .samples
        .iter()
        .filter(|(k, _)| k.starts_with("tt_serving_worker_restarts_total{"))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let resets = metrics.sum("tt_serving_card_resets_total", &[("outcome", "proven")]);
    let failed_resets = metrics.sum("tt_serving_card_resets_total", &[("outcome", "failed")]);

    // Availability: of the requests whose client waited for the end, the
    // share answered in full. A client that dropped its stream on purpose
    // neither got nor was denied an answer.
    let kept = args.requests - cancelled;
    let availability = if kept > 0 {
        answered as f64 / kept as f64
    } else {
        0.0
    };
    println!("\nrequests sent     {}", args.requests);
    println!(
        "  answered        {answered} (availability {:.1} % of the {kept} not dropped by their client)",
        100.0 * availability
    );
    println!("  errored         {errored}");
    println!("  client-cancelled {cancelled}");
    println!("  hung            {hung}");
    println!("  by end          {by_kind:?}");
    println!(
        "longest request   {longest_ms} ms; worst (took - deadline) {worst_over_deadline_ms} ms; bound: deadline + {} ms stall",
        stall.as_millis()
    );
    println!(
        "worker kills      {} (restarts in metrics {restarts}, card resets proven {resets}, failed {failed_resets})",
        kills.len()
    );
    println!(
        "daemon            start {start_counts:?}\n                  mid   {mid:?}\n                  end   {end_counts:?}"
    );
    println!("orphans           {orphans}; stale locks 0 (checked)");
    println!("load time         {load_secs:.1} s");
    println!("machine load      {load_before:?} before, {load_after:?} after (1/5/15 min)");

    let line = json!({
        "bench": "soak",
        "unix_ms": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        "config": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "kill_every": args.kill_every,
            "cancel_percent": args.cancel_percent,
            "deadline_ms": [args.min_deadline_ms, args.max_deadline_ms],
            "stall_timeout_secs": args.stall_secs,
            "seed": args.seed,
            "recovery_wait_secs": args.recovery_wait_secs.map_or(json!("default (30)"), |s| json!(s)),
            "reset_delay_ms": args.reset_delay_ms.unwrap_or(300),
            "slots": ["one: TP=1 on card 0", "two: TP=2 on cards 1,2"],
            "model": "tiny test model",
        },
        "requests_sent": args.requests,
        "answered": answered,
        "availability": availability,
        "answered_of_sent": answered as f64 / args.requests.max(1) as f64,
        "errored": errored,
        "errored_by_code": by_kind.iter().filter(|(k, _)| !["ok", "client_cancelled", "hung"].contains(&k.as_str())).collect::<BTreeMap<_, _>>(),
        "client_cancelled": cancelled,
        "hung": hung,
        "max_request_ms": longest_ms,
        "max_over_deadline_ms": worst_over_deadline_ms,
        "bound": "deadline + stall_timeout",
        "over_bound": over_bound,
        "worker_kills": kills.len(),
        "metrics_requests_total": outcomes,
        "metrics_worker_restarts_total": restart_causes,
        "card_resets_proven": resets,
        "card_resets_failed": failed_resets,
        "daemon": {
            "start": counts_json(&start_counts),
            "mid": counts_json(&mid),
            "end": counts_json(&end_counts),
        },
        "orphans": orphans,
        "stale_locks": 0,
        "load_secs": load_secs,
        "machine": {
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "failures": failures,
    });
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .expect("open the results file");
    writeln!(out, "{line}").expect("append the result");
    println!("appended to {}", args.out.display());
    if !failures.is_empty() {
        eprintln!("INVARIANTS FAILED: {failures:?}");
        // exit() skips destructors: stop the daemon (and its workers) first.
        drop(daemon);
        std::process::exit(1);
    }
    println!("all invariants held");
}
