//! Live reconfiguration: SIGHUP, `ttctl reload` and `systemctl reload`
//! (ExecReload= runs `ttctl reload`) all land in [`reload`].
//!
//! The new file is validated completely first; an invalid one is refused as
//! a whole and the old config keeps serving. Otherwise the [`plan`] says,
//! per slot, keep / update / restart / stop / start, and it is applied in an
//! order that never has two owners for a card: stop what goes away or
//! changes (draining in-flight requests), put the new config in force
//! (cards of removed slots are unlocked, cards of new ones locked), start
//! what is new or changed, then wait for those slots to settle. A model
//! with `rollback_on_failure` whose new definition fails comes back with its
//! old one. Reloads take a lock, so two never interleave.

pub mod plan;

use crate::config::{Config, ModelConfig};
use crate::notify;
use crate::slots::{configured_slots, SlotState, SlotView};
use crate::state::DaemonState;
use plan::{Action, Plan};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tt_serving_proto::v1 as pb;

/// How to reload.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Only compute the plan.
    pub dry_run: bool,
    /// Wait for started slots to be Ready or failed before answering.
    pub wait: bool,
    /// Show the config's values in the plan (old → new, added (value)) and
    /// the problems' details; false: keys and what happens to them only,
    /// for a caller who may not read the config file.
    pub show_values: bool,
}

/// Re-read the config file and apply what changed. Never fails: the report
/// says what happened.
pub async fn reload(state: &Arc<DaemonState>, trigger: &str, options: Options) -> pb::ReloadReport {
    let _turn = state.reloads().turn().await;
    reload_in_turn(state, trigger, options).await
}

/// [`reload`] by one already holding the reload turn (a trial ending).
pub async fn reload_in_turn(
    state: &Arc<DaemonState>,
    trigger: &str,
    options: Options,
) -> pb::ReloadReport {
    let mut report = pb::ReloadReport {
        trigger: trigger.to_string(),
        started_unix_ms: tt_serving_proto::time::unix_ms(SystemTime::now()),
        config_path: state.config_path().display().to_string(),
        ..Default::default()
    };
    if !options.dry_run {
        notify::reloading("reloading the config");
    }
    tracing::info!(trigger, dry_run = options.dry_run, path = %report.config_path, "reload requested");
    let new = match crate::config::load(state.config_path()) {
        Ok(new) => new,
        Err(e) => {
            report.outcome = pb::ReloadOutcome::Refused as i32;
            report.problems = match e.problems() {
                [] => vec![e.to_string()],
                problems => problems.iter().map(ToString::to_string).collect(),
            };
            for problem in &report.problems {
                tracing::error!(%problem, "reload refused: the new config is invalid; the old one keeps serving");
            }
            // A problem quotes the file's values; its key alone for a
            // caller who may not read it (the log keeps the whole).
            if !options.show_values {
                report.problems = match e.problems() {
                    [] => vec!["the config file cannot be read or parsed (details for root and the admin group: ttctl reload --dry-run as one of them, or the daemon's log)".into()],
                    problems => problems
                        .iter()
                        .map(|p| format!("{}: invalid (details for root and the admin group)", p.key))
                        .collect(),
                };
            }
            report.summary = format!("refused: {} problem(s)", report.problems.len());
            return finish(state, report, options);
        }
    };
    apply_config(state, report, new, options).await
}

/// Puts `new` (already validated) in force by the reload's plan and order,
/// by one holding the reload turn: a reload's file, or a trial's
/// definition (`trial.rs`), which is never written to the file.
pub async fn apply_config(
    state: &Arc<DaemonState>,
    mut report: pb::ReloadReport,
    new: Config,
    options: Options,
) -> pb::ReloadReport {
    let old = state.config();
    // Replicas a halted roll left on an older definition are compared by
    // what they run.
    let running = state.slot_manager().outdated();
    let plan = plan::diff(
        &old,
        &new,
        &|model, m| variant_key(&old, model, m),
        &running,
        options.show_values,
    );
    report.summary = plan.summary();
    report.needs_restart = plan.needs_restart.clone();
    report.steps = plan
        .steps
        .iter()
        .map(|s| pb::ReloadStep {
            slot: s.slot.clone(),
            model: s.model.clone(),
            action: s.action.word().to_string(),
            reason: s.reason.clone(),
            result: String::new(),
        })
        .collect();
    for line in &plan.needs_restart {
        tracing::warn!(change = %line, "config change needs a daemon restart; not applied");
    }
    if options.dry_run {
        report.outcome = pb::ReloadOutcome::DryRun as i32;
        return finish(state, report, options);
    }
    if !plan.changes_slots() {
        report.outcome = pb::ReloadOutcome::Unchanged as i32;
        for step in &mut report.steps {
            step.result = "untouched".into();
        }
        return finish(state, report, options);
    }
    for step in &plan.steps {
        if step.action != Action::Keep {
            tracing::info!(slot = %step.slot, action = step.action.word(), reason = %step.reason, "reload plan");
        }
    }
    let results = apply(state, &old, &new, &plan, options).await;
    for step in &mut report.steps {
        step.result = results.get(&step.slot).cloned().unwrap_or_default();
    }
    report.outcome = pb::ReloadOutcome::Applied as i32;
    finish(state, report, options)
}

fn finish(
    state: &Arc<DaemonState>,
    mut report: pb::ReloadReport,
    options: Options,
) -> pb::ReloadReport {
    report.finished_unix_ms = tt_serving_proto::time::unix_ms(SystemTime::now());
    // A dry run changed nothing, and read-only users may ask for one: kept
    // out of the history, so dry runs never push real reloads out of it.
    if !options.dry_run {
        state.reloads().record(&report);
    }
    if !options.dry_run {
        if report.outcome == pb::ReloadOutcome::Refused as i32 {
            notify::ready(&format!(
                "reload refused: {} problems",
                report.problems.len()
            ));
        } else {
            notify::ready(&state.summary());
        }
    }
    tracing::info!(outcome = ?report.outcome(), summary = %report.summary, "reload finished");
    state.cards().bus().notify();
    report
}

/// Put a reloaded config in force: slots read it when they start, cards
/// follow its assignment, the router its limits. The only code that swaps
/// the config in force.
fn put_in_force(state: &DaemonState, config: Config) {
    state.cards().reassign(&config);
    state.slot_manager().set_config(config);
    state.router().sync_queues();
}

fn variant_key(config: &Config, model: &str, m: &ModelConfig) -> String {
    crate::cache::Variant::for_model(
        &config.daemon.cache_dir,
        model,
        m,
        &crate::worker::command_for(m),
    )
    .key
}

/// Apply a plan; returns each touched slot's result in words.
///
/// Order, so that no card ever has two owners and a model with several
/// replicas keeps serving:
/// 1. stop removed slots, and restarted slots whose cards change;
/// 2. put the new config in force (cards of removed slots are unlocked,
///    new ones locked);
/// 3. start added slots and the restarted slots stopped in 1;
/// 4. restart the other changed slots in waves, one replica of each model
///    per wave, each wave Ready before the next (without waiting: at once);
///    a model whose replica fails stops rolling, and its remaining replicas
///    keep their old definition;
/// 5. wait for everything started, then roll back the models that asked
///    for it and failed.
async fn apply(
    state: &Arc<DaemonState>,
    old: &Config,
    new: &Config,
    plan: &Plan,
    options: Options,
) -> BTreeMap<String, String> {
    let slots = state.slot_manager().clone();
    let mut results = BTreeMap::new();
    for slot in plan.slots(Action::Keep) {
        results.insert(slot, "untouched".to_string());
    }
    for slot in plan.slots(Action::Update) {
        results.insert(slot, "limits updated live; worker untouched".to_string());
    }
    let old_cards = state.cards().slot_cards();
    let mut in_force = plan::in_force(old, new);
    let new_cards = state.cards().assignment_of(&in_force);
    let reason_of = |slot: &str| {
        plan.steps
            .iter()
            .find(|s| s.slot == slot)
            .map(|s| s.reason.clone())
            .unwrap_or_default()
    };
    let model_of = |slot: &str| {
        plan.steps
            .iter()
            .find(|s| s.slot == slot)
            .map(|s| s.model.clone())
            .unwrap_or_default()
    };
    let restarts = plan.slots(Action::Restart);
    let (moving, rolling): (Vec<String>, Vec<String>) = restarts
        .iter()
        .cloned()
        .partition(|s| !options.wait || old_cards.get(s) != new_cards.get(s));

    // 1. Stop what goes away, and what changes its cards.
    let mut stops: Vec<(String, String)> = plan
        .slots(Action::Stop)
        .into_iter()
        .map(|s| (s, "reload: removed from the config; draining".to_string()))
        .collect();
    stops.extend(moving.iter().map(|s| {
        (
            s.clone(),
            format!("reload: draining to restart ({})", reason_of(s)),
        )
    }));
    let aborted = slots.stop_slots(&stops, old.stop_limit()).await;
    for slot in plan.slots(Action::Stop) {
        slots.remove_slot(&slot);
        // Gone from the config: its cgroup goes too. A slot restarted
        // under the same name keeps its cgroup (and the page cache charged
        // to it).
        crate::worker::containment::get().release(&slot);
        results.insert(
            slot.clone(),
            if aborted.contains(&slot) {
                "did not stop in time; killed, cards released".to_string()
            } else {
                "drained and stopped; cards released".to_string()
            },
        );
    }

    // 2. The new config in force.
    put_in_force(state, in_force.clone());

    // 3. Start what is new, and what moved cards.
    let mut started: Vec<String> = plan.slots(Action::Start);
    started.extend(moving.iter().cloned());
    for slot in &started {
        slots.replace_slot(slot, &model_of(slot));
    }

    // 4. Rolling restarts, one replica per model per wave.
    let mut waves: Vec<Vec<String>> = Vec::new();
    let mut per_model: BTreeMap<String, usize> = BTreeMap::new();
    for slot in &rolling {
        let k = per_model.entry(model_of(slot)).or_insert(0);
        if waves.len() <= *k {
            waves.push(Vec::new());
        }
        waves[*k].push(slot.clone());
        *k += 1;
    }
    let rollback_models: Vec<String> = new
        .models
        .iter()
        .filter(|(name, m)| m.rollback_on_failure && old.models.contains_key(*name))
        .map(|(name, _)| name.clone())
        .collect();
    let mut halted: Vec<String> = Vec::new();
    let mut settled: BTreeMap<String, SlotView> = BTreeMap::new();
    for wave in waves {
        let (go, skip): (Vec<String>, Vec<String>) = wave
            .into_iter()
            .partition(|s| !halted.contains(&model_of(s)));
        for slot in skip {
            results.insert(
                slot,
                "not restarted: another replica of the model failed with the new definition; this one keeps the old one (fix the config and reload)".into(),
            );
        }
        let stops: Vec<(String, String)> = go
            .iter()
            .map(|s| {
                (
                    s.clone(),
                    format!("reload: draining to restart ({})", reason_of(s)),
                )
            })
            .collect();
        slots.stop_slots(&stops, old.stop_limit()).await;
        for slot in &go {
            slots.replace_slot(slot, &model_of(slot));
        }
        let views = wait_settled(state, &go, &rollback_models).await;
        for (slot, view) in views {
            if view.state != SlotState::Ready {
                halted.push(view.model.clone());
            }
            settled.insert(slot, view);
        }
        started.extend(go);
    }
    if !options.wait {
        for slot in &started {
            results.insert(
                slot.clone(),
                "started; not waiting for readiness (--no-wait)".into(),
            );
        }
        return results;
    }

    // 5. Wait, then roll back the models that asked for it.
    let rest: Vec<String> = started
        .iter()
        .filter(|s| !settled.contains_key(*s))
        .cloned()
        .collect();
    settled.extend(wait_settled(state, &rest, &rollback_models).await);
    let mut failed_models: Vec<String> = Vec::new();
    for slot in &started {
        let Some(view) = settled.get(slot) else {
            continue;
        };
        if view.state != SlotState::Ready && !failed_models.contains(&view.model) {
            failed_models.push(view.model.clone());
        }
        results.insert(slot.clone(), describe(view));
    }
    for model in failed_models
        .into_iter()
        .filter(|m| rollback_models.contains(m))
    {
        let changed: Vec<String> = started
            .iter()
            .filter(|s| model_of(s) == model)
            .cloned()
            .collect();
        let why = changed
            .iter()
            .filter_map(|s| settled.get(s))
            .find(|v| v.state != SlotState::Ready)
            .map(describe)
            .unwrap_or_default();
        tracing::warn!(%model, %why, "new definition failed; rolling back (rollback_on_failure)");
        let restored = rollback(state, old, &mut in_force, &model, &changed).await;
        for (slot, now) in restored {
            results.insert(
                slot,
                format!("rolled back ({why}); previous definition: {now}"),
            );
        }
    }
    results
}

/// Bring a model's old definition back: stop the slots the reload started
/// for it (and the added ones), put the old definition in force, start the
/// old slots that are not running. Replicas the reload never touched keep
/// running. Returns (slot, how it ended up).
async fn rollback(
    state: &Arc<DaemonState>,
    old: &Config,
    in_force: &mut Config,
    model: &str,
    changed: &[String],
) -> Vec<(String, String)> {
    let slots = state.slot_manager().clone();
    let stops: Vec<(String, String)> = changed
        .iter()
        .map(|s| {
            (
                s.clone(),
                "reload: rolling back to the previous definition".into(),
            )
        })
        .collect();
    slots.stop_slots(&stops, in_force.stop_limit()).await;
    let mut logs = BTreeMap::new();
    for slot in changed {
        logs.insert(slot.clone(), slots.remove_slot(slot));
    }
    if let Some(previous) = old.models.get(model) {
        in_force.models.insert(model.to_string(), previous.clone());
    }
    put_in_force(state, in_force.clone());
    let running: Vec<String> = state.slots().into_iter().map(|v| v.name).collect();
    let restored: Vec<String> = configured_slots(in_force)
        .into_iter()
        .filter(|(s, m)| m == model && !running.contains(s))
        .map(|(s, _)| s)
        .collect();
    for slot in &restored {
        slots.add_slot(slot, model, logs.remove(slot).flatten());
    }
    let back = wait_settled(state, &restored, &[]).await;
    changed
        .iter()
        .chain(&restored)
        .map(|slot| {
            let now = back
                .get(slot)
                .map(describe)
                .unwrap_or_else(|| "removed (not in the previous definition)".into());
            (slot.clone(), now)
        })
        .collect()
}

/// Wait until each slot is Ready or has given up (failed for good,
/// quarantined); slots of `fail_fast` models also count as settled at their
/// first failure (their reload rolls back). Returns the views then.
async fn wait_settled(
    state: &Arc<DaemonState>,
    names: &[String],
    fail_fast: &[String],
) -> BTreeMap<String, SlotView> {
    let mut changes = state.subscribe();
    loop {
        changes.borrow_and_update();
        let views: BTreeMap<String, SlotView> = state
            .slots()
            .into_iter()
            .filter(|v| names.contains(&v.name))
            .map(|v| (v.name.clone(), v))
            .collect();
        let settled = views.values().all(|v| match v.state {
            SlotState::Ready | SlotState::Quarantined | SlotState::Stopped => true,
            SlotState::Failed => v.retry_at.is_none() || fail_fast.contains(&v.model),
            _ => false,
        });
        if settled || state.is_shutting_down() {
            return views;
        }
        // Cold builds can take long; keep systemd's reload job alive.
        notify::extend_timeout(Duration::from_secs(30));
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return views },
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

fn describe(view: &SlotView) -> String {
    match view.state {
        SlotState::Ready => format!(
            "Ready ({} start{})",
            view.cache_mode.map_or("unknown", |m| m.as_str()),
            if view.variant.is_empty() {
                String::new()
            } else {
                format!(", cache variant {}", view.variant)
            }
        ),
        state => format!("{state:?}: {}", view.reason),
    }
}
