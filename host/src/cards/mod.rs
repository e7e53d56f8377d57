//! Cards: discovery, locks, reset with proof, and the one place that holds
//! each card's state.
//!
//! [`CardManager`] owns a table keyed by BDF. Only its methods change a
//! card's state; everyone else reads [`CardManager::snapshot`] or waits on
//! [`CardManager::subscribe`]. Managed cards (those the config's models use,
//! or every card when there are no models) are locked by the daemon for as
//! long as it runs; a card whose lock someone else holds is never touched.

pub mod discovery;
pub mod driver;
// The lock file format is shared with ttctl and scripts: its own crate.
pub use tt_card_lock as lock;
pub mod reset;

use crate::bus::StatusBus;
use crate::config::{CardRef, Config};
use crate::hostfs;
use discovery::{CardInfo, CardProcess, HardwareRoot};
use lock::{CardLock, LockError, LockHolder, LockPolicy};
use reset::{
    FailureKind, MissingCard, ResetError, ResetEvent, ResetFailure, ResetOutcome, Resetter,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tt_serving_telemetry::{attr, Attribute, Kind, Span};

/// What the daemon is doing with a card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CardState {
    /// Locked, healthy, belongs to a slot.
    Ready,
    /// Locked, healthy, no slot (config without models).
    Idle,
    /// Another process holds its lock.
    HeldElsewhere,
    /// tt-smi is resetting it.
    Resetting,
    /// Proving it came back.
    Probing,
    /// Failed too many resets, or a reset of it hung; unused until an
    /// operator resets it ([`QuarantineKind`] says which).
    Quarantined,
    /// Configured but not found.
    Missing,
    /// The last reset failed; will be retried.
    Failed,
    /// Not used by any model; not locked, not touched.
    Unmanaged,
}

/// What the reason of a quarantined card begins with when a tt-smi reset
/// of it did not return. `ttctl status` shows such a card as `quarantined
/// (reset hung)` by this prefix (ttctl's `render/status.rs` spells it too).
pub const RESET_HUNG_PREFIX: &str = "reset hung: ";

/// Why a card is quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuarantineKind {
    /// Its reset failed every attempt: it stays out until an operator's
    /// reset proves it back. Automatic resets (start-up, a slot's) may still
    /// run on it.
    Failed,
    /// A tt-smi reset of it did not return and was killed (tt-smi issues 85
    /// and 185: the host may need a reboot). No reset of it is tried
    /// automatically; an operator's `ttctl card reset` may try, and lifts
    /// the quarantine once it proves the card back.
    ResetHung,
}

impl QuarantineKind {
    /// The kind a recorded quarantine reason says. The reason is what
    /// survives a restart (the state dir keeps only it), so the kind is
    /// read from it.
    pub fn of(reason: &str) -> QuarantineKind {
        if reason.starts_with(RESET_HUNG_PREFIX) {
            QuarantineKind::ResetHung
        } else {
            QuarantineKind::Failed
        }
    }
}

/// Everything known about one card, as shown by `ttctl status`.
#[derive(Debug, Clone)]
pub struct CardView {
    /// PCI address (or `index N` for a configured index that was not found).
    pub bdf: String,
    /// Last discovery result; None while the card is gone.
    pub info: Option<CardInfo>,
    /// Current state.
    pub state: CardState,
    /// Why it is in that state.
    pub reason: String,
    /// Lock holder, when locked by anyone.
    pub holder: Option<LockHolder>,
    /// Whether the holder is this daemon.
    pub held_by_daemon: bool,
    /// Processes with the device open (excluding the daemon's own workers).
    pub processes: Vec<CardProcess>,
    /// The slot using it.
    pub slot: Option<String>,
    /// False once the heartbeat has read the same value for a whole
    /// `reset.heartbeat_interval_ms` ([`heartbeat_alive`]), and while it
    /// cannot be read; true before that interval has passed, so that a
    /// heartbeat seen for the first time (at start, after a reset) is not
    /// called stalled before it had the time to advance.
    pub heartbeat_ok: bool,
    /// Failed resets in a row.
    pub reset_failures: u32,
    /// Output of the last tt-smi run.
    pub last_reset_output: String,
}

struct Entry {
    view: CardView,
    /// Whether the daemon keeps this card locked.
    managed: bool,
    lock: Option<CardLock>,
    /// A reset is running; a second one is refused.
    busy: bool,
    /// Lent to an outside job (`ttctl card borrow`): the daemon neither
    /// holds nor retakes the lock until the card is taken back.
    lent: Option<String>,
    /// The heartbeat value last read and when it was first read at that
    /// value; None while unreadable.
    heartbeat_seen: Option<(u64, Instant)>,
    /// When to log again that someone else holds this managed card's lock,
    /// and the interval after that (doubling up to ten minutes), so an
    /// operator sees why a slot waits without a line every tick.
    held_log: Option<(std::time::Instant, std::time::Duration)>,
}

/// Why a card operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// No card matches.
    #[error("no card {0}; `ttctl status` lists the cards by index and BDF")]
    NotFound(String),
    /// Someone else owns it.
    #[error(transparent)]
    Locked(#[from] LockError),
    /// A reset is already running.
    #[error("card {0} is already being reset; wait for it to finish (`ttctl status --watch`)")]
    Busy(String),
    /// The reset ran and failed.
    #[error(transparent)]
    ResetFailed(#[from] ResetFailure),
    /// A card of the reset is not on the host, so tt-smi was not called.
    #[error(transparent)]
    NotAttempted(#[from] MissingCard),
}

/// Each card's reset outcome and duration, as the metrics count them: a
/// card the failure blames as hung or failed, every other one proven.
fn record_reset_metrics(
    metrics: &crate::metrics::Metrics,
    bdfs: &[String],
    result: &Result<ResetOutcome, ResetError>,
    took: std::time::Duration,
) {
    let failure = match result {
        Err(ResetError::Failed(failure)) => Some(failure),
        _ => None,
    };
    for bdf in bdfs {
        let outcome = match failure {
            Some(f) if f.blames(bdf) && f.kind == FailureKind::Hung => {
                crate::metrics::ResetOutcome::Hung
            }
            Some(f) if f.blames(bdf) => {
                // The last attempt's proof failed too.
                metrics.reset_proof_failure(bdf);
                crate::metrics::ResetOutcome::Failed
            }
            _ => crate::metrics::ResetOutcome::Proven,
        };
        metrics.card_reset(bdf, outcome, took);
    }
}

impl From<ResetError> for CardError {
    fn from(e: ResetError) -> CardError {
        match e {
            ResetError::NotAttempted(m) => CardError::NotAttempted(m),
            ResetError::Failed(f) => CardError::ResetFailed(f),
        }
    }
}

/// The daemon's table of cards.
pub struct CardManager {
    hw: HardwareRoot,
    lock_dir: PathBuf,
    lock_policy: LockPolicy,
    quarantine_dir: PathBuf,
    resetter: Resetter,
    /// `reset.heartbeat_interval_ms`: a heartbeat that stands still this
    /// long is stalled, as in a reset's proof.
    heartbeat_interval: Duration,
    /// Which slot each card belongs to; a reload changes it.
    assignment: RwLock<Assignment>,
    table: Mutex<BTreeMap<String, Entry>>,
    bus: StatusBus,
}

impl CardManager {
    /// Build the table from a first discovery. Configured cards given by
    /// index are resolved to BDFs now, since indices can change later.
    pub fn new(config: &Config, bus: StatusBus) -> std::io::Result<Arc<CardManager>> {
        let hw = HardwareRoot::from(&config.hardware);
        let found = hw.discover()?;
        let (assignment, missing) = Assignment::from_config(config, &found);
        let manager = Arc::new(CardManager {
            resetter: Resetter::new(
                hw.clone(),
                config.hardware.tt_smi.clone(),
                config.reset.clone(),
            ),
            hw,
            heartbeat_interval: Duration::from_millis(config.reset.heartbeat_interval_ms),
            lock_dir: config.daemon.lock_dir.clone(),
            lock_policy: lock_policy(config),
            quarantine_dir: config.daemon.state_dir.join("quarantine"),
            assignment: RwLock::new(assignment),
            table: Mutex::new(BTreeMap::new()),
            bus,
        });
        {
            let mut table = manager.lock_table();
            manager.add_missing(&mut table, missing);
        }
        manager.apply_discovery(found);
        Ok(manager)
    }

    fn lock_table(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.bus.notify();
    }

    fn dirty_file(&self, bdf: &str) -> PathBuf {
        self.quarantine_dir
            .with_file_name("dirty")
            .join(format!("{bdf}.dirty"))
    }

    /// Record that these cards must be reset before their next use (a
    /// worker on them did not stop cleanly). The record is a file in the
    /// state dir, so it survives a daemon restart.
    pub fn mark_dirty(&self, bdfs: &[String]) {
        for bdf in bdfs {
            let path = self.dirty_file(bdf);
            let written = path
                .parent()
                .map_or(Ok(()), hostfs::create_dir_all_no_follow)
                .and_then(|_| hostfs::write_atomic(&path, b"worker did not stop cleanly\n", 0o644));
            if let Err(e) = written {
                tracing::error!(card = %bdf, error = %e, "cannot record a dirty card");
            }
        }
    }

    /// Forget the dirty record of these cards: their worker stopped cleanly
    /// on request.
    pub fn clear_dirty(&self, bdfs: &[String]) {
        for bdf in bdfs {
            let path = self.dirty_file(bdf);
            if let Err(e) = hostfs::remove_file(&path) {
                tracing::warn!(card = %bdf, error = %e, "cannot remove the dirty record")
            }
        }
    }

    /// Cards recorded dirty by an earlier run.
    pub fn dirty_cards(&self) -> Vec<String> {
        self.lock_table()
            .keys()
            .filter(|bdf| hostfs::is_plain_file(&self.dirty_file(bdf)))
            .cloned()
            .collect()
    }

    /// The status bus this table reports its changes on.
    pub fn bus(&self) -> &StatusBus {
        &self.bus
    }

    /// The hardware root in use.
    pub fn hardware(&self) -> &HardwareRoot {
        &self.hw
    }

    fn assignment(&self) -> std::sync::RwLockReadGuard<'_, Assignment> {
        self.assignment.read().unwrap_or_else(|e| e.into_inner())
    }

    fn new_entry(&self, bdf: &str, info: Option<CardInfo>) -> Entry {
        let assignment = self.assignment();
        let managed = assignment.manages(bdf);
        Entry {
            view: CardView {
                bdf: bdf.to_string(),
                info,
                state: if managed {
                    CardState::Failed
                } else {
                    CardState::Unmanaged
                },
                reason: String::new(),
                holder: None,
                held_by_daemon: false,
                processes: Vec::new(),
                slot: assignment.slots_of.get(bdf).cloned(),
                heartbeat_ok: false,
                reset_failures: 0,
                last_reset_output: String::new(),
            },
            managed,
            lock: None,
            busy: false,
            lent: None,
            heartbeat_seen: None,
            held_log: None,
        }
    }

    /// Re-read the hardware: discovery, heartbeats, telemetry, processes, and
    /// lock attempts for managed cards not locked yet. Called every tick.
    pub fn refresh(&self) {
        match self.hw.discover() {
            Ok(found) => self.apply_discovery(found),
            Err(e) => tracing::warn!(error = %e, "card discovery failed"),
        }
    }

    fn apply_discovery(&self, found: Vec<CardInfo>) {
        let mut changed = false;
        {
            let mut table = self.lock_table();
            let present: BTreeSet<String> = found.iter().map(|c| c.bdf.clone()).collect();
            for info in found {
                let bdf = info.bdf.clone();
                let entry = table
                    .entry(bdf.clone())
                    .or_insert_with(|| self.new_entry(&bdf, None));
                entry.view.heartbeat_ok = heartbeat_alive(
                    &mut entry.heartbeat_seen,
                    info.heartbeat,
                    Instant::now(),
                    self.heartbeat_interval,
                );
                entry.view.processes = self
                    .hw
                    .processes(info.index)
                    .into_iter()
                    .filter(|p| !is_daemon_or_descendant(p.pid))
                    .collect();
                entry.view.info = Some(info);
                changed = true;
            }
            for (bdf, entry) in table.iter_mut() {
                if !present.contains(bdf) && !entry.busy && entry.view.state != CardState::Missing {
                    entry.view.info = None;
                    entry.view.heartbeat_ok = false;
                    entry.heartbeat_seen = None;
                    if entry.view.state != CardState::Quarantined {
                        entry.view.state = CardState::Missing;
                        entry.view.reason =
                            "the card disappeared from sysfs outside a reset; check `dmesg`".into();
                        tracing::warn!(card = %bdf, "card disappeared");
                    }
                    changed = true;
                }
            }
            let bdfs: Vec<String> = table.keys().cloned().collect();
            for bdf in bdfs {
                if let Some(entry) = table.get_mut(&bdf) {
                    changed |= self.settle(entry);
                }
            }
        }
        if changed {
            self.notify();
        }
    }

    /// Bring a card that is not busy into the state its lock and quarantine
    /// record say. Returns whether anything changed.
    fn settle(&self, entry: &mut Entry) -> bool {
        if entry.busy || entry.view.info.is_none() {
            return false;
        }
        let before = (entry.view.state, entry.view.reason.clone());
        let node_missing = entry.view.info.as_ref().is_some_and(|i| !i.dev_node);
        if let Some(q) = self.read_quarantine(&entry.view.bdf) {
            // Keep a managed quarantined card locked so that nobody else
            // (a benchmark, a script) picks up a card known to be bad.
            if entry.managed && entry.lock.is_none() {
                // Held by someone else: they already keep it from others.
                let _ = self.take_lock(entry, "tt-servingd (card quarantined)");
            }
            entry.view.state = CardState::Quarantined;
            entry.view.reason = q;
        } else if node_missing && entry.managed {
            // A class dir without its device node: nothing can open the
            // card, and a reset naming it would not be attempted.
            entry.view.state = CardState::Missing;
            entry.view.reason = format!(
                "{} is missing although sysfs lists the card; check `dmesg` and the udev rules",
                self.hw
                    .dev_node(entry.view.info.as_ref().map_or(0, |i| i.index))
                    .display()
            );
        } else if let Some(purpose) = &entry.lent {
            entry.view.state = CardState::HeldElsewhere;
            entry.view.reason = format!("lent to {purpose} (ttctl card borrow)");
            entry.view.holder = lock::holder_of(&lock::lock_path(&self.lock_dir, &entry.view.bdf));
            entry.view.held_by_daemon = false;
        } else if !entry.managed {
            entry.view.state = CardState::Unmanaged;
            entry.view.holder = lock::holder_of(&lock::lock_path(&self.lock_dir, &entry.view.bdf));
            entry.view.reason.clear();
        } else if entry.lock.is_none() {
            let purpose = match &entry.view.slot {
                Some(slot) => format!("tt-servingd slot {slot}"),
                None => "tt-servingd".to_string(),
            };
            match self.take_lock(entry, &purpose) {
                Ok(()) => {
                    entry.view.state = self.healthy_state(entry);
                    entry.view.reason.clear();
                    entry.held_log = None;
                }
                Err(LockError::Held { holder, path, .. }) => {
                    entry.view.state = CardState::HeldElsewhere;
                    entry.view.reason = format!(
                        "lock {} held by {}; the daemon takes the card when it is released",
                        path.display(),
                        holder
                            .as_deref()
                            .map(LockHolder::describe)
                            .unwrap_or_else(|| "another process".into())
                    );
                    entry.view.holder = holder.map(|h| *h);
                    entry.view.held_by_daemon = false;
                    log_held_with_backoff(entry);
                }
                // Someone who may not hold the card can take its lock
                // whenever it is free: refused, named, with the fix.
                Err(e @ LockError::Foreign { .. }) => {
                    entry.view.state = CardState::HeldElsewhere;
                    entry.view.reason = e.to_string();
                    if let LockError::Foreign { openers, .. } = e {
                        entry.view.holder = openers.into_iter().next();
                    }
                    entry.view.held_by_daemon = false;
                    log_held_with_backoff(entry);
                }
                Err(e) => {
                    entry.view.state = CardState::Failed;
                    entry.view.reason = e.to_string();
                }
            }
        } else if matches!(
            entry.view.state,
            CardState::Missing | CardState::Failed | CardState::Resetting | CardState::Probing
        ) {
            entry.view.state = self.healthy_state(entry);
            entry.view.reason.clear();
        }
        if before != (entry.view.state, entry.view.reason.clone()) {
            tracing::info!(card = %entry.view.bdf, state = ?entry.view.state, reason = %entry.view.reason, "card state changed");
            true
        } else {
            false
        }
    }

    fn take_lock(&self, entry: &mut Entry, purpose: &str) -> Result<(), LockError> {
        let l = lock::try_lock(&self.lock_dir, &entry.view.bdf, purpose, self.lock_policy)?;
        tracing::info!(card = %entry.view.bdf, "took card lock");
        entry.lock = Some(l);
        entry.view.holder = Some(LockHolder {
            pid: std::process::id(),
            purpose: purpose.to_string(),
            ..LockHolder::default()
        });
        entry.view.held_by_daemon = true;
        Ok(())
    }

    fn healthy_state(&self, entry: &Entry) -> CardState {
        if entry.view.slot.is_some() {
            CardState::Ready
        } else {
            CardState::Idle
        }
    }

    /// Each configured slot's cards in rank order (a configured index that
    /// was not found appears as `index N`).
    pub fn slot_cards(&self) -> BTreeMap<String, Vec<String>> {
        self.assignment().slot_cards.clone()
    }

    /// Each slot's cards under another config (indices resolved against the
    /// cards present now), without applying it.
    pub fn assignment_of(&self, config: &Config) -> BTreeMap<String, Vec<String>> {
        let found: Vec<CardInfo> = self
            .lock_table()
            .values()
            .filter_map(|e| e.view.info.clone())
            .collect();
        Assignment::from_config(config, &found).0.slot_cards
    }

    fn add_missing(&self, table: &mut BTreeMap<String, Entry>, missing: Vec<(CardRef, String)>) {
        for (card, slot) in missing {
            let key = match &card {
                CardRef::Index(i) => format!("index {i}"),
                CardRef::Bdf(b) => crate::config::parse_bdf(b).unwrap_or_else(|| b.clone()),
            };
            if table.get(&key).is_some_and(|e| e.view.info.is_some()) {
                continue;
            }
            let mut entry = self.new_entry(&key, None);
            entry.view.slot = Some(slot);
            entry.view.state = CardState::Missing;
            entry.view.reason = format!(
                "configured card {card} is not present under {}; check the config and `lspci -d 1e52:`",
                self.hw.sys_root.join("class/tenstorrent").display()
            );
            table.insert(key, entry);
        }
    }

    /// Apply a reloaded config's card assignment. Cards no slot uses any
    /// more are unlocked (their slots were stopped first) and become
    /// Unmanaged; newly used cards are locked for their slot, or shown as
    /// held elsewhere until their holder lets go.
    pub fn reassign(&self, config: &Config) {
        {
            let mut table = self.lock_table();
            let found: Vec<CardInfo> = table.values().filter_map(|e| e.view.info.clone()).collect();
            let (assignment, missing) = Assignment::from_config(config, &found);
            *self.assignment.write().unwrap_or_else(|e| e.into_inner()) = assignment;
            // Placeholders of configured-but-absent cards are rebuilt.
            table.retain(|_, e| e.view.info.is_some());
            let assignment = self.assignment();
            for entry in table.values_mut() {
                let bdf = entry.view.bdf.clone();
                let managed = assignment.manages(&bdf);
                entry.view.slot = assignment.slots_of.get(&bdf).cloned();
                if entry.managed && !managed && !entry.busy {
                    if entry.lock.take().is_some() {
                        tracing::info!(card = %bdf, "released card lock: no slot uses the card any more");
                    }
                    entry.view.held_by_daemon = false;
                    entry.view.holder = None;
                }
                entry.managed = managed;
            }
            drop(assignment);
            self.add_missing(&mut table, missing);
            let bdfs: Vec<String> = table.keys().cloned().collect();
            for bdf in bdfs {
                if let Some(entry) = table.get_mut(&bdf) {
                    if entry.managed && entry.lock.is_some() {
                        // A managed card keeps its lock; its state follows
                        // its (new) slot.
                        if matches!(entry.view.state, CardState::Ready | CardState::Idle) {
                            entry.view.state = self.healthy_state(entry);
                        }
                    }
                    self.settle(entry);
                }
            }
        }
        self.notify();
    }

    /// Every card, sorted by BDF.
    pub fn snapshot(&self) -> Vec<CardView> {
        self.lock_table().values().map(|e| e.view.clone()).collect()
    }

    /// The BDF of a card named by index or BDF, as an operator types it.
    pub fn resolve_name(&self, name: &str) -> Result<String, CardError> {
        let table = self.lock_table();
        let found = if let Ok(index) = name.trim().parse::<u32>() {
            table
                .values()
                .find(|e| e.view.info.as_ref().is_some_and(|i| i.index == index))
        } else {
            let bdf = crate::config::parse_bdf(name).unwrap_or_default();
            table.get(&bdf)
        };
        found
            .map(|e| e.view.bdf.clone())
            .ok_or_else(|| CardError::NotFound(crate::echo::echo(name)))
    }

    /// Managed cards the daemon holds locks for, grouped by slot so that a
    /// TP=2 slot's cards are reset in one tt-smi call.
    pub fn reset_groups(&self) -> Vec<Vec<String>> {
        let table = self.lock_table();
        let mut by_slot: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for e in table.values().filter(|e| e.lock.is_some()) {
            let key = e.view.slot.clone().unwrap_or_else(|| e.view.bdf.clone());
            by_slot.entry(key).or_default().push(e.view.bdf.clone());
        }
        by_slot.into_values().collect()
    }

    /// Reset cards together and prove them back. Managed cards must be locked
    /// by the daemon already; an unmanaged card is locked for the duration.
    /// `manual` marks an operator's request: its success lifts quarantine.
    /// Every automatic reset (start-up, a slot's, a loan's return) comes
    /// through here with `manual` false and is refused, before tt-smi runs,
    /// when one of the cards is quarantined because a reset of it hung.
    pub async fn reset(
        &self,
        bdfs: &[String],
        manual: bool,
        on_event: &mut (dyn FnMut(ResetEvent) + Send),
    ) -> Result<ResetOutcome, CardError> {
        if !manual {
            let hung = |bdf: &str| {
                self.read_quarantine(bdf)
                    .is_some_and(|q| QuarantineKind::of(&q) == QuarantineKind::ResetHung)
            };
            if let Some(refused) = refuse_automatic_reset(bdfs, hung) {
                tracing::warn!(cards = %bdfs.join(","), "{refused}");
                return Err(CardError::ResetFailed(refused));
            }
        }
        let temporary_locks = self.begin_reset(bdfs, manual)?;
        self.notify();
        tracing::info!(cards = %bdfs.join(","), manual, "resetting cards");
        // A span per reset (traces on): its phases as events, its outcome.
        let trace = Span::root("card reset", Kind::Internal, None, None);
        trace.set_with(|| {
            vec![
                Attribute::new(attr::CARDS, bdfs.join(",")),
                Attribute::new("tt.reset.manual", manual),
            ]
        });
        let began = std::time::Instant::now();
        let metrics = crate::metrics::get();
        let result = {
            let mut forward = |event: ResetEvent| {
                // Progress shows in the table: tt-smi is done and the proof
                // waits for the cards to come back.
                if event.phase == reset::Phase::WaitingForDevice {
                    self.set_state(bdfs, CardState::Probing, &event.message);
                }
                if event.phase == reset::Phase::Retrying {
                    bdfs.iter().for_each(|b| metrics.reset_proof_failure(b));
                }
                tracing::info!(cards = %bdfs.join(","), attempt = event.attempt, phase = ?event.phase, "{}", event.message);
                trace.event("reset progress", || {
                    vec![
                        Attribute::new("tt.reset.attempt", i64::from(event.attempt)),
                        Attribute::new("tt.reset.phase", format!("{:?}", event.phase)),
                        Attribute::new("message", event.message.clone()),
                    ]
                });
                on_event(event);
            };
            self.resetter.reset_and_prove(bdfs, &mut forward).await
        };
        drop(temporary_locks);
        match &result {
            Err(ResetError::NotAttempted(missing)) => {
                tracing::error!(cards = %bdfs.join(","), "{missing}")
            }
            _ => record_reset_metrics(metrics, bdfs, &result, began.elapsed()),
        }
        self.settle_after_reset(bdfs, &result, manual);
        self.notify();
        match &result {
            Ok(outcome) => trace.set("tt.reset.attempts", i64::from(outcome.attempts)),
            Err(e) => trace.fail(|| e.to_string()),
        }
        trace.end();
        result.map_err(CardError::from)
    }

    /// Marks every card of a reset Resetting (refused when one is in use),
    /// taking for the reset's duration the locks of unmanaged cards.
    fn begin_reset(&self, bdfs: &[String], manual: bool) -> Result<Vec<CardLock>, CardError> {
        let mut temporary_locks = Vec::new();
        let mut table = self.lock_table();
        for entry in free_entries(&table, bdfs)? {
            if entry.lock.is_none() {
                temporary_locks.push(lock::try_lock(
                    &self.lock_dir,
                    &entry.view.bdf,
                    "tt-servingd reset",
                    self.lock_policy,
                )?);
            }
        }
        for bdf in bdfs {
            if let Some(entry) = table.get_mut(bdf) {
                entry.busy = true;
                entry.view.state = CardState::Resetting;
                entry.view.reason = if manual {
                    "reset requested by an operator".into()
                } else {
                    "reset by the daemon".into()
                };
            }
        }
        Ok(temporary_locks)
    }

    /// Every card of a reset set by its own outcome, under one hold of the
    /// table: in a reset of several, the cards proven back are back even
    /// when another is not, and one that was not attempted changed nothing.
    fn settle_after_reset(
        &self,
        bdfs: &[String],
        result: &Result<ResetOutcome, ResetError>,
        manual: bool,
    ) {
        let output = match result {
            Ok(outcome) => outcome.tt_smi_output.as_str(),
            Err(ResetError::Failed(failure)) => failure.tt_smi_output.as_str(),
            Err(ResetError::NotAttempted(_)) => "",
        };
        let mut table = self.lock_table();
        for bdf in bdfs {
            let Some(entry) = table.get_mut(bdf) else {
                continue;
            };
            entry.busy = false;
            match result {
                // Nothing was done to any card: the absent one is Missing,
                // the others go back to what they were, nobody is
                // quarantined, and the last reset's output stays.
                Err(ResetError::NotAttempted(missing)) => {
                    if *bdf == missing.bdf || entry.view.info.is_none() {
                        entry.view.info = self.hw.find(bdf);
                        entry.view.state = CardState::Missing;
                        entry.view.reason = missing.to_string();
                    } else {
                        entry.view.state = CardState::Probing;
                        entry.view.reason.clear();
                    }
                }
                Err(ResetError::Failed(failure)) if failure.blames(bdf) => {
                    entry.view.last_reset_output = output.to_string();
                    entry.view.reset_failures += failure.attempts;
                    entry.view.reason = quarantine_reason(bdf, failure);
                    self.write_quarantine(bdf, &entry.view.reason);
                    entry.view.state = CardState::Quarantined;
                    tracing::error!(card = %bdf, reason = %failure.reason, kind = ?failure.kind, "card quarantined");
                }
                Ok(_) | Err(ResetError::Failed(_)) => {
                    entry.view.last_reset_output = output.to_string();
                    entry.view.reset_failures = 0;
                    let _ = hostfs::remove_file(&self.dirty_file(bdf));
                    if manual {
                        self.clear_quarantine(bdf);
                    }
                    // Proven back: settle() below puts it in its healthy state.
                    entry.view.state = CardState::Probing;
                    entry.view.reason.clear();
                    entry.view.info = self.hw.find(bdf);
                }
            }
            self.settle(entry);
        }
    }

    fn set_state(&self, bdfs: &[String], state: CardState, reason: &str) {
        {
            let mut table = self.lock_table();
            for bdf in bdfs {
                if let Some(e) = table.get_mut(bdf) {
                    e.view.state = state;
                    e.view.reason = reason.to_string();
                }
            }
        }
        self.notify();
    }

    fn quarantine_file(&self, bdf: &str) -> PathBuf {
        self.quarantine_dir.join(format!("{bdf}.reason"))
    }

    /// Quarantine survives daemon restarts: a bad card stays out of service
    /// until an operator proves it back with a manual reset.
    fn read_quarantine(&self, bdf: &str) -> Option<String> {
        let bytes = hostfs::read(&self.quarantine_file(bdf)).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn write_quarantine(&self, bdf: &str, reason: &str) {
        let write = hostfs::create_dir_all_no_follow(&self.quarantine_dir).and_then(|_| {
            hostfs::write_atomic(&self.quarantine_file(bdf), reason.as_bytes(), 0o644)
        });
        if let Err(e) = write {
            tracing::error!(card = %bdf, error = %e, "cannot record quarantine in the state dir");
        }
    }

    fn clear_quarantine(&self, bdf: &str) {
        let _ = hostfs::remove_file(&self.quarantine_file(bdf));
    }

    /// Lend cards to an outside job: release the daemon's locks and do not
    /// retake them until [`CardManager::take_back`].
    pub fn lend(&self, bdfs: &[String], purpose: &str) -> Result<(), CardError> {
        {
            let mut table = self.lock_table();
            free_entries(&table, bdfs)?;
            for bdf in bdfs {
                if let Some(entry) = table.get_mut(bdf) {
                    entry.lent = Some(purpose.to_string());
                    entry.lock = None;
                    entry.view.holder = None;
                    self.settle(entry);
                }
            }
        }
        tracing::info!(cards = %bdfs.join(","), purpose, "cards lent");
        self.notify();
        Ok(())
    }

    /// End a loan: the daemon takes the locks again as soon as the borrower
    /// has released them.
    pub fn take_back(&self, bdfs: &[String]) {
        {
            let mut table = self.lock_table();
            for bdf in bdfs {
                if let Some(entry) = table.get_mut(bdf) {
                    entry.lent = None;
                    self.settle(entry);
                }
            }
        }
        tracing::info!(cards = %bdfs.join(","), "loan ended");
        self.notify();
    }

    /// Who other than the daemon uses these cards: holders of a lock the
    /// daemon does not hold, and processes (not the daemon's) that hold the
    /// chip (its tt-umd CHIP_IN_USE lock names them), as `card: pid N
    /// (user: command)` lines. A process that only has the device open (a
    /// monitoring tool) is not a user: it reads telemetry, and resets and
    /// engines work beside it.
    pub fn foreign_users(&self, bdfs: &[String]) -> Vec<String> {
        let table = self.lock_table();
        let mut out = Vec::new();
        for bdf in bdfs {
            let Some(entry) = table.get(bdf) else {
                continue;
            };
            if entry.lock.is_none() {
                if let Some(h) = lock::holder_of(&lock::lock_path(&self.lock_dir, bdf)) {
                    out.push(format!("{bdf}: {} (holds its lock)", h.describe()));
                }
            }
            for p in entry.view.processes.iter().filter(|p| p.holds_chip) {
                let (user, command) = tt_card_lock::procs::identity(p.pid);
                let holder = LockHolder {
                    pid: p.pid,
                    user,
                    command: if command.is_empty() {
                        p.command.clone()
                    } else {
                        command
                    },
                    ..LockHolder::default()
                };
                let how = if p.note.is_empty() {
                    "its tt-umd CHIP_IN_USE lock names it".to_string()
                } else {
                    p.note.clone()
                };
                out.push(format!(
                    "{bdf}: {} (holds the chip: {how})",
                    holder.describe()
                ));
            }
        }
        out
    }

    /// The first of these cards that is gone from the host, as
    /// `card BDF is missing (why)`; None when all are there.
    pub fn first_missing(&self, bdfs: &[String]) -> Option<String> {
        let table = self.lock_table();
        bdfs.iter().find_map(|bdf| match table.get(bdf) {
            Some(e) if e.view.state == CardState::Missing => {
                Some(format!("card {bdf} is missing ({})", e.view.reason))
            }
            None => Some(format!("card {bdf} is missing (not found on the host)")),
            _ => None,
        })
    }

    /// Whether the daemon holds the locks of all these cards.
    pub fn holds_all(&self, bdfs: &[String]) -> bool {
        let table = self.lock_table();
        bdfs.iter()
            .all(|b| table.get(b).is_some_and(|e| e.lock.is_some()))
    }

    /// Release every lock (at shutdown).
    pub fn release_all(&self) {
        let mut table = self.lock_table();
        for entry in table.values_mut() {
            entry.lock = None;
            entry.view.held_by_daemon = false;
        }
    }
}

/// Judges a heartbeat from a new read (`now_value`, None when unreadable)
/// and updates `seen`, the value last read and since when it reads so.
/// Stalled (false) only once it has stood still for a whole `interval`:
/// the firmware needs that long to advance it, so a value read for the
/// first time, at start or after a reset, is not stalled yet. Comparing
/// the last two reads alone called every card stalled for a tick at start
/// and after every reset (issue 46). Any change counts as a beat, a drop
/// included: the counter restarts when the firmware does.
fn heartbeat_alive(
    seen: &mut Option<(u64, Instant)>,
    now_value: Option<u64>,
    now: Instant,
    interval: Duration,
) -> bool {
    let Some(value) = now_value else {
        *seen = None;
        return false;
    };
    match *seen {
        Some((last, since)) if last == value => now.saturating_duration_since(since) < interval,
        _ => {
            *seen = Some((value, now));
            true
        }
    }
}

/// The reason a card is quarantined with after this failed reset; one whose
/// tt-smi hung begins with [`RESET_HUNG_PREFIX`].
fn quarantine_reason(bdf: &str, failure: &ResetFailure) -> String {
    match failure.kind {
        FailureKind::Hung => format!(
            "{RESET_HUNG_PREFIX}{}. No reset of this card is tried automatically: reboot the host, then `ttctl card reset {bdf}` (its quarantine lifts once that proves the card back)",
            failure.reason
        ),
        FailureKind::Failed | FailureKind::Refused => format!(
            "quarantined after {} failed reset attempt(s): {}. Fix the card, then `ttctl card reset {bdf}` to bring it back",
            failure.attempts, failure.reason
        ),
    }
}

/// The refusal of an automatic reset of `bdfs` when one of them (`hung`
/// says which) is quarantined because a reset of it hung: a second tt-smi
/// call on it may hang the host for good (tt-smi issue 185), so only an
/// operator decides. None: the reset may go ahead.
fn refuse_automatic_reset(bdfs: &[String], hung: impl Fn(&str) -> bool) -> Option<ResetFailure> {
    let stuck: Vec<&str> = bdfs
        .iter()
        .map(String::as_str)
        .filter(|b| hung(b))
        .collect();
    let first = stuck.first()?;
    Some(ResetFailure {
        bdfs: bdfs.join(","),
        reason: format!(
            "a reset of card {} did not return (tt-smi hung), so no reset of it is tried automatically; the host may need a reboot (tt-smi issues 85, 185). Reboot the host, then `ttctl card reset {first}`: an operator's reset may try, and lifts the quarantine once it proves the card back",
            stuck.join(", ")
        ),
        attempts: 0,
        tt_smi_output: String::new(),
        kind: FailureKind::Refused,
        not_back: Vec::new(),
    })
}

/// The entries of these cards, when every one exists and no reset runs on
/// it.
fn free_entries<'a>(
    table: &'a BTreeMap<String, Entry>,
    bdfs: &[String],
) -> Result<Vec<&'a Entry>, CardError> {
    bdfs.iter()
        .map(|bdf| {
            let entry = table
                .get(bdf)
                .ok_or_else(|| CardError::NotFound(bdf.clone()))?;
            if entry.busy {
                return Err(CardError::Busy(bdf.clone()));
            }
            Ok(entry)
        })
        .collect()
}

/// Which slot uses which card, from the config.
#[derive(Default)]
struct Assignment {
    /// BDF -> slot name (indices resolved against the discovery at hand).
    slots_of: BTreeMap<String, String>,
    /// Slot name -> its cards' BDFs in rank order, which is PCI order.
    slot_cards: BTreeMap<String, Vec<String>>,
    /// Manage every discovered card (no models configured).
    manage_all: bool,
}

impl Assignment {
    /// The assignment a config gives, and the configured cards not found.
    fn from_config(config: &Config, found: &[CardInfo]) -> (Assignment, Vec<(CardRef, String)>) {
        let mut a = Assignment {
            manage_all: config.models.is_empty(),
            ..Assignment::default()
        };
        let mut missing = Vec::new();
        for (model, m) in &config.models {
            for (i, set) in m.card_sets().iter().enumerate() {
                let slot = crate::config::slot_name(model, i, !m.replicas.is_empty());
                let mut bdfs = Vec::new();
                for card in set {
                    match resolve(card, found) {
                        Some(bdf) => {
                            if !found.iter().any(|c| c.bdf == bdf) {
                                missing.push((card.clone(), slot.clone()));
                            }
                            a.slots_of.insert(bdf.clone(), slot.clone());
                            bdfs.push(bdf);
                        }
                        None => {
                            missing.push((card.clone(), slot.clone()));
                            bdfs.push(format!("index {card}"));
                        }
                    }
                }
                // Rank order is PCI order: tt-umd orders the cards a
                // process sees by PCI address whatever order
                // TT_VISIBLE_DEVICES lists them in (pci_device.cpp
                // enumerate_devices), so rank r is the r-th card by BDF.
                bdfs.sort();
                a.slot_cards.insert(slot, bdfs);
            }
        }
        (a, missing)
    }

    fn manages(&self, bdf: &str) -> bool {
        self.manage_all || self.slots_of.contains_key(bdf)
    }
}

fn resolve(card: &CardRef, found: &[CardInfo]) -> Option<String> {
    match card {
        CardRef::Index(i) => found.iter().find(|c| c.index == *i).map(|c| c.bdf.clone()),
        CardRef::Bdf(b) => crate::config::parse_bdf(b),
    }
}

/// Problems for configured cards that are not present under the hardware
/// root (for `check-config` on the host itself).
pub fn check_cards_exist(config: &Config, hw: &HardwareRoot) -> Vec<crate::config::Problem> {
    let found = hw.discover().unwrap_or_default();
    let listed: Vec<String> = found
        .iter()
        .map(|c| format!("{} = {}", c.index, c.bdf))
        .collect();
    let mut problems = Vec::new();
    for (model, m) in &config.models {
        let sets = m.card_sets();
        for (r, set) in sets.iter().enumerate() {
            for (i, card) in set.iter().enumerate() {
                let present = match resolve(card, &found) {
                    Some(bdf) => found.iter().any(|c| c.bdf == bdf),
                    None => false,
                };
                if !present {
                    let key = if m.replicas.is_empty() {
                        format!("models.{model}.cards[{i}]")
                    } else {
                        format!("models.{model}.replicas[{r}][{i}]")
                    };
                    problems.push(crate::config::Problem {
                        key,
                        message: format!(
                            "unknown card {card}: no such card under {} (present: {})",
                            hw.sys_root.join("class/tenstorrent").display(),
                            if listed.is_empty() {
                                "none".to_string()
                            } else {
                                listed.join(", ")
                            }
                        ),
                    });
                }
            }
        }
    }
    problems
}

/// Where the host falls short of a model's `[models.X.requires]`: one
/// message per card below the firmware minimum and one for a driver below
/// the kmd minimum (an unreadable version counts as short: the model's
/// spec says it is required). `cards` are the model's cards as found.
pub fn requirement_shortfalls(
    m: &crate::config::ModelConfig,
    cards: &[&CardInfo],
    driver_version: Option<&str>,
) -> Vec<(&'static str, String)> {
    use driver::Version;
    let mut short = Vec::new();
    if let Some(min) = m.requires.firmware.as_deref().and_then(Version::parse) {
        for card in cards {
            match Version::parse(&card.fw_bundle_version) {
                Some(v) if v.not_below(&min) => {}
                found => short.push((
                    "firmware",
                    format!(
                        "card {} runs firmware bundle {}, below the {min} the model's engine build requires; update the card's firmware (tt-flash) or serve a build whose spec allows it",
                        card.bdf,
                        found.map_or_else(|| "(unreadable tt_fw_bundle_ver)".to_string(), |v| v.to_string())
                    ),
                )),
            }
        }
    }
    if let Some(min) = m.requires.kmd.as_deref().and_then(Version::parse) {
        match driver_version.and_then(Version::parse) {
            Some(v) if v.not_below(&min) => {}
            found => short.push((
                "kmd",
                format!(
                    "the tenstorrent driver is {}, below the tt-kmd {min} the model's engine build requires; upgrade tt-kmd",
                    found.map_or_else(|| "unreadable".to_string(), |v| v.to_string())
                ),
            )),
        }
    }
    short
}

/// `requirement_shortfalls` for every model of `config`, as check-config
/// problems at `models.X.requires.<firmware|kmd>`.
pub fn check_requirements(config: &Config, hw: &HardwareRoot) -> Vec<crate::config::Problem> {
    let found = hw.discover().unwrap_or_default();
    let driver = hw.driver_version();
    let mut problems = Vec::new();
    for (model, m) in &config.models {
        let cards: Vec<&CardInfo> = m
            .card_sets()
            .iter()
            .flatten()
            .filter_map(|card| resolve(card, &found))
            .filter_map(|bdf| found.iter().find(|c| c.bdf == bdf))
            .collect();
        for (field, message) in requirement_shortfalls(m, &cards, driver.as_deref()) {
            problems.push(crate::config::Problem {
                key: format!("models.{model}.requires.{field}"),
                message,
            });
        }
    }
    problems
}

/// The lock policy a config gives: the admin group, when one is configured
/// and exists (a missing group stops the daemon earlier, in `api::AdminRule`).
pub fn lock_policy(config: &Config) -> LockPolicy {
    LockPolicy::daemon(
        config
            .daemon
            .control_admin_group
            .as_deref()
            .and_then(|name| nix::unistd::Group::from_name(name).ok().flatten())
            .map(|g| g.gid.as_raw()),
    )
}

/// Log that a managed card's lock is held by someone else: at once, then
/// after 10 s, 20 s, 40 s ... up to every ten minutes while it lasts.
fn log_held_with_backoff(entry: &mut Entry) {
    let now = std::time::Instant::now();
    let due = entry.held_log.is_none_or(|(at, _)| now >= at);
    if !due {
        return;
    }
    let interval = entry
        .held_log
        .map(|(_, i)| (i * 2).min(std::time::Duration::from_secs(600)))
        .unwrap_or(std::time::Duration::from_secs(10));
    entry.held_log = Some((now + interval, interval));
    tracing::warn!(
        card = %entry.view.bdf,
        holder = %entry.view.holder.as_ref().map(LockHolder::describe).unwrap_or_default(),
        slot = %entry.view.slot.clone().unwrap_or_default(),
        "a managed card's lock is held by another process; its slot waits until it is released (next note in {}s)",
        interval.as_secs()
    );
}

/// Whether `pid` is this daemon or one of its descendants (its workers and
/// what they started), by walking parents in the real `/proc`. Anything
/// else with a card open is a foreign user of the card.
pub fn is_daemon_or_descendant(pid: u32) -> bool {
    tt_card_lock::procs::is_self_or_below(pid, std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_stalled_only_after_a_whole_interval_without_a_beat() {
        let interval = Duration::from_millis(500);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut seen = None;
        // First read (start, or the first after a reset): not stalled yet.
        assert!(heartbeat_alive(&mut seen, Some(40), at(0), interval));
        assert!(heartbeat_alive(&mut seen, Some(40), at(499), interval));
        assert!(!heartbeat_alive(&mut seen, Some(40), at(500), interval));
        assert!(heartbeat_alive(&mut seen, Some(41), at(600), interval));
        // Unreadable (mid-reset): not ok, and forgotten.
        assert!(!heartbeat_alive(&mut seen, None, at(700), interval));
        assert_eq!(seen, None);
        // Back with the counter restarted: a beat, not a stall.
        assert!(heartbeat_alive(&mut seen, Some(1), at(800), interval));
        assert!(!heartbeat_alive(&mut seen, Some(1), at(1300), interval));
    }

    fn failure(kind: FailureKind) -> ResetFailure {
        ResetFailure {
            bdfs: "0000:01:00.0".into(),
            reason:
                "reset did not return within 5s; the host may need a reboot (tt-smi issues 85, 185)"
                    .into(),
            attempts: 1,
            tt_smi_output: String::new(),
            kind,
            not_back: Vec::new(),
        }
    }

    #[test]
    fn a_hung_reset_quarantines_with_its_own_kind_and_the_reboot_hint() {
        let hung = quarantine_reason("0000:01:00.0", &failure(FailureKind::Hung));
        assert!(hung.starts_with(RESET_HUNG_PREFIX), "{hung}");
        assert!(
            hung.contains("the host may need a reboot (tt-smi issues 85, 185)"),
            "{hung}"
        );
        assert!(
            hung.contains("reboot the host, then `ttctl card reset 0000:01:00.0`"),
            "{hung}"
        );
        assert_eq!(QuarantineKind::of(&hung), QuarantineKind::ResetHung);
        let failed = quarantine_reason("0000:01:00.0", &failure(FailureKind::Failed));
        assert!(failed.starts_with("quarantined after 1 failed"), "{failed}");
        assert_eq!(QuarantineKind::of(&failed), QuarantineKind::Failed);
        // Only the start counts: a failure that quotes the words is not one.
        assert_eq!(
            QuarantineKind::of("quarantined after 1 failed reset attempt(s): reset hung: x"),
            QuarantineKind::Failed
        );
    }

    #[test]
    fn automatic_resets_of_a_card_whose_reset_hung_are_refused() {
        let cards = vec!["0000:01:00.0".to_string(), "0000:02:00.0".to_string()];
        assert!(refuse_automatic_reset(&cards, |_| false).is_none());
        // One hung card of a TP=2 slot stops the slot's whole reset: its
        // cards share one tt-smi call.
        let refused = refuse_automatic_reset(&cards, |b| b == "0000:02:00.0").expect("refused");
        assert_eq!(refused.kind, FailureKind::Refused);
        assert_eq!(refused.attempts, 0);
        let text = refused.to_string();
        assert!(
            text.starts_with("automatic reset of 0000:01:00.0,0000:02:00.0 refused: a reset of card 0000:02:00.0 did not return"),
            "{text}"
        );
        assert!(text.contains("`ttctl card reset 0000:02:00.0`"), "{text}");
        assert!(text.contains("lifts the quarantine"), "{text}");
    }
}
