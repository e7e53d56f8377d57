//! Trials (`ttctl ab`): a model run on temporary definitions, arm after
//! arm, then put back.
//!
//! An arm is the configured definition plus the arm's flags, with the
//! banner rule in `both` mode over those flags, so each arm proves by its
//! banners that its flags engaged and the baseline that they did not. It is
//! applied exactly like a reload (the same plan, the same stop-then-start
//! order, so a card never has two owners or is left owned by nobody) but
//! never written to the config file, and status shows it on the slots.
//!
//! The trial lasts as long as its client's stream: when the client says
//! done, fails, is interrupted or dies, the configured definition comes
//! back by a reload of the config file (or, should the file have become
//! invalid meanwhile, the definition in force before the trial). The trial
//! holds the reload turn from its first arm to its restore, so a reload or
//! another trial waits instead of interleaving.

use crate::config::{BannerMode, Config};
use crate::reload::{self, Options};
use crate::slots::{SlotState, SlotView};
use crate::state::{DaemonState, TrialMark};
use std::sync::Arc;
use tokio::sync::mpsc;
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::trial_event::Kind;

/// What a trial reports as it goes; the API turns it into a
/// `TrialEvent` (the slots as status shows them).
#[derive(Debug, Clone)]
pub struct ArmEvent {
    /// What happened.
    pub kind: Kind,
    /// In words.
    pub message: String,
    /// The model's slots, once an arm is Ready.
    pub slots: Vec<SlotView>,
    /// Whether it went well.
    pub ok: bool,
}

/// Why a trial did not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrialError {
    /// The model is not in the config.
    #[error("no model {model:?} in the config (configured: {known:?})")]
    NoSuchModel {
        /// The model asked for.
        model: String,
        /// The configured models.
        known: Vec<String>,
    },
}

/// What the client sends after the first arm.
#[derive(Debug, Clone)]
pub enum Step {
    /// The next arm.
    Arm(pb::TrialArm),
    /// The trial is over.
    Done,
}

fn event(kind: Kind, message: impl Into<String>) -> Result<ArmEvent, TrialError> {
    Ok(ArmEvent {
        kind,
        message: message.into(),
        slots: Vec::new(),
        ok: false,
    })
}

/// `base` with the arm applied to `model`: its flags set (an empty value
/// removes one), every arm flag held to the banner rule in `both` mode.
pub fn arm_config(base: &Config, arm: &pb::TrialArm) -> Result<Config, String> {
    let mut config = base.clone();
    let Some(m) = config.models.get_mut(&arm.model) else {
        let known: Vec<&String> = base.models.keys().collect();
        return Err(format!(
            "no model {:?} in the config (configured: {known:?})",
            arm.model
        ));
    };
    for (flag, value) in &arm.flags {
        if value.is_empty() {
            m.flags.remove(flag);
        } else {
            m.flags.insert(flag.clone(), value.clone());
        }
        if !m.banners.patterns.is_empty() && !m.banners.patterns.contains(flag) {
            m.banners.patterns.push(flag.clone());
        }
    }
    if !arm.flags.is_empty() {
        m.banners.mode = BannerMode::Both;
    }
    let problems = crate::config::problems_of(&config);
    if !problems.is_empty() {
        return Err(format!(
            "arm {} is not a valid definition of {}: {}",
            arm.name,
            arm.model,
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    Ok(config)
}

/// Runs one trial from its first arm; the client's next steps come on
/// `steps` (closed: the client went away); events go to `tx`.
pub async fn run(
    state: Arc<DaemonState>,
    first: pb::TrialArm,
    mut steps: mpsc::Receiver<Step>,
    tx: mpsc::Sender<Result<ArmEvent, TrialError>>,
) {
    tracing::info!(model = %crate::echo::echo(&first.model), arm = %crate::echo::echo(&first.name), purpose = %crate::echo::echo(&first.purpose), "trial requested over the control socket");
    let model = first.model.clone();
    if !state.config().models.contains_key(&model) {
        let known: Vec<String> = state.config().models.keys().cloned().collect();
        let _ = tx.send(Err(TrialError::NoSuchModel { model, known })).await;
        return;
    }
    let turn = state.reloads().turn().await;
    let base = state.config();
    let mut next = Some(first);
    while let Some(arm) = next.take() {
        if arm.model != model {
            let _ = tx
                .send(event(
                    Kind::ArmFailed,
                    format!(
                        "every arm of a trial names the same model ({model}), not {}",
                        arm.model
                    ),
                ))
                .await;
        } else {
            let ev = apply_arm(&state, &base, &arm).await;
            if tx.send(ev).await.is_err() {
                break;
            }
        }
        // The next arm, or done, or the client's end.
        match steps.recv().await {
            Some(Step::Arm(arm)) => next = Some(arm),
            Some(Step::Done) => break,
            None => {
                tracing::warn!(%model, "the trial's client went away; restoring the configured definition");
                break;
            }
        }
    }
    let ev = restore(&state, &base, &model).await;
    state.set_trial(None);
    drop(turn);
    let _ = tx.send(ev).await;
}

async fn apply_arm(
    state: &Arc<DaemonState>,
    base: &Config,
    arm: &pb::TrialArm,
) -> Result<ArmEvent, TrialError> {
    let config = match arm_config(base, arm) {
        Ok(c) => c,
        Err(e) => return event(Kind::ArmFailed, e),
    };
    tracing::info!(model = %arm.model, arm = %arm.name, purpose = %arm.purpose, "trial: bringing up an arm");
    state.set_trial(Some(TrialMark {
        model: arm.model.clone(),
        arm: arm.name.clone(),
        flags: arm.flags.clone().into_iter().collect(),
        purpose: arm.purpose.clone(),
    }));
    let report = pb::ReloadReport {
        trigger: format!("ttctl ab: arm {}", arm.name),
        started_unix_ms: tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
        config_path: "(trial definition, not written)".into(),
        ..Default::default()
    };
    let report = reload::apply_config(
        state,
        report,
        config,
        Options {
            dry_run: false,
            wait: true,
            show_values: true,
        },
    )
    .await;
    let slots: Vec<_> = state
        .slots()
        .into_iter()
        .filter(|v| v.model == arm.model)
        .collect();
    let failed: Vec<String> = slots
        .iter()
        .filter(|v| v.state != SlotState::Ready)
        .map(|v| format!("{} is {:?}: {}", v.name, v.state, v.reason))
        .collect();
    if !failed.is_empty() || slots.is_empty() {
        return event(
            Kind::ArmFailed,
            format!(
                "arm {} did not come up: {} ({})",
                arm.name,
                failed.join("; "),
                report.summary
            ),
        );
    }
    Ok(ArmEvent {
        kind: Kind::ArmReady,
        message: format!("arm {} is Ready on {} slot(s)", arm.name, slots.len()),
        ok: true,
        slots,
    })
}

/// The configured definition back: the file, or (if it has become
/// invalid) the config in force before the trial.
async fn restore(
    state: &Arc<DaemonState>,
    base: &Config,
    model: &str,
) -> Result<ArmEvent, TrialError> {
    let options = Options {
        dry_run: false,
        wait: true,
        show_values: true,
    };
    let report = reload::reload_in_turn(state, "ttctl ab: trial over", options).await;
    let mut message = String::new();
    if report.outcome == pb::ReloadOutcome::Refused as i32 {
        tracing::warn!(problems = ?report.problems, "trial over, but the config file is invalid now; restoring the definition in force before the trial");
        message = format!(
            "the config file is invalid now ({}); the definition in force before the trial was restored instead. ",
            report.problems.join("; ")
        );
        let report = pb::ReloadReport {
            trigger: "ttctl ab: trial over (config file invalid)".into(),
            started_unix_ms: tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
            config_path: state.config_path().display().to_string(),
            ..Default::default()
        };
        reload::apply_config(state, report, base.clone(), options).await;
    }
    let slots: Vec<_> = state
        .slots()
        .into_iter()
        .filter(|v| v.model == model)
        .collect();
    let ok = !slots.is_empty()
        && slots
            .iter()
            .all(|v| v.state == SlotState::Ready && v.outdated.is_empty());
    message.push_str(&if ok {
        format!("{model} is back on its configured definition")
    } else {
        format!(
            "{model} is not fully back: {}",
            slots
                .iter()
                .map(|v| format!("{} {:?}", v.name, v.state))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    tracing::info!(%model, ok, "trial over");
    Ok(ArmEvent {
        kind: Kind::Restored,
        message,
        slots: Vec::new(),
        ok,
    })
}
