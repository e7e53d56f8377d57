//! Behaviour of the worker on the tiny generated model: the protocol,
//! sharding, batching, sampling, the cache, banners and the test faults.

mod common;

use common::*;
use std::time::Duration;
use tt_serving_proto::v1 as pb;

const PROMPTS: [&str; 8] = [
    "the cat is on the mat",
    "Hello world",
    "in the beginning",
    "a cat sat",
    "1234 + 5678 =",
    "Zürich und Köln",
    "東京タワー",
    "emoji 🦀 time",
];

async fn outputs(
    c: &mut tt_serving_proto::v1::engine_client::EngineClient<tonic::transport::Channel>,
    n: u32,
) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for p in PROMPTS {
        out.push(greedy(c, p, n).await.ids);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_health_generate_and_shutdown() {
    let cache = tempfile::tempdir().unwrap();
    let mut w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;

    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.model_name, "tt-tiny-llama");
    assert_eq!(info.architecture, "llama");
    assert_eq!(info.tp, 1);
    assert_eq!(
        info.ranks,
        vec![pb::RankBinding {
            rank: 0,
            bdf: "0000:01:00.0".into()
        }]
    );
    assert_eq!(info.context_length, 256);
    assert_eq!(info.cache_mode, "cold");
    assert!(info.cache_files_read.is_empty());
    assert!(
        info.cache_files_written
            .iter()
            .any(|f| f == "blk.0.attn_qkv.weight_tp1_rank0_dtype_Q4_1_layout_ROWSHARD_X8.tensorbin"),
        "{:?}",
        info.cache_files_written
    );
    assert!(info.parameter_count > 0);
    assert!(info.engine_version.starts_with("tt-worker "));
    assert_eq!(info.state, pb::WorkerState::Ready as i32);
    assert!(info.banners_engaged.is_empty());

    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (
            h.state,
            h.active_sequences,
            h.queued_sequences,
            h.last_progress_unix_ms
        ),
        (pb::WorkerState::Ready as i32, 0, 0, 0)
    );

    let out = greedy(&mut c, "the cat", 12).await;
    assert_eq!(out.ids.len(), 12);
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Length as i32);
    let usage = out.final_.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 12));
    let t = out.final_.timings.unwrap();
    assert!(
        t.time_to_first_token_us >= t.prefill_us && t.prefill_us > 0 && t.decode_us > 0,
        "{t:?}"
    );
    // Greedy is deterministic.
    assert_eq!(greedy(&mut c, "the cat", 12).await.ids, out.ids);
    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert!(h.last_progress_unix_ms > 0);

    let r = c
        .shutdown(pb::ShutdownRequest {
            drain_timeout_ms: 1000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.finished, r.cancelled), (0, 0));
    let st = w.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "stderr:\n{}", w.stderr());
    assert!(!w.socket.exists(), "socket left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tp2_greedy_equals_tp1() {
    let (c1, c2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let w1 = Worker::start(&Opts::new(&tiny_model(), 1, c1.path(), "cold")).await;
    let w2 = Worker::start(&Opts::new(&tiny_model(), 2, c2.path(), "cold")).await;
    let a = outputs(&mut w1.client().await, 16).await;
    let b = outputs(&mut w2.client().await, 16).await;
    assert_eq!(a, b);
    // The prompt's logprobs (every row of the vocabulary-split LM head)
    // agree too.
    let scored = |c| async move {
        let mut c = c;
        run(
            &mut c,
            request_with("the cat sat on the mat", 1, |g| {
                g.prompt_logprobs = Some(2);
                g.prompt_only = true;
            }),
        )
        .await
        .unwrap()
        .prompt_logprobs
        .unwrap()
    };
    let (p1, p2) = (
        scored(w1.client().await).await,
        scored(w2.client().await).await,
    );
    assert_eq!(p1.len(), p2.len());
    for (x, y) in p1.iter().zip(&p2) {
        assert_eq!(x.token_id, y.token_id);
        assert!((x.logprob - y.logprob).abs() < 1e-4, "{x:?} {y:?}");
        let ids = |t: &pb::TokenLogprob| {
            t.top_logprobs
                .iter()
                .map(|a| a.token_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(x), ids(y));
    }
    let info = w2
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.tp, 2);
    assert_eq!(
        info.ranks
            .iter()
            .map(|r| r.bdf.as_str())
            .collect::<Vec<_>>(),
        vec!["0000:01:00.0", "0000:02:00.0"]
    );
    // Attention split by whole KV-head groups: 3 heads go 1 + 2.
    let files = info.cache_files_written;
    assert!(
        files.contains(
            &"blk.0.attn_output.weight_tp2_rank1_dtype_Q4_1_layout_COLSHARD_X8.tensorbin"
                .to_string()
        ),
        "{files:?}"
    );
    assert!(
        files.contains(
            &"blk.1.ffn_gate.weight_tp2_rank0_dtype_Q8_0_layout_ROWSHARD_X8.tensorbin".to_string()
        ),
        "{files:?}"
    );
    assert!(
        files.contains(
            &"blk.0.ffn_gate_up.weight_tp2_rank1_dtype_F16_layout_ROWSHARD.tensorbin".to_string()
        ),
        "{files:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_start_maps_the_cache_and_matches_cold() {
    let cache = tempfile::tempdir().unwrap();
    let model_copy = cache.path().join("model.gguf");
    std::fs::copy(tiny_model(), &model_copy).unwrap();
    let cold = Worker::start(&Opts::new(&model_copy, 2, &cache.path().join("v"), "cold")).await;
    let cold_out = outputs(&mut cold.client().await, 10).await;
    let written = cold
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .cache_files_written;
    drop(cold);

    // Zero the checkpoint's tensor data (keep the header): a warm start that
    // read the checkpoint's weights would now produce different tokens.
    let ckpt = tt_worker::gguf::Checkpoint::open(&model_copy).unwrap();
    let first = ckpt.tensors.values().map(|t| t.offset).min().unwrap() as usize;
    let mut bytes = std::fs::read(&model_copy).unwrap();
    bytes[first..].fill(0);
    std::fs::write(&model_copy, bytes).unwrap();

    let warm = Worker::start(&Opts::new(&model_copy, 2, &cache.path().join("v"), "warm")).await;
    let mut c = warm.client().await;
    assert_eq!(outputs(&mut c, 10).await, cold_out);
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.cache_mode, "warm");
    assert!(info.cache_files_written.is_empty());
    let mut read = info.cache_files_read.clone();
    let mut w = written.clone();
    read.sort();
    w.sort();
    assert_eq!(read, w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_start_with_a_missing_or_short_file_refuses_naming_it() {
    let cache = tempfile::tempdir().unwrap();
    drop(Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await);
    let victim = "blk.1.ffn_down.weight_tp1_rank0_dtype_Q4_1_layout_COLSHARD_X8.tensorbin";
    let path = cache.path().join(victim);
    let bytes = std::fs::read(&path).unwrap();

    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let mut w = Worker::spawn(&Opts::new(&tiny_model(), 1, cache.path(), "warm"));
    let st = w.wait_exit(Duration::from_secs(60));
    assert_eq!(st.code(), Some(1));
    assert!(
        w.stderr().contains(victim) && w.stderr().contains("bytes"),
        "{}",
        w.stderr()
    );

    std::fs::remove_file(&path).unwrap();
    let mut w = Worker::spawn(&Opts::new(&tiny_model(), 1, cache.path(), "warm"));
    assert_eq!(w.wait_exit(Duration::from_secs(60)).code(), Some(1));
    assert!(
        w.stderr().contains(victim) && w.stderr().contains("missing"),
        "{}",
        w.stderr()
    );
    // Nothing was synthesized in its place.
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_start_reads_the_cached_header_and_refuses_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::copy(tiny_model(), &model).unwrap();
    let cache = dir.path().join("v");
    let cold = Worker::start(&Opts::new(&model, 1, &cache, "cold")).await;
    let written = cold
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .cache_files_written;
    drop(cold);
    let header = tt_worker::cache::META_FILE;
    assert!(written.iter().any(|f| f == header), "{written:?}");
    let saved = std::fs::read(cache.join(header)).unwrap();

    // A checkpoint that is not the one the cache was built from.
    let mut bytes = std::fs::read(&model).unwrap();
    bytes.push(0);
    std::fs::write(&model, &bytes).unwrap();
    let mut w = Worker::spawn(&Opts::new(&model, 1, &cache, "warm"));
    assert_eq!(w.wait_exit(Duration::from_secs(60)).code(), Some(1));
    assert!(
        w.stderr().contains(header) && w.stderr().contains("bytes"),
        "{}",
        w.stderr()
    );
    bytes.pop();
    std::fs::write(&model, &bytes).unwrap();

    // No header: an error naming it, and nothing written in its place.
    std::fs::remove_file(cache.join(header)).unwrap();
    let mut w = Worker::spawn(&Opts::new(&model, 1, &cache, "warm"));
    assert_eq!(w.wait_exit(Duration::from_secs(60)).code(), Some(1));
    assert!(
        w.stderr().contains(header) && w.stderr().contains("missing"),
        "{}",
        w.stderr()
    );
    assert!(!cache.join(header).exists());

    // A damaged header is an error too, not a guess.
    std::fs::write(cache.join(header), &saved[..saved.len() / 2]).unwrap();
    let mut w = Worker::spawn(&Opts::new(&model, 1, &cache, "warm"));
    assert_eq!(w.wait_exit(Duration::from_secs(60)).code(), Some(1));
    assert!(w.stderr().contains(header), "{}", w.stderr());

    // Restored, the warm start serves without opening the checkpoint: an
    // unreadable header in the GGUF does not matter.
    std::fs::write(cache.join(header), &saved).unwrap();
    let mut garbled = bytes.clone();
    garbled[..8].fill(0);
    std::fs::write(&model, &garbled).unwrap();
    let w = Worker::start(&Opts::new(&model, 1, &cache, "warm")).await;
    let info = w
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.model_name, "tt-tiny-llama");
    assert_eq!(
        info.cache_files_read.first().map(String::as_str),
        Some(header)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_eight_equals_each_alone_and_outputs_differ() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let alone = outputs(&mut c, 24).await;
    let mut tasks = Vec::new();
    for p in PROMPTS {
        let mut c = w.client().await;
        tasks.push(tokio::spawn(async move { greedy(&mut c, p, 24).await.ids }));
    }
    let mut batched = Vec::new();
    for t in tasks {
        batched.push(t.await.unwrap());
    }
    assert_eq!(batched, alone);
    let distinct: std::collections::HashSet<_> = batched.iter().collect();
    assert_eq!(distinct.len(), 8, "{batched:?}");
    // The outputs depend on context, not only on the last token.
    for o in &batched {
        let kinds: std::collections::HashSet<_> = o.iter().collect();
        assert!(kinds.len() >= 3, "{o:?}");
    }
}

fn request(
    prompt: &str,
    max_tokens: u32,
    sampling: Option<pb::SamplingParams>,
    stop: &[&str],
) -> pb::EngineGenerateRequest {
    let mut r = prompt_request(prompt, max_tokens);
    let g = r.request.as_mut().unwrap();
    g.sampling = sampling;
    g.stop = stop.iter().map(|s| s.to_string()).collect();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_is_reproducible_by_seed_and_limits_are_enforced() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let sp = |seed| {
        Some(pb::SamplingParams {
            temperature: 1.5,
            top_p: 0.95,
            top_k: 40,
            seed: Some(seed),
        })
    };
    let a = run(&mut c, request("the cat", 32, sp(11), &[]))
        .await
        .unwrap();
    let b = run(&mut c, request("the cat", 32, sp(11), &[]))
        .await
        .unwrap();
    let d = run(&mut c, request("the cat", 32, sp(12), &[]))
        .await
        .unwrap();
    assert_eq!(a.ids, b.ids);
    assert_ne!(a.ids, d.ids);
    assert_ne!(a.ids, greedy(&mut c, "the cat", 32).await.ids);

    // Context overflow names the limit.
    let e = run(&mut c, request("the cat", 300, None, &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("256"), "{}", e.message());
    let long = "a ".repeat(300);
    let e = run(&mut c, request(&long, 0, None, &[])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("context length is 256"),
        "{}",
        e.message()
    );
    let e = run(
        &mut c,
        request(
            "x",
            4,
            Some(pb::SamplingParams {
                temperature: -1.0,
                ..Default::default()
            }),
            &[],
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // max_tokens 0 takes the default but never passes the context.
    let o = run(&mut c, request(&"a ".repeat(120), 0, None, &[]))
        .await
        .unwrap();
    let u = o.final_.usage.unwrap();
    let total = u.prompt_tokens + u.completion_tokens;
    // The random model may emit an end-of-turn token first (STOP).
    if o.final_.finish_reason == pb::FinishReason::Length as i32 {
        assert_eq!(total, 256);
    } else {
        assert_eq!(o.final_.finish_reason, pb::FinishReason::Stop as i32);
        assert!(total < 256);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_end_the_stream_without_the_stop_text() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let full = greedy(&mut c, "the cat", 40).await;
    // Pick a stop string from the middle of the greedy output.
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() >= 6, "{:?}", full.text);
    let stop: String = chars[3..5].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    let o = run(&mut c, request("the cat", 40, None, &[&stop]))
        .await
        .unwrap();
    assert_eq!(o.text, full.text[..cut]);
    assert_eq!(o.final_.finish_reason, pb::FinishReason::Stop as i32);
    assert!(o.ids.len() < 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_requests_use_the_template() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let mut req = prompt_request("", 4);
    req.request.as_mut().unwrap().input =
        Some(pb::generate_request::Input::Chat(pb::ChatMessages {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }],
        }));
    let o = run(&mut c, req).await.unwrap();
    // <|im_start|> user \n h i <|im_end|> \n <|im_start|> assistant \n
    // ("user" and "assistant" are several byte tokens each).
    let templated = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    let raw = greedy(&mut c, templated, 4).await;
    assert_eq!(o.ids, raw.ids);
    assert_eq!(
        o.final_.usage.unwrap().prompt_tokens,
        raw.final_.usage.unwrap().prompt_tokens
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_bounded_and_cancelled_streams_leave_the_batch() {
    let cache = tempfile::tempdir().unwrap();
    let o = Opts::new(&tiny_model(), 1, cache.path(), "cold")
        .arg("--max-batch")
        .arg("1")
        .arg("--max-queue")
        .arg("1");
    let w = Worker::start(&o).await;
    let mut c = w.client().await;
    // Two long streams fill the batch (1) and the queue (1).
    let mut s1 = c
        .generate(prompt_request("the cat", 250))
        .await
        .unwrap()
        .into_inner();
    let s1_first = s1.message().await.unwrap();
    assert!(s1_first.is_some());
    let s2 = c
        .generate(prompt_request("a cat", 200))
        .await
        .unwrap()
        .into_inner();
    let e = run(&mut c, prompt_request("in the", 4)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!((h.active_sequences, h.queued_sequences), (1, 1));
    // Cancelling both frees the worker at once.
    drop(s1);
    drop(s2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
        if h.active_sequences == 0 && h.queued_sequences == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{h:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(greedy(&mut c, "in the", 4).await.ids.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_short_work_and_cancels_at_the_deadline() {
    let cache = tempfile::tempdir().unwrap();
    // The hold fault keeps the request in the batch, taking no step, until
    // the shutdown's deadline cancels it: no race with the model's speed.
    let hold = cache.path().join("hold");
    let opts = Opts::new(&tiny_model(), 1, cache.path(), "cold")
        .env("TTW_TEST_FAULTS", "1")
        .env("TTW_FAULT_HOLD_FILE", &hold.display().to_string());
    let mut w = Worker::start(&opts).await;
    std::fs::write(&hold, b"").unwrap();
    let mut c = w.client().await;
    let mut c2 = w.client().await;
    let long = tokio::spawn(async move { run(&mut c2, prompt_request("the cat", 250)).await });
    wait_active(&mut c, 1).await;
    let r = shutdown(&mut c, 0).await;
    assert_eq!((r.finished, r.cancelled), (0, 1));
    let out = long.await.unwrap().unwrap();
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Cancelled as i32);
    assert_eq!(w.wait_exit(Duration::from_secs(10)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_exit_2_with_a_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let mut o = Opts::new(&tiny_model(), 2, cache.path(), "cold");
    let socket = cache.path().join("s.sock");
    let out = command(&o, &socket)
        .env("TT_VISIBLE_DEVICES", "0000:01:00.0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TT_VISIBLE_DEVICES") && err.contains("--tp is 2"),
        "{err}"
    );

    o.tp = 1;
    let out = command(&o, &socket)
        .env("TT_CACHE_MODE", "lukewarm")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lukewarm"));

    o.model = cache.path().join("nope.gguf");
    let out = command(&o, &socket).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.gguf"));

    let out = command(&o, &socket)
        .env_remove("TT_WORKER_SOCKET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_state_is_visible_and_generate_is_unavailable_until_ready() {
    let cache = tempfile::tempdir().unwrap();
    // Held at the first load step until the test has looked.
    let hold = cache.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let o = Opts::new(&tiny_model(), 1, cache.path(), "cold")
        .env("TTW_TEST_FAULTS", "1")
        .env("TTW_FAULT_HOLD_FILE", &hold.display().to_string());
    let mut w = Worker::spawn(&o);
    w.wait_socket(Duration::from_secs(10)).await;
    let mut c = w.client().await;
    // The header and plan come first; the hold stops the first tensor.
    let since = std::time::Instant::now();
    let info = loop {
        let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
        if info.progress.as_ref().is_some_and(|p| p.total > 0) {
            break info;
        }
        assert!(since.elapsed() < Duration::from_secs(10), "{info:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(info.state, pb::WorkerState::Loading as i32);
    let p = info.progress.unwrap();
    assert!(
        p.total > 0 && p.done < p.total && p.message.contains("cold start"),
        "{p:?}"
    );
    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!(h.state, pb::WorkerState::Loading as i32);
    let e = run(&mut c, prompt_request("the", 2)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(e.message().contains("loading"), "{e:?}");
    std::fs::remove_file(&hold).unwrap();
    w.wait_ready(Duration::from_secs(30)).await;
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.state, pb::WorkerState::Ready as i32);
    assert_eq!(greedy(&mut c, "the", 2).await.ids.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dtype_flags_change_the_files_and_banner_only_after_they_run() {
    let cache = tempfile::tempdir().unwrap();
    let o = Opts::new(&tiny_model(), 1, cache.path(), "cold")
        .env("TTW_MLP_DOWN_Q8", "1")
        .env("TTW_KV_F16", "1");
    let w = Worker::start(&o).await;
    let mut c = w.client().await;
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert!(
        info.banners_engaged.is_empty(),
        "banner before the feature ran: {:?}",
        info.banners_engaged
    );
    assert!(!w.stdout().contains("engaged"));
    assert!(info.cache_files_written.contains(
        &"blk.0.ffn_down.weight_tp1_rank0_dtype_Q8_0_layout_COLSHARD_X8.tensorbin".to_string()
    ));
    let out = greedy(&mut c, "the cat", 8).await;
    assert_eq!(out.ids.len(), 8);
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(
        info.banners_engaged,
        vec![
            "TTW_MLP_DOWN_Q8".to_string(),
            "TTW_KV_F16".to_string(),
            "TTW_PREFIX_CACHE".to_string()
        ]
    );
    let stdout = w.stdout();
    assert_eq!(
        stdout.matches("TTW_MLP_DOWN_Q8 engaged").count(),
        1,
        "{stdout}"
    );
    assert_eq!(stdout.matches("TTW_KV_F16 engaged").count(), 1, "{stdout}");
    // Both variants' files live side by side without colliding.
    drop(w);
    let plain = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    drop(plain);
    assert!(cache
        .path()
        .join("blk.0.ffn_down.weight_tp1_rank0_dtype_Q4_1_layout_COLSHARD_X8.tensorbin")
        .exists());
    assert!(cache
        .path()
        .join("blk.0.ffn_down.weight_tp1_rank0_dtype_Q8_0_layout_COLSHARD_X8.tensorbin")
        .exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kernels_isa_answers_alike_and_a_bad_one_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let want = outputs(&mut w.client().await, 6).await;
    drop(w);
    for isa in ["avx2", "scalar"] {
        let o = Opts::new(&tiny_model(), 1, cache.path(), "warm").env("TTW_KERNELS_ISA", isa);
        let w = Worker::start(&o).await;
        let mut c = w.client().await;
        let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
        assert!(
            info.banners_engaged.is_empty(),
            "{isa}: banner before a step"
        );
        assert_eq!(outputs(&mut c, 6).await, want, "{isa}: same tokens");
        let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
        assert!(
            info.banners_engaged
                .contains(&"TTW_KERNELS_ISA".to_string()),
            "{isa}: {:?}",
            info.banners_engaged
        );
    }
    let o = Opts::new(&tiny_model(), 1, cache.path(), "warm");
    let out = command(&o, &cache.path().join("s.sock"))
        .env("TTW_KERNELS_ISA", "sse9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sse9") && err.contains("avx2"), "{err}");
}
