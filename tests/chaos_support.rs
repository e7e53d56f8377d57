//! Chaos and soak helpers, shared by `tests/chaos.rs` and `bench/soak`:
//! counting a process's file descriptors, threads and children, finding
//! orphan workers, probing card and cache-build locks, checking cache
//! variants against their markers, scraping `/metrics`, timing client
//! requests against their bound, and the invariant checker run after every
//! scenario.
//!
//! Everything reads the real `/proc`: the daemon and its workers are real
//! processes even on a fake hardware root.

use crate::{wait_until, Daemon};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;

/// File descriptors, threads, children and RSS of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcCounts {
    /// Entries in `/proc/<pid>/fd`.
    pub fds: usize,
    /// `Threads:` in `/proc/<pid>/status`.
    pub threads: usize,
    /// Processes whose parent it is.
    pub children: usize,
    /// `VmRSS:` in KiB.
    pub rss_kib: u64,
}

/// The counts of a live process; None when it is gone.
pub fn proc_counts(pid: u32) -> Option<ProcCounts> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(ProcCounts {
        fds,
        threads: field("Threads:") as usize,
        children: children_of(pid).len(),
        rss_kib: field("VmRSS:"),
    })
}

/// One line of `/proc/<pid>/stat`: (state, parent pid).
fn stat_of(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Pids of the processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| stat_of(*p).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// Children of `pid` that exited and were never reaped.
pub fn zombie_children(pid: u32) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| stat_of(*p).is_some_and(|(state, ppid)| ppid == pid && state == 'Z'))
        .collect()
}

/// A worker process found by its socket path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerProcess {
    /// Its pid.
    pub pid: u32,
    /// Its parent's pid (1 or a subreaper once its daemon is gone).
    pub ppid: u32,
    /// `TT_WORKER_SOCKET` from its environment.
    pub socket: String,
}

/// Live worker processes (not zombies) whose `TT_WORKER_SOCKET` lies under
/// `dir`: the workers of the daemon run from that dir, whoever their parent
/// is now. Other daemons on the machine (parallel tests) are not counted.
pub fn workers_under(dir: &Path) -> Vec<WorkerProcess> {
    let prefix = format!("TT_WORKER_SOCKET={}/", dir.display());
    all_pids()
        .into_iter()
        .filter_map(|pid| {
            let (state, ppid) = stat_of(pid)?;
            if state == 'Z' || state == 'X' {
                return None;
            }
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let socket = environ
                .split(|b| *b == 0)
                .filter_map(|v| std::str::from_utf8(v).ok())
                .find(|v| v.starts_with(&prefix))?;
            Some(WorkerProcess {
                pid,
                ppid,
                socket: socket["TT_WORKER_SOCKET=".len()..].to_string(),
            })
        })
        .collect()
}

/// Workers of the daemon run from `dir` whose parent is not `daemon_pid`
/// (every one of them when the daemon is gone).
pub fn orphan_workers(dir: &Path, daemon_pid: Option<u32>) -> Vec<WorkerProcess> {
    workers_under(dir)
        .into_iter()
        .filter(|w| Some(w.ppid) != daemon_pid)
        .collect()
}

/// Whether someone holds an exclusive flock on `path` (probed with a
/// non-blocking lock that is released at once).
pub fn lock_is_held(path: &Path) -> bool {
    use fs2::FileExt;
    let Ok(file) = std::fs::OpenOptions::new().read(true).open(path) else {
        return false;
    };
    match file.try_lock_exclusive() {
        Ok(()) => {
            let _ = FileExt::unlock(&file);
            false
        }
        Err(_) => true,
    }
}

/// `*.lock` files under `dir` (recursively) that are held right now.
pub fn held_locks(dir: &Path) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "lock"))
        .filter(|p| lock_is_held(p))
        .collect()
}

/// Every file under `dir`, recursively (empty when it does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Name of the completeness marker in a variant dir.
pub const MARKER: &str = ".tt-serving-complete.json";
const DESCRIPTION: &str = ".tt-serving-variant.json";
/// The content hashes a cold build records beside its marker.
const DIGESTS: &str = ".tt-serving-digests.json";

/// Variant dirs (`<cache>/<model>/<variant>/`) under a cache dir.
pub fn variant_dirs(cache_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for model in std::fs::read_dir(cache_dir).into_iter().flatten().flatten() {
        if !model.path().is_dir() {
            continue;
        }
        for variant in std::fs::read_dir(model.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if variant.path().is_dir() {
                out.push(variant.path());
            }
        }
    }
    out
}

/// What is wrong with variants marked complete: a listed file missing or of
/// another size, a file the marker does not list, a temporary file. A
/// partial build must never carry a marker. Empty means consistent.
pub fn marked_variant_problems(cache_dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for dir in variant_dirs(cache_dir) {
        let Ok(text) = std::fs::read_to_string(dir.join(MARKER)) else {
            continue;
        };
        let marker: Value = match serde_json::from_str(&text) {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!("{}: unreadable marker: {e}", dir.display()));
                continue;
            }
        };
        let listed: BTreeMap<String, u64> = marker["files"]
            .as_object()
            .map(|files| {
                files
                    .iter()
                    // Each entry is the file's stamp (size, times, inode),
                    // or its size alone in an older marker.
                    .map(|(k, v)| {
                        let size = v["size"].as_u64().or_else(|| v.as_u64());
                        (k.clone(), size.unwrap_or(u64::MAX))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if listed.is_empty() {
            problems.push(format!("{}: marker lists no files", dir.display()));
        }
        for (name, size) in &listed {
            match std::fs::metadata(dir.join(name)) {
                Ok(m) if m.len() == *size => {}
                Ok(m) => problems.push(format!(
                    "{}: {name} has {} bytes, marker says {size}",
                    dir.display(),
                    m.len()
                )),
                Err(_) => problems.push(format!("{}: {name} is missing", dir.display())),
            }
        }
        for file in files_under(&dir) {
            let name = file
                .strip_prefix(&dir)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            if name == MARKER || name == DESCRIPTION || name == DIGESTS {
                continue;
            }
            if !listed.contains_key(&name) {
                problems.push(format!(
                    "{}: {name} is not listed by the marker",
                    dir.display()
                ));
            }
        }
    }
    problems
}

/// One `/metrics` scrape: `series{labels}` -> value.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Every sample line, keyed by its series text as exposed.
    pub samples: BTreeMap<String, f64>,
    /// The raw text.
    pub text: String,
}

impl Scrape {
    /// Parse the text (OpenMetrics or 0.0.4: their sample lines agree).
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.trim().parse().ok()?))
            })
            .collect();
        Scrape {
            samples,
            text: text.to_string(),
        }
    }

    /// The value of one exact series (`name{a="x",b="y"}`).
    pub fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    /// Sum of every sample of `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series.as_str(), ""));
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum::<f64>()
            + 0.0
    }
}

/// The `Accept` Prometheus 2.43 and later send with a scrape (OpenMetrics
/// first, the 0.0.4 text format as a fallback).
pub const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// GET /metrics from the daemon as `curl` does (the 0.0.4 text format),
/// parsed.
pub fn scrape(daemon: &Daemon) -> Scrape {
    scrape_with(daemon, None)
}

/// GET /metrics from the daemon with `accept` as its `Accept` header (e.g.
/// [`PROMETHEUS_ACCEPT`]), parsed.
pub fn scrape_with(daemon: &Daemon, accept: Option<&str>) -> Scrape {
    let address = daemon.status()["daemon"]["metrics_address"]
        .as_str()
        .expect("metrics address in status")
        .to_string();
    let mut stream = TcpStream::connect(&address).expect("connect to the metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\n{accept}Connection: close\r\n\r\n"
    )
    .expect("send the metrics request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the metrics response");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("");
    Scrape::parse(body)
}

/// How a client request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The final chunk arrived.
    Answered {
        /// Tokens streamed.
        tokens: usize,
    },
    /// The stream ended with an error status.
    Errored {
        /// Its code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// The client dropped the stream on purpose after this many chunks.
    Cancelled {
        /// Chunks read before dropping.
        chunks: usize,
    },
    /// Nothing ended it within the client's own guard: a hang.
    Hung,
}

/// One client request and how long it took.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// How it ended.
    pub end: End,
    /// From sending to the end.
    pub took: Duration,
    /// The gRPC deadline it carried.
    pub deadline: Duration,
}

impl RequestRecord {
    /// The error code name, or `ok`, `client_cancelled`, `hung`. A deadline
    /// that passes before the response starts is answered by gRPC's server
    /// layer (tonic) as CANCELLED "Timeout expired"; that counts as
    /// `DeadlineExceeded` here, as it does in the daemon's metrics.
    pub fn kind(&self) -> String {
        match &self.end {
            End::Answered { .. } => "ok".into(),
            End::Errored { code, message }
                if *code == tonic::Code::Cancelled && message.contains("Timeout expired") =>
            {
                "DeadlineExceeded".into()
            }
            End::Errored { code, .. } => format!("{code:?}"),
            End::Cancelled { .. } => "client_cancelled".into(),
            End::Hung => "hung".into(),
        }
    }
}

/// A request to run.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Model name.
    pub model: String,
    /// The prompt.
    pub prompt: String,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// gRPC deadline (`grpc-timeout`).
    pub deadline: Duration,
    /// Drop the stream after this many chunks (a client going away).
    pub cancel_after: Option<usize>,
    /// How long past the deadline the client waits before calling it a
    /// hang (the bound under test plus a margin).
    pub guard: Duration,
}

/// A channel to the daemon's public port.
pub async fn connect(address: &str) -> Result<tonic::transport::Channel, tonic::Status> {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))
}

/// Run one streamed request and time it. `started` (if given) is told when
/// the first chunk arrives.
pub async fn run_request(
    channel: tonic::transport::Channel,
    spec: &RequestSpec,
    started: Option<tokio::sync::mpsc::UnboundedSender<()>>,
) -> RequestRecord {
    use pb::generate_response::Chunk;
    let began = Instant::now();
    let work = async {
        let mut client = pb::inference_client::InferenceClient::new(channel);
        let mut request = tonic::Request::new(pb::GenerateRequest {
            model: spec.model.clone(),
            input: Some(pb::generate_request::Input::Prompt(spec.prompt.clone())),
            max_tokens: spec.max_tokens,
            ..Default::default()
        });
        request.set_timeout(spec.deadline);
        let mut stream = match client.generate(request).await {
            Ok(s) => s.into_inner(),
            Err(status) => return errored(status),
        };
        let mut chunks = 0;
        let mut tokens = 0;
        loop {
            match stream.message().await {
                Ok(Some(chunk)) => {
                    chunks += 1;
                    if chunks == 1 {
                        if let Some(tx) = &started {
                            let _ = tx.send(());
                        }
                    }
                    match chunk.chunk {
                        Some(Chunk::Delta(d)) => tokens += d.token_ids.len(),
                        Some(Chunk::Final(_)) => return End::Answered { tokens },
                        Some(Chunk::PromptLogprobs(_)) | None => {}
                    }
                    if spec.cancel_after.is_some_and(|n| chunks >= n) {
                        return End::Cancelled { chunks };
                    }
                }
                Ok(None) => {
                    return End::Errored {
                        code: tonic::Code::Unknown,
                        message: "stream ended without a final chunk".into(),
                    }
                }
                Err(status) => return errored(status),
            }
        }
    };
    let end = tokio::time::timeout(spec.deadline + spec.guard, work)
        .await
        .unwrap_or(End::Hung);
    RequestRecord {
        end,
        took: began.elapsed(),
        deadline: spec.deadline,
    }
}

fn errored(status: tonic::Status) -> End {
    End::Errored {
        code: status.code(),
        message: status.message().to_string(),
    }
}

/// Assert that every request ended (no hang) within `deadline + stall`,
/// plus `slack` for a loaded machine; returns the largest
/// `took - deadline` seen, in milliseconds.
pub fn assert_bounded(records: &[RequestRecord], stall: Duration, slack: Duration) -> i64 {
    let mut worst = i64::MIN;
    for r in records {
        assert_ne!(r.end, End::Hung, "a request hung: {r:?}");
        let bound = r.deadline + stall + slack;
        assert!(
            r.took <= bound,
            "a request took {:?}, over its deadline {:?} + stall timeout {stall:?} (+{slack:?} slack): {r:?}",
            r.took,
            r.deadline
        );
        worst = worst.max(r.took.as_millis() as i64 - r.deadline.as_millis() as i64);
    }
    worst
}

/// The daemon's counts when every slot was settled, to compare later ones
/// against.
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    /// The counts.
    pub counts: ProcCounts,
}

/// File descriptors the daemon may hold above the baseline at a check
/// (a connection the kernel has not finished closing).
pub const FD_SLACK: usize = 4;
/// Threads above the baseline (blocking-pool threads idle out after 10 s;
/// the checker waits for them).
pub const THREAD_SLACK: usize = 2;

/// Slot states in which nothing is about to change on its own.
pub fn settled(slot: &Value) -> bool {
    match slot["state"].as_str().unwrap_or("") {
        "ready" | "quarantined" | "stopped" => true,
        "failed" => slot["retry_at_unix_ms"].as_u64().unwrap_or(0) == 0,
        _ => false,
    }
}

/// Wait until every slot is settled; returns the status.
pub fn wait_settled(daemon: &Daemon) -> Value {
    wait_until("every slot to settle", || {
        let status = daemon.status();
        status["slots"]
            .as_array()?
            .iter()
            .all(settled)
            .then_some(status)
    })
}

/// Take the baseline once every slot is settled.
pub fn baseline(daemon: &Daemon) -> Baseline {
    wait_settled(daemon);
    // Let connections of the start-up (readiness pings, ttctl) close.
    let counts = wait_until("the daemon's counts to be readable", || {
        proc_counts(daemon.pid())
    });
    Baseline { counts }
}

/// What the invariant checker saw.
#[derive(Debug, Clone)]
pub struct InvariantReport {
    /// The daemon's counts at the check.
    pub counts: ProcCounts,
    /// Live worker pids per status.
    pub workers: BTreeSet<u32>,
    /// The metrics at the check.
    pub metrics: Scrape,
    /// `ttctl status --json` at the check.
    pub status: Value,
}

/// The invariants every scenario must leave behind, on a running daemon:
/// every slot settled; the daemon's children are exactly the workers status
/// shows (no zombie, no stray tt-smi); no orphan worker of this daemon; file
/// descriptors and threads back to the baseline (within small slack); no
/// card lock held on a card the daemon does not use, no cache build lock
/// held while nothing builds; no cache variant marked complete that is not;
/// `ttctl status` and the metrics agree on each slot's state.
pub fn check_invariants(daemon: &Daemon, baseline: &Baseline) -> InvariantReport {
    let pid = daemon.pid();
    let status = wait_settled(daemon);
    // Children: exactly the live workers (a tt-smi run or a worker exit
    // being reaped may lag a moment).
    let workers = wait_until("the daemon's children to be its live workers", || {
        let status = daemon.status();
        let workers: BTreeSet<u32> = status["slots"]
            .as_array()?
            .iter()
            .filter_map(|s| s["worker_pid"].as_u64())
            .filter(|p| *p != 0)
            .map(|p| p as u32)
            .collect();
        let children: BTreeSet<u32> = children_of(pid).into_iter().collect();
        (children == workers).then_some(workers)
    });
    assert!(
        zombie_children(pid).is_empty(),
        "unreaped children of the daemon: {:?}",
        zombie_children(pid)
    );
    let orphans = orphan_workers(&daemon.dir, Some(pid));
    assert!(orphans.is_empty(), "orphan workers: {orphans:?}");
    let counts = wait_until(
        &format!(
            "the daemon's fds and threads to return to the baseline {:?}",
            baseline.counts
        ),
        || {
            let now = proc_counts(pid)?;
            (now.fds <= baseline.counts.fds + FD_SLACK
                && now.threads <= baseline.counts.threads + THREAD_SLACK)
                .then_some(now)
        },
    );
    // Locks: cards no slot uses are not held by anyone; no build lock is
    // held once every slot has settled.
    let used: BTreeSet<String> = status["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["cards"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    for lock in held_locks(&daemon.lock_dir) {
        let bdf = lock
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        assert!(
            used.contains(&bdf),
            "stale lock {} on a card no slot uses",
            lock.display()
        );
    }
    let cache = daemon.dir.join("cache");
    let build_locks = held_locks(&cache);
    assert!(
        build_locks.is_empty(),
        "cache build locks held with every slot settled: {build_locks:?}"
    );
    let problems = marked_variant_problems(&cache);
    assert!(
        problems.is_empty(),
        "cache variants marked complete but not: {problems:?}"
    );
    // Status and metrics agree on every slot's state.
    let metrics = scrape(daemon);
    let status = daemon.status();
    for slot in status["slots"].as_array().into_iter().flatten() {
        let (name, state) = (
            slot["name"].as_str().unwrap_or(""),
            slot["state"].as_str().unwrap_or(""),
        );
        assert_eq!(
            metrics.sum("tt_serving_slot_state", &[("slot", name), ("state", state)]),
            1.0,
            "slot {name} is {state} in status but not in the metrics:\n{}",
            metrics.text
        );
    }
    InvariantReport {
        counts,
        workers,
        metrics,
        status,
    }
}

/// After the daemon has gone (killed or stopped): no worker of it is left
/// running, and no card or build lock is held by anyone.
pub fn check_gone(daemon_dir: &Path, lock_dir: &Path) {
    let deadline = Instant::now() + crate::DEADLINE;
    loop {
        let left = workers_under(daemon_dir);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "workers outlived their daemon: {left:?}; {}",
            left.iter()
                .map(|w| {
                    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", w.pid))
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|t| {
                            let p = t.path();
                            format!(
                                "{} wchan={}",
                                std::fs::read_to_string(p.join("stat"))
                                    .unwrap_or_default()
                                    .trim(),
                                std::fs::read_to_string(p.join("wchan")).unwrap_or_default()
                            )
                        })
                        .collect();
                    format!(
                        "{}\n{}",
                        std::fs::read_to_string(format!("/proc/{}/status", w.pid))
                            .unwrap_or_default(),
                        tasks.join("\n")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = held_locks(lock_dir);
    assert!(
        held.is_empty(),
        "card locks still held after the daemon died: {held:?}"
    );
    let held = held_locks(&daemon_dir.join("cache"));
    assert!(
        held.is_empty(),
        "build locks still held after the daemon died: {held:?}"
    );
}
