//! Slots: one model instance on its cards (one card for TP=1, two for TP=2).
//!
//! [`SlotManager`] owns every slot's state, and [`SlotManager::transition`]
//! is the one place that changes it: it logs the transition with its reason,
//! publishes it to `Status`/`WatchStatus`, and keeps gRPC health in step
//! (a model is SERVING only while one of its slots is Ready). Each slot's
//! [`supervisor`] task drives its lifecycle; the router only reads.

mod accuracy;
mod attempt;
mod backoff;
mod error;
mod generate;
mod lifecycle;
mod memory_trend;
pub mod recovery;
mod start;
pub mod stats;
mod supervisor;
mod watchdog;

use crate::cards::CardManager;
use crate::config::{Config, ModelConfig};
use crate::worker::logs::LogRing;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tt_serving_proto::v1::engine_client::EngineClient;

pub use error::SlotError;
pub use recovery::Availability;

/// Lifecycle states (see docs/ARCHITECTURE.md for the transitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Configured, not started.
    Pending,
    /// Taking card locks.
    Locking,
    /// Resetting cards.
    Resetting,
    /// Proving cards back.
    Probing,
    /// Spawning the worker.
    Starting,
    /// Worker loading.
    Loading,
    /// Readiness ping and banner checks.
    Verifying,
    /// Serving.
    Ready,
    /// Finishing in-flight work before a stop.
    Draining,
    /// Stopped on request.
    Stopped,
    /// Failed; see reason.
    Failed,
    /// A card is quarantined.
    Quarantined,
}

impl SlotState {
    /// Every state, in lifecycle order.
    pub const ALL: [SlotState; 12] = [
        SlotState::Pending,
        SlotState::Locking,
        SlotState::Resetting,
        SlotState::Probing,
        SlotState::Starting,
        SlotState::Loading,
        SlotState::Verifying,
        SlotState::Ready,
        SlotState::Draining,
        SlotState::Stopped,
        SlotState::Failed,
        SlotState::Quarantined,
    ];

    /// Whether a slot in this state owns its cards and cache variant in
    /// use: it is resetting them, or has (or is about to have) a worker on
    /// them. Resetting a card under it, or removing its cache variant, would
    /// wedge the card or break the worker. Pending, Locking, Failed, Stopped
    /// and Quarantined slots hold no worker.
    pub fn holds_worker(self) -> bool {
        !matches!(
            self,
            SlotState::Pending
                | SlotState::Locking
                | SlotState::Failed
                | SlotState::Stopped
                | SlotState::Quarantined
        )
    }

    /// The state's word, as status and metrics show it.
    pub fn word(self) -> &'static str {
        match self {
            SlotState::Pending => "pending",
            SlotState::Locking => "locking",
            SlotState::Resetting => "resetting",
            SlotState::Probing => "probing",
            SlotState::Starting => "starting",
            SlotState::Loading => "loading",
            SlotState::Verifying => "verifying",
            SlotState::Ready => "ready",
            SlotState::Draining => "draining",
            SlotState::Stopped => "stopped",
            SlotState::Failed => "failed",
            SlotState::Quarantined => "quarantined",
        }
    }
}

/// A slot as status shows it.
#[derive(Debug, Clone)]
pub struct SlotView {
    /// `model` or `model/N`.
    pub name: String,
    /// Model name.
    pub model: String,
    /// Card BDFs in rank order.
    pub cards: Vec<String>,
    /// Current state.
    pub state: SlotState,
    /// When it entered the state.
    pub since: SystemTime,
    /// Why.
    pub reason: String,
    /// `warm` or `cold` for the current or last start.
    pub cache_mode: Option<crate::cache::CacheMode>,
    /// Start attempt within the restart window.
    pub attempt: u32,
    /// Start attempts since the slot was configured; a restart is done when
    /// a start other than the one its request found is Ready.
    pub starts: u64,
    /// Starts that reached Ready (the restart policy tells a worker that
    /// served, then died, from a start that never did).
    pub served: u64,
    /// Card resets this slot's supervisor made since it last served.
    pub resets_since_served: u32,
    /// Next retry (Failed only).
    pub retry_at: Option<SystemTime>,
    /// Worker pid (0 when none).
    pub worker_pid: u32,
    /// The memory of the worker's slot in bytes: the worker and everything
    /// it started (its cgroup's memory less inactive file cache, or the sum
    /// of the RSS over its process tree).
    pub worker_rss_bytes: u64,
    /// The highest memory of the current worker's slot (the cgroup's
    /// `memory.peak`, or the highest seen), or of the last worker once it
    /// exited; 0 before the first.
    pub worker_memory_peak_bytes: u64,
    /// The current worker's memory growth while it serves, when it grows
    /// steadily (`memory_trend.rs`): what grew, how fast, and when a limit
    /// is reached at that rate; empty otherwise.
    pub memory_growth: String,
    /// That growth's rate, bytes per hour (0 when not growing steadily).
    pub memory_growth_per_hour: u64,
    /// Requests being served.
    pub in_flight: u32,
    /// Last error, kept after recovery.
    pub last_error: String,
    /// The cache variant key in use.
    pub variant: String,
    /// Recent request figures.
    pub stats: Arc<stats::SlotStats>,
    /// The context length in tokens its worker reported (Engine.Info) when
    /// it became ready; 0 until then.
    pub context_length: u32,
    /// Who its worker said it is and which optional parameters it honours
    /// (Engine.Info) when it became ready; empty until then.
    pub engine_facts: Arc<EngineFacts>,
    /// Its engine's KV memory as the worker reports it (Engine.Info when it
    /// became ready, Health since); None when the engine does not say.
    /// Kept from the last worker until the next one is Ready: read it only
    /// while the slot is Ready.
    pub kv: Option<KvMemory>,
    /// The banners its current worker printed (the worker's own set, shared
    /// with the output reader, so it stays live); set at the banner check.
    pub banners: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// The model definition the slot's supervisor runs (read once when it
    /// started; a reload that does not restart the slot leaves it).
    pub definition: Option<Arc<ModelConfig>>,
    /// Keys in which that definition differs from the one in force, other
    /// than the limits a reload applies live: non-empty when a rolling
    /// restart halted before reaching this replica. Kept up to date when the
    /// definition is recorded and when a config is put in force.
    pub outdated: Vec<String>,
}

/// What a worker said of itself in Engine.Info when it became ready, that
/// the router checks requests against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineFacts {
    /// `engine_version`, e.g. `tt-worker 0.1.0`.
    pub version: String,
    /// `supported_parameters`: the optional GenerateRequest parameters it
    /// honours (none when it lists none).
    pub supported_parameters: Vec<String>,
    /// `host_sampling_parameters`: those of them that move the request's
    /// whole batch to the engine's slower host sampling.
    pub host_sampling_parameters: Vec<String>,
    /// `context_length`: tokens of prompt and answer together (0: not said).
    pub context_length: u32,
}

/// An engine's KV memory: the pool every sequence's keys and values share
/// (Engine.Info `kv_cache`) and how much of it is taken (Engine.Health).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMemory {
    /// The pool's budget in bytes, all ranks together.
    pub budget_bytes: u64,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Blocks the budget holds.
    pub blocks_total: u32,
    /// Whether finished sequences' blocks are kept for reuse.
    pub prefix_cache: bool,
    /// Blocks held by running sequences.
    pub blocks_in_use: u32,
    /// Blocks held only by the prefix cache (reusable, evicted first).
    pub blocks_cached: u32,
}

/// Operator and daemon requests to a slot's supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotCommand {
    /// Drain and stop; the supervisor ends.
    Stop,
    /// Start again now (also leaves a final Failed state and a loan).
    Restart,
    /// Drain and stop because the cards are being lent out; wait for
    /// Restart.
    Lend,
    /// Drain and stop on an operator's request (`ttctl slot stop`); the
    /// daemon keeps the cards locked; wait for Restart (`ttctl slot
    /// start`).
    Hold,
}

/// Why a slot is parked: Stopped with its supervisor waiting for Restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Park {
    /// Its cards are lent out (`ttctl card borrow`).
    Lent,
    /// An operator stopped it (`ttctl slot stop`).
    Held,
}

impl Park {
    /// The parked slot's reason.
    pub fn reason(self, slot: &str) -> String {
        match self {
            Park::Lent => "stopped: its cards are lent out (ttctl card borrow)".into(),
            Park::Held => format!(
                "stopped by an operator (ttctl slot stop); the daemon keeps its cards locked; `ttctl slot start {slot}` starts it again"
            ),
        }
    }
}

struct SlotEntry {
    view: SlotView,
    /// The worker's Engine client while the worker serves.
    engine: Option<EngineClient<Channel>>,
    in_flight: Arc<AtomicU32>,
    logs: Arc<LogRing>,
    commands: Option<mpsc::UnboundedSender<SlotCommand>>,
    /// The supervisor task, while one runs.
    task: Option<JoinHandle<()>>,
    /// Why the slot is being stopped (shown while it drains).
    stop_reason: Option<String>,
    /// Its phases on the way to Ready, for the router's estimates.
    timeline: recovery::Timeline,
    /// Its lifecycle's spans (traces on).
    lifecycle: lifecycle::Lifecycle,
}

impl SlotEntry {
    fn new(name: &str, model: &str, cards: Vec<String>, logs: Arc<LogRing>) -> SlotEntry {
        SlotEntry {
            view: SlotView {
                cards,
                name: name.to_string(),
                model: model.to_string(),
                state: SlotState::Pending,
                since: SystemTime::now(),
                reason: "configured".into(),
                cache_mode: None,
                attempt: 0,
                starts: 0,
                served: 0,
                resets_since_served: 0,
                retry_at: None,
                worker_pid: 0,
                worker_rss_bytes: 0,
                memory_growth: String::new(),
                memory_growth_per_hour: 0,
                worker_memory_peak_bytes: 0,
                in_flight: 0,
                last_error: String::new(),
                variant: String::new(),
                stats: Arc::new(stats::SlotStats::default()),
                context_length: 0,
                engine_facts: Arc::default(),
                kv: None,
                banners: Arc::default(),
                definition: None,
                outdated: Vec::new(),
            },
            engine: None,
            in_flight: Arc::new(AtomicU32::new(0)),
            logs,
            commands: None,
            task: None,
            stop_reason: None,
            timeline: recovery::Timeline::new(Instant::now()),
            lifecycle: lifecycle::Lifecycle::default(),
        }
    }
}

/// Owner of all slot state.
pub struct SlotManager {
    /// The config in force; a reload swaps it.
    config: RwLock<Arc<Config>>,
    cards: Arc<CardManager>,
    slots: Mutex<BTreeMap<String, SlotEntry>>,
    /// Woken whenever a slot's state or load changes (the router waits on it).
    pub changed: Notify,
    /// Cache builds asked for (`ttctl cache build`), taken by the slot's
    /// next start, which then builds cold and stops instead of serving.
    pending_builds: Mutex<BTreeMap<String, oneshot::Sender<Result<String, String>>>>,
}

/// A model's slots as admission reads them ([`SlotManager::standing`]).
pub struct Standing {
    /// Whether the model can serve now, soon, or not without an operator.
    pub availability: Availability,
    /// What the engines of its Ready slots honour.
    pub ready_engines: Vec<Arc<EngineFacts>>,
    /// Requests its Ready slots serve now.
    pub in_flight: u32,
}

/// [`SlotManager::availability`] over a table already locked.
fn availability_in(
    table: &BTreeMap<String, SlotEntry>,
    model: &str,
    lost: Option<&str>,
) -> Availability {
    let now = Instant::now();
    let (mut recovering, mut stopped) = (false, false);
    let mut eta: Option<Duration> = None;
    let mut retry_in: Option<Duration> = None;
    for (name, e) in table.iter().filter(|(_, e)| e.view.model == model) {
        let state = e.view.state;
        let slot_eta = if state == SlotState::Ready && Some(name.as_str()) == lost {
            e.timeline.eta_after_loss()
        } else if state == SlotState::Ready {
            return Availability::Ready;
        } else if let (SlotState::Failed, Some(at), false) =
            (state, e.view.retry_at, e.timeline.has_served())
        {
            let d = at.duration_since(SystemTime::now()).unwrap_or_default();
            retry_in = Some(retry_in.map_or(d, |best| best.min(d)));
            continue;
        } else if recovery::is_recovering(state, e.view.retry_at) {
            e.timeline.eta(state, e.view.retry_at, now)
        } else {
            stopped |= matches!(state, SlotState::Draining | SlotState::Stopped);
            continue;
        };
        recovering = true;
        if let Some(d) = slot_eta {
            eta = Some(eta.map_or(d, |best| best.min(d)));
        }
    }
    if recovering {
        Availability::Recovering { eta }
    } else if let Some(retry_in) = retry_in {
        Availability::Retrying { retry_in }
    } else if stopped {
        Availability::Stopped
    } else {
        Availability::Down
    }
}

/// What the router needs to send a request to a slot.
#[derive(Clone)]
pub struct Route {
    /// Slot name.
    pub slot: String,
    /// The worker's client.
    pub engine: EngineClient<Channel>,
    /// The slot's in-flight counter (the caller increments and decrements).
    pub in_flight: Arc<AtomicU32>,
    /// The slot's recent figures (the caller records into them).
    pub stats: Arc<stats::SlotStats>,
    /// What its worker said of itself when it became ready.
    pub engine_facts: Arc<EngineFacts>,
}

/// A Ready slot the router may send a request to, with its load: what
/// [`SlotManager::pick`] offers the router's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// The slot's name.
    pub slot: &'a str,
    /// Its requests in flight.
    pub in_flight: u32,
}

/// Log lines kept per slot for `ttctl logs`.
const LOG_LINES: usize = 2000;

/// Every slot a config defines: (slot name, model name), in name order.
pub fn configured_slots(config: &Config) -> Vec<(String, String)> {
    let mut slots = Vec::new();
    for (model, m) in &config.models {
        let numbered = !m.replicas.is_empty();
        for i in 0..m.card_sets().len() {
            slots.push((crate::config::slot_name(model, i, numbered), model.clone()));
        }
    }
    slots.sort();
    slots
}

/// Keys in which a slot's running definition differs from the one `config`
/// puts in force (empty before its supervisor has started, or when equal).
fn outdated(view: &SlotView, config: &Config) -> Vec<String> {
    match (&view.definition, config.models.get(&view.model)) {
        (Some(running), Some(in_force)) => crate::config::diff::outdated_keys(running, in_force),
        _ => Vec::new(),
    }
}

impl SlotManager {
    /// Every configured slot, Pending.
    pub fn new(config: &Config, cards: Arc<CardManager>) -> Arc<SlotManager> {
        let mut slots = BTreeMap::new();
        for (name, model) in configured_slots(config) {
            let entry = SlotEntry::new(
                &name,
                &model,
                cards.slot_cards().get(&name).cloned().unwrap_or_default(),
                Arc::new(LogRing::new(LOG_LINES)),
            );
            slots.insert(name, entry);
        }
        Arc::new(SlotManager {
            config: RwLock::new(Arc::new(config.clone())),
            cards,
            slots: Mutex::new(slots),
            changed: Notify::new(),
            pending_builds: Mutex::new(BTreeMap::new()),
        })
    }

    fn table(&self) -> MutexGuard<'_, BTreeMap<String, SlotEntry>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start a supervisor task for every slot.
    pub fn start_all(self: &Arc<Self>) {
        let names: Vec<String> = self.table().keys().cloned().collect();
        for name in names {
            self.spawn_supervisor(&name);
        }
    }

    fn spawn_supervisor(self: &Arc<Self>, name: &str) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut table = self.table();
        if let Some(entry) = table.get_mut(name) {
            entry.commands = Some(tx);
            entry.stop_reason = None;
            entry.task = Some(tokio::spawn(supervisor::run(
                self.clone(),
                name.to_string(),
                rx,
            )));
        }
    }

    /// Add a slot (reload) and start its supervisor. A slot replacing one of
    /// the same name keeps that slot's log lines, so `ttctl logs` shows the
    /// old worker's last words next to the new one's.
    pub fn add_slot(self: &Arc<Self>, name: &str, model: &str, logs: Option<Arc<LogRing>>) {
        let cards = self
            .cards
            .slot_cards()
            .get(name)
            .cloned()
            .unwrap_or_default();
        let logs = logs.unwrap_or_else(|| Arc::new(LogRing::new(LOG_LINES)));
        self.table()
            .insert(name.to_string(), SlotEntry::new(name, model, cards, logs));
        self.spawn_supervisor(name);
        self.publish();
    }

    /// Replace a stopped slot with a fresh one of the same name (a reload's
    /// restart) in one step: the status never shows the model without it
    /// (a scrape between a removal and an add did). Its log lines stay.
    pub fn replace_slot(self: &Arc<Self>, name: &str, model: &str) {
        let cards = self
            .cards
            .slot_cards()
            .get(name)
            .cloned()
            .unwrap_or_default();
        {
            let mut table = self.table();
            let logs = table
                .remove(name)
                .map(|e| e.logs)
                .unwrap_or_else(|| Arc::new(LogRing::new(LOG_LINES)));
            table.insert(name.to_string(), SlotEntry::new(name, model, cards, logs));
        }
        self.spawn_supervisor(name);
        self.publish();
    }

    /// Remove a stopped slot (reload); returns its log ring.
    pub fn remove_slot(&self, name: &str) -> Option<Arc<LogRing>> {
        let entry = self.table().remove(name)?;
        self.publish();
        Some(entry.logs)
    }

    /// Drain and stop these slots (name, why: shown while it drains), and
    /// wait for their supervisors to end (at most `limit`; a supervisor still
    /// running then is aborted, which kills its worker). Returns the slots
    /// that had to be aborted.
    pub async fn stop_slots(&self, slots: &[(String, String)], limit: Duration) -> Vec<String> {
        let mut tasks = Vec::new();
        for (name, why) in slots {
            let task = {
                let mut table = self.table();
                let Some(entry) = table.get_mut(name) else {
                    continue;
                };
                entry.stop_reason = Some(why.clone());
                entry.task.take()
            };
            let _ = self.command(name, SlotCommand::Stop);
            if let Some(task) = task {
                tasks.push((name.clone(), task));
            }
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut aborted = Vec::new();
        for (name, mut task) in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::error!(slot = %name, limit_secs = limit.as_secs(), "slot did not stop in time; aborting its supervisor");
                task.abort();
                let _ = task.await;
                aborted.push(name);
            }
        }
        aborted
    }

    /// Why a slot is being stopped, if someone said.
    pub fn stop_reason(&self, slot: &str) -> Option<String> {
        self.table().get(slot).and_then(|e| e.stop_reason.clone())
    }

    /// The only place a slot's state changes (with [`Self::retry_later`],
    /// its variant for a failure with a retry scheduled).
    pub fn transition(&self, slot: &str, state: SlotState, reason: impl Into<String>) {
        self.set_state(slot, state, reason.into(), None);
    }

    /// Failed, with the next attempt at `retry_at`. The state and the retry
    /// time change together: a reader seeing Failed without a retry takes
    /// the slot for one that gave up (the router then refuses at once
    /// instead of waiting for it).
    pub fn retry_later(&self, slot: &str, reason: impl Into<String>, retry_at: SystemTime) {
        self.set_state(slot, SlotState::Failed, reason.into(), Some(retry_at));
    }

    fn set_state(
        &self,
        slot: &str,
        state: SlotState,
        reason: String,
        retry_at: Option<SystemTime>,
    ) {
        {
            let mut table = self.table();
            let Some(entry) = table.get_mut(slot) else {
                return;
            };
            let from = entry.view.state;
            if from == state && entry.view.reason == reason && entry.view.retry_at == retry_at {
                // Nothing changed: publishing would wake every subscriber,
                // a supervisor waiting for its cards among them, which would
                // set the same state again (a busy loop that burned a core
                // while a slot waited on a Failed card).
                return;
            }
            if from != state {
                tracing::info!(slot, from = ?from, to = ?state, %reason, "slot transition");
            } else if entry.view.reason != reason {
                tracing::debug!(slot, state = ?state, %reason, "slot progress");
            }
            if from != state {
                entry.view.since = SystemTime::now();
                entry.timeline.enter(from, state, Instant::now());
            }
            entry
                .lifecycle
                .transition(slot, &entry.view.model, from, state, &reason);
            entry.view.state = state;
            entry.view.reason = reason;
            entry.view.retry_at = retry_at;
            if state != SlotState::Ready {
                entry.engine = None;
            }
        }
        self.publish();
    }

    /// Change the facts of a slot that are not its state (pid, RSS, cache
    /// mode, attempt, errors), then publish.
    pub fn update(&self, slot: &str, f: impl FnOnce(&mut SlotView)) {
        {
            let mut table = self.table();
            let Some(entry) = table.get_mut(slot) else {
                return;
            };
            f(&mut entry.view);
        }
        self.publish();
    }

    /// Make a Ready slot routable with this client.
    pub fn set_engine(&self, slot: &str, engine: Option<EngineClient<Channel>>) {
        if let Some(entry) = self.table().get_mut(slot) {
            entry.engine = engine;
        }
        self.changed.notify_waiters();
    }

    /// Tell everyone who reads slots that one changed: status watchers and
    /// gRPC health through the status bus, the router through `changed`.
    fn publish(&self) {
        self.cards.bus().notify();
        self.changed.notify_waiters();
    }

    /// Every slot, sorted by name, with live in-flight counts.
    pub fn snapshot(&self) -> Vec<SlotView> {
        self.table()
            .values()
            .map(|e| {
                let mut v = e.view.clone();
                v.in_flight = e.in_flight.load(Ordering::Relaxed);
                v
            })
            .collect()
    }

    /// The reset guard: a card may be reset by hand only while no slot
    /// holds a worker on it (resetting a card under a live engine wedges
    /// it). The error names the slot and what to do.
    pub fn check_manual_reset(&self, bdf: &str) -> Result<(), SlotError> {
        match self
            .snapshot()
            .into_iter()
            .find(|s| s.cards.iter().any(|c| c == bdf) && s.state.holds_worker())
        {
            Some(slot) => Err(SlotError::CardInUse {
                bdf: bdf.to_string(),
                slot: slot.name,
                state: format!("{:?}", slot.state),
            }),
            None => Ok(()),
        }
    }

    /// Slots that hold a worker on this cache variant, as `name (state)`.
    pub fn using_variant(&self, model: &str, key: &str) -> Vec<String> {
        self.snapshot()
            .into_iter()
            .filter(|s| s.model == model && s.variant == key && s.state.holds_worker())
            .map(|s| format!("{} ({:?})", s.name, s.state))
            .collect()
    }

    /// Record the model definition a slot's supervisor runs (once, when it
    /// starts) and whether it is the one in force.
    pub fn set_definition(&self, slot: &str, definition: ModelConfig) {
        let config = self.config();
        if let Some(e) = self.table().get_mut(slot) {
            e.view.definition = Some(Arc::new(definition));
            e.view.outdated = outdated(&e.view, &config);
        }
    }

    /// Slots whose supervisor runs another definition than the one in
    /// force (a halted rolling restart), with the definition they run.
    pub fn outdated(&self) -> BTreeMap<String, ModelConfig> {
        self.snapshot()
            .into_iter()
            .filter(|v| !v.outdated.is_empty())
            .filter_map(|v| v.definition.map(|d| (v.name, d.as_ref().clone())))
            .collect()
    }

    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Put a new config in force (reload). Running supervisors keep the
    /// model definition they started with; new ones read this.
    pub fn set_config(&self, config: Config) {
        for e in self.table().values_mut() {
            e.view.outdated = outdated(&e.view, &config);
        }
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    /// The card table.
    pub fn cards(&self) -> &Arc<CardManager> {
        &self.cards
    }

    /// The log ring of a slot.
    pub fn logs(&self, slot: &str) -> Option<Arc<LogRing>> {
        self.table().get(slot).map(|e| e.logs.clone())
    }

    /// The view of one slot.
    pub fn view(&self, slot: &str) -> Option<SlotView> {
        self.table().get(slot).map(|e| e.view.clone())
    }

    /// Send a command to a slot's supervisor.
    pub fn command(&self, slot: &str, command: SlotCommand) -> Result<(), SlotError> {
        Self::send(&self.table(), slot, command).map(|_| ())
    }

    /// Ask a slot's supervisor to restart it, and return the slot as the
    /// request found it. Taken under the table lock with the request
    /// queued, so every start counted after this snapshot's `starts` began
    /// after the request.
    pub fn request_restart(&self, slot: &str) -> Result<SlotView, SlotError> {
        let table = self.table();
        let entry = Self::send(&table, slot, SlotCommand::Restart)?;
        let mut view = entry.view.clone();
        view.in_flight = entry.in_flight.load(Ordering::Relaxed);
        Ok(view)
    }

    /// Ask a slot to drain and stop until `request_restart` (`ttctl slot
    /// stop`); the slot as the request found it.
    pub fn request_hold(&self, slot: &str) -> Result<SlotView, SlotError> {
        let table = self.table();
        let entry = Self::send(&table, slot, SlotCommand::Hold)?;
        let mut view = entry.view.clone();
        view.in_flight = entry.in_flight.load(Ordering::Relaxed);
        Ok(view)
    }

    /// Sends `command` to the slot's supervisor; the slot's entry.
    fn send<'t>(
        table: &'t BTreeMap<String, SlotEntry>,
        slot: &str,
        command: SlotCommand,
    ) -> Result<&'t SlotEntry, SlotError> {
        let entry = table.get(slot).ok_or_else(|| SlotError::NoSuchSlot {
            name: crate::echo::echo(slot),
            known: table.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        entry
            .commands
            .as_ref()
            .ok_or_else(|| SlotError::SupervisorEnded(slot.to_string()))?
            .send(command)
            .map_err(|_| SlotError::SupervisorEnded(slot.to_string()))?;
        Ok(entry)
    }

    /// Ask a slot for a cold cache build instead of its next normal start;
    /// the answer arrives on the returned receiver.
    pub fn request_build(
        &self,
        slot: &str,
    ) -> Result<oneshot::Receiver<Result<String, String>>, SlotError> {
        let (tx, rx) = oneshot::channel();
        self.pending_builds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(slot.to_string(), tx);
        self.command(slot, SlotCommand::Restart)?;
        Ok(rx)
    }

    /// The pending build request of a slot, if any (taken once).
    pub fn take_build(&self, slot: &str) -> Option<oneshot::Sender<Result<String, String>>> {
        self.pending_builds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(slot)
    }

    /// Whether `model` can serve now, soon (and when), or not without an
    /// operator. `lost` names a slot whose worker the caller has just seen
    /// die: it still shows Ready until its supervisor notices, so it is
    /// counted as at the start of a recovery instead.
    pub fn availability(&self, model: &str, lost: Option<&str>) -> Availability {
        availability_in(&self.table(), model, lost)
    }

    /// A model's slots as admission reads them, under one lock: how they
    /// stand, and what the engines of the Ready ones honour.
    pub fn standing(&self, model: &str) -> Standing {
        let table = self.table();
        Standing {
            availability: availability_in(&table, model, None),
            ready_engines: table
                .values()
                .filter(|e| e.view.model == model && e.view.state == SlotState::Ready)
                .map(|e| e.view.engine_facts.clone())
                .collect(),
            in_flight: table
                .values()
                .filter(|e| e.view.model == model && e.view.state == SlotState::Ready)
                .map(|e| e.in_flight.load(Ordering::Relaxed))
                .sum(),
        }
    }
    /// The Ready slot of `model` that `choose` picks among the candidates
    /// (the Ready slots with a worker and their loads, in name order), or
    /// None when it picks none. The slot's in-flight count is taken before
    /// the table is released, so two requests routed at once both see the
    /// other's place; the caller gives it back (the router's `InFlight`).
    pub fn pick(
        &self,
        model: &str,
        choose: impl FnOnce(&[Candidate<'_>]) -> Option<usize>,
    ) -> Option<Route> {
        let table = self.table();
        let ready: Vec<(&String, &SlotEntry, EngineClient<Channel>)> = table
            .iter()
            .filter(|(_, e)| e.view.model == model && e.view.state == SlotState::Ready)
            .filter_map(|(name, e)| Some((name, e, e.engine.clone()?)))
            .collect();
        let candidates: Vec<Candidate<'_>> = ready
            .iter()
            .map(|(name, e, _)| Candidate {
                slot: name.as_str(),
                in_flight: e.in_flight.load(Ordering::Relaxed),
            })
            .collect();
        let (name, e, engine) = ready.get(choose(&candidates)?)?;
        e.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Route {
            slot: name.to_string(),
            engine: engine.clone(),
            in_flight: e.in_flight.clone(),
            stats: e.view.stats.clone(),
            engine_facts: e.view.engine_facts.clone(),
        })
    }

    /// Stop every slot (drain, Shutdown, SIGTERM, SIGKILL) and wait until all
    /// supervisors have ended or `limit` passes.
    pub async fn stop_all(&self, limit: std::time::Duration) {
        let names: Vec<String> = self.table().keys().cloned().collect();
        for name in &names {
            let _ = self.command(name, SlotCommand::Stop);
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            let running = self
                .snapshot()
                .iter()
                .filter(|v| !matches!(v.state, SlotState::Stopped | SlotState::Pending))
                .count();
            if running == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(running, "slots still stopping at the shutdown limit");
                return;
            }
        }
    }
}
