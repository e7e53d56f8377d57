//! One start attempt's shared types and the ways a worker is stopped:
//! what the supervisor loop (`supervisor.rs`), a start (`start.rs`) and
//! the Ready watchdog (`watchdog.rs`) all use, so none of them imports
//! another's internals.

use super::{SlotCommand, SlotManager, SlotState};
use crate::config::ModelConfig;
use crate::worker::{self, Worker};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// Why a slot's worker was restarted, as `tt_serving_worker_restarts_total`
/// labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RestartCause {
    /// The worker exited: `exit_code`, `signal` or `oom` (with the slot
    /// cgroup's evidence), from [`worker::Exit::metric_cause`].
    Exit(&'static str),
    /// A start failed before the slot served.
    StartFailed,
    /// A card of the slot went missing.
    CardMissing,
    /// The worker passed `restart.max_rss_mib`.
    Rss,
    /// The worker stopped answering Health (frozen).
    Watchdog,
    /// Requests active and the engine's progress stopped, with no word
    /// from the runtime.
    Stalled,
    /// The runtime said the device hung (tt-metal's timeout lines, or its
    /// timeout command ran the capture).
    DeviceHang,
}

impl RestartCause {
    /// The metric's label value.
    pub(super) fn label(self) -> &'static str {
        match self {
            RestartCause::Exit(cause) => cause,
            RestartCause::StartFailed => "start_failed",
            RestartCause::CardMissing => "card_missing",
            RestartCause::Rss => "rss",
            RestartCause::Watchdog => "watchdog",
            RestartCause::Stalled => "stalled",
            RestartCause::DeviceHang => "device_hang",
        }
    }
}

/// How one start attempt ended.
pub(super) enum Outcome {
    /// Stopped on request; the supervisor ends.
    Stopped,
    /// Stopped to start again at once (operator restart, RSS limit);
    /// `dirty` when the cards must be reset first (the worker stopped
    /// cleanly but left processes in its slot that had to be killed).
    Restart { reason: String, dirty: bool },
    /// Failed; `dirty` when the cards must be reset first; `cause` for the
    /// restart metric.
    Failed {
        reason: String,
        dirty: bool,
        cause: RestartCause,
    },
    /// A requested cache build finished: the variant is complete and the
    /// build worker stopped cleanly; the slot starts again (warm).
    Built { reason: String },
    /// Stopped and parked until Restart: the cards are lent out, or an
    /// operator stopped the slot.
    Parked(super::Park),
}

impl Outcome {
    /// A start that failed before the slot served.
    pub(super) fn start_failed(reason: impl Into<String>, dirty: bool) -> Outcome {
        Outcome::Failed {
            reason: reason.into(),
            dirty,
            cause: RestartCause::StartFailed,
        }
    }
}

/// Everything a start attempt needs that does not change between attempts.
pub(super) struct SlotPlan {
    pub(super) slot: String,
    pub(super) model: String,
    pub(super) m: ModelConfig,
    pub(super) cards: Vec<String>,
    pub(super) worker_command: Vec<String>,
    pub(super) socket: PathBuf,
    pub(super) cache_dir: PathBuf,
    pub(super) tick: Duration,
    /// How long the Ready watchdog waits for one Health answer.
    pub(super) health_timeout: Duration,
    /// `<state_dir>/captures/<slot>`: hang captures.
    pub(super) captures: PathBuf,
}

impl SlotPlan {
    /// A hang capture of this slot, of process `pid`'s tree.
    pub(super) fn capture_spec(
        &self,
        sys_root: &std::path::Path,
        pid: Option<u32>,
        why: String,
    ) -> crate::hang::CaptureSpec {
        let h = &self.m.hang;
        crate::hang::CaptureSpec {
            slot: self.slot.clone(),
            dir: self.captures.clone(),
            cards: self.cards.clone(),
            pid,
            sys_root: sys_root.to_path_buf(),
            why,
            timeout: Duration::from_secs(h.capture_timeout_secs),
            max_bytes: usize::try_from(h.capture_max_kib * 1024).unwrap_or(usize::MAX),
            triage: h.triage_command.clone(),
        }
    }
}

/// A worker death the runtime named a device hang (its timeout line, or
/// its timeout command's capture): the reason, with the capture's path
/// and first lines. Waits for a capture still being written first, so the
/// cards are never reset while its triage reads them. None for any other
/// death.
pub(super) async fn device_hang(plan: &SlotPlan, worker: &Worker) -> Option<String> {
    let line = worker.device_hang_line();
    let limit = Duration::from_secs(plan.m.hang.capture_timeout_secs);
    if !crate::hang::wait_finished(&plan.captures, limit).await {
        tracing::warn!(slot = %plan.slot, "a hang capture did not finish within hang.capture_timeout_secs; resetting anyway");
    }
    let capture = crate::hang::latest_since(&plan.captures, worker.started_at());
    if line.is_none() && capture.is_none() {
        return None;
    }
    let said = match &line {
        Some(l) => format!("the runtime said \"{}\"", l.trim()),
        None => "the runtime's timeout command ran".to_string(),
    };
    let evidence = match &capture {
        Some(path) => {
            worker.logs.push(crate::worker::logs::LogLine {
                unix_ms: tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
                stream: crate::worker::logs::Stream::Stderr,
                text: format!("tt-servingd: device hang capture: {}", path.display()),
            });
            format!("capture {}: {}", path.display(), crate::hang::head(path, 3))
        }
        None => {
            "no capture was written (hang.capture is off, or the command failed: see `ttctl logs`)"
                .into()
        }
    };
    Some(format!(
        "device hang: {said}; {evidence}; the cards are reset"
    ))
}

/// Stop the worker cleanly, then report the failure (cards dirty only if the
/// stop was not clean).
pub(super) async fn fail_after_stop(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: Option<&mut EngineClient<Channel>>,
    reason: String,
) -> Outcome {
    let exit = drain_and_stop(mgr, plan, worker, engine, "stopping after a failed check").await;
    // A check that failed because the device hung (the runtime's timeout
    // ended the engine under the readiness ping) is a device hang.
    if let Some(hang) = device_hang(plan, worker).await {
        return Outcome::Failed {
            reason: format!("{reason}; {hang}"),
            dirty: true,
            cause: RestartCause::DeviceHang,
        };
    }
    Outcome::start_failed(reason, exit.leaves_cards_dirty())
}

/// Draining → Shutdown RPC → SIGTERM → SIGKILL.
pub(super) async fn drain_and_stop(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: Option<&mut EngineClient<Channel>>,
    why: &str,
) -> worker::Exit {
    let m = &plan.m;
    mgr.set_engine(&plan.slot, None);
    mgr.transition(&plan.slot, SlotState::Draining, why.to_string());
    worker.mark_stop_requested();
    let drain = Duration::from_secs(m.drain_timeout_secs);
    if let Some(engine) = engine {
        let request = pb::ShutdownRequest {
            drain_timeout_ms: u32::try_from(drain.as_millis()).unwrap_or(u32::MAX),
        };
        let _ =
            tokio::time::timeout(drain + Duration::from_secs(5), engine.shutdown(request)).await;
    }
    let grace = Duration::from_secs(m.restart.stop_timeout_secs);
    let exit = match tokio::time::timeout(grace, worker.wait()).await {
        Ok(exit) => exit,
        Err(_) => worker.terminate(grace).await,
    };
    if !exit.leaves_cards_dirty() {
        mgr.cards().clear_dirty(&plan.cards);
    }
    exit
}

/// A command that arrives while a worker runs: drain and stop it, then
/// restart, park for a loan, or end.
pub(super) async fn stop_worker(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: Option<&mut EngineClient<Channel>>,
    cmd: Option<SlotCommand>,
) -> Outcome {
    let why = match cmd {
        Some(SlotCommand::Restart) => "restart requested".to_string(),
        Some(SlotCommand::Lend) => "draining: the cards are being lent out".to_string(),
        Some(SlotCommand::Hold) => "draining: stopped by an operator (ttctl slot stop)".to_string(),
        Some(SlotCommand::Stop) | None => mgr
            .stop_reason(&plan.slot)
            .unwrap_or_else(|| "stop requested".into()),
    };
    let exit = drain_and_stop(mgr, plan, worker, engine, &why).await;
    let unclean = exit.leaves_cards_dirty();
    match cmd {
        Some(SlotCommand::Restart) if exit.cause.leaves_cards_dirty() => Outcome::Failed {
            reason: format!("worker {} when stopped for a restart", exit.describe()),
            dirty: true,
            cause: RestartCause::Exit(exit.metric_cause()),
        },
        // Stopped cleanly, but what it left running was killed: the restart
        // goes on, through a reset of the cards.
        Some(SlotCommand::Restart) if unclean => {
            let reason = format!("{why}; the worker {}", exit.describe());
            mgr.update(&plan.slot, |v| v.last_error = reason.clone());
            Outcome::Restart {
                reason,
                dirty: true,
            }
        }
        Some(SlotCommand::Restart) => Outcome::Restart {
            reason: why,
            dirty: false,
        },
        Some(cmd @ (SlotCommand::Lend | SlotCommand::Hold)) => {
            if unclean {
                mgr.cards().mark_dirty(&plan.cards);
            }
            Outcome::Parked(if cmd == SlotCommand::Lend {
                super::Park::Lent
            } else {
                super::Park::Held
            })
        }
        Some(SlotCommand::Stop) | None => {
            if unclean {
                tracing::warn!(slot = %plan.slot, exit = %exit.describe(), "worker did not stop cleanly; its cards will be reset at the next start");
                mgr.cards().mark_dirty(&plan.cards);
            }
            Outcome::Stopped
        }
    }
}

/// The last lines of a worker's output, for failure reasons, and the
/// worker's own last word when its engine's output came after it.
pub(super) fn log_tail(worker: &Worker) -> String {
    let mut lines: Vec<String> = worker.logs.tail(3).into_iter().map(|l| l.text).collect();
    if let Some(word) = worker.last_word().filter(|w| !lines.contains(w)) {
        lines.insert(0, word);
    }
    if lines.is_empty() {
        "no output".into()
    } else {
        lines.join(" | ")
    }
}
