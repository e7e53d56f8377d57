use super::*;

#[test]
fn restart_steps_tell_the_new_worker_from_the_old() {
    let slot = |state: SlotState, starts: u64, since: u64, reason: &str| Slot {
        name: "qwen/1".into(),
        state: state as i32,
        starts,
        since_unix_ms: since,
        worker_pid: 7,
        reason: reason.into(),
        ..Default::default()
    };
    // The request found the slot verifying its first start.
    let before = slot(SlotState::Verifying, 1, 10, "readiness ping");
    assert_eq!(restart_step(&before, &before), RestartStep::Unchanged);
    // That start reaching Ready is the old worker: the restart follows.
    assert_eq!(
        restart_step(&before, &slot(SlotState::Ready, 1, 20, "serving")),
        RestartStep::Unchanged
    );
    assert_eq!(
        restart_step(
            &before,
            &slot(SlotState::Draining, 1, 30, "restart\nrequested")
        ),
        RestartStep::Progress("slot qwen/1: draining: restart / requested".into())
    );
    assert_eq!(
        restart_step(&before, &slot(SlotState::Starting, 2, 40, "")),
        RestartStep::Progress("slot qwen/1: starting".into())
    );
    // Merged snapshots: the next one seen is already the new worker.
    assert_eq!(
        restart_step(&before, &slot(SlotState::Ready, 2, 50, "serving")),
        RestartStep::Done("slot qwen/1 is ready again with a new worker (pid 7): serving".into())
    );
    // The request found it failed (given up): a new failure is news.
    let failed = slot(SlotState::Failed, 3, 10, "gave up");
    assert_eq!(restart_step(&failed, &failed), RestartStep::Unchanged);
    assert!(matches!(
        restart_step(&failed, &slot(SlotState::Failed, 4, 60, "exited with status 3")),
        RestartStep::Failed(m) if m.contains("exited with status 3")
    ));
    assert!(matches!(
        restart_step(&before, &slot(SlotState::Quarantined, 1, 60, "card 0000:01:00.0 is quarantined")),
        RestartStep::Failed(m) if m.starts_with("slot qwen/1 cannot restart: it is quarantined")
    ));
    assert_eq!(
        slot_restart_requested_line(
            &Slot {
                worker_pid: 0,
                ..failed
            },
            RestartFollow::Following
        ),
        "restart of slot qwen/1 requested (it was failed); following it until a new worker is ready (Ctrl-C stops following, not the restart)"
    );
}
