//! The worker's shared status: lifecycle state, load progress and the
//! counters `Health` reports. Written by the loader and the scheduler, read
//! by the RPC handlers; everything is atomics or short locks so `Health`
//! stays cheap even while a step runs.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

pub use tt_worker_contract::Phase;
use tt_worker_contract::PhaseCell;

/// Load progress, as `LoadProgress` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Steps done.
    pub done: u32,
    /// Steps in all.
    pub total: u32,
    /// What is happening.
    pub message: String,
}

/// What the load produced, for `Info`.
#[derive(Debug, Clone, Default)]
pub struct LoadedInfo {
    /// Model name from the checkpoint.
    pub model_name: String,
    /// Architecture.
    pub architecture: String,
    /// Parameters in the checkpoint.
    pub parameter_count: u64,
    /// Context length served.
    pub context_length: u32,
    /// Cache files mapped.
    pub cache_files_read: Vec<String>,
    /// Cache files written.
    pub cache_files_written: Vec<String>,
    /// The KV pool.
    pub kv: KvInfo,
    /// Load wall time.
    pub load_time_ms: u64,
}

/// The KV pool's shape, for `Info`.
#[derive(Debug, Clone, Default)]
pub struct KvInfo {
    /// Bytes the pool's blocks hold (all ranks).
    pub budget_bytes: u64,
    /// Blocks in the pool.
    pub blocks: u32,
    /// Whether the prefix cache is on.
    pub prefix_cache: bool,
}

/// Shared worker status.
#[derive(Debug)]
pub struct Status {
    phase: PhaseCell,
    progress: Mutex<Progress>,
    /// Sequences in the batch.
    pub active: AtomicU32,
    /// Sequences admitted and not yet finished (batch plus queue); the
    /// admission bound is checked against it.
    pub in_flight: AtomicU32,
    /// Unix ms of the last completed step.
    pub last_step_unix_ms: AtomicU64,
    /// Prompt tokens of batch sequences not yet fed (Health's
    /// `prefill_tokens`).
    pub prefill_tokens: AtomicU64,
    /// KV blocks held by running sequences.
    pub kv_blocks_in_use: AtomicU32,
    /// KV blocks held only by the prefix cache.
    pub kv_blocks_cached: AtomicU32,
    /// A drain found the engine thread stuck in a step: the worker exits
    /// with a failure status so the daemon treats its cards as dirty.
    pub engine_stuck: AtomicBool,
    loaded: OnceLock<LoadedInfo>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            phase: PhaseCell::default(),
            progress: Mutex::new(Progress::default()),
            active: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            last_step_unix_ms: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            kv_blocks_in_use: AtomicU32::new(0),
            kv_blocks_cached: AtomicU32::new(0),
            engine_stuck: AtomicBool::new(false),
            loaded: OnceLock::new(),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub use tt_serving_proto::time::now_unix_ms as unix_ms;

impl Status {
    /// Sequences admitted but not yet in the batch.
    pub fn queued(&self) -> u32 {
        let in_flight = self.in_flight.load(Ordering::Acquire);
        in_flight.saturating_sub(self.active.load(Ordering::Acquire))
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase.get()
    }

    /// Moves to `phase`.
    pub fn set_phase(&self, phase: Phase) {
        self.phase.set(phase);
    }

    /// Records load progress.
    pub fn set_progress(&self, done: u32, total: u32, message: String) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        *p = Progress {
            done,
            total,
            message,
        };
    }

    /// Latest load progress.
    pub fn progress(&self) -> Progress {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Publishes the load's outcome (once).
    pub fn set_loaded(&self, info: LoadedInfo) {
        let _ = self.loaded.set(info);
    }

    /// The load's outcome, once loaded.
    pub fn loaded(&self) -> Option<&LoadedInfo> {
        self.loaded.get()
    }
}
