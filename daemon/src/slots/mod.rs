//! Slots: one model instance on its cards (one card for TP=1, two for TP=2).
//!
//! This module owns the slot lifecycle. The foundation knows the slots the
//! config defines and reports them as `Pending`; supervising their workers
//! (spawn, readiness, recovery) is the slots feature built on top.

use crate::cards::CardManager;
use crate::config::Config;
use std::time::SystemTime;

/// The name of replica `index` of `model` with `replicas` replicas in all:
/// the model's name alone when there is one replica, `model/N` otherwise.
pub fn slot_name(model: &str, index: usize, replicas: usize) -> String {
    if replicas == 1 {
        model.to_string()
    } else {
        format!("{model}/{index}")
    }
}

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
}

/// The configured slots, each `Pending` until worker supervision starts it.
pub fn configured(config: &Config, cards: &CardManager, since: SystemTime) -> Vec<SlotView> {
    let mut slots = Vec::new();
    for (model, m) in &config.models {
        let sets = m.card_sets();
        for i in 0..sets.len() {
            let name = slot_name(model, i, sets.len());
            slots.push(SlotView {
                cards: cards.slot_cards().get(&name).cloned().unwrap_or_default(),
                name,
                model: model.clone(),
                state: SlotState::Pending,
                since,
                reason: "configured; this build holds and resets the slot's cards but does not start workers yet".into(),
            });
        }
    }
    slots
}
