//! `ttctl card reset`: one line per step of a reset.

use tt_serving_proto::v1::{ResetPhase, ResetProgress};

use super::one_line;

/// What a reset phase is doing, for progress lines without a message.
fn reset_phase_words(phase: i32) -> &'static str {
    match ResetPhase::try_from(phase) {
        Ok(ResetPhase::RunningTtSmi) => "running tt-smi -r",
        Ok(ResetPhase::WaitingForDevice) => "waiting for the device to reappear",
        Ok(ResetPhase::ReadingSysfs) => "reading sysfs",
        Ok(ResetPhase::CheckingHeartbeat) => "checking the heartbeat advances",
        Ok(ResetPhase::RunningProbe) => "running the site probe",
        Ok(ResetPhase::Retrying) => "attempt failed, retrying",
        Ok(ResetPhase::Done) => "card is back",
        Ok(ResetPhase::Failed) => "reset failed",
        Ok(ResetPhase::Unspecified) | Err(_) => "working",
    }
}

/// One line for one `ResetProgress` message:
/// `[0000:01:00.0] attempt 1: running tt-smi -r ...`.
pub fn reset_progress_line(progress: &ResetProgress) -> String {
    let what = if progress.message.is_empty() {
        reset_phase_words(progress.phase).to_string()
    } else {
        one_line(&progress.message)
    };
    if progress.attempt == 0 {
        format!("[{}] {what}", progress.bdf)
    } else {
        format!("[{}] attempt {}: {what}", progress.bdf, progress.attempt)
    }
}
