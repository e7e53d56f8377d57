//! The Ready watchdog: while a slot serves, every tick it reads the
//! worker's RSS, polls `Health` (keeping the KV blocks it reports), and ends the slot's serving when the
//! worker exits, is told to stop, loses a card (gone from the host),
//! outgrows `restart.rss_limit_mib`, stops answering
//! (`UNANSWERED_HEALTH_POLLS` polls in a row), or has requests active
//! without decode progress for `restart.stall_timeout_secs`.

use super::attempt::{
    device_hang, drain_and_stop, log_tail, stop_worker, Outcome, RestartCause, SlotPlan,
};
use super::memory_trend::{MemoryTrend, Reported};
use super::{SlotCommand, SlotManager, SlotState};
use crate::config::UNANSWERED_HEALTH_POLLS;
use crate::worker::Worker;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// What the watchdog remembers between ticks.
#[derive(Default)]
struct Watch {
    /// When requests were first seen active without progress since.
    busy_since: Option<Instant>,
    /// The worker's last reported decode progress.
    last_progress_ms: u64,
    /// Health polls in a row that got no answer.
    unanswered: u32,
    /// The engine's own progress counters as last reported: a change is
    /// progress (they move only while its engine loop does).
    counters: std::collections::BTreeMap<String, f64>,
    /// The KV blocks (in use, cached) the worker last reported; the slot's
    /// view is updated only when they change.
    kv_blocks: (u32, u32),
    /// The worker's memory over its serving life.
    memory: Option<MemoryTrend>,
    /// The steady growth reported for it, if one was: a restart for its
    /// memory says so.
    growth_reported: Option<String>,
}

/// Ready: watch for exit, hangs, memory growth and commands.
pub(super) async fn serve(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Outcome {
    let mut tick = tokio::time::interval(plan.tick);
    // After a poll that waited its whole timeout, poll again at once, then
    // every tick: no burst of catch-up polls.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch = Watch::default();
    loop {
        tokio::select! {
            exit = worker.wait() => {
                mgr.set_engine(&plan.slot, None);
                if let Some(reason) = device_hang(plan, worker).await {
                    return Outcome::Failed { reason, dirty: true, cause: RestartCause::DeviceHang };
                }
                // The last word on its memory: memory.peak catches a spike
                // between two ticks (an allocation the OOM killer ended).
                mgr.update(&plan.slot, |v| v.worker_memory_peak_bytes = v.worker_memory_peak_bytes.max(exit.memory_peak));
                return Outcome::Failed {
                    reason: format!("worker {}; last output: {}", exit.describe(), log_tail(worker)),
                    dirty: exit.leaves_cards_dirty(),
                    cause: RestartCause::Exit(exit.metric_cause()),
                };
            }
            cmd = commands.recv() => return stop_worker(mgr, plan, worker, Some(engine), cmd).await,
            _ = tick.tick() => {}
        }
        if let Some(outcome) = check_cards(mgr, plan, worker, engine).await {
            return outcome;
        }
        if let Some(outcome) = check_rss(mgr, plan, worker, engine, &mut watch).await {
            return outcome;
        }
        if let Some(outcome) = check_health(mgr, plan, worker, engine, &mut watch).await {
            return outcome;
        }
    }
}

/// Stop a worker one of whose cards left the host (hot removal, a dead
/// link): its engine cannot be serving right, and the slot must wait for
/// the card rather than answer from a half-gone mesh. The cards are dirty.
async fn check_cards(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
) -> Option<Outcome> {
    let missing = mgr.cards().first_missing(&plan.cards)?;
    let reason =
        format!("{missing} while the slot served; stopped its worker, the slot waits for the card");
    tracing::error!(slot = %plan.slot, "{reason}");
    let _ = drain_and_stop(mgr, plan, worker, Some(engine), "a card went missing").await;
    Some(Outcome::Failed {
        reason,
        dirty: true,
        cause: RestartCause::CardMissing,
    })
}

/// Restart a worker whose RSS is over `restart.rss_limit_mib` before the
/// kernel's OOM killer takes it (and wedges its cards).
async fn check_rss(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    watch: &mut Watch,
) -> Option<Outcome> {
    let memory = worker.memory();
    let rss = memory.current;
    mgr.update(&plan.slot, |v| {
        v.worker_rss_bytes = rss;
        v.worker_memory_peak_bytes = memory.peak;
    });
    watch_growth(mgr, plan, rss, watch);
    let limit = plan.m.restart.rss_limit_mib?;
    if rss <= limit * 1024 * 1024 {
        return None;
    }
    let mut reason = format!(
        "the slot's memory (its worker and everything it started) {} MiB is over restart.rss_limit_mib ({limit} MiB); restarting it before the kernel's OOM killer does",
        rss / (1024 * 1024)
    );
    if let Some(growth) = &watch.growth_reported {
        reason.push_str(&format!(" (reported before: {growth})"));
    }
    tracing::warn!(slot = %plan.slot, "{reason}");
    mgr.update(&plan.slot, |v| v.last_error = reason.clone());
    let exit = drain_and_stop(mgr, plan, worker, Some(engine), "RSS over the limit").await;
    Some(if exit.leaves_cards_dirty() {
        Outcome::Failed {
            reason,
            dirty: true,
            cause: RestartCause::Rss,
        }
    } else {
        crate::metrics::get().worker_restart(&plan.slot, &plan.model, "rss");
        Outcome::Restart {
            reason,
            dirty: false,
        }
    })
}

/// Judge the worker's memory for a steady growth (a leak), and report one
/// the first time it shows: a warning, the slot's `memory_growth`, the
/// growth gauge; a growth that stopped clears them.
fn watch_growth(mgr: &Arc<SlotManager>, plan: &SlotPlan, rss: u64, watch: &mut Watch) {
    let restart = &plan.m.restart;
    let trend = watch.memory.get_or_insert_with(|| {
        MemoryTrend::new(
            Duration::from_secs(restart.rss_growth_window_secs),
            restart.rss_growth_report_mib * 1024 * 1024,
        )
    });
    let growth = match trend.sample(Instant::now(), rss) {
        Reported::Unchanged | Reported::None => return,
        Reported::Stopped => {
            tracing::info!(slot = %plan.slot, "the worker's memory stopped growing");
            mgr.update(&plan.slot, |v| {
                v.memory_growth.clear();
                v.memory_growth_per_hour = 0;
            });
            return;
        }
        Reported::New(g) | Reported::Still(g) => g,
    };
    // What it would run into at this rate: the watchdog's limit, else the
    // kernel's, else what the host has left.
    let limit = restart
        .rss_limit_mib
        .map(|mib| ("restart.rss_limit_mib", mib * 1024 * 1024))
        .or(plan
            .m
            .memory_max_mib
            .map(|mib| ("memory_max_mib", mib * 1024 * 1024)))
        .or_else(|| {
            crate::host_memory::HostMemory::read(mgr.cards().hardware())
                .mem_available_bytes
                .map(|free| ("the host's available memory", rss.saturating_add(free)))
        });
    let text = growth.describe(limit);
    if watch.growth_reported.is_none() {
        let then = if restart.rss_limit_mib.is_some() {
            "the watchdog restarts it at restart.rss_limit_mib"
        } else {
            "set restart.rss_limit_mib to restart it before the kernel's OOM killer ends it"
        };
        tracing::warn!(
            slot = %plan.slot,
            "the worker's memory {text}: a leak in the engine? {then}"
        );
    }
    watch.growth_reported = Some(text.clone());
    mgr.update(&plan.slot, |v| {
        v.memory_growth = text;
        v.memory_growth_per_hour = growth.bytes_per_hour.max(0.0) as u64;
    });
}

/// Poll `Health` once: an unanswered worker after a few polls, or one with
/// requests active and no decode progress for the stall timeout, is hung.
async fn check_health(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    watch: &mut Watch,
) -> Option<Outcome> {
    let health =
        tokio::time::timeout(plan.health_timeout, engine.health(pb::HealthRequest {})).await;
    let (active, progress_ms, prefill_tokens, counters_moved) = match health {
        Ok(Ok(h)) => {
            watch.unanswered = 0;
            let h = h.into_inner();
            let counters: std::collections::BTreeMap<String, f64> =
                h.engine_counters.into_iter().collect();
            let counters_moved = counters != watch.counters;
            watch.counters = counters;
            let kv_blocks = (h.kv_blocks_in_use, h.kv_blocks_cached);
            if kv_blocks != watch.kv_blocks {
                watch.kv_blocks = kv_blocks;
                mgr.update(&plan.slot, |v| {
                    if let Some(kv) = v.kv.as_mut() {
                        (kv.blocks_in_use, kv.blocks_cached) = kv_blocks;
                    }
                });
            }
            (
                h.active_sequences + h.queued_sequences,
                h.last_progress_unix_ms,
                h.prefill_tokens,
                counters_moved,
            )
        }
        // A worker that does not answer Health (frozen by SIGSTOP, its RPC
        // thread stuck) cannot serve either, while requests would queue
        // behind it until the stall timeout. A few misses in a row are a
        // hang, with or without work in flight.
        unanswered_poll => {
            watch.unanswered += 1;
            if watch.unanswered < UNANSWERED_HEALTH_POLLS {
                return None;
            }
            let last = match unanswered_poll {
                Ok(Err(status)) => format!("the last failed: {}", status.message()),
                _ => format!("each waited {} ms", plan.health_timeout.as_millis()),
            };
            let reason = format!(
                "worker stopped answering: {} Health polls in a row unanswered ({last}); it is frozen or hung",
                watch.unanswered
            );
            // Out of routing and NOT_SERVING before anything else.
            mgr.set_engine(&plan.slot, None);
            mgr.transition(
                &plan.slot,
                SlotState::Failed,
                format!("{reason}; killing it, then its cards are reset"),
            );
            return Some(kill_hung(worker, format!("{reason}; killed it")).await);
        }
    };
    if active == 0 || progress_ms != watch.last_progress_ms || counters_moved {
        watch.busy_since = (active > 0).then(Instant::now);
        watch.last_progress_ms = progress_ms;
    } else if watch.busy_since.is_none() {
        watch.busy_since = Some(Instant::now());
    }
    let stall = stall_bound(&plan.m.restart, prefill_tokens);
    if watch
        .busy_since
        .is_some_and(|since| since.elapsed() >= stall)
    {
        mgr.set_engine(&plan.slot, None);
        let allowance = if prefill_tokens > 0 {
            format!(
                ", including {:.0}s for {prefill_tokens} prompt tokens pending prefill at restart.min_prefill_tokens_per_sec = {}",
                (stall - Duration::from_secs(plan.m.restart.stall_timeout_secs)).as_secs_f64(),
                plan.m.restart.min_prefill_tokens_per_sec
            )
        } else {
            String::new()
        };
        let counters = if watch.counters.is_empty() {
            String::new()
        } else {
            format!(
                "; the engine's counters stayed at {}",
                watch
                    .counters
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let reason = format!(
            "stalled: {active} sequence(s) active and no decode progress for {:.0}s (restart.stall_timeout_secs{allowance}) while the worker still answered Health{counters}",
            stall.as_secs_f64()
        );
        return Some(stalled(mgr, plan, worker, reason).await);
    }
    None
}

/// How long requests may be active without decode progress: the stall
/// timeout, plus time for the prompt tokens still to prefill at the slowest
/// rate allowed (an engine prefilling a long prompt takes no decode step
/// for minutes, and is not hung for that).
fn stall_bound(restart: &crate::config::RestartConfig, prefill_tokens: u64) -> Duration {
    let base = Duration::from_secs(restart.stall_timeout_secs);
    match restart.min_prefill_tokens_per_sec {
        0 => base,
        rate => base + Duration::from_secs_f64(prefill_tokens as f64 / rate as f64),
    }
}

/// A worker whose engine stopped progressing: if the runtime's own
/// timeout is capturing right now, that capture finishes and the death is
/// a device hang; otherwise the daemon captures the slot itself (the
/// worker's tree, the cards), then kills it. The cards are reset after.
async fn stalled(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    reason: String,
) -> Outcome {
    tracing::error!(slot = %plan.slot, "{reason}");
    if crate::hang::in_progress(&plan.captures) {
        if let Some(hang) = device_hang(plan, worker).await {
            let mut outcome = kill_hung(worker, format!("{reason}; {hang}")).await;
            if let Outcome::Failed { cause, .. } = &mut outcome {
                *cause = RestartCause::DeviceHang;
            }
            return outcome;
        }
    }
    let evidence = if plan.m.hang.capture {
        mgr.transition(
            &plan.slot,
            SlotState::Failed,
            format!("{reason}; capturing the slot before it is stopped"),
        );
        let spec = plan.capture_spec(
            &mgr.cards().hardware().sys_root,
            Some(worker.pid()),
            reason.clone(),
        );
        match tokio::task::spawn_blocking(move || crate::hang::capture(&spec)).await {
            Ok(Ok(path)) => format!(
                "; capture {}: {}",
                path.display(),
                crate::hang::head(&path, 3)
            ),
            Ok(Err(e)) => format!("; the capture failed: {e}"),
            Err(e) => format!("; the capture stopped: {e}"),
        }
    } else {
        String::new()
    };
    let mut outcome = kill_hung(worker, format!("{reason}; killed it{evidence}")).await;
    if let Outcome::Failed { cause, .. } = &mut outcome {
        *cause = RestartCause::Stalled;
    }
    outcome
}

/// SIGKILL a hung worker (it ends a stopped process too; no SIGCONT
/// needed); its cards are dirty.
async fn kill_hung(worker: &mut Worker, reason: String) -> Outcome {
    worker.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = worker.wait().await;
    Outcome::Failed {
        reason,
        dirty: true,
        cause: RestartCause::Watchdog,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_bound_grows_with_the_prompt_tokens_pending_prefill() {
        let restart = crate::config::RestartConfig {
            stall_timeout_secs: 120,
            min_prefill_tokens_per_sec: 100,
            ..Default::default()
        };
        assert_eq!(stall_bound(&restart, 0), Duration::from_secs(120));
        // The field's 240k-token prompt: 40 min more than the stall timeout.
        assert_eq!(
            stall_bound(&restart, 240_000),
            Duration::from_secs(120 + 2400)
        );
        let off = crate::config::RestartConfig {
            min_prefill_tokens_per_sec: 0,
            ..restart
        };
        assert_eq!(stall_bound(&off, 240_000), Duration::from_secs(120));
    }
}
