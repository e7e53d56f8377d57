//! From the daemon's own types to the control protocol's messages.

use crate::cards::{CardState, CardView};
use crate::slots::{SlotState, SlotView};
use crate::state::DaemonState;
use tt_serving_proto::time::unix_ms;
use tt_serving_proto::v1 as pb;

/// A card as the control protocol shows it.
pub fn card(view: &CardView) -> pb::Card {
    let info = view.info.as_ref();
    let telemetry = info.map(|i| &i.telemetry);
    pb::Card {
        bdf: view.bdf.clone(),
        index: info.map(|i| i.index),
        card_type: info.map(|i| i.card_type.clone()).unwrap_or_default(),
        serial: info.map(|i| i.serial.clone()).unwrap_or_default(),
        fw_bundle_version: info
            .map(|i| i.fw_bundle_version.clone())
            .unwrap_or_default(),
        m3app_fw_version: info.map(|i| i.m3app_fw_version.clone()).unwrap_or_default(),
        aiclk_mhz: info.and_then(|i| i.aiclk_mhz).unwrap_or_default(),
        heartbeat: info.and_then(|i| i.heartbeat).unwrap_or_default(),
        heartbeat_ok: view.heartbeat_ok,
        telemetry: telemetry.map(|t| pb::Telemetry {
            temperature_c: t.temperature_c,
            power_w: t.power_w,
            voltage_v: t.voltage_v,
            current_a: t.current_a,
            fan_rpm: t.fan_rpm,
        }),
        state: card_state(view.state) as i32,
        state_reason: view.reason.clone(),
        lock_holder: view.holder.as_ref().map(|h| pb::LockHolder {
            pid: h.pid,
            purpose: h.purpose.clone(),
            is_daemon: view.held_by_daemon,
            user: h.user.clone(),
            command: h.command.clone(),
        }),
        processes: view
            .processes
            .iter()
            .map(|p| pb::CardProcess {
                pid: p.pid,
                command: p.command.clone(),
                holds_chip: p.holds_chip,
            })
            .collect(),
        slot: view.slot.clone().unwrap_or_default(),
        reset_failures: view.reset_failures,
        last_reset_output: view.last_reset_output.clone(),
    }
}

fn card_state(state: CardState) -> pb::CardState {
    match state {
        CardState::Ready => pb::CardState::Ready,
        CardState::Idle => pb::CardState::Idle,
        CardState::HeldElsewhere => pb::CardState::HeldElsewhere,
        CardState::Resetting => pb::CardState::Resetting,
        CardState::Probing => pb::CardState::Probing,
        CardState::Quarantined => pb::CardState::Quarantined,
        CardState::Missing => pb::CardState::Missing,
        CardState::Failed => pb::CardState::Failed,
        CardState::Unmanaged => pb::CardState::Unmanaged,
    }
}

/// A slot as status shows it: [`slot`] with the trial in force, if its
/// model is on trial.
pub fn slot_of(state: &DaemonState, view: &SlotView) -> pb::Slot {
    let mut s = slot(view);
    if let Some(t) = state.trial().filter(|t| t.model == view.model) {
        s.trial = t.describe();
    }
    s
}

/// A slot as the control protocol shows it.
pub fn slot(view: &SlotView) -> pb::Slot {
    let stats = view.stats.view();
    pb::Slot {
        name: view.name.clone(),
        model: view.model.clone(),
        cards: view.cards.clone(),
        state: slot_state(view.state) as i32,
        since_unix_ms: unix_ms(view.since),
        reason: view.reason.clone(),
        cache_mode: view
            .cache_mode
            .map(|m| m.as_str().to_string())
            .unwrap_or_default(),
        attempt: view.attempt,
        starts: view.starts,
        retry_at_unix_ms: view.retry_at.map(unix_ms).unwrap_or(0),
        worker_pid: view.worker_pid,
        worker_rss_bytes: view.worker_rss_bytes,
        worker_memory_peak_bytes: view.worker_memory_peak_bytes,
        memory_growth: view.memory_growth.clone(),
        requests_in_flight: view.in_flight,
        last_error: view.last_error.clone(),
        generated_tokens: stats.generated_tokens,
        requests_served: stats.requests,
        ttft_p50_ms: stats.ttft_p50_ms,
        itl_p50_ms: stats.itl_p50_ms,
        outdated_keys: view.outdated.clone(),
        engine_version: view.engine_facts.version.clone(),
        cache_variant: view.variant.clone(),
        flags: view
            .definition
            .as_ref()
            .map(|d| d.flags.clone().into_iter().collect())
            .unwrap_or_default(),
        trial: String::new(),
        banners_engaged: view
            .banners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect(),
        prompt_tokens: stats.prompt_tokens,
        cached_prompt_tokens: stats.cached_prompt_tokens,
        affinity_affine: stats.affine,
        affinity_fallback: stats.fallback,
        // The last worker's figures stay in the view until the next one is
        // Ready (as for the KV gauges of /metrics).
        context_length: view.context_length,
        max_in_flight: view.definition.as_ref().map_or(0, |d| d.max_in_flight),
        worker_command: view
            .definition
            .as_ref()
            .map(|d| crate::worker::command_for(d))
            .unwrap_or_default(),
        kv: view
            .kv
            .filter(|_| view.state == SlotState::Ready)
            .map(|kv| pb::SlotKvMemory {
                budget_bytes: kv.budget_bytes,
                block_tokens: kv.block_tokens,
                blocks_total: kv.blocks_total,
                prefix_cache: kv.prefix_cache,
                blocks_in_use: kv.blocks_in_use,
                blocks_cached: kv.blocks_cached,
            }),
    }
}

fn slot_state(state: SlotState) -> pb::SlotState {
    match state {
        SlotState::Pending => pb::SlotState::Pending,
        SlotState::Locking => pb::SlotState::Locking,
        SlotState::Resetting => pb::SlotState::Resetting,
        SlotState::Probing => pb::SlotState::Probing,
        SlotState::Starting => pb::SlotState::Starting,
        SlotState::Loading => pb::SlotState::Loading,
        SlotState::Verifying => pb::SlotState::Verifying,
        SlotState::Ready => pb::SlotState::Ready,
        SlotState::Draining => pb::SlotState::Draining,
        SlotState::Stopped => pb::SlotState::Stopped,
        SlotState::Failed => pb::SlotState::Failed,
        SlotState::Quarantined => pb::SlotState::Quarantined,
    }
}

/// A reset phase as the control protocol shows it.
pub fn reset_phase(phase: crate::cards::reset::Phase) -> pb::ResetPhase {
    use crate::cards::reset::Phase;
    match phase {
        Phase::RunningTtSmi => pb::ResetPhase::RunningTtSmi,
        Phase::WaitingForDevice => pb::ResetPhase::WaitingForDevice,
        Phase::ReadingSysfs => pb::ResetPhase::ReadingSysfs,
        Phase::CheckingHeartbeat => pb::ResetPhase::CheckingHeartbeat,
        Phase::RunningProbe => pb::ResetPhase::RunningProbe,
        Phase::Retrying => pb::ResetPhase::Retrying,
        Phase::Done => pb::ResetPhase::Done,
        Phase::Failed => pb::ResetPhase::Failed,
    }
}

/// A captured worker output line.
pub fn log_line(line: &crate::worker::logs::LogLine) -> pb::LogLine {
    pb::LogLine {
        unix_ms: line.unix_ms,
        stream: match line.stream {
            crate::worker::logs::Stream::Stdout => "stdout".into(),
            crate::worker::logs::Stream::Stderr => "stderr".into(),
        },
        text: line.text.clone(),
    }
}

/// The full status message.
pub fn status(state: &DaemonState) -> pb::StatusResponse {
    let summary = state.summary();
    pb::StatusResponse {
        daemon: Some(pb::DaemonInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            started_unix_ms: tt_serving_proto::time::unix_ms(state.started()),
            config_path: state.config_path().display().to_string(),
            summary,
            driver_version: state
                .cards()
                .hardware()
                .driver_version()
                .unwrap_or_default(),
            inference_address: state.inference_address().to_string(),
            metrics_address: state.metrics_address().to_string(),
            openai_address: state.openai_address().to_string(),
            lock_dir: state.config().daemon.lock_dir.display().to_string(),
            containment: crate::worker::containment::get().describe().to_string(),
            hardware: state.cards().hardware().kind(),
        }),
        cards: state.cards().snapshot().iter().map(card).collect(),
        slots: state.slots().iter().map(|v| slot_of(state, v)).collect(),
        reloads: state.reloads().history(),
        queues: state
            .router()
            .waiting()
            .into_iter()
            .map(|(model, waiting)| pb::ModelQueue {
                max_queue: state
                    .config()
                    .models
                    .get(&model)
                    .map(|m| m.max_queue)
                    .unwrap_or(0),
                model,
                waiting,
            })
            .collect(),
        accuracy: state
            .config()
            .models
            .iter()
            .flat_map(|(model, m)| {
                m.accuracy.iter().map(move |(task, gate)| {
                    let (pass_correct, pass_of) = gate
                        .pass_mark
                        .as_deref()
                        .and_then(tt_serving_proto::accuracy::pass_mark)
                        .unwrap_or((0, 0));
                    pb::AccuracyGate {
                        model: model.clone(),
                        task: task.clone(),
                        reference: gate.reference,
                        tolerance: gate.tolerance.unwrap_or(0.0),
                        pass_correct,
                        pass_of,
                    }
                })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::stats::SlotStats;
    use crate::slots::KvMemory;
    use std::sync::Arc;
    use std::time::SystemTime;

    fn view(state: SlotState, kv: Option<KvMemory>) -> SlotView {
        let stats = Arc::new(SlotStats::default());
        stats.prompt(600, 0);
        stats.prompt(640, 592);
        stats.affinity(true);
        stats.affinity(true);
        stats.affinity(false);
        SlotView {
            name: "m/0".into(),
            model: "m".into(),
            cards: vec![],
            state,
            since: SystemTime::UNIX_EPOCH,
            reason: String::new(),
            cache_mode: None,
            attempt: 0,
            starts: 1,
            served: 0,
            resets_since_served: 0,
            retry_at: None,
            worker_pid: 0,
            worker_rss_bytes: 0,
            worker_memory_peak_bytes: 0,
            memory_growth: String::new(),
            memory_growth_per_hour: 0,
            in_flight: 0,
            last_error: String::new(),
            variant: String::new(),
            stats,
            context_length: 0,
            engine_facts: Arc::default(),
            kv,
            banners: Arc::default(),
            definition: None,
            outdated: vec![],
        }
    }

    const KV: KvMemory = KvMemory {
        budget_bytes: 512 << 20,
        block_tokens: 16,
        blocks_total: 1024,
        prefix_cache: true,
        blocks_in_use: 256,
        blocks_cached: 100,
    };

    #[test]
    fn the_slot_carries_its_prefix_cache_and_affinity_counters_and_kv_memory() {
        let s = slot(&view(SlotState::Ready, Some(KV)));
        assert_eq!((s.prompt_tokens, s.cached_prompt_tokens), (1240, 592));
        assert_eq!((s.affinity_affine, s.affinity_fallback), (2, 1));
        assert_eq!(
            s.kv,
            Some(pb::SlotKvMemory {
                budget_bytes: 512 << 20,
                block_tokens: 16,
                blocks_total: 1024,
                prefix_cache: true,
                blocks_in_use: 256,
                blocks_cached: 100,
            })
        );
    }

    #[test]
    fn kv_memory_is_shown_only_while_ready_and_when_the_engine_says() {
        // The last worker's figures are kept in the view until the next is
        // Ready; they describe no engine meanwhile.
        let s = slot(&view(SlotState::Failed, Some(KV)));
        assert_eq!(s.kv, None);
        // The counters are the slot's, across workers.
        assert_eq!(s.prompt_tokens, 1240);
        assert_eq!(slot(&view(SlotState::Ready, None)).kv, None);
    }
}
