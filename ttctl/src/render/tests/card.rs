use tt_serving_proto::v1::{ResetPhase, ResetProgress};

use super::*;

#[test]
fn reset_progress_lines_name_card_and_attempt() {
    let progress = ResetProgress {
        bdf: "0000:01:00.0".into(),
        phase: ResetPhase::RunningTtSmi as i32,
        attempt: 1,
        message: "running tt-smi -r 0000:01:00.0".into(),
        ..Default::default()
    };
    assert_eq!(
        reset_progress_line(&progress),
        "[0000:01:00.0] attempt 1: running tt-smi -r 0000:01:00.0"
    );
    let bare = ResetProgress {
        message: String::new(),
        phase: ResetPhase::CheckingHeartbeat as i32,
        attempt: 2,
        ..progress
    };
    assert_eq!(
        reset_progress_line(&bare),
        "[0000:01:00.0] attempt 2: checking the heartbeat advances"
    );
}
