//! End-to-end with the real SmolLM2-135M-Instruct (Q4_1) checkpoint.
//! Needs `TT_SMOLLM2_GGUF` (see scripts/fetch-smollm2.sh).

mod common;

use common::*;
use tt_serving_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capital_of_france_is_paris() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&model, 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let out = greedy(&mut c, "The capital of France is", 8).await;
    assert!(
        out.text.trim_start().starts_with("Paris"),
        "got {:?}",
        out.text
    );
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Length as i32);
    assert_eq!(out.final_.usage.unwrap().completion_tokens, 8);
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.architecture, "llama");
    assert_eq!(info.context_length, 8192);
    assert!(
        info.parameter_count > 130_000_000 && info.parameter_count < 140_000_000,
        "{}",
        info.parameter_count
    );
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The three primary colors are",
    "1, 2, 3, 4,",
    "Water boils at a temperature of",
    "The quick brown fox",
    "In 1969, the first man on the moon was",
];

async fn all_greedy(w: &Worker, n: u32) -> Vec<Vec<u32>> {
    let mut c = w.client().await;
    let mut out = Vec::new();
    for p in PROMPTS {
        out.push(greedy(&mut c, p, n).await.ids);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tp2_equals_tp1_and_warm_equals_cold() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let tp1 = Worker::start(&Opts::new(&model, 1, &cache.path().join("tp1"), "cold")).await;
    let a = all_greedy(&tp1, 16).await;
    drop(tp1);
    let tp2 = Worker::start(&Opts::new(&model, 2, &cache.path().join("tp2"), "cold")).await;
    let b = all_greedy(&tp2, 16).await;
    drop(tp2);
    assert_eq!(a, b, "TP=2 greedy output differs from TP=1");
    let warm = Worker::start(&Opts::new(&model, 2, &cache.path().join("tp2"), "warm")).await;
    let info = warm
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.cache_mode, "warm");
    assert!(!info.cache_files_read.is_empty() && info.cache_files_written.is_empty());
    assert_eq!(
        all_greedy(&warm, 16).await,
        b,
        "warm start output differs from cold"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_eight_equals_each_alone() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&model, 1, cache.path(), "cold")).await;
    let alone = all_greedy(&w, 16).await;
    let mut tasks = Vec::new();
    for p in PROMPTS {
        let mut c = w.client().await;
        tasks.push(tokio::spawn(async move { greedy(&mut c, p, 16).await.ids }));
    }
    let mut batched = Vec::new();
    for t in tasks {
        batched.push(t.await.unwrap());
    }
    assert_eq!(batched, alone);
    let distinct: std::collections::HashSet<_> = batched.iter().collect();
    assert_eq!(distinct.len(), PROMPTS.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answer_streams_valid_utf8_and_stops_at_end_of_turn() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&model, 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let mut req = prompt_request("", 64);
    req.request.as_mut().unwrap().input =
        Some(pb::generate_request::Input::Chat(pb::ChatMessages {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: "What is the capital of France?".into(),
            }],
        }));
    let out = run(&mut c, req).await.unwrap();
    // A 135M model's answer wanders; what must hold is the plumbing: real
    // text, whole characters, no control tokens shown.
    assert!(out.text.split_whitespace().count() >= 3, "{:?}", out.text);
    assert!(!out.text.contains('\u{fffd}'), "{:?}", out.text);
    assert!(!out.text.contains("<|im_"), "{:?}", out.text);
    assert_eq!(
        out.ids.len() as u32,
        out.final_.usage.unwrap().completion_tokens
    );
}

/// Token ids from llama.cpp (llama-cpp-python 0.3.36, `tokenize(add_bos=False,
/// special=False)`) on this checkpoint: digits, spaces, newlines, tabs,
/// accents, CJK and emoji.
#[test]
fn tokenizer_matches_llama_cpp() {
    let ckpt = tt_worker::gguf::Checkpoint::open(&real_model()).unwrap();
    let tok = tt_worker::tokenizer::Tokenizer::from_spec(&ckpt.tokenizer).unwrap();
    let cases: &[(&str, &[u32])] = &[
        (
            "The year 2024 had 366 days.",
            &[
                504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 30,
            ],
        ),
        (
            "  leading spaces\n\nand\ttabs  ",
            &[216, 2899, 5600, 198, 198, 397, 197, 100, 7366, 256],
        ),
        (
            "Café naïve résumé façade",
            &[51, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 40852],
        ),
        (
            "東京タワーは333メートル",
            &[
                30679, 126, 16736, 122, 10391, 140, 11100, 124, 35130, 7365, 124, 35, 35, 35,
                11100, 111, 35130, 11100, 226, 11100, 121,
            ],
        ),
        (
            "emoji 🦀🚀 ok 👍🏽",
            &[
                391, 33777, 15107, 116, 218, 10813, 244, 218, 10907, 15107, 235, 231, 10813, 233,
                138,
            ],
        ),
        (
            "x=3.14159; y=-42e10",
            &[
                104, 45, 35, 30, 33, 36, 33, 37, 41, 43, 329, 15196, 36, 34, 85, 33, 32,
            ],
        ),
        ("Hello\n world\r\n!", &[19556, 198, 905, 201, 198, 17]),
    ];
    for (text, want) in cases {
        let got = tok.encode(text).unwrap();
        assert_eq!(&got, want, "{text:?}");
        assert_eq!(tok.decode(&got), *text);
    }
}

/// The answer to this chat ends by itself, well before 48 tokens.
const SHORT_ANSWER: &str = "What is the capital of France? Answer with one word.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_and_min_tokens_run_past_the_end_of_the_answer() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&model, 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let plain = run(&mut c, chat_request(SHORT_ANSWER, 48, |_| {}))
        .await
        .unwrap();
    assert_eq!(
        plain.final_.finish_reason,
        pb::FinishReason::Stop as i32,
        "{plain:?}"
    );
    let n = plain.ids.len();
    assert!(n < 24, "{plain:?}");
    eprintln!("plain answer: {:?} ({n} tokens)", plain.text);
    let end = plain.ids[n - 1];

    // ignore_eos: exactly max_tokens, never the end-of-generation token.
    let fixed = run(
        &mut c,
        chat_request(SHORT_ANSWER, 48, |g| g.ignore_eos = true),
    )
    .await
    .unwrap();
    assert_eq!(fixed.ids.len(), 48, "{fixed:?}");
    assert_eq!(fixed.final_.finish_reason, pb::FinishReason::Length as i32);
    assert_eq!(fixed.final_.usage.unwrap().completion_tokens, 48);
    assert_eq!(fixed.ids[..n - 1], plain.ids[..n - 1]);
    assert!(!fixed.ids.contains(&end), "{:?}", fixed.ids);
    assert!(fixed.text.starts_with(&plain.text), "{:?}", fixed.text);

    // min_tokens: the early end is suppressed until that many tokens.
    let min = n as u32 + 4;
    let held = run(
        &mut c,
        chat_request(SHORT_ANSWER, 48, |g| g.min_tokens = min),
    )
    .await
    .unwrap();
    assert!(held.ids.len() >= min as usize, "{held:?}");
    eprintln!(
        "min_tokens {min}: {:?}; ignore_eos: {:?}",
        held.text, fixed.text
    );
    assert_eq!(held.ids[..n - 1], plain.ids[..n - 1]);
    assert!(!held.ids[..min as usize].contains(&end), "{:?}", held.ids);
    // Deterministic, as greedy is.
    let again = run(
        &mut c,
        chat_request(SHORT_ANSWER, 48, |g| g.min_tokens = min),
    )
    .await
    .unwrap();
    assert_eq!(again.ids, held.ids);

    // The answer's logprob: a confident model, a real distribution.
    let lp = run(
        &mut c,
        request_with("The capital of France is", 1, |g| g.logprobs = Some(3)),
    )
    .await
    .unwrap();
    assert_eq!(lp.text, " Paris");
    let first = &lp.logprobs[0];
    assert_eq!(first.token, " Paris");
    assert!(first.logprob > (0.5f32).ln(), "{first:?}");
    assert_eq!(first.top_logprobs[0].token, " Paris");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_change_greedy_output_on_a_repetitive_prompt_and_are_deterministic() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&model, 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let prompt = "red blue red blue red blue red blue red blue";
    let base = greedy(&mut c, prompt, 24).await;
    let distinct = |ids: &[u32]| ids.iter().collect::<std::collections::HashSet<_>>().len();
    type Set = fn(&mut pb::GenerateRequest);
    let cases: [(&str, Set); 3] = [
        ("presence_penalty", |g| g.presence_penalty = 1.5),
        ("frequency_penalty", |g| g.frequency_penalty = 1.0),
        ("repetition_penalty", |g| g.repetition_penalty = 1.5),
    ];
    for (name, set) in cases {
        let a = run(&mut c, request_with(prompt, 24, set)).await.unwrap();
        let b = run(&mut c, request_with(prompt, 24, set)).await.unwrap();
        assert_eq!(a.ids, b.ids, "{name} is not deterministic");
        eprintln!("{name}: {:?} (none: {:?})", a.text, base.text);
        assert_ne!(a.ids, base.ids, "{name} changed nothing: {:?}", a.text);
        assert!(
            distinct(&a.ids) > distinct(&base.ids),
            "{name}: {:?} repeats as much as {:?}",
            a.text,
            base.text
        );
    }
}
