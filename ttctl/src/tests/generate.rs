use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::GenerateRequest;

use super::fake::Seen;
use super::*;

fn seen_generate(fake: &Arc<Mutex<Seen>>) -> GenerateRequest {
    fake.lock().unwrap().generate.last().cloned().unwrap()
}

#[tokio::test]
async fn generate_prints_the_text_then_the_summary_on_stderr() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (out, err, failure) =
        ttctl_with_stderr(&h.socket, &["generate", "qwen", "The capital of France is"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(out, "Paris, of course.\n");
    assert_eq!(
        err,
        "[stop] 5 prompt tokens, 3 completion tokens, slot qwen, TTFT 35.2 ms, \
         decode 20.0 tok/s\n"
    );
    let request = seen_generate(&seen);
    assert_eq!(request.model, "qwen");
    assert_eq!(
        request.input,
        Some(Input::Prompt("The capital of France is".into()))
    );
    assert_eq!(request.max_tokens, 64, "the default");
    assert_eq!(request.sampling, None, "greedy unless asked");
    assert!(request.stop.is_empty());
}

#[tokio::test]
async fn generate_sends_sampling_stop_strings_and_chat() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (_, failure) = ttctl(
        &h.socket,
        &[
            "generate",
            "qwen",
            "Hi there",
            "--max-tokens",
            "8",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--top-k",
            "40",
            "--seed",
            "7",
            "--stop",
            ".",
            "--stop",
            "\n\n",
            "--chat",
        ],
    )
    .await;
    assert!(failure.is_none(), "{failure:?}");
    let request = seen_generate(&seen);
    assert_eq!(request.max_tokens, 8);
    let sampling = request.sampling.unwrap();
    assert_eq!(
        (
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            sampling.seed
        ),
        (0.7, 0.9, 40, Some(7))
    );
    assert_eq!(request.stop, [".", "\n\n"]);
    let Some(Input::Chat(chat)) = request.input else {
        panic!("--chat sends a conversation: {:?}", request.input);
    };
    assert_eq!(chat.messages.len(), 1);
    assert_eq!(
        (
            chat.messages[0].role.as_str(),
            chat.messages[0].content.as_str()
        ),
        ("user", "Hi there")
    );

    // One sampling option alone still sends the settings, the rest zero.
    let (_, failure) = ttctl(&h.socket, &["generate", "qwen", "x", "--seed", "3"]).await;
    assert!(failure.is_none(), "{failure:?}");
    let sampling = seen_generate(&seen).sampling.unwrap();
    assert_eq!(
        (
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            sampling.seed
        ),
        (0.0, 0.0, 0, Some(3))
    );
}

#[tokio::test]
async fn generate_sends_the_priority_negative_included() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (_, failure) = ttctl(&h.socket, &["generate", "qwen", "x"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(seen_generate(&seen).priority, 0, "the default");
    for (given, sent) in [("5", 5), ("-3", -3)] {
        let (_, failure) = ttctl(&h.socket, &["generate", "qwen", "x", "--priority", given]).await;
        assert!(failure.is_none(), "{given}: {failure:?}");
        assert_eq!(seen_generate(&seen).priority, sent, "--priority {given}");
    }
    // The form with `=` too.
    let (_, failure) = ttctl(&h.socket, &["generate", "qwen", "x", "--priority=-7"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(seen_generate(&seen).priority, -7);
}

#[tokio::test]
async fn generate_prints_each_delta_as_it_arrives() {
    let daemon = fake();
    let release = daemon.release.clone();
    let h = serve(daemon);
    let out = SharedOut::default();
    let mut writer = out.clone();
    let mut err = Vec::new();
    let generating = execute(
        cli(&h.socket, &["generate", "slow", "hi"]),
        &mut writer,
        &mut err,
        false,
    );
    let watcher = async {
        // The first delta shows up while the daemon holds back the rest.
        while !String::from_utf8_lossy(&out.0.lock().unwrap()).contains("first") {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(&*out.0.lock().unwrap(), b"first");
        release.notify_one();
    };
    let (result, ()) = tokio::join!(generating, watcher);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(&*out.0.lock().unwrap(), b"first then more\n");
    assert!(String::from_utf8(err).unwrap().starts_with("[stop] "));
}

#[tokio::test]
async fn generate_text_ending_in_a_newline_gets_no_extra_one() {
    let h = serve(fake());
    let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", "lines", "x"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(out, "one\ntwo\n");
    assert!(
        err.starts_with("[length] 5 prompt tokens, 2 completion tokens"),
        "{err}"
    );
    assert!(err.ends_with("decode 10.0 tok/s\n"), "{err}");
}

#[tokio::test]
async fn generate_stream_without_a_final_chunk_exits_1() {
    let h = serve(fake());
    let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", "cut", "x"]).await;
    assert_eq!(out, "partial\n", "the text so far stays, its line ended");
    assert_eq!(err, "", "no summary without a final chunk");
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(
        failure.message().contains("without its final chunk"),
        "{failure:?}"
    );
}

#[tokio::test]
async fn generate_failing_mid_stream_exits_1_with_the_daemons_message() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["generate", "dying", "x"]).await;
    assert_eq!(out, "par\n");
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert_eq!(
        failure.message(),
        "the worker of slot dying failed mid-request (Unknown: broken pipe); the slot is \
         recovering, retry shortly"
    );
}

#[tokio::test]
async fn generate_cancelled_by_the_daemon_prints_the_summary_and_exits_1() {
    let h = serve(fake());
    let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", "drain", "x"]).await;
    assert_eq!(out, "half\n");
    assert!(err.starts_with("[cancelled] "), "{err}");
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(failure.message().contains("cancelled"), "{failure:?}");
}

#[tokio::test]
async fn generate_refusals_keep_the_daemons_message() {
    let h = serve(fake());
    for (model, message) in [
        ("nope", "unknown model `nope`; known models: qwen"),
        (
            "down",
            "model `down` has no ready slot (slot down is Loading for 3s: loading)",
        ),
        (
            "busy",
            "model `busy` has 8 requests waiting (max_queue); retry in a few seconds",
        ),
        ("bad", "sampling.top_p: 2 is outside [0, 1]"),
    ] {
        let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", model, "x"]).await;
        assert_eq!((out.as_str(), err.as_str()), ("", ""), "{model}");
        let failure = failure.unwrap();
        assert_eq!((failure.exit_code(), failure.message()), (1, message));
    }
}
