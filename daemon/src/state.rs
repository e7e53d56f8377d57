//! The daemon's shared state: handles to the parts that own state (cards,
//! slots, the router), the facts about this process, and the reload lock and
//! history. Built once at startup (`daemon`), read by the API, the reload
//! and loans. It holds no second copy of any card's or slot's state.

use crate::cards::{CardManager, CardState};
use crate::config::Config;
use crate::router::Router;
use crate::shutdown::Shutdown;
use crate::slots::{SlotManager, SlotState, SlotView};
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::sync::watch;
use tt_serving_proto::v1 as pb;

/// Shared state the API reads. Cards and slots each have one owner; this
/// only holds handles and the facts about the process.
pub struct DaemonState {
    config_path: PathBuf,
    cards: Arc<CardManager>,
    slots: Arc<SlotManager>,
    router: Router,
    started: SystemTime,
    inference_address: String,
    metrics_address: String,
    openai_address: String,
    reloads: Reloads,
    shutdown: Shutdown,
    trial: Mutex<Option<TrialMark>>,
}

/// The facts about this daemon process that status shows.
pub struct Process {
    /// The config file read at start and reload.
    pub config_path: PathBuf,
    /// When the daemon started.
    pub started: SystemTime,
    /// The public port's bound address.
    pub inference_address: String,
    /// The metrics endpoint's bound address, empty when off.
    pub metrics_address: String,
    /// The OpenAI front door's bound address, empty when off.
    pub openai_address: String,
}

impl DaemonState {
    /// Tie the parts together (at startup).
    pub fn new(
        process: Process,
        cards: Arc<CardManager>,
        slots: Arc<SlotManager>,
        shutdown: Shutdown,
    ) -> DaemonState {
        DaemonState {
            router: Router::new(slots.clone()),
            slots,
            cards,
            config_path: process.config_path,
            started: process.started,
            inference_address: process.inference_address,
            metrics_address: process.metrics_address,
            openai_address: process.openai_address,
            reloads: Reloads::default(),
            shutdown,
            trial: Mutex::new(None),
        }
    }

    /// The trial in force (`ttctl ab`), if any.
    pub fn trial(&self) -> Option<TrialMark> {
        self.trial.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Marks (or clears) the trial in force.
    pub fn set_trial(&self, mark: Option<TrialMark>) {
        *self.trial.lock().unwrap_or_else(|e| e.into_inner()) = mark;
        self.cards.bus().notify();
    }

    /// When the daemon started.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// The public port's address.
    pub fn inference_address(&self) -> &str {
        &self.inference_address
    }

    /// The metrics endpoint's address (empty when off).
    pub fn metrics_address(&self) -> &str {
        &self.metrics_address
    }

    /// The OpenAI front door's address (empty when off).
    pub fn openai_address(&self) -> &str {
        &self.openai_address
    }

    /// The config in force (a reload swaps it).
    pub fn config(&self) -> Arc<Config> {
        self.slots.config()
    }

    /// The config file the daemon reads at start and reload.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The reload lock and history.
    pub fn reloads(&self) -> &Reloads {
        &self.reloads
    }

    /// Whether the daemon is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_triggered()
    }

    /// The card table.
    pub fn cards(&self) -> &Arc<CardManager> {
        &self.cards
    }

    /// The slots as they are now.
    pub fn slots(&self) -> Vec<SlotView> {
        self.slots.snapshot()
    }

    /// The slot manager (commands to slots, logs).
    pub fn slot_manager(&self) -> &Arc<SlotManager> {
        &self.slots
    }

    /// The request router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// A receiver that changes whenever anything in status changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.cards.bus().subscribe()
    }

    /// The one-line summary, also sent to systemd as STATUS=.
    pub fn summary(&self) -> String {
        let cards = self.cards.snapshot();
        let count = |s: CardState| cards.iter().filter(|c| c.state == s).count();
        let mut parts = vec![format!("{} card(s)", cards.len())];
        for (state, word) in [
            (CardState::Ready, "ready"),
            (CardState::Idle, "idle"),
            (CardState::Unmanaged, "unmanaged"),
            (CardState::HeldElsewhere, "held elsewhere"),
            (CardState::Resetting, "resetting"),
            (CardState::Probing, "probing"),
            (CardState::Failed, "failed"),
            (CardState::Quarantined, "quarantined"),
            (CardState::Missing, "missing"),
        ] {
            let n = count(state);
            if n > 0 {
                parts.push(format!("{n} {word}"));
            }
        }
        let slots = self.slots();
        let ready = slots.iter().filter(|s| s.state == SlotState::Ready).count();
        let mut line = format!(
            "{}; {ready} of {} slot(s) ready",
            parts.join(", "),
            slots.len()
        );
        if let Some(problems) = self.reloads.last_refused() {
            line.push_str(&format!(
                "; last reload refused: {problems} problems (ttctl reload)"
            ));
        }
        line
    }
}

/// Reloads kept for `ttctl status`.
const HISTORY: usize = 16;

/// The reload lock and the record of past reloads.
#[derive(Default)]
pub struct Reloads {
    lock: tokio::sync::Mutex<()>,
    history: Mutex<VecDeque<pb::ReloadReport>>,
}

impl Reloads {
    /// Wait for the turn to change the config (held by a reload, and by
    /// startup until READY=1).
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// Past reloads, oldest first.
    pub fn history(&self) -> Vec<pb::ReloadReport> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Problems of the last reload when it was refused (for STATUS=).
    pub fn last_refused(&self) -> Option<usize> {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        history
            .iter()
            .rev()
            .find(|r| r.outcome != pb::ReloadOutcome::DryRun as i32)
            .filter(|r| r.outcome == pb::ReloadOutcome::Refused as i32)
            .map(|r| r.problems.len())
    }

    /// Keep a finished reload's report (the oldest goes beyond 16).
    pub fn record(&self, report: &pb::ReloadReport) {
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        history.push_back(report.clone());
        while history.len() > HISTORY {
            history.pop_front();
        }
    }
}

/// What status shows on a model's slots while a trial runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialMark {
    /// The model on trial.
    pub model: String,
    /// The arm in force.
    pub arm: String,
    /// The arm's flags.
    pub flags: BTreeMap<String, String>,
    /// Who asked, and why.
    pub purpose: String,
}

impl TrialMark {
    /// One line for a slot's `trial` field.
    pub fn describe(&self) -> String {
        let flags: Vec<String> = self.flags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "arm {} ({}){}",
            self.arm,
            if flags.is_empty() {
                "configured flags".to_string()
            } else {
                flags.join(",")
            },
            if self.purpose.is_empty() {
                String::new()
            } else {
                format!(" for {}", self.purpose)
            }
        )
    }
}
