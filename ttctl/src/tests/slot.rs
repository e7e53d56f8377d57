use tt_serving_proto::v1::SlotState;

use super::*;

#[tokio::test]
async fn slot_restart_follows_the_slot_until_a_new_worker_is_ready() {
    use SlotState::*;
    let h = serve(restarting(vec![
        // Before the supervisor acted: not news, not printed.
        restart_slot(Ready, 1, 1_000, 4242, "serving"),
        restart_slot(Draining, 1, 2_000, 4242, "restart requested"),
        restart_slot(Starting, 2, 3_000, 0, "starting the worker (warm start)"),
        restart_slot(Loading, 2, 4_000, 4250, "warm start: worker loading"),
        restart_slot(Ready, 2, 5_000, 4250, "serving (warm start took 0.2s)"),
    ]));
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "restart of slot qwen requested (it was ready, worker pid 4242); following it until a new worker is ready (Ctrl-C stops following, not the restart)\n\
         slot qwen: draining: restart requested\n\
         slot qwen: starting: starting the worker (warm start)\n\
         slot qwen: loading: warm start: worker loading\n\
         slot qwen is ready again with a new worker (pid 4250): serving (warm start took 0.2s)\n"
    );
}

#[tokio::test]
async fn slot_restart_that_fails_exits_1_with_the_daemons_reason() {
    use SlotState::*;
    let h = serve(restarting(vec![
        restart_slot(Draining, 1, 2_000, 4242, "restart requested"),
        restart_slot(
            Failed,
            2,
            3_000,
            0,
            "worker exited with status 3 while loading; retrying in 50 ms (attempt 2 of 5)",
        ),
    ]));
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen"]).await;
    assert!(
        out.ends_with("slot qwen: draining: restart requested\n"),
        "{out}"
    );
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (
            1,
            "restart of slot qwen failed: worker exited with status 3 while loading; retrying in 50 ms (attempt 2 of 5) (`ttctl logs qwen` shows the worker's output)"
        )
    );
}

#[tokio::test]
async fn slot_restart_without_waiting_claims_no_state_it_has_not_reached() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen", "--no-wait"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "restart of slot qwen requested (it was ready, worker pid 4242); it restarts in the background: follow it with `ttctl status --watch`\n"
    );
    // An older daemon cannot tell the new worker from the old: ttctl says
    // so instead of waiting for a sign that never comes.
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "old"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(
        out.ends_with(
            "this tt-servingd does not report restarts: follow it with `ttctl status --watch`\n"
        ),
        "{out}"
    );
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen/3"]).await;
    assert_eq!(out, "");
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no slot `qwen/3`; slots: qwen")
    );
}
