//! One start attempt of a slot, as phases. Each phase returns
//! `Result<_, Outcome>`: an `Err` ends the attempt with that outcome (the
//! worker, when one runs, already stopped). [`start`] composes them:
//!
//! 1. [`prepare`]: the cache variant, warm or cold ([`crate::cache::claim`]),
//!    the secret env file, the worker's environment.
//! 2. [`spawn`]: the dirty-card record, then the worker process.
//! 3. [`wait_loaded`]: `Info` until READY, its progress shown as the
//!    slot's reason, within `readiness.deadline_secs`.
//! 4. [`verify`]: the readiness ping, `readiness.expect`, the banner rule;
//!    then [`warm_up`]: one generation per `readiness.warmup_prompt_tokens`,
//!    and [`check_accuracy`]: the `readiness.accuracy` task against its gate.
//! 5. [`seal_cache`]: a cold start writes the marker; a warm start runs the
//!    guard.
//!
//! Then the slot is Ready and the watchdog takes over. An engine kind
//! whose start differs (a container to pull, an engine with its own health
//! endpoint) changes a phase here, not the loop around it.

use super::attempt::{
    drain_and_stop, fail_after_stop, log_tail, stop_worker, Outcome, RestartCause, SlotPlan,
};
use super::{EngineFacts, KvMemory, SlotCommand, SlotManager, SlotState};
use crate::cache::{BuildLock, CacheMode, RuntimeFiles, Variant};
use crate::config::{ModelConfig, VisibleDevices};
use crate::worker::{Worker, WorkerSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use tonic::transport::Channel;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

/// What the preparation decided for this attempt.
struct Prepared {
    variant: Variant,
    mode: CacheMode,
    /// Why a cold start is cold (shown while it loads).
    why_cold: Option<String>,
    /// Held for a cold start until the marker is written.
    build_lock: Option<BuildLock>,
    spec: WorkerSpec,
    /// The `readiness.accuracy` task, read before the worker starts.
    accuracy: Option<super::accuracy::Task>,
}

/// A cold start that failed is a failed cache build.
fn count_failed_cold_start(mgr: &SlotManager, plan: &SlotPlan) {
    if mgr
        .view(&plan.slot)
        .is_some_and(|v| v.cache_mode == Some(CacheMode::Cold))
    {
        crate::metrics::get().cache_build(&plan.model, false, Duration::ZERO);
    }
}

/// A start attempt, with `ttctl cache build`'s reply when one asked for
/// this start (it builds cold and stops instead of serving).
pub(super) async fn start_and_serve(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    commands: &mut UnboundedReceiver<SlotCommand>,
) -> Outcome {
    let build = mgr.take_build(&plan.slot);
    let outcome = match start(mgr, plan, commands, build.is_some()).await {
        Ok(outcome) | Err(outcome) => outcome,
    };
    if let Outcome::Failed {
        cause: RestartCause::StartFailed,
        ..
    } = &outcome
    {
        count_failed_cold_start(mgr, plan);
    }
    if let Some(reply) = build {
        let _ = reply.send(match &outcome {
            Outcome::Built { reason } => Ok(reason.clone()),
            Outcome::Failed { reason, .. } => Err(reason.clone()),
            _ => Err("the cache build was interrupted (stop, restart or loan)".into()),
        });
    }
    outcome
}

/// One start attempt through its phases, then serving. With
/// `build_only`, the start is cold whatever the cache holds, and the worker
/// stops once the marker is written.
async fn start(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    commands: &mut UnboundedReceiver<SlotCommand>,
    build_only: bool,
) -> Result<Outcome, Outcome> {
    let mut prepared = prepare(mgr, plan, build_only).await?;
    // The deadline runs from the spawn: waiting for another replica's cold
    // build is not this worker's loading time.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(plan.m.readiness.deadline_secs);
    let mut worker = spawn(mgr, plan, &prepared)?;
    let mode = prepared.mode.as_str();
    let (mut engine, runtime_files) =
        wait_loaded(mgr, plan, mode, &mut worker, commands, deadline).await?;
    verify(
        mgr,
        plan,
        &prepared.spec.env,
        &mut worker,
        &mut engine,
        deadline,
    )
    .await?;
    // A build-only start never serves: its warm-up would be thrown away.
    if !build_only {
        warm_up(mgr, plan, &mut worker, &mut engine, deadline).await?;
    }
    // Before the cache is certified: a variant whose answers fail the gate
    // gets no marker.
    let accuracy = check_accuracy(
        mgr,
        plan,
        prepared.accuracy.as_ref(),
        &mut worker,
        &mut engine,
        deadline,
    )
    .await?;
    seal_cache(
        mgr,
        plan,
        &prepared,
        &runtime_files,
        &mut worker,
        &mut engine,
        started,
    )
    .await?;
    if build_only {
        drop(prepared.build_lock.take());
        return Ok(stop_after_build(mgr, plan, &prepared, &mut worker, &mut engine, started).await);
    }
    drop(prepared.build_lock.take());
    crate::metrics::get().slot_start(&plan.slot, &plan.model, mode);
    // The client first, so that whoever sees the slot Ready can route to
    // it (a request in between would go to another replica: the router
    // only picks Ready slots with a client).
    mgr.set_engine(&plan.slot, Some(engine.clone()));
    mgr.update(&plan.slot, |v| {
        v.served += 1;
        v.resets_since_served = 0;
    });
    mgr.transition(
        &plan.slot,
        SlotState::Ready,
        format!(
            "serving ({mode} start took {:.1}s{})",
            started.elapsed().as_secs_f64(),
            accuracy.map(|a| format!("; {a}")).unwrap_or_default()
        ),
    );
    Ok(super::watchdog::serve(mgr, plan, &mut worker, &mut engine, commands).await)
}

/// Phase 1: cache variant and mode, secrets, the worker's spec.
async fn prepare(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    build_only: bool,
) -> Result<Prepared, Outcome> {
    let (slot, m) = (&plan.slot, &plan.m);
    // A limit the host cannot enforce is refused, not ignored: the
    // operator set it to protect the host.
    if let Some(mib) = m.memory_max_mib {
        if let Err(why) = crate::worker::containment::get().memory_limits() {
            return Err(Outcome::start_failed(
                format!(
                    "models.{}.memory_max_mib = {mib} cannot be enforced: {why}. Give the daemon a delegated cgroup v2 with the memory controller (systemd: Delegate=yes, which the NixOS module sets) or remove memory_max_mib",
                    plan.model
                ),
                false,
            ));
        }
    }
    let variant = Variant::for_model(&plan.cache_dir, &plan.model, m, &plan.worker_command);
    let variant = on_engine(mgr, plan, variant).await?;
    mgr.update(slot, |v| {
        v.variant = variant.key.clone();
        v.starts += 1;
    });
    let claim = crate::cache::claim(&variant, build_only, || {
        mgr.transition(
            slot,
            SlotState::Starting,
            format!(
                "waiting for another replica's cold build of cache variant {}",
                variant.key
            ),
        )
    })
    .await
    .map_err(|reason| Outcome::start_failed(reason, false))?;
    let (mode, build_lock) = (claim.mode, claim.build_lock);
    mgr.update(slot, |v| v.cache_mode = Some(mode));
    mgr.transition(
        slot,
        SlotState::Starting,
        format!(
            "starting the worker ({} start, cache variant {}{})",
            mode.as_str(),
            variant.key,
            claim
                .why_cold
                .as_ref()
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        ),
    );
    // Read at every start, so a rotated secret reaches the next worker.
    let secrets = match &m.env_file {
        Some(path) => {
            crate::worker::env_file::load(path, &format!("models.{}.env_file", plan.model))
                .map_err(|reason| Outcome::start_failed(reason, false))?
        }
        None => BTreeMap::new(),
    };
    let accuracy = super::accuracy::configured(m, &plan.model)
        .map_err(|reason| Outcome::start_failed(reason, false))?;
    let device_nodes =
        device_nodes(mgr, &plan.cards).map_err(|r| Outcome::start_failed(r, false))?;
    let visible_devices = match m.visible_devices {
        VisibleDevices::Bdf => plan.cards.join(","),
        VisibleDevices::Index => mgr
            .cards()
            .hardware()
            .device_indices(&plan.cards)
            .map_err(|reason| Outcome::start_failed(reason, false))?,
    };
    // tt-umd's hugepage files of these cards left by an engine that is
    // gone (reads /proc: off the runtime).
    let (hw, name, cards) = (
        mgr.cards().hardware().clone(),
        slot.clone(),
        plan.cards.clone(),
    );
    let _ = tokio::task::spawn_blocking(move || {
        crate::worker::leftovers::clear_hugepages(&hw, &name, &cards)
    })
    .await;
    let mut spec = WorkerSpec {
        slot: slot.clone(),
        command: plan.worker_command.clone(),
        env: worker_env(
            plan,
            &mgr.cards().hardware().sys_root,
            &variant,
            mode,
            &visible_devices,
            &device_nodes,
            secrets,
        ),
        socket: plan.socket.clone(),
        memory_max: m.memory_max_mib.map(|mib| mib * 1024 * 1024),
        leftovers: None,
    };
    traces_env(&mut spec.env, plan, &mgr.config().tracing.otlp_endpoint);
    // Open MPI's segments go to the slot's own directory, unless the
    // model's environment says where.
    spec.leftovers = Some(crate::worker::leftovers::Leftovers::for_start(
        &mgr.cards().hardware().dev_root,
        slot,
        &mut spec.env,
    ));
    Ok(Prepared {
        variant,
        mode,
        why_cold: claim.why_cold,
        build_lock,
        spec,
        accuracy,
    })
}

/// The variant for the engine this start would run (the worker's
/// identity step) on these cards: their types and the mesh.
async fn on_engine(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    variant: Variant,
) -> Result<Variant, Outcome> {
    let (slot, m) = (&plan.slot, &plan.m);
    mgr.transition(
        slot,
        SlotState::Starting,
        "asking the worker which engine it runs (identity step)".to_string(),
    );
    let mut env = m.env.clone();
    env.extend(m.flags.clone());
    let identity = crate::worker::identity::probe(slot, &plan.worker_command, &env).await;
    if let crate::worker::identity::Identity::Unanswered(why) = &identity {
        tracing::warn!(%slot, %why, "the worker did not say which engine it runs; the cache key holds the worker program's file identity only");
    }
    let hw = mgr.cards().hardware();
    // The engine build's firmware and driver minimums, read at every start
    // (a card reflashed or a driver changed since check-config).
    let found: Vec<_> = plan.cards.iter().filter_map(|bdf| hw.find(bdf)).collect();
    let short = crate::cards::requirement_shortfalls(
        m,
        &found.iter().collect::<Vec<_>>(),
        hw.driver_version().as_deref(),
    );
    let mut why: Vec<String> = short.into_iter().map(|(_, m)| m).collect();
    // The host's hugepages against what every configured slot needs (a
    // reservation lowered since check-config shows here).
    // and the RAM that reservation leaves.
    if m.hugepages_per_card > 0 {
        let host = crate::host_memory::HostMemory::read(hw);
        why.extend(crate::host_memory::shortfalls(&mgr.config(), &host));
    }
    if !why.is_empty() {
        return Err(Outcome::start_failed(
            format!(
                "the host falls short of model {}: {}",
                plan.model,
                why.join("; ")
            ),
            false,
        ));
    }
    let mut types = Vec::with_capacity(plan.cards.len());
    for bdf in &plan.cards {
        match hw.find(bdf).map(|c| c.card_type).filter(|t| !t.is_empty()) {
            Some(t) => types.push(t),
            None => {
                return Err(Outcome::start_failed(
                    format!("card {bdf}'s type (tt_card_type) cannot be read, and the cache variant is keyed by it; check `ttctl status` and reset the card"),
                    false,
                ))
            }
        }
    }
    Ok(variant.on_engine(&plan.cache_dir, &identity, &types, &m.mesh_device()))
}

/// Phase 2: the worker process, Loading.
fn spawn(mgr: &Arc<SlotManager>, plan: &SlotPlan, prepared: &Prepared) -> Result<Worker, Outcome> {
    let slot = &plan.slot;
    let logs = mgr
        .logs(slot)
        .ok_or_else(|| Outcome::start_failed("slot vanished", false))?;
    let _ = std::fs::remove_file(&plan.socket);
    // A running engine leaves its cards dirty unless it stops cleanly on
    // request. Record that before it starts, so that a daemon killed while
    // the worker runs (the worker dies with it: PR_SET_PDEATHSIG) resets the
    // cards at its next start whatever its reset policy; a clean stop or a
    // proven reset clears the record.
    mgr.cards().mark_dirty(&plan.cards);
    let worker = Worker::spawn(&prepared.spec, logs).map_err(|e| {
        mgr.cards().clear_dirty(&plan.cards);
        Outcome::start_failed(e.to_string(), false)
    })?;
    mgr.update(slot, |v| {
        v.worker_pid = worker.pid();
        v.worker_memory_peak_bytes = 0;
    });
    mgr.transition(
        slot,
        SlotState::Loading,
        match &prepared.why_cold {
            Some(why) => format!("cold start ({why}): worker loading"),
            None => format!("{} start: worker loading", prepared.mode.as_str()),
        },
    );
    Ok(worker)
}

/// Phase 3: poll `Info` until the worker is READY; often at first (a warm
/// start of a small model takes ~0.1 s), then every 50 ms. Its progress
/// becomes the slot's reason.
async fn wait_loaded(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    mode: &str,
    worker: &mut Worker,
    commands: &mut UnboundedReceiver<SlotCommand>,
    deadline: Instant,
) -> Result<(EngineClient<Channel>, RuntimeFiles), Outcome> {
    let m = &plan.m;
    let mut client: Option<EngineClient<Channel>> = None;
    let mut poll = Duration::from_millis(10);
    loop {
        if Instant::now() >= deadline {
            worker
                .terminate(Duration::from_secs(m.restart.stop_timeout_secs))
                .await;
            return Err(Outcome::start_failed(
                format!(
                    "not ready within {}s (readiness.deadline_secs) while loading; last output: {}",
                    m.readiness.deadline_secs,
                    log_tail(worker)
                ),
                true,
            ));
        }
        tokio::select! {
            exit = worker.wait() => {
                if let Some(reason) = super::attempt::device_hang(plan, worker).await {
                    return Err(Outcome::Failed { reason, dirty: true, cause: RestartCause::DeviceHang });
                }
                let reason = format!("worker {} while loading; last output: {}", exit.describe(), log_tail(worker));
                // An OOM kill counts as one in the restart metric whenever
                // it happens: a limit too small for the model shows there.
                // (start_and_serve counts a start_failed cold start as a
                // failed cache build; this one counts itself.)
                if exit.oom_in_slot().is_none() {
                    return Err(Outcome::start_failed(reason, exit.leaves_cards_dirty()));
                }
                count_failed_cold_start(mgr, plan);
                return Err(Outcome::Failed { reason, dirty: exit.leaves_cards_dirty(), cause: RestartCause::Exit("oom") });
            }
            cmd = commands.recv() => return Err(stop_worker(mgr, plan, worker, None, cmd).await),
            _ = tokio::time::sleep(poll) => {}
        }
        poll = (poll * 2).min(Duration::from_millis(50));
        if client.is_none() {
            // Connected from the relay runtime, so the connection's tasks
            // (tonic's buffer, h2's connection) live where the streams it
            // carries are relayed.
            let socket = plan.socket.clone();
            client = crate::relay_runtime::spawn(async move {
                tt_serving_proto::uds::channel(&socket).await
            })
            .await
            .ok()
            .and_then(Result::ok)
            .map(EngineClient::new);
        }
        let Some(c) = client.as_mut() else { continue };
        match tokio::time::timeout(Duration::from_secs(5), c.info(pb::InfoRequest {})).await {
            Ok(Ok(info)) => {
                let info = info.into_inner();
                if info.state == pb::WorkerState::Ready as i32 {
                    // ListModels reports the context from the ready
                    // replicas; the router checks requests against the
                    // engine's facts.
                    let facts = Arc::new(EngineFacts {
                        version: info.engine_version,
                        supported_parameters: info.supported_parameters,
                        host_sampling_parameters: info.host_sampling_parameters,
                        context_length: info.context_length,
                    });
                    let kv = info.kv_cache.map(|k| KvMemory {
                        budget_bytes: k.budget_bytes,
                        block_tokens: k.block_tokens,
                        blocks_total: k.blocks_total,
                        prefix_cache: k.prefix_cache,
                        ..KvMemory::default()
                    });
                    mgr.update(&plan.slot, |v| {
                        v.context_length = info.context_length;
                        v.engine_facts = facts;
                        v.kv = kv;
                    });
                    return match RuntimeFiles::new(info.runtime_cache_files) {
                        Ok(files) => Ok((c.clone(), files)),
                        Err(e) => {
                            worker
                                .terminate(Duration::from_secs(m.restart.stop_timeout_secs))
                                .await;
                            Err(Outcome::start_failed(e, true))
                        }
                    };
                }
                if let Some(p) = info.progress {
                    let progress = if p.total > 0 {
                        format!("{mode} start: {} ({}/{})", p.message, p.done, p.total)
                    } else {
                        format!("{mode} start: {}", p.message)
                    };
                    mgr.transition(&plan.slot, SlotState::Loading, progress);
                }
            }
            _ => client = None,
        }
    }
}

/// Phase 4: a real inference ping within the readiness deadline, the
/// expected text, then the banner rule (fail closed: never served).
async fn verify(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    env: &BTreeMap<String, String>,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    deadline: Instant,
) -> Result<(), Outcome> {
    let m = &plan.m;
    mgr.transition(&plan.slot, SlotState::Verifying, "readiness ping");
    let grace = Duration::from_secs(m.restart.stop_timeout_secs);
    let remaining = deadline.saturating_duration_since(Instant::now());
    let text = tokio::select! {
        result = tokio::time::timeout(remaining, ping(engine, m)) => match result {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => {
                worker.terminate(grace).await;
                return Err(Outcome::start_failed(format!("readiness ping failed: {e}"), true));
            }
            Err(_) => {
                worker.terminate(grace).await;
                return Err(Outcome::start_failed(
                    format!("readiness ping did not finish within readiness.deadline_secs ({}s)", m.readiness.deadline_secs),
                    true,
                ));
            }
        },
        exit = worker.wait() => {
            return Err(Outcome::start_failed(
                format!("worker {} during the readiness ping; last output: {}", exit.describe(), log_tail(worker)),
                exit.leaves_cards_dirty(),
            ));
        }
    };
    let failed_check = if let Some(expect) = m
        .readiness
        .expect
        .as_ref()
        .filter(|e| !text.contains(e.as_str()))
    {
        Some(format!(
            "readiness ping answered {text:?}, which lacks the expected {expect:?} (readiness.expect): the model is loaded wrong or is the wrong model"
        ))
    } else {
        let covered = crate::worker::banners::covered_settings(&m.banners, &m.flags, env);
        let violations = check_banners(engine, worker, m, &covered).await;
        let banners = worker.engaged_handle();
        mgr.update(&plan.slot, |v| v.banners = banners);
        (!violations.is_empty()).then(|| {
            format!(
                "banner check failed (fail-closed, never served): {}",
                violations.join("; ")
            )
        })
    };
    stop_on_failure(mgr, plan, worker, engine, failed_check).await
}

/// Phase 4c: `readiness.accuracy`, the configured task through the worker
/// and judged by its gate; a failing score fails the start (fail closed:
/// never served), with the score in the reason. The passing summary, if a
/// check ran.
async fn check_accuracy(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    task: Option<&super::accuracy::Task>,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    deadline: Instant,
) -> Result<Option<String>, Outcome> {
    let Some(checked_task) = task else {
        return Ok(None);
    };
    let task = checked_task.name.as_str();
    let progress = |done: usize, of: usize| {
        mgr.transition(
            &plan.slot,
            SlotState::Verifying,
            format!("accuracy check {task}: question {}/{of}", done + 1),
        )
    };
    let grace = Duration::from_secs(plan.m.restart.stop_timeout_secs);
    let checked = tokio::select! {
        r = super::accuracy::check(engine, &plan.model, checked_task, &progress, deadline) => r,
        exit = worker.wait() => {
            return Err(Outcome::start_failed(
                format!("worker {} during the accuracy check {task}; last output: {}", exit.describe(), log_tail(worker)),
                exit.leaves_cards_dirty(),
            ));
        }
    };
    match checked {
        Ok(c) if c.pass => {
            tracing::info!(slot = %plan.slot, "{}", c.summary);
            Ok(Some(c.summary))
        }
        Ok(c) => {
            let reason = format!(
                "{} (readiness.accuracy, fail-closed: never served)",
                c.summary
            );
            Err(fail_after_stop(mgr, plan, worker, Some(engine), reason).await)
        }
        Err(e) => {
            worker.terminate(grace).await;
            Err(Outcome::start_failed(
                format!("accuracy check {task} (readiness.accuracy): {e}"),
                true,
            ))
        }
    }
}

/// Phase 5: a cold start certifies the variant's file set (marker); a warm
/// start checks it generated no file it should have read (guard), the
/// field's NaN-placeholder trap.
async fn seal_cache(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    prepared: &Prepared,
    runtime_files: &RuntimeFiles,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    started: Instant,
) -> Result<(), Outcome> {
    let variant = &prepared.variant;
    let failure = match prepared.mode {
        CacheMode::Cold => match variant.write_marker(runtime_files) {
            Ok(_) => {
                tracing::info!(slot = %plan.slot, variant = %variant.key, "cache variant marked complete");
                crate::metrics::get().cache_build(&plan.model, true, started.elapsed());
                None
            }
            Err(e) => Some(format!(
                "cannot write the cache marker in {}: {e}",
                variant.dir.display()
            )),
        },
        CacheMode::Warm => warm_start_failure(variant, runtime_files, worker),
    };
    if failure.is_none() && prepared.mode == CacheMode::Cold {
        record_digests(mgr, plan, variant).await;
    }
    stop_on_failure(mgr, plan, worker, engine, failure).await
}

/// Why a warm start may not serve, if it may not: the engine said it
/// generated or failed to load a cache file, or the guard found a file
/// changed, missing or new. Either invalidates the variant (next start
/// cold).
fn warm_start_failure(
    variant: &Variant,
    runtime_files: &RuntimeFiles,
    worker: &Worker,
) -> Option<String> {
    let rebuilt: Vec<String> = worker
        .cache_rebuild_lines()
        .into_iter()
        .filter(|line| !runtime_files.excuses(line, &variant.dir))
        .collect();
    let guard = match variant.guard(runtime_files) {
        Ok(report) => report,
        Err(e) => {
            return Some(format!(
                "cannot check the cache variant {}: {e}",
                variant.dir.display()
            ))
        }
    };
    let mut found = Vec::new();
    if !rebuilt.is_empty() {
        if guard.passed() {
            // The guard invalidates only what it saw itself.
            if let Err(e) = crate::cache::invalidate(&variant.dir, "the engine rebuilt cache files")
            {
                tracing::error!(variant = %variant.key, error = %e, "cannot invalidate the cache variant");
            }
        }
        found.push(format!(
            "the engine wrote tensor cache files on a warm start ({} lines): {}",
            rebuilt.len(),
            rebuilt
                .iter()
                .take(4)
                .map(|l| format!("\"{}\"", l.trim()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !guard.passed() {
        found.push(guard.describe());
    }
    (!found.is_empty()).then(|| {
        format!(
            "warm start refused: {}. The worker may have been serving placeholder weights; cache variant {} is invalidated and the next start builds it cold",
            found.join("; "),
            variant.key
        )
    })
}

/// After a cold build: the files' content hashes, for `ttctl cache
/// verify`. Read once more after minutes of building (a 27B model's 30 GB
/// hash in well under a minute at SHA-NI speed), off the runtime; before
/// Ready, so that a verify right after the build finds them. A failure is
/// said and leaves the variant unverifiable, not broken.
async fn record_digests(mgr: &Arc<SlotManager>, plan: &SlotPlan, variant: &Variant) {
    mgr.transition(
        &plan.slot,
        SlotState::Verifying,
        format!(
            "hashing cache variant {} for `ttctl cache verify`",
            variant.key
        ),
    );
    let (slot, dir, key) = (plan.slot.clone(), variant.dir.clone(), variant.key.clone());
    let started = Instant::now();
    match tokio::task::spawn_blocking(move || crate::cache::digest::record(&dir)).await {
        Ok(Ok(d)) => {
            tracing::info!(%slot, variant = %key, files = d.files.len(), secs = started.elapsed().as_secs_f64(), "cache content hashes recorded")
        }
        Ok(Err(e)) => {
            tracing::warn!(%slot, variant = %key, error = %e, "cache content hashes not recorded; `ttctl cache verify` will say so")
        }
        Err(e) => tracing::warn!(%slot, variant = %key, error = %e, "cache hashing stopped"),
    }
}

/// A check that failed (`Some(reason)`) stops the worker cleanly and ends
/// the attempt.
async fn stop_on_failure(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    failure: Option<String>,
) -> Result<(), Outcome> {
    match failure {
        Some(reason) => Err(fail_after_stop(mgr, plan, worker, Some(engine), reason).await),
        None => Ok(()),
    }
}

/// `ttctl cache build`: the variant is built; stop the worker cleanly.
async fn stop_after_build(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    prepared: &Prepared,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    started: Instant,
) -> Outcome {
    let reason = format!(
        "cache built: variant {} of model {} is complete ({:.1}s)",
        prepared.variant.key,
        plan.model,
        started.elapsed().as_secs_f64()
    );
    let exit = drain_and_stop(
        mgr,
        plan,
        worker,
        Some(engine),
        "cache built; stopping the build worker",
    )
    .await;
    if exit.leaves_cards_dirty() {
        Outcome::start_failed(
            format!("{reason}, but the build worker {}", exit.describe()),
            true,
        )
    } else {
        Outcome::Built { reason }
    }
}

/// The slot's cards' device nodes, rank order, comma-separated
/// (TT_WORKER_DEVICES): what a container of the engine needs passed in
/// (`--device` each), read at every start since a hot-plug renumbers them.
fn device_nodes(mgr: &SlotManager, cards: &[String]) -> Result<String, String> {
    let hw = mgr.cards().hardware();
    let mut nodes = Vec::with_capacity(cards.len());
    for bdf in cards {
        let index = hw
            .index_of(bdf)
            .ok_or_else(|| format!("card {bdf} is not present"))?;
        nodes.push(hw.dev_node(index).display().to_string());
    }
    Ok(nodes.join(","))
}

/// The worker's environment: the model's tables, then its `env_file`
/// (`secrets`), then its flags, then the contract.
fn worker_env(
    plan: &SlotPlan,
    sys_root: &std::path::Path,
    variant: &Variant,
    mode: CacheMode,
    visible_devices: &str,
    device_nodes: &str,
    secrets: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let m = &plan.m;
    // First, so the model's own env table wins.
    let mut env = hang_env(plan, sys_root);
    env.extend(m.env.clone());
    env.extend(match mode {
        CacheMode::Cold => m.cold_env.clone(),
        CacheMode::Warm => m.warm_env.clone(),
    });
    env.extend(secrets);
    env.extend(m.flags.clone());
    // The contract, last so nothing above can override it.
    use tt_worker_contract::names;
    env.insert(names::VISIBLE_DEVICES.into(), visible_devices.into());
    env.insert(names::DEVICES.into(), device_nodes.into());
    env.insert(names::MESH_DEVICE.into(), m.mesh_device());
    if let Some(tt) = m.tt_json() {
        env.insert(
            names::TT_CONFIG.into(),
            serde_json::Value::Object(tt).to_string(),
        );
    }
    env.insert(names::SOCKET.into(), plan.socket.display().to_string());
    env.insert(names::MODEL.into(), m.checkpoint.display().to_string());
    env.insert(names::TP.into(), m.tp.to_string());
    env.insert(names::CACHE_DIR.into(), variant.dir.display().to_string());
    env.insert(names::CACHE_MODE.into(), mode.as_str().into());
    env
}

/// Traces on: the worker exports its spans to the daemon's collector,
/// named by slot and model (OpenTelemetry's own resource variable, in
/// front of a value the model's env table gave).
fn traces_env(env: &mut BTreeMap<String, String>, plan: &SlotPlan, otlp_endpoint: &str) {
    use tt_worker_contract::names;
    if otlp_endpoint.is_empty() {
        return;
    }
    env.insert(names::OTLP_ENDPOINT.into(), otlp_endpoint.into());
    let ours = format!("tt.slot={},tt.model={}", plan.slot, plan.model);
    let value = match env.get(names::OTEL_RESOURCE_ATTRIBUTES) {
        Some(theirs) if !theirs.is_empty() => format!("{ours},{theirs}"),
        _ => ours,
    };
    env.insert(names::OTEL_RESOURCE_ATTRIBUTES.into(), value);
}

/// tt-metal's hang switches for the engine (`[models.X.hang]`): its
/// dispatch timeout, and the capture it runs on one (this binary's
/// `hang-capture`, with the engine as `$PPID`).
fn hang_env(plan: &SlotPlan, sys_root: &std::path::Path) -> BTreeMap<String, String> {
    let h = &plan.m.hang;
    let mut env = BTreeMap::new();
    if h.operation_timeout_secs == 0 {
        return env;
    }
    env.insert(
        "TT_METAL_OPERATION_TIMEOUT_SECONDS".into(),
        h.operation_timeout_secs.to_string(),
    );
    match std::env::current_exe() {
        Ok(exe) if h.capture => {
            let spec =
                plan.capture_spec(sys_root, None, "tt-metal's dispatch timeout fired".into());
            env.insert(
                "TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE".into(),
                crate::hang::command_line(&exe, &spec),
            );
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(slot = %plan.slot, error = %e, "cannot name this binary for the hang capture command; tt-metal's timeout will run none")
        }
    }
    env
}

/// The readiness prompt, greedily, `readiness_concurrency` times at once:
/// the text every position produced, which must be one and the same (one
/// prompt, greedy). A batch shows what one request alone does not: an
/// engine that fails above some batch size, cuts answers short, or lets
/// one request's tokens into another's.
async fn ping(engine: &mut EngineClient<Channel>, m: &ModelConfig) -> Result<String, String> {
    let n = m.readiness_concurrency();
    let answers = batch(
        engine,
        n,
        m.readiness.ping_prompt.clone(),
        m.readiness.ping_max_tokens,
        "readiness-ping",
    )
    .await;
    let texts = answers
        .into_iter()
        .enumerate()
        .map(|(i, a)| a.map(|(text, _)| text).map_err(|e| at_position(i, n, &e)))
        .collect::<Result<Vec<String>, String>>()?;
    same_answers(&texts)?;
    Ok(texts.into_iter().next().unwrap_or_default())
}

/// `n` generations of `prompt` at once; each answer in its position.
async fn batch(
    engine: &EngineClient<Channel>,
    n: u32,
    prompt: String,
    max_tokens: u32,
    request_id: &str,
) -> Vec<Result<(String, Option<pb::Usage>), String>> {
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n as usize {
        let mut engine = engine.clone();
        let prompt = prompt.clone();
        let id = if n == 1 {
            request_id.to_string()
        } else {
            format!("{request_id}-{}", i + 1)
        };
        calls.spawn(async move { (i, generate_once(&mut engine, prompt, max_tokens, &id).await) });
    }
    let mut answers: Vec<Result<(String, Option<pb::Usage>), String>> =
        (0..n).map(|_| Err("not answered".to_string())).collect();
    while let Some(joined) = calls.join_next().await {
        match joined {
            Ok((i, answer)) => answers[i] = answer,
            Err(e) => return vec![Err(format!("a readiness request ended abnormally: {e}"))],
        }
    }
    answers
}

fn at_position(i: usize, n: u32, e: &str) -> String {
    if n == 1 {
        e.to_string()
    } else {
        format!(
            "position {} of a batch of {n} (readiness.concurrency): {e}",
            i + 1
        )
    }
}

/// Greedy answers to one prompt in one batch must be the same: the first
/// position that differs from the most common answer is named, with both.
fn same_answers(texts: &[String]) -> Result<(), String> {
    let mut counts: Vec<(&String, usize)> = Vec::new();
    for t in texts {
        match counts.iter_mut().find(|(s, _)| *s == t) {
            Some((_, c)) => *c += 1,
            None => counts.push((t, 1)),
        }
    }
    let Some((common, _)) = counts.iter().max_by_key(|(_, c)| *c) else {
        return Ok(());
    };
    match texts.iter().position(|t| t != *common) {
        None => Ok(()),
        Some(i) => Err(format!(
            "position {} of a batch of {} (readiness.concurrency) answered {:?} where the others answered {:?}: greedy answers to one prompt must be the same; the engine cut it short or mixed another request's tokens in (set readiness.concurrency = 1 only for an engine whose batches are known not to be batch-invariant)",
            i + 1,
            texts.len(),
            texts[i],
            common
        )),
    }
}

/// A prompt of about `tokens` tokens: one common word repeated, a single
/// token in the usual BPE vocabularies (the prompt tokens the engine
/// counted are reported beside it).
fn warmup_prompt(tokens: u32) -> String {
    " the".repeat(tokens as usize)
}

/// Phase 4b: `readiness.warmup_prompt_tokens`, one short greedy generation
/// per length, so that no client meets an engine's first-use compile of
/// that prompt length (tt_transformers compiles and captures a trace per
/// padded prefill length). Within the readiness deadline; a failure ends
/// the start like a failed ping.
async fn warm_up(
    mgr: &Arc<SlotManager>,
    plan: &SlotPlan,
    worker: &mut Worker,
    engine: &mut EngineClient<Channel>,
    deadline: Instant,
) -> Result<(), Outcome> {
    let m = &plan.m;
    let lengths = &m.readiness.warmup_prompt_tokens;
    let context = mgr.view(&plan.slot).map_or(0, |v| v.context_length);
    let grace = Duration::from_secs(m.restart.stop_timeout_secs);
    for (i, &tokens) in lengths.iter().enumerate() {
        if context > 0 && tokens >= context {
            worker.terminate(grace).await;
            return Err(Outcome::start_failed(
                format!(
                    "readiness.warmup_prompt_tokens lists {tokens}, but the engine's context is {context} tokens; list lengths below it"
                ),
                true,
            ));
        }
        mgr.transition(
            &plan.slot,
            SlotState::Verifying,
            format!(
                "warm-up: a prompt of {tokens} tokens ({}/{})",
                i + 1,
                lengths.len()
            ),
        );
        let began = Instant::now();
        let remaining = deadline.saturating_duration_since(began);
        let n = m.readiness_concurrency();
        let at_batch = async {
            let answers = batch(engine, n, warmup_prompt(tokens), 2, "warm-up").await;
            let mut usage = None;
            for (i, a) in answers.into_iter().enumerate() {
                usage = a.map_err(|e| at_position(i, n, &e))?.1;
            }
            Ok::<_, String>(((), usage))
        };
        let result = tokio::select! {
            r = tokio::time::timeout(remaining, at_batch) => r,
            exit = worker.wait() => {
                return Err(Outcome::start_failed(
                    format!("worker {} during the warm-up at {tokens} prompt tokens; last output: {}", exit.describe(), log_tail(worker)),
                    exit.leaves_cards_dirty(),
                ));
            }
        };
        match result {
            Ok(Ok((_, usage))) => {
                tracing::info!(
                    slot = %plan.slot,
                    tokens,
                    prompt_tokens = usage.map(|u| u.prompt_tokens),
                    secs = began.elapsed().as_secs_f64(),
                    "warm-up length done"
                );
            }
            Ok(Err(e)) => {
                worker.terminate(grace).await;
                return Err(Outcome::start_failed(
                    format!("warm-up at {tokens} prompt tokens failed: {e}"),
                    true,
                ));
            }
            Err(_) => {
                worker.terminate(grace).await;
                return Err(Outcome::start_failed(
                    format!(
                        "warm-up at {tokens} prompt tokens did not finish within readiness.deadline_secs ({}s)",
                        m.readiness.deadline_secs
                    ),
                    true,
                ));
            }
        }
    }
    Ok(())
}

/// One greedy generation to its final chunk: the text and the usage.
async fn generate_once(
    engine: &mut EngineClient<Channel>,
    prompt: String,
    max_tokens: u32,
    request_id: &str,
) -> Result<(String, Option<pb::Usage>), String> {
    let request = pb::EngineGenerateRequest {
        request: Some(pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Prompt(prompt)),
            max_tokens,
            ..Default::default()
        }),
        request_id: request_id.into(),
    };
    super::generate::complete(engine, request).await
}

/// Banners may print only once a feature first runs, so this runs after the
/// ping. The worker's own list (Info) and its output lines both count; the
/// output pipe can trail the RPC by a moment, so missing banners get a short
/// grace period before the rule fails closed.
async fn check_banners(
    engine: &mut EngineClient<Channel>,
    worker: &Worker,
    m: &ModelConfig,
    covered: &BTreeMap<String, String>,
) -> Vec<String> {
    let grace = Instant::now() + Duration::from_millis(500);
    loop {
        let mut engaged = worker.engaged();
        if let Ok(Ok(info)) =
            tokio::time::timeout(Duration::from_secs(5), engine.info(pb::InfoRequest {})).await
        {
            engaged.extend(info.into_inner().banners_engaged);
        }
        let violations = crate::worker::banners::check(&m.banners, covered, &engaged);
        if violations.is_empty() || Instant::now() >= grace {
            return violations;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
