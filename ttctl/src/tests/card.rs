use super::*;

#[tokio::test]
async fn proven_reset_streams_each_step_and_succeeds() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["card", "reset", "1"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "[0000:01:00.0] attempt 1: running tt-smi -r 0000:01:00.0\n\
         [0000:01:00.0] attempt 1: waiting for the device to reappear\n\
         [0000:01:00.0] attempt 1: back as /dev/tenstorrent/3\n"
    );
}

#[tokio::test]
async fn unproven_reset_exits_1_with_the_reason() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["card", "reset", "2"]).await;
    assert_eq!(
        out,
        "[0000:01:00.0] attempt 1: running tt-smi -r 0000:01:00.0\n\
         [0000:01:00.0] attempt 1: heartbeat did not advance\n"
    );
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert_eq!(
        failure.message(),
        "heartbeat did not advance after 2 attempts"
    );
}

#[tokio::test]
async fn daemon_refusals_are_printed_as_the_daemon_wrote_them() {
    let h = serve(fake());
    let (_, failure) = ttctl(&h.socket, &["card", "reset", "9"]).await;
    let failure = failure.unwrap();
    assert_eq!((failure.exit_code(), failure.message()), (1, "no card 9"));

    let (_, failure) = ttctl(&h.socket, &["card", "reset", "5"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert_eq!(
        failure.message(),
        "card 0000:05:00.0 is locked by pid 4242 (bench-sweep)"
    );
}

#[tokio::test]
async fn reset_stream_ending_without_a_result_is_a_failure() {
    let h = serve(fake());
    let (_, failure) = ttctl(&h.socket, &["card", "reset", "7"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(
        failure.message().contains("without a result"),
        "{failure:?}"
    );
}
