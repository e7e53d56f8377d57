//! The paged KV pool and the prefix cache: reuse gives the same tokens as
//! computing afresh (TP=1 and TP=2), the pool is reported and bounded, and a
//! pool too small for the batch preempts and recomputes instead of failing.

mod common;

use common::*;
use tt_serving_proto::v1 as pb;

const BLOCK: u32 = 16;

/// A prompt long enough to span several blocks of the tiny model.
fn long_prompt(tag: &str) -> String {
    format!(
        "{tag} {}",
        "the cat sat on the mat and the dog ran to the cat ".repeat(6)
    )
}

fn cached(out: &Output) -> u32 {
    out.final_.timings.as_ref().unwrap().cached_prompt_tokens
}

fn prompt_tokens(out: &Output) -> u32 {
    out.final_.usage.unwrap().prompt_tokens
}

async fn ignore_eos(w: &Worker, prompt: &str, n: u32) -> Output {
    let mut c = w.client().await;
    run(&mut c, request_with(prompt, n, |g| g.ignore_eos = true))
        .await
        .unwrap()
}

async fn tiny_reuse(tp: usize) {
    let cache = tempfile::tempdir().unwrap();
    let on = Worker::start(&Opts::new(
        &tiny_model(),
        tp,
        &cache.path().join("on"),
        "cold",
    ))
    .await;
    let off = Worker::start(
        &Opts::new(&tiny_model(), tp, &cache.path().join("off"), "cold")
            .env("TTW_PREFIX_CACHE", "0"),
    )
    .await;
    let first = long_prompt("first");
    let longer = format!("{first} and then the dog sat");

    let a = ignore_eos(&on, &first, 12).await;
    assert_eq!(cached(&a), 0, "nothing to reuse yet");
    let n = prompt_tokens(&a);
    assert!(n > 3 * BLOCK, "the prompt spans several blocks: {n}");

    // The same prompt again: everything but the last token (which must be
    // computed for its logits): the whole blocks shared, and the part of
    // the last block the first request left copied.
    let again = ignore_eos(&on, &first, 12).await;
    assert!(
        !(n - 1).is_multiple_of(BLOCK),
        "the prompt ends inside a block: {n}"
    );
    assert_eq!(cached(&again), n - 1);
    assert_eq!(again.ids, a.ids, "reused KV gives the same greedy tokens");

    // A longer prompt sharing the first: what the two have in common
    // (the longer one diverges inside a block: the part before is copied).
    let b = ignore_eos(&on, &longer, 12).await;
    assert!(
        cached(&b) >= (n - 1) / BLOCK * BLOCK - BLOCK,
        "{}",
        cached(&b)
    );
    let fresh = ignore_eos(&off, &longer, 12).await;
    assert_eq!(cached(&fresh), 0, "TTW_PREFIX_CACHE=0 reuses nothing");
    assert_eq!(b.ids, fresh.ids, "same tokens with and without reuse");
    assert_eq!(b.text, fresh.text);

    // The generated tokens are cached too: the prompt plus the answer (a
    // chat's next turn) reuses past the original prompt.
    let continued = format!("{first}{}", a.text);
    let c = ignore_eos(&on, &continued, 4).await;
    let fresh = ignore_eos(&off, &continued, 4).await;
    assert_eq!(c.ids, fresh.ids);
    assert!(
        cached(&c) >= (n - 1) / BLOCK * BLOCK,
        "reused {} of {} (first prompt {n})",
        cached(&c),
        prompt_tokens(&c)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_gives_the_same_tokens_at_tp1() {
    tiny_reuse(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_gives_the_same_tokens_at_tp2() {
    tiny_reuse(2).await;
}

/// Two sequences that compute the same prefix at once keep one copy of it,
/// and each one's own later blocks stay reusable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_prefixes_fold_into_one_copy() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let shared = long_prompt("shared");
    let prompts = [
        format!("{shared} and then the cat ran to the dog and sat"),
        format!("{shared} so the dog sat on the mat and ran to it"),
    ];
    let mut tasks = Vec::new();
    for p in prompts.clone() {
        let socket = w.socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = connect(&socket).await.unwrap();
            run(&mut c, request_with(&p, 4, |g| g.ignore_eos = true))
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for p in &prompts {
        let again = ignore_eos(&w, p, 4).await;
        let n = prompt_tokens(&again);
        assert_eq!(
            cached(&again),
            n - 1,
            "both conversations find all of their own positions"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_and_health_report_the_pool() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(
        &Opts::new(&tiny_model(), 1, cache.path(), "cold").env("TTW_KV_BUDGET_MIB", "2"),
    )
    .await;
    let mut c = w.client().await;
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    let kv = info.kv_cache.expect("kv_cache in Info");
    // Tiny model: 2 layers x 3 KV heads x 32 dims x f32, keys and values.
    let block_bytes = 2 * 2 * 3 * 32 * 4 * 16;
    assert_eq!(kv.block_tokens, BLOCK);
    assert_eq!(kv.blocks_total as u64, (2 << 20) / block_bytes);
    assert_eq!(kv.budget_bytes, kv.blocks_total as u64 * block_bytes);
    assert!(kv.prefix_cache);
    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!((h.kv_blocks_in_use, h.kv_blocks_cached), (0, 0));

    let out = ignore_eos(&w, &long_prompt("x"), 20).await;
    let positions = prompt_tokens(&out) + 20 - 1;
    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!(h.kv_blocks_in_use, 0, "a finished sequence holds nothing");
    assert_eq!(
        h.kv_blocks_cached,
        positions.div_ceil(BLOCK),
        "its blocks stay cached, the part-filled last one too"
    );
    // The banner says the cache ran.
    assert!(info.banners_engaged.is_empty());
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert!(info
        .banners_engaged
        .contains(&"TTW_PREFIX_CACHE".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_below_one_block_is_refused_naming_the_option() {
    let cache = tempfile::tempdir().unwrap();
    // TTW_KV_BUDGET_MIB=0 is out of range for the parser.
    let mut w = Worker::spawn(
        &Opts::new(&tiny_model(), 1, cache.path(), "cold").env("TTW_KV_BUDGET_MIB", "0"),
    );
    let st = w.wait_exit(std::time::Duration::from_secs(30));
    assert_eq!(st.code(), Some(2), "{}", w.stderr());
    assert!(w.stderr().contains("kv-budget-mib"), "{}", w.stderr());
}

// SmolLM2 (TT_SMOLLM2_GGUF).

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024
}

/// Exact equality after a recomputation needs matmuls whose bits do not
/// depend on how many rows a step stacks: our Q4_1 and Q8_0 kernels (all of
/// SmolLM2's), not candle's F16 path (part of the tiny model's layer 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_small_for_the_batch_preempts_and_recomputes_with_the_same_tokens() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    // 16 MiB holds 22 blocks (352 positions) of SmolLM2 in f32: six
    // sequences of ~130 positions need 2.2 times that.
    let small = Worker::start(
        &Opts::new(&model, 1, &cache.path().join("s"), "cold").env("TTW_KV_BUDGET_MIB", "16"),
    )
    .await;
    let big = Worker::start(&Opts::new(&model, 1, &cache.path().join("b"), "cold")).await;
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("Story number {i}: once upon a time"))
        .collect();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(ignore_eos(&big, p, 120).await.ids);
    }
    let mut tasks = Vec::new();
    for p in prompts.clone() {
        let socket = small.socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = connect(&socket).await.unwrap();
            run(&mut c, request_with(&p, 120, |g| g.ignore_eos = true)).await
        }));
    }
    for (t, want) in tasks.into_iter().zip(&alone) {
        let out = t.await.unwrap().expect("every sequence completes");
        assert_eq!(out.ids.len(), 120);
        assert_eq!(&out.ids, want, "a recomputed sequence continues exactly");
    }
    assert!(
        small.stderr().contains("preempted"),
        "the pool was too small for all six at once: {}",
        small.stderr()
    );
    let mut c = small.client().await;
    let h = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!(h.kv_blocks_in_use, 0);
    assert!(h.kv_blocks_cached <= 22);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_f16_memory_grows_with_use_not_with_the_budget() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let gguf_mib = std::fs::metadata(&model).unwrap().len() >> 20;
    for f16 in ["0", "1"] {
        let w = Worker::start(
            &Opts::new(&model, 1, &cache.path().join(f16), "cold").env("TTW_KV_F16", f16),
        )
        .await;
        let mut c = w.client().await;
        greedy(&mut c, "The capital of France is", 8).await;
        let rss = rss_mib(w.child.id());
        // Weights mapped (~GGUF size) plus working memory; the 512 MiB
        // budget is address space until blocks are used. Before the pool,
        // TTW_KV_F16=1 made this ~1.6 GiB.
        assert!(
            rss < 2 * gguf_mib + 64,
            "TTW_KV_F16={f16}: RSS {rss} MiB after one short request (GGUF {gguf_mib} MiB)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_smaller_than_the_context_shortens_it() {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let w =
        Worker::start(&Opts::new(&model, 1, cache.path(), "cold").env("TTW_KV_BUDGET_MIB", "100"))
            .await;
    let mut c = w.client().await;
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    // 30 layers x 3 KV heads x 64 dims x f32 x 2 = 45 KiB per token.
    let blocks = (100u64 << 20) / (46_080 * 16);
    assert_eq!(info.context_length as u64, blocks * 16);
    assert!(
        w.stderr().contains("raise TTW_KV_BUDGET_MIB"),
        "{}",
        w.stderr()
    );
}

fn conversation(turns: &[(&str, &str)]) -> pb::EngineGenerateRequest {
    let system = "You are a helpful assistant who answers in one short sentence. ".repeat(4);
    let mut messages = vec![pb::ChatMessage {
        role: "system".into(),
        content: system,
    }];
    for (role, content) in turns {
        messages.push(pb::ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        });
    }
    request_with("", 24, |g| {
        g.input = Some(pb::generate_request::Input::Chat(pb::ChatMessages {
            messages,
        }))
    })
}

async fn second_turn(tp: usize) {
    let model = real_model();
    let cache = tempfile::tempdir().unwrap();
    let on = Worker::start(&Opts::new(&model, tp, &cache.path().join("on"), "cold")).await;
    let off = Worker::start(
        &Opts::new(&model, tp, &cache.path().join("off"), "cold").env("TTW_PREFIX_CACHE", "0"),
    )
    .await;
    let (mut con, mut coff) = (on.client().await, off.client().await);
    let q1 = "What is the capital of France?";
    let first = run(&mut con, conversation(&[("user", q1)])).await.unwrap();
    let first_prompt = prompt_tokens(&first);
    let turns = [
        ("user", q1),
        ("assistant", first.text.as_str()),
        ("user", "And of Italy?"),
    ];
    let second = run(&mut con, conversation(&turns)).await.unwrap();
    let fresh = run(&mut coff, conversation(&turns)).await.unwrap();
    assert_eq!(second.ids, fresh.ids, "TP={tp}: same answer with reuse");
    assert_eq!(cached(&fresh), 0);
    assert!(
        cached(&second) >= first_prompt / BLOCK * BLOCK,
        "TP={tp}: the second turn reused {} tokens; the first turn's prompt alone was {first_prompt}",
        cached(&second)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_second_turn_reuses_the_first_at_tp1() {
    second_turn(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_second_turn_reuses_the_first_at_tp2() {
    second_turn(2).await;
}
