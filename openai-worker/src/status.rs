//! The worker's shared state: its phase, what the engine said when it
//! became ready, the requests in flight (for the drain), and the engine's
//! load as its metrics last showed it. Written by the life in `worker.rs`
//! and the request relays, read by the RPC handlers; atomics and short
//! locks, so `Health` stays cheap.

use crate::cli::EngineKind;
use crate::http;
use crate::metrics;
use crate::output::OutputScan;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use tt_worker_contract::PhaseCell;
pub use tt_worker_contract::{DrainReport, Phase};

/// What the engine told us once it was ready.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The model id from `/v1/models`, which requests name.
    pub model: String,
    /// Tokens per sequence.
    pub context_length: u32,
    /// Parameters, when the engine says (llama-server).
    pub parameters: u64,
    /// The engine's version, when it says.
    pub engine_version: Option<String>,
    /// From spawn to ready.
    pub load_time: Duration,
    /// The engine's KV cache, when it says (vLLM's `cache_config_info`).
    pub kv_cache: Option<tt_serving_proto::v1::KvCacheInfo>,
    /// llama-server: whether the model's chat template can call tools
    /// (`/props` `chat_template_caps.supports_tool_calls`); `None` when the
    /// engine does not say. llama-server given tools its template cannot
    /// render answers in prose, even with `tool_choice: "required"`, so
    /// `tools` is declared only when this is `Some(true)`.
    pub template_calls_tools: Option<bool>,
}

/// The engine's load as `/metrics` showed it.
#[derive(Debug, Default)]
struct LoadCache {
    /// Running and waiting requests; `None` when the metrics lacked them.
    counts: Option<(u32, u32)>,
    /// The share of KV blocks in use (vLLM's `vllm:kv_cache_usage_perc`:
    /// blocks held by running requests; blocks only its prefix cache keeps
    /// count as free there).
    kv_usage: Option<f64>,
    /// The engine's progress counters ([`EngineKind::progress_counters`]).
    counters: std::collections::BTreeMap<String, f64>,
    /// When they were read.
    at: Option<Instant>,
    /// A read is under way.
    refreshing: bool,
}

/// Load figures older than this are refreshed (in the background: `Health`
/// answers at once with what it has).
const LOAD_REFRESH: Duration = Duration::from_millis(500);
/// Figures older than this are not trusted (the engine stopped answering
/// its metrics); `Health` then counts the worker's own requests.
const LOAD_STALE: Duration = Duration::from_secs(10);

/// Shared worker state.
#[derive(Debug)]
pub struct Status {
    phase: PhaseCell,
    /// The engine's output, whose lines are the load progress.
    pub output: Arc<OutputScan>,
    loaded: OnceLock<Loaded>,
    /// Requests between arrival and their stream's end.
    in_flight: watch::Sender<u32>,
    /// Set when a drain's time is up: relays send their final chunk as
    /// cancelled and close the engine's stream.
    cancel: watch::Sender<bool>,
    /// Unix ms of the last token any request received (0 before the first).
    pub last_token_unix_ms: AtomicU64,
    /// Estimated prompt tokens of requests still waiting for their first
    /// token (Health's `prefill_tokens`).
    prefill_tokens: AtomicU64,
    load: Mutex<LoadCache>,
    /// The missing-metrics warning was logged.
    warned_metrics: AtomicBool,
}

/// Milliseconds since the Unix epoch.
pub use tt_serving_proto::time::now_unix_ms as unix_ms;

/// A request in flight; the count drops when it is dropped.
pub struct InFlight {
    status: Arc<Status>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.status
            .in_flight
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A request's prompt counted in `prefill_tokens` until its first token
/// arrives or it ends.
pub struct Prefill {
    status: Arc<Status>,
    tokens: u64,
    released: AtomicBool,
}

impl Prefill {
    /// The first token came: the prefill is over.
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.status
                .prefill_tokens
                .fetch_sub(self.tokens, Ordering::AcqRel);
        }
    }
}

impl Drop for Prefill {
    fn drop(&mut self) {
        self.release();
    }
}

impl Status {
    /// A loading worker reading `output`.
    pub fn new(output: Arc<OutputScan>) -> Self {
        Self {
            phase: PhaseCell::default(),
            output,
            loaded: OnceLock::new(),
            in_flight: watch::Sender::new(0),
            cancel: watch::Sender::new(false),
            last_token_unix_ms: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            load: Mutex::new(LoadCache::default()),
            warned_metrics: AtomicBool::new(false),
        }
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase.get()
    }

    /// Moves to `phase`.
    pub fn set_phase(&self, phase: Phase) {
        self.phase.set(phase);
    }

    /// Publishes what the engine said when it became ready and moves to
    /// Ready.
    pub fn set_ready(&self, loaded: Loaded) {
        let _ = self.loaded.set(loaded);
        self.set_phase(Phase::Ready);
    }

    /// What the engine said when it became ready.
    pub fn loaded(&self) -> Option<&Loaded> {
        self.loaded.get()
    }

    /// Counts a request until the returned guard is dropped.
    pub fn begin_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.send_modify(|n| *n += 1);
        InFlight {
            status: self.clone(),
        }
    }

    /// Counts `tokens` prompt tokens as pending prefill until the returned
    /// guard is released or dropped.
    pub fn begin_prefill(self: &Arc<Self>, tokens: u64) -> Prefill {
        self.prefill_tokens.fetch_add(tokens, Ordering::AcqRel);
        Prefill {
            status: self.clone(),
            tokens,
            released: AtomicBool::new(false),
        }
    }

    /// Estimated prompt tokens waiting for their first token.
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens.load(Ordering::Acquire)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u32 {
        *self.in_flight.borrow()
    }

    /// A receiver that turns true when in-flight requests must end.
    pub fn cancelled(&self) -> watch::Receiver<bool> {
        self.cancel.subscribe()
    }

    /// Records that a token arrived.
    pub fn token_arrived(&self) {
        self.last_token_unix_ms.store(unix_ms(), Ordering::Release);
    }

    /// Stops admitting work, lets in-flight requests finish for `timeout`,
    /// then cancels the rest (each gets its final chunk as cancelled).
    pub async fn drain(&self, timeout: Duration) -> DrainReport {
        self.set_phase(Phase::Draining);
        let mut rx = self.in_flight.subscribe();
        let started_with = *rx.borrow();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0)).await;
        let left = *rx.borrow();
        if left > 0 {
            tracing::warn!(left, "drain timeout: cancelling the requests still running");
            self.cancel.send_replace(true);
            // Each relay answers its client and closes the engine's
            // stream at once; a client that stopped reading is not waited
            // for long.
            let _ = tokio::time::timeout(Duration::from_secs(2), rx.wait_for(|n| *n == 0)).await;
        }
        DrainReport {
            finished: started_with.saturating_sub(left),
            cancelled: left,
        }
    }

    /// Running and waiting requests for `Health`: the engine's own figures
    /// when its metrics have them (fresh enough), else the worker's count
    /// of its requests as running. Starts a background refresh of the
    /// figures when they are old.
    pub fn load(self: &Arc<Self>, port: u16, kind: EngineKind) -> (u32, u32) {
        if self.phase() == Phase::Loading {
            return (0, 0);
        }
        let mut cache = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let age = cache.at.map(|at| at.elapsed());
        if !cache.refreshing && age.is_none_or(|a| a >= LOAD_REFRESH) {
            cache.refreshing = true;
            let status = self.clone();
            tokio::spawn(async move { status.refresh_load(port, kind).await });
        }
        match (cache.counts, age) {
            // vLLM publishes its gauges with a finished step's outputs: a
            // request in its first step (a prefill, or a device hang there)
            // is in none of them. Every request of ours the engine does not
            // count as waiting is running, so the daemon's stall watchdog
            // sees it (docs/ENGINES.md, "Device hangs").
            (Some((running, waiting)), Some(age)) if age < LOAD_STALE => (
                running.max(self.in_flight().saturating_sub(waiting)),
                waiting,
            ),
            _ => (self.in_flight(), 0),
        }
    }

    async fn refresh_load(&self, port: u16, kind: EngineKind) {
        let (running, waiting) = kind.load_gauges();
        let mut kv_usage = None;
        let mut counters = std::collections::BTreeMap::new();
        let counts = match http::get(port, "/metrics", Duration::from_secs(2)).await {
            Ok((code, text)) if code.is_success() => {
                kv_usage = metrics::gauge(&text, "vllm:kv_cache_usage_perc");
                for name in kind.progress_counters() {
                    if let Some(value) = metrics::gauge(&text, name) {
                        counters.insert(name.to_string(), value);
                    }
                }
                match (
                    metrics::count(&text, running),
                    metrics::count(&text, waiting),
                ) {
                    (Some(r), w) => Some((r, w.unwrap_or(0))),
                    (None, _) => {
                        self.warn_metrics(format!("its /metrics has no `{running}`"));
                        None
                    }
                }
            }
            Ok((code, _)) => {
                self.warn_metrics(format!("its /metrics answered {code}"));
                None
            }
            Err(e) => {
                tracing::debug!(%e, "cannot read the engine's metrics");
                None
            }
        };
        let mut cache = self.load.lock().unwrap_or_else(|e| e.into_inner());
        cache.refreshing = false;
        cache.at = Some(Instant::now());
        cache.counts = counts;
        cache.kv_usage = kv_usage;
        cache.counters = counters;
    }

    /// The engine's progress counters from its last metrics read.
    pub fn engine_counters(&self) -> std::collections::HashMap<String, f64> {
        let cache = self.load.lock().unwrap_or_else(|e| e.into_inner());
        cache.counters.clone().into_iter().collect()
    }

    /// KV blocks in use by running requests, from the engine's last fresh
    /// metrics and its KV cache size; 0 when it does not say.
    pub fn kv_blocks_in_use(&self) -> u32 {
        let Some(total) = self
            .loaded()
            .and_then(|l| l.kv_cache.as_ref())
            .map(|k| k.blocks_total)
        else {
            return 0;
        };
        let cache = self.load.lock().unwrap_or_else(|e| e.into_inner());
        match (cache.kv_usage, cache.at.map(|at| at.elapsed())) {
            (Some(share), Some(age)) if age < LOAD_STALE => {
                (share.clamp(0.0, 1.0) * f64::from(total)).round() as u32
            }
            _ => 0,
        }
    }

    fn warn_metrics(&self, what: String) {
        if !self.warned_metrics.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "cannot read the engine's load: {what}; Health reports the worker's own requests as running (llama-server needs `--metrics`)"
            );
        }
    }
}
