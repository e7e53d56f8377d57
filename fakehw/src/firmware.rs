//! The fake card firmware: what happens on a card while nobody is looking.
//!
//! One [`tick_at`] is one step of every card's firmware: the heartbeat of
//! each present card advances (unless its heartbeat is frozen, the card is
//! in a reset, or the driver has no heartbeat), and every reset whose delay
//! has passed completes — in place (attributes readable again, link back),
//! or for a card that left the bus, rebuilt at its old index or at a new
//! one under the `new-index` fault; or not at all under `never-returns`. The `tt-fakehw firmware` command runs ticks in a loop;
//! tests call [`crate::FakeRoot::tick_at`] directly to step time by hand.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{FakeHwError, Result};
use crate::layout::{
    finish_in_place_reset, materialize_card, present_cards, read_attr, write_atomic, Layout,
    Readings, HEARTBEAT_AFTER_RESET, LINK_DOWNTRAINED, LINK_FULL,
};
use crate::running::{FirmwareLock, STEP_FAILED};
use crate::state::{self, PendingReset, StateLock};

/// What one firmware step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// BDFs whose heartbeat advanced.
    pub heartbeats: Vec<String>,
    /// Cards whose reset completed in this step.
    pub returned: Vec<ReturnedCard>,
}

/// A card brought back by the firmware after a reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnedCard {
    /// Its PCI address (unchanged by the reset).
    pub bdf: String,
    /// The index it had before the reset.
    pub old_index: u32,
    /// The index it has now.
    pub new_index: u32,
}

/// Runs one firmware step on the root as if the time were `now_unix_ms`.
pub(crate) fn tick_at(layout: &Layout, now_unix_ms: u64) -> Result<TickReport> {
    let _lock = StateLock::acquire(layout)?;
    let inventory = state::load_inventory(layout)?;
    let faults = state::load_faults(layout)?;
    let mut report = TickReport::default();

    let present = present_cards(layout)?;
    let pending = state::load_pending(layout)?;
    for card in &present {
        if !inventory.kmd.has_heartbeat()
            || faults.get(&card.bdf).is_some_and(|f| f.frozen_heartbeat)
            || pending.iter().any(|p| p.bdf == card.bdf)
        {
            continue;
        }
        let path = layout.class_dir(&card.bdf, card.index).join("tt_heartbeat");
        let beat: u64 = read_attr(&path)?.trim().parse().map_err(|_| {
            FakeHwError::Invalid(format!(
                "{} does not hold an integer; only the fake firmware should write it",
                path.display()
            ))
        })?;
        write_atomic(&path, format!("{}\n", beat.wrapping_add(1)).as_bytes())?;
        report.heartbeats.push(card.bdf.clone());
    }

    if pending.is_empty() {
        return Ok(report);
    }
    let (mut due, mut waiting): (Vec<PendingReset>, Vec<PendingReset>) = pending
        .into_iter()
        .partition(|p| p.due_unix_ms <= now_unix_ms);
    due.sort_by_key(|p| (p.due_unix_ms, p.old_index));

    let mut in_use: BTreeSet<u32> = present.iter().map(|c| c.index).collect();
    let returns_home = |p: &PendingReset| {
        faults
            .get(&p.bdf)
            .is_none_or(|f| !f.never_returns && !f.new_index)
    };
    let mut changed = false;
    for (i, reset) in due.iter().enumerate() {
        let card_faults = faults.get(&reset.bdf).cloned().unwrap_or_default();
        if card_faults.never_returns {
            waiting.push(reset.clone());
            continue;
        }
        changed = true;
        let Some(card) = inventory.card(&reset.bdf) else {
            // A pending reset for a card not in the inventory can only come
            // from a hand-edited state file; dropping it is the only repair.
            continue;
        };
        // Indices that cards still on their way back will return to: a card
        // moving to a new index must not take one of them.
        let reserved: BTreeSet<u32> = due[i + 1..]
            .iter()
            .chain(waiting.iter())
            .filter(|p| returns_home(p))
            .map(|p| p.old_index)
            .collect();
        let free = |idx: &u32| !in_use.contains(idx) && !reserved.contains(idx);
        let link = if card_faults.downtrained {
            LINK_DOWNTRAINED
        } else {
            LINK_FULL
        };
        let readings = Readings {
            heartbeat: HEARTBEAT_AFTER_RESET,
            therm_trips: reset.therm_trips + u64::from(card_faults.therm_trip),
        };
        if reset.in_place {
            finish_in_place_reset(
                layout,
                card,
                reset.old_index,
                readings,
                &inventory.kmd,
                link,
            )?;
            report.returned.push(ReturnedCard {
                bdf: reset.bdf.clone(),
                old_index: reset.old_index,
                new_index: reset.old_index,
            });
            continue;
        }
        let index = if card_faults.new_index {
            (0..).find(|idx| *idx != reset.old_index && free(idx))
        } else if !in_use.contains(&reset.old_index) {
            Some(reset.old_index)
        } else {
            (0..).find(free)
        }
        .unwrap_or(reset.old_index);
        materialize_card(layout, card, index, readings, &inventory.kmd)?;
        crate::layout::write_link(layout, &card.bdf, link)?;
        in_use.insert(index);
        report.returned.push(ReturnedCard {
            bdf: reset.bdf.clone(),
            old_index: reset.old_index,
            new_index: index,
        });
    }
    if changed {
        waiting.sort_by_key(|p| (p.due_unix_ms, p.old_index));
        state::save_pending(layout, &waiting)?;
    }
    Ok(report)
}

/// Runs firmware steps every `interval` until `should_stop` gives a reason
/// (recorded for `tt-fakehw status` and the fake `tt-smi -r`) or the root is
/// removed (then it returns `Ok`). Refuses a root another loop runs on. An
/// error that is not caused by the root disappearing ends the loop with
/// that error.
pub fn run_firmware(
    root: &Path,
    interval: Duration,
    mut should_stop: impl FnMut() -> Option<String>,
) -> Result<()> {
    let layout = Layout::new(root);
    if !layout.cards_file().is_file() {
        return Ok(());
    }
    let lock = FirmwareLock::acquire(&layout)?;
    loop {
        if !lock.root_is_ours() || !layout.cards_file().is_file() {
            return Ok(());
        }
        if let Some(reason) = should_stop() {
            lock.record_stop(&reason);
            return Ok(());
        }
        if let Err(e) = tick_at(&layout, state::now_unix_ms()) {
            if !layout.cards_file().is_file() {
                return Ok(());
            }
            lock.record_stop(&format!("{STEP_FAILED}: {e}"));
            return Err(e);
        }
        std::thread::sleep(interval);
    }
}

/// The firmware loop running on a thread of this process; stops when dropped.
///
/// For tests that want real time to pass without spawning `tt-fakehw firmware`.
#[derive(Debug)]
pub struct FirmwareThread {
    /// Set to ask the loop to stop.
    stop: Arc<AtomicBool>,
    /// The loop; `None` once joined.
    handle: Option<JoinHandle<Result<()>>>,
}

impl FirmwareThread {
    pub(crate) fn spawn(root: &Path, interval: Duration) -> FirmwareThread {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let root = root.to_path_buf();
        let handle = std::thread::spawn(move || {
            run_firmware(&root, interval, || {
                flag.load(Ordering::Relaxed)
                    .then(|| "its owner stopped it".to_string())
            })
        });
        FirmwareThread {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the loop and returns how it ended.
    pub fn stop(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(FakeHwError::Invalid(
                "the firmware thread panicked".to_string(),
            )),
        }
    }
}

impl Drop for FirmwareThread {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
