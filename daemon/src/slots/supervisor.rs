//! One task per slot drives its lifecycle:
//! `Locking → Resetting → Probing → Starting(warm|cold) → Loading → Verifying
//! → Ready`, then watches the worker until it exits, hangs, outgrows its
//! memory limit, or is told to stop; failures back off and retry, and give
//! up after the configured attempts until `ttctl slot restart`.
//!
//! Field rules applied here: any exit that was not a requested clean stop
//! leaves the cards dirty, and they are reset and proven before the next
//! start; a slot is Ready only after a real inference ping and the banner
//! rule; a warm start is guarded against generating cache files.

use super::{SlotCommand, SlotManager, SlotState};
use crate::cache::{CacheState, Variant};
use crate::cards::CardState;
use crate::config::{ModelConfig, UNANSWERED_HEALTH_POLLS};
use crate::worker::{self, Worker, WorkerSpec};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc::UnboundedReceiver;
use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// How one start attempt ended.
enum Outcome {
    /// Stopped on request; the supervisor ends.
    Stopped,
    /// Stopped to start again at once (operator restart, RSS limit).
    Restart { reason: String },
    /// Failed; `dirty` when the cards must be reset first; `cause` for the
    /// restart metric (exit_code, signal, watchdog, rss, start_failed).
    Failed {
        reason: String,
        dirty: bool,
        cause: &'static str,
    },
    /// Stopped because the cards are lent out.
    Lent,
}

/// Park a slot whose cards are lent: Stopped until Restart (true) or Stop
/// (false).
async fn park(
    mgr: &Arc<SlotManager>,
    slot: &str,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> bool {
    mgr.update(slot, |v| {
        v.worker_pid = 0;
        v.worker_rss_bytes = 0;
    });
    mgr.transition(
        slot,
        SlotState::Stopped,
        "stopped: its cards are lent out (ttctl card borrow)",
    );
    loop {
        match commands.recv().await {
            Some(SlotCommand::Restart) => return true,
            Some(SlotCommand::Lend) => {}
            Some(SlotCommand::Stop) | None => return false,
        }
    }
}

/// Everything a start attempt needs that does not change between attempts.
struct SlotPlan {
    slot: String,
    model: String,
    m: ModelConfig,
    cards: Vec<String>,
    worker_command: Vec<String>,
    socket: PathBuf,
    cache_dir: PathBuf,
    tick: Duration,
    /// How long the Ready watchdog waits for one Health answer.
    health_timeout: Duration,
}

/// The supervisor task of one slot.
pub async fn run(
    mgr: Arc<SlotManager>,
    slot: String,
    mut commands: UnboundedReceiver<SlotCommand>,
) {
    let Some(view) = mgr.view(&slot) else { return };
    let config = mgr.config();
    let Some(m) = config.models.get(&view.model).cloned() else {
        return;
    };
    let socket_dir = config.daemon.worker_socket_dir();
    let plan = SlotPlan {
        socket: socket_dir.join(format!("{}.sock", slot.replace('/', "_"))),
        worker_command: worker::command_for(&m),
        slot: slot.clone(),
        model: view.model.clone(),
        cards: view.cards.clone(),
        cache_dir: config.daemon.cache_dir.clone(),
        tick: Duration::from_millis(config.daemon.tick_ms),
        health_timeout: config.daemon.health_poll_timeout(),
        m,
    };
    mgr.set_definition(&slot, plan.m.clone());
    if let Err(e) = crate::hostfs::create_dir_all_no_follow(&socket_dir) {
        mgr.transition(
            &slot,
            SlotState::Failed,
            format!("cannot create {}: {e}", socket_dir.display()),
        );
        return;
    }
    // Cards an earlier worker on them left dirty (a slot replaced by a
    // reload, or a previous daemon run) are reset before this slot's first
    // start too.
    let recorded_dirty = mgr.cards().dirty_cards();
    let mut dirty = plan.cards.iter().any(|c| recorded_dirty.contains(c));
    let mut failures: VecDeque<Instant> = VecDeque::new();
    loop {
        if !wait_for_cards(&mgr, &plan, &mut commands).await {
            mgr.transition(&slot, SlotState::Stopped, "stopped on request");
            return;
        }
        if dirty {
            mgr.transition(
                &slot,
                SlotState::Resetting,
                "resetting the cards after an unclean worker exit",
            );
            let cards = mgr.cards().clone();
            let slot_for_events = slot.clone();
            let mgr_for_events = mgr.clone();
            let mut on_event = move |e: crate::cards::reset::ResetEvent| {
                if e.phase == crate::cards::reset::Phase::WaitingForDevice {
                    mgr_for_events.transition(&slot_for_events, SlotState::Probing, e.message);
                }
            };
            match cards.reset(&plan.cards, false, &mut on_event).await {
                Ok(_) => dirty = false,
                Err(e) => {
                    mgr.transition(&slot, SlotState::Quarantined, format!("{e}"));
                    continue; // wait_for_cards waits until an operator fixes it
                }
            }
        }
        let attempt = failures.len() as u32 + 1;
        mgr.update(&slot, |v| v.attempt = attempt);
        match start_and_serve(&mgr, &plan, &mut commands).await {
            Outcome::Stopped => {
                mgr.update(&slot, |v| {
                    v.worker_pid = 0;
                    v.worker_rss_bytes = 0;
                });
                mgr.transition(&slot, SlotState::Stopped, "stopped on request");
                return;
            }
            Outcome::Restart { reason } => {
                tracing::info!(slot = %slot, %reason, "restarting slot");
                failures.clear();
            }
            Outcome::Lent => {
                if !park(&mgr, &slot, &mut commands).await {
                    mgr.transition(&slot, SlotState::Stopped, "stopped on request");
                    return;
                }
                failures.clear();
            }
            Outcome::Failed {
                reason,
                dirty: d,
                cause,
            } => {
                dirty |= d;
                crate::metrics::get().worker_restart(&slot, &plan.model, cause);
                mgr.update(&slot, |v| {
                    v.last_error = reason.clone();
                    v.worker_pid = 0;
                    v.worker_rss_bytes = 0;
                });
                let r = &plan.m.restart;
                let window = Duration::from_secs(r.window_secs);
                let now = Instant::now();
                failures.push_back(now);
                while failures
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > window)
                {
                    failures.pop_front();
                }
                if failures.len() as u32 >= r.max_attempts {
                    mgr.transition(
                        &slot,
                        SlotState::Failed,
                        format!(
                            "gave up after {} failed start(s) within {}s (restart.max_attempts); last: {reason}. Fix the cause, then `ttctl slot restart {slot}`",
                            failures.len(),
                            r.window_secs
                        ),
                    );
                    match commands.recv().await {
                        Some(SlotCommand::Restart) => {
                            failures.clear();
                            continue;
                        }
                        Some(SlotCommand::Lend) => {
                            if !park(&mgr, &slot, &mut commands).await {
                                mgr.transition(&slot, SlotState::Stopped, "stopped on request");
                                return;
                            }
                            failures.clear();
                            continue;
                        }
                        Some(SlotCommand::Stop) | None => {
                            mgr.transition(&slot, SlotState::Stopped, "stopped on request");
                            return;
                        }
                    }
                }
                let exponent = (failures.len() as u32).saturating_sub(1).min(20);
                let backoff = Duration::from_millis(
                    r.backoff_ms
                        .saturating_mul(1u64 << exponent)
                        .min(r.backoff_max_ms),
                );
                mgr.retry_later(
                    &slot,
                    format!(
                        "{reason}; retrying in {} ms (attempt {} of {})",
                        backoff.as_millis(),
                        failures.len() + 1,
                        r.max_attempts
                    ),
                    SystemTime::now() + backoff,
                );
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    cmd = commands.recv() => match cmd {
                        Some(SlotCommand::Restart) => failures.clear(),
                        Some(SlotCommand::Lend) => {
                            if !park(&mgr, &slot, &mut commands).await {
                                mgr.transition(&slot, SlotState::Stopped, "stopped on request");
                                return;
                            }
                            failures.clear();
                        }
                        Some(SlotCommand::Stop) | None => {
                            mgr.transition(&slot, SlotState::Stopped, "stopped on request");
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Wait until every card of the slot is locked by the daemon and healthy.
/// Returns false when told to stop meanwhile.
async fn wait_for_cards(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> bool {
    let mut changes = mgr.cards().subscribe();
    loop {
        changes.borrow_and_update();
        let snapshot = mgr.cards().snapshot();
        let mut blocking = Vec::new();
        let mut quarantined = Vec::new();
        for bdf in &plan.cards {
            match snapshot.iter().find(|c| &c.bdf == bdf) {
                // Two users on one card block or corrupt each other: a
                // process that has the device open without its lock (a
                // borrowed job's escapee, a script that skipped the lock)
                // keeps the slot from starting until it is gone.
                Some(c) if c.state == CardState::Ready && !c.processes.is_empty() => {
                    blocking.push(format!(
                        "card {bdf} is open by {} outside the daemon; stop it (the slot starts when it is gone)",
                        c.processes
                            .iter()
                            .map(|p| format!("pid {} ({})", p.pid, p.command))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
                Some(c) if c.state == CardState::Ready => {}
                Some(c) if c.state == CardState::Quarantined => {
                    quarantined.push(format!("card {bdf} is quarantined: {}", c.reason))
                }
                Some(c) => blocking.push(format!(
                    "card {bdf} is {:?}{}",
                    c.state,
                    if c.reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", c.reason)
                    }
                )),
                None => blocking.push(format!("card {bdf} is not present")),
            }
        }
        if quarantined.is_empty() && blocking.is_empty() {
            return true;
        }
        if quarantined.is_empty() {
            mgr.transition(
                &plan.slot,
                SlotState::Locking,
                format!("waiting for cards: {}", blocking.join("; ")),
            );
        } else {
            mgr.transition(&plan.slot, SlotState::Quarantined, quarantined.join("; "));
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return false },
            cmd = commands.recv() => match cmd {
                Some(SlotCommand::Restart) => {}
                Some(SlotCommand::Lend) => {
                    if !park(mgr, &plan.slot, commands).await {
                        return false;
                    }
                }
                Some(SlotCommand::Stop) | None => return false,
            },
        }
    }
}

/// The worker's environment: the model's tables, then its `env_file`
/// (`secrets`), then its flags, then the contract.
fn worker_env(
    plan: &SlotPlan,
    variant: &Variant,
    mode: &str,
    secrets: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let m = &plan.m;
    let mut env = BTreeMap::new();
    env.extend(m.env.clone());
    env.extend(if mode == "cold" {
        m.cold_env.clone()
    } else {
        m.warm_env.clone()
    });
    env.extend(secrets);
    env.extend(m.flags.clone());
    // The contract, last so nothing above can override it.
    env.insert("TT_VISIBLE_DEVICES".into(), plan.cards.join(","));
    env.insert("MESH_DEVICE".into(), m.mesh_device());
    env.insert("TT_WORKER_SOCKET".into(), plan.socket.display().to_string());
    env.insert("TT_WORKER_MODEL".into(), m.checkpoint.display().to_string());
    env.insert("TT_WORKER_TP".into(), m.tp.to_string());
    env.insert("TT_CACHE_DIR".into(), variant.dir.display().to_string());
    env.insert("TT_CACHE_MODE".into(), mode.into());
    env
}

/// Pick warm or cold. Cold builds of a variant are serialised by a lock: a
/// second replica waits for the first build, then starts warm.
async fn decide_mode(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    variant: &Variant,
    force_cold: bool,
) -> Result<(&'static str, Option<std::fs::File>), String> {
    if let (CacheState::Warm { .. }, false) = (variant.state(), force_cold) {
        return Ok(("warm", None));
    }
    let lock_path = variant.build_lock_path();
    if let Some(parent) = lock_path.parent() {
        crate::hostfs::create_dir_all_no_follow(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let file = crate::hostfs::open_in_place(&lock_path, 0o600).map_err(|e| {
        format!(
            "cannot open the cache build lock {}: {e}",
            lock_path.display()
        )
    })?;
    use fs2::FileExt;
    let file = if file.try_lock_exclusive().is_ok() {
        file
    } else {
        mgr.transition(
            &plan.slot,
            SlotState::Starting,
            format!(
                "waiting for another replica's cold build of cache variant {}",
                variant.key
            ),
        );
        tokio::task::spawn_blocking(move || file.lock_exclusive().map(|_| file))
            .await
            .map_err(|e| format!("cache build lock task failed: {e}"))?
            .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?
    };
    match variant.state() {
        CacheState::Warm { .. } if !force_cold => Ok(("warm", None)),
        state => {
            if let CacheState::Incomplete { reason } = &state {
                tracing::warn!(slot = %plan.slot, variant = %variant.key, %reason, "cache variant incomplete; rebuilding cold");
            }
            variant
                .prepare_cold()
                .map_err(|e| format!("cannot prepare cache dir {}: {e}", variant.dir.display()))?;
            Ok(("cold", Some(file)))
        }
    }
}

fn log_tail(worker: &Worker) -> String {
    let lines: Vec<String> = worker.logs.tail(3).into_iter().map(|l| l.text).collect();
    if lines.is_empty() {
        "no output".into()
    } else {
        lines.join(" | ")
    }
}

async fn start_and_serve(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Outcome {
    let build = mgr.take_build(&plan.slot);
    let outcome = start(mgr, plan, commands, build.is_some()).await;
    if let Outcome::Failed {
        cause: "start_failed",
        ..
    } = &outcome
    {
        if mgr.view(&plan.slot).is_some_and(|v| v.cache_mode == "cold") {
            crate::metrics::get().cache_build(&plan.model, false, Duration::ZERO);
        }
    }
    if let Some(reply) = build {
        let _ = reply.send(match &outcome {
            Outcome::Restart { reason } if reason.starts_with("cache built") => Ok(reason.clone()),
            Outcome::Failed { reason, .. } => Err(reason.clone()),
            _ => Err("the cache build was interrupted (stop, restart or loan)".into()),
        });
    }
    outcome
}

/// One start attempt. With `build_only`, the start is cold whatever the
/// cache holds, and the worker stops once the marker is written.
async fn start(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    commands: &mut UnboundedReceiver<SlotCommand>,
    build_only: bool,
) -> Outcome {
    let slot = &plan.slot;
    let m = &plan.m;
    let variant = Variant::for_model(&plan.cache_dir, &plan.model, m, &plan.worker_command);
    mgr.update(slot, |v| {
        v.variant = variant.key.clone();
        v.starts += 1;
    });
    let (mode, build_lock) = match decide_mode(mgr, plan, &variant, build_only).await {
        Ok(decision) => decision,
        Err(reason) => {
            return Outcome::Failed {
                reason,
                dirty: false,
                cause: "start_failed",
            }
        }
    };
    mgr.update(slot, |v| v.cache_mode = mode.to_string());
    mgr.transition(
        slot,
        SlotState::Starting,
        format!(
            "starting the worker ({mode} start, cache variant {})",
            variant.key
        ),
    );
    // Read at every start, so a rotated secret reaches the next worker.
    let secrets = match &m.env_file {
        Some(path) => {
            match crate::worker::env_file::load(path, &format!("models.{}.env_file", plan.model)) {
                Ok(vars) => vars,
                Err(reason) => {
                    return Outcome::Failed {
                        reason,
                        dirty: false,
                        cause: "start_failed",
                    }
                }
            }
        }
        None => BTreeMap::new(),
    };
    let _ = std::fs::remove_file(&plan.socket);
    let spec = WorkerSpec {
        slot: slot.clone(),
        command: plan.worker_command.clone(),
        env: worker_env(plan, &variant, mode, secrets),
        socket: plan.socket.clone(),
    };
    let Some(logs) = mgr.logs(slot) else {
        return Outcome::Failed {
            reason: "slot vanished".into(),
            dirty: false,
            cause: "start_failed",
        };
    };
    let started = Instant::now();
    // A running engine leaves its cards dirty unless it stops cleanly on
    // request. Record that before it starts, so that a daemon killed while
    // the worker runs (the worker dies with it: PR_SET_PDEATHSIG) resets the
    // cards at its next start whatever its reset policy; a clean stop or a
    // proven reset clears the record.
    mgr.cards().mark_dirty(&plan.cards);
    let mut worker = match Worker::spawn(&spec, logs) {
        Ok(w) => w,
        Err(e) => {
            mgr.cards().clear_dirty(&plan.cards);
            return Outcome::Failed {
                reason: e.to_string(),
                dirty: false,
                cause: "start_failed",
            };
        }
    };
    mgr.update(slot, |v| v.worker_pid = worker.pid());
    mgr.transition(
        slot,
        SlotState::Loading,
        format!("{mode} start: worker loading"),
    );
    let deadline = started + Duration::from_secs(m.readiness.deadline_secs);

    // Loading: the worker answers Info while it loads; wait for READY.
    // Polled often at first (a warm start of a small model takes ~0.1 s),
    // then every 50 ms.
    let mut client: Option<EngineClient<Channel>> = None;
    let mut poll = Duration::from_millis(10);
    loop {
        if Instant::now() >= deadline {
            worker
                .terminate(Duration::from_secs(m.restart.stop_timeout_secs))
                .await;
            return Outcome::Failed {
                reason: format!(
                    "not ready within {}s (readiness.deadline_secs) while loading; last output: {}",
                    m.readiness.deadline_secs,
                    log_tail(&worker)
                ),
                dirty: true,
                cause: "start_failed",
            };
        }
        tokio::select! {
            exit = worker.wait() => {
                return Outcome::Failed {
                    reason: format!("worker {} while loading; last output: {}", exit.describe(), log_tail(&worker)),
                    dirty: exit.leaves_cards_dirty(), cause: "start_failed" };
            }
            cmd = commands.recv() => return stop_worker(mgr, plan, &mut worker, None, cmd).await,
            _ = tokio::time::sleep(poll) => {}
        }
        poll = (poll * 2).min(Duration::from_millis(50));
        if client.is_none() {
            client = crate::uds::channel(&plan.socket)
                .await
                .ok()
                .map(EngineClient::new);
        }
        let Some(c) = client.as_mut() else { continue };
        match tokio::time::timeout(Duration::from_secs(5), c.info(pb::InfoRequest {})).await {
            Ok(Ok(info)) => {
                let info = info.into_inner();
                if info.state == pb::WorkerState::Ready as i32 {
                    // ListModels reports it from the ready replicas.
                    mgr.update(slot, |v| v.context_length = info.context_length);
                    break;
                }
                if let Some(p) = info.progress {
                    let progress = if p.total > 0 {
                        format!("{mode} start: {} ({}/{})", p.message, p.done, p.total)
                    } else {
                        format!("{mode} start: {}", p.message)
                    };
                    mgr.transition(slot, SlotState::Loading, progress);
                }
            }
            _ => client = None,
        }
    }
    let Some(mut engine) = client else {
        return Outcome::Failed {
            reason: "lost the worker's socket".into(),
            dirty: true,
            cause: "start_failed",
        };
    };

    // Verifying: a real inference ping, then the banner rule.
    mgr.transition(slot, SlotState::Verifying, "readiness ping");
    let remaining = deadline.saturating_duration_since(Instant::now());
    let ping = tokio::time::timeout(remaining, ping(&mut engine, m));
    let text = tokio::select! {
        result = ping => match result {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => {
                worker.terminate(Duration::from_secs(m.restart.stop_timeout_secs)).await;
                return Outcome::Failed { reason: format!("readiness ping failed: {e}"), dirty: true, cause: "start_failed" };
            }
            Err(_) => {
                worker.terminate(Duration::from_secs(m.restart.stop_timeout_secs)).await;
                return Outcome::Failed {
                    reason: format!("readiness ping did not finish within readiness.deadline_secs ({}s)", m.readiness.deadline_secs),
                    dirty: true, cause: "start_failed" };
            }
        },
        exit = worker.wait() => {
            return Outcome::Failed {
                reason: format!("worker {} during the readiness ping; last output: {}", exit.describe(), log_tail(&worker)),
                dirty: exit.leaves_cards_dirty(), cause: "start_failed" };
        }
    };
    if let Some(expect) = &m.readiness.expect {
        if !text.contains(expect.as_str()) {
            let reason = format!(
                "readiness ping answered {text:?}, which lacks the expected {expect:?} (readiness.expect): the model is loaded wrong or is the wrong model"
            );
            return fail_after_stop(mgr, plan, &mut worker, Some(&mut engine), reason).await;
        }
    }
    let violations = check_banners(&mut engine, &worker, m).await;
    if !violations.is_empty() {
        let reason = format!(
            "banner check failed (fail-closed, never served): {}",
            violations.join("; ")
        );
        return fail_after_stop(mgr, plan, &mut worker, Some(&mut engine), reason).await;
    }
    if mode == "cold" {
        if let Err(e) = variant.write_marker() {
            let reason = format!(
                "cannot write the cache marker in {}: {e}",
                variant.dir.display()
            );
            return fail_after_stop(mgr, plan, &mut worker, Some(&mut engine), reason).await;
        }
        tracing::info!(slot = %slot, variant = %variant.key, "cache variant marked complete");
        crate::metrics::get().cache_build(&plan.model, true, started.elapsed());
        if build_only {
            drop(build_lock);
            let reason = format!(
                "cache built: variant {} of model {} is complete ({:.1}s)",
                variant.key,
                plan.model,
                started.elapsed().as_secs_f64()
            );
            let exit = drain_and_stop(
                mgr,
                plan,
                &mut worker,
                Some(&mut engine),
                "cache built; stopping the build worker",
            )
            .await;
            return if exit.leaves_cards_dirty() {
                Outcome::Failed {
                    reason: format!("{reason}, but the build worker {}", exit.describe()),
                    dirty: true,
                    cause: "start_failed",
                }
            } else {
                Outcome::Restart { reason }
            };
        }
    } else {
        match variant.guard() {
            Ok(unexpected) if unexpected.is_empty() => {}
            Ok(unexpected) => {
                let reason = format!(
                    "warm start generated cache files it should have read: {} (deleted). The worker may be serving placeholder weights; rebuild the variant with `ttctl cache rm {}` then `ttctl slot restart {slot}`",
                    unexpected.join(", "),
                    variant.key
                );
                return fail_after_stop(mgr, plan, &mut worker, Some(&mut engine), reason).await;
            }
            Err(e) => {
                let reason = format!(
                    "cannot check the cache variant {}: {e}",
                    variant.dir.display()
                );
                return fail_after_stop(mgr, plan, &mut worker, Some(&mut engine), reason).await;
            }
        }
    }
    drop(build_lock);
    crate::metrics::get().slot_start(slot, &plan.model, mode);
    mgr.transition(
        slot,
        SlotState::Ready,
        format!(
            "serving ({mode} start took {:.1}s)",
            started.elapsed().as_secs_f64()
        ),
    );
    mgr.set_engine(slot, Some(engine.clone()));
    serve(mgr, plan, &mut worker, &mut engine, commands).await
}

async fn ping(engine: &mut EngineClient<Channel>, m: &ModelConfig) -> Result<String, String> {
    let request = pb::EngineGenerateRequest {
        request: Some(pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Prompt(
                m.readiness.ping_prompt.clone(),
            )),
            max_tokens: m.readiness.ping_max_tokens,
            ..Default::default()
        }),
        request_id: "readiness-ping".into(),
    };
    let mut stream = engine
        .generate(request)
        .await
        .map_err(|s| s.message().to_string())?
        .into_inner();
    let mut text = String::new();
    let mut finished = false;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| s.message().to_string())?
    {
        match chunk.chunk {
            Some(pb::generate_response::Chunk::Delta(d)) => text.push_str(&d.text),
            Some(pb::generate_response::Chunk::Final(_)) => finished = true,
            None => {}
        }
    }
    if !finished {
        return Err("the stream ended without a final chunk".into());
    }
    Ok(text)
}

/// Banners may print only once a feature first runs, so this runs after the
/// ping. The worker's own list (Info) and its output lines both count; the
/// output pipe can trail the RPC by a moment, so missing banners get a short
/// grace period before the rule fails closed.
async fn check_banners(
    engine: &mut EngineClient<Channel>,
    worker: &Worker,
    m: &ModelConfig,
) -> Vec<String> {
    let grace = Instant::now() + Duration::from_millis(500);
    loop {
        let mut engaged = worker.engaged();
        if let Ok(Ok(info)) =
            tokio::time::timeout(Duration::from_secs(5), engine.info(pb::InfoRequest {})).await
        {
            engaged.extend(info.into_inner().banners_engaged);
        }
        let violations = crate::worker::banners::check(&m.banners, &m.flags, &engaged);
        if violations.is_empty() || Instant::now() >= grace {
            return violations;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Stop the worker cleanly, then report the failure (cards dirty only if the
/// stop was not clean).
async fn fail_after_stop(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: Option<&mut EngineClient<Channel>>,
    reason: String,
) -> Outcome {
    let exit = drain_and_stop(mgr, plan, worker, engine, "stopping after a failed check").await;
    Outcome::Failed {
        reason,
        dirty: exit.leaves_cards_dirty(),
        cause: "start_failed",
    }
}

/// Draining → Shutdown RPC → SIGTERM → SIGKILL.
async fn drain_and_stop(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: Option<&mut EngineClient<Channel>>,
    why: &str,
) -> worker::ExitCause {
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
    let exit = match tokio::time::timeout(
        Duration::from_secs(m.restart.stop_timeout_secs),
        worker.wait(),
    )
    .await
    {
        Ok(exit) => exit,
        Err(_) => {
            worker
                .terminate(Duration::from_secs(m.restart.stop_timeout_secs))
                .await
        }
    };
    if !exit.leaves_cards_dirty() {
        mgr.cards().clear_dirty(&plan.cards);
    }
    exit
}

async fn stop_worker(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: Option<&mut EngineClient<Channel>>,
    cmd: Option<SlotCommand>,
) -> Outcome {
    match cmd {
        Some(SlotCommand::Restart) => {
            let exit = drain_and_stop(mgr, plan, worker, engine, "restart requested").await;
            if exit.leaves_cards_dirty() {
                Outcome::Failed {
                    reason: format!("worker {} when stopped for a restart", exit.describe()),
                    dirty: true,
                    cause: exit.metric_cause(),
                }
            } else {
                Outcome::Restart {
                    reason: "restart requested".into(),
                }
            }
        }
        Some(SlotCommand::Lend) => {
            let exit = drain_and_stop(
                mgr,
                plan,
                worker,
                engine,
                "draining: the cards are being lent out",
            )
            .await;
            if exit.leaves_cards_dirty() {
                mgr.cards().mark_dirty(&plan.cards);
            }
            Outcome::Lent
        }
        Some(SlotCommand::Stop) | None => {
            let why = mgr
                .stop_reason(&plan.slot)
                .unwrap_or_else(|| "stop requested".into());
            let exit = drain_and_stop(mgr, plan, worker, engine, &why).await;
            if exit.leaves_cards_dirty() {
                tracing::warn!(slot = %plan.slot, exit = %exit.describe(), "worker did not stop cleanly; its cards will be reset at the next start");
                mgr.cards().mark_dirty(&plan.cards);
            }
            Outcome::Stopped
        }
    }
}

/// Ready: watch for exit, hangs, memory growth and commands.
async fn serve(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Outcome {
    let m = &plan.m;
    let stall = Duration::from_secs(m.restart.stall_timeout_secs);
    let mut tick = tokio::time::interval(plan.tick);
    // After a poll that waited its whole timeout, poll again at once, then
    // every tick: no burst of catch-up polls.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When requests were first seen active without progress since.
    let mut busy_since: Option<Instant> = None;
    let mut last_progress_ms = 0u64;
    // Health polls in a row that got no answer.
    let mut unanswered = 0u32;
    loop {
        tokio::select! {
            exit = worker.wait() => {
                mgr.set_engine(&plan.slot, None);
                return Outcome::Failed {
                    reason: format!("worker {}; last output: {}", exit.describe(), log_tail(worker)),
                    dirty: exit.leaves_cards_dirty(),
                    cause: exit.metric_cause(),
                };
            }
            cmd = commands.recv() => return stop_worker(mgr, plan, worker, Some(engine), cmd).await,
            _ = tick.tick() => {}
        }
        let rss = worker.rss_bytes();
        mgr.update(&plan.slot, |v| v.worker_rss_bytes = rss);
        if let Some(limit) = m.restart.rss_limit_mib {
            if rss > limit * 1024 * 1024 {
                let reason = format!(
                    "worker RSS {} MiB is over restart.rss_limit_mib ({limit} MiB); restarting it before the kernel's OOM killer does",
                    rss / (1024 * 1024)
                );
                tracing::warn!(slot = %plan.slot, "{reason}");
                mgr.update(&plan.slot, |v| v.last_error = reason.clone());
                let exit =
                    drain_and_stop(mgr, plan, worker, Some(engine), "RSS over the limit").await;
                return if exit.leaves_cards_dirty() {
                    Outcome::Failed {
                        reason,
                        dirty: true,
                        cause: "rss",
                    }
                } else {
                    {
                        crate::metrics::get().worker_restart(&plan.slot, &plan.model, "rss");
                        Outcome::Restart { reason }
                    }
                };
            }
        }
        let health =
            tokio::time::timeout(plan.health_timeout, engine.health(pb::HealthRequest {})).await;
        let (active, progress_ms) = match health {
            Ok(Ok(h)) => {
                unanswered = 0;
                let h = h.into_inner();
                (
                    h.active_sequences + h.queued_sequences,
                    h.last_progress_unix_ms,
                )
            }
            // A worker that does not answer Health (frozen by SIGSTOP, its
            // RPC thread stuck) cannot serve either, while requests would
            // queue behind it until the stall timeout. A few misses in a
            // row are a hang, with or without work in flight.
            unanswered_poll => {
                unanswered += 1;
                if unanswered < UNANSWERED_HEALTH_POLLS {
                    continue;
                }
                let last = match unanswered_poll {
                    Ok(Err(status)) => format!("the last failed: {}", status.message()),
                    _ => format!("each waited {} ms", plan.health_timeout.as_millis()),
                };
                let reason = format!(
                    "worker stopped answering: {unanswered} Health polls in a row unanswered ({last}); it is frozen or hung"
                );
                // Out of routing and NOT_SERVING before anything else.
                mgr.set_engine(&plan.slot, None);
                mgr.transition(
                    &plan.slot,
                    SlotState::Failed,
                    format!("{reason}; killing it, then its cards are reset"),
                );
                // SIGKILL ends a stopped process too; no SIGCONT needed.
                worker.signal(nix::sys::signal::Signal::SIGKILL);
                let _ = worker.wait().await;
                return Outcome::Failed {
                    reason: format!("{reason}; killed it"),
                    dirty: true,
                    cause: "watchdog",
                };
            }
        };
        if active == 0 || progress_ms != last_progress_ms {
            busy_since = (active > 0).then(Instant::now);
            last_progress_ms = progress_ms;
        } else if busy_since.is_none() {
            busy_since = Some(Instant::now());
        }
        if let Some(since) = busy_since {
            if since.elapsed() >= stall {
                mgr.set_engine(&plan.slot, None);
                worker.signal(nix::sys::signal::Signal::SIGKILL);
                let _ = worker.wait().await;
                return Outcome::Failed {
                    reason: format!(
                        "worker hung: {active} sequence(s) active and no decode progress for {}s (restart.stall_timeout_secs); killed it",
                        stall.as_secs()
                    ),
                    dirty: true, cause: "watchdog" };
            }
        }
    }
}
