//! The optional GenerateRequest parameters on the tiny generated model:
//! what Info declares, logprobs, stop_token_ids, and the refusals naming
//! the field. (The ones that need a model that stops by itself, and the
//! penalties on real text, are in smollm2.rs.)

mod common;

use common::*;
use tt_serving_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_declares_every_optional_parameter_but_guided_decoding_and_tools() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let info = w
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    use tt_serving_proto::parameters::{OPTIONAL_PARAMETERS, RESPONSE_FORMAT, TOOLS};
    let expected: Vec<&str> = OPTIONAL_PARAMETERS
        .into_iter()
        .filter(|p| ![RESPONSE_FORMAT, TOOLS].contains(p))
        .collect();
    assert_eq!(info.supported_parameters, expected);
    assert!(info.supported_parameters.iter().any(|p| p == "seed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_and_response_format_are_refused_by_name() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let chat = |f: &dyn Fn(&mut pb::GenerateRequest)| {
        request_with("x", 4, |g| {
            g.input = Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                }],
            }));
            f(g);
        })
    };
    let tools = chat(&|g| {
        g.tools = r#"[{"type":"function","function":{"name":"f"}}]"#.into();
    });
    let e = run(&mut c, tools).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .starts_with("tools: not supported by engine tt-worker"),
        "{}",
        e.message()
    );
    let json = chat(&|g| {
        g.response_format = Some(pb::ResponseFormat {
            r#type: pb::ResponseFormatType::JsonObject as i32,
            ..Default::default()
        });
    });
    let e = run(&mut c, json).await.unwrap_err();
    assert!(
        e.message().starts_with("response_format: "),
        "{}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_per_token_with_the_alternatives_asked_for() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let plain = greedy(&mut c, "the cat", 12).await;
    assert!(plain.logprobs.is_empty(), "not asked for");

    let out = run(
        &mut c,
        request_with("the cat", 12, |g| g.logprobs = Some(5)),
    )
    .await
    .unwrap();
    // Asking for logprobs changes nothing else.
    assert_eq!(out.ids, plain.ids);
    assert_eq!(out.text, plain.text);
    assert_eq!(out.logprobs.len(), out.ids.len());
    for (lp, &id) in out.logprobs.iter().zip(&out.ids) {
        assert_eq!(lp.token_id, id);
        assert!(lp.logprob <= 0.0 && lp.logprob.is_finite(), "{lp:?}");
        assert_eq!(lp.top_logprobs.len(), 5, "{lp:?}");
        // Greedy picks the most likely token: the first alternative.
        assert_eq!(lp.top_logprobs[0].token_id, Some(id), "{lp:?}");
        assert_eq!(lp.top_logprobs[0].logprob, lp.logprob, "{lp:?}");
        assert!(
            lp.top_logprobs
                .windows(2)
                .all(|w| w[0].logprob >= w[1].logprob && w[1].logprob <= 0.0),
            "{lp:?}"
        );
        // Probabilities: the alternatives' mass is at most 1.
        let mass: f64 = lp
            .top_logprobs
            .iter()
            .map(|t| (t.logprob as f64).exp())
            .sum();
        assert!(mass <= 1.0 + 1e-5, "{mass}");
        assert_eq!(String::from_utf8_lossy(&lp.bytes), lp.token, "{lp:?}");
    }

    // 0: the chosen token's logprob only.
    let only = run(
        &mut c,
        request_with("the cat", 12, |g| g.logprobs = Some(0)),
    )
    .await
    .unwrap();
    assert_eq!(only.logprobs.len(), only.ids.len());
    assert!(only.logprobs.iter().all(|l| l.top_logprobs.is_empty()));
    assert_eq!(
        only.logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        out.logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>()
    );

    // Sampled: the chosen token is among the alternatives with its own
    // logprob, which reads the logits before temperature.
    let sampled = run(
        &mut c,
        request_with("the cat", 12, |g| {
            g.logprobs = Some(20);
            g.sampling = Some(pb::SamplingParams {
                temperature: 1.0,
                seed: Some(5),
                ..Default::default()
            });
        }),
    )
    .await
    .unwrap();
    for lp in &sampled.logprobs {
        assert_eq!(lp.top_logprobs.len(), 20);
        assert!(lp.logprob <= lp.top_logprobs[0].logprob, "{lp:?}");
        if let Some(t) = lp
            .top_logprobs
            .iter()
            .find(|t| t.token_id == Some(lp.token_id))
        {
            assert_eq!(t.logprob, lp.logprob, "{lp:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_token_ids_end_the_generation_at_that_token() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let full = greedy(&mut c, "the cat", 24).await;
    // The first token from the third on that did not occur before it.
    let k = (2..full.ids.len())
        .find(|&k| !full.ids[..k].contains(&full.ids[k]))
        .expect("a new token in the greedy output");
    let stop = full.ids[k];
    let out = run(
        &mut c,
        request_with("the cat", 24, |g| g.stop_token_ids = vec![stop]),
    )
    .await
    .unwrap();
    assert_eq!(out.ids, full.ids[..=k], "stops after the stop token");
    assert_eq!(out.final_.finish_reason, pb::FinishReason::Stop as i32);
    assert_eq!(out.final_.usage.unwrap().completion_tokens, k as u32 + 1);
    // The stop token's own text is not sent.
    assert!(
        full.text.starts_with(&out.text) && out.text.len() < full.text.len(),
        "{:?} vs {:?}",
        out.text,
        full.text
    );

    // min_tokens holds a stop token back until that many tokens exist.
    let held = run(
        &mut c,
        request_with("the cat", 24, |g| {
            g.stop_token_ids = vec![stop];
            g.min_tokens = k as u32 + 2;
        }),
    )
    .await
    .unwrap();
    assert!(held.ids.len() >= k + 2, "{:?}", held.ids);
    assert_eq!(held.ids[..k], full.ids[..k]);
    assert_ne!(held.ids[k], stop);
    assert!(!held.ids[..k + 2].contains(&stop), "{:?}", held.ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_parameters_are_refused_naming_the_field() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    type Set = fn(&mut pb::GenerateRequest);
    let cases: [(Set, &str); 9] = [
        (
            |g| g.presence_penalty = 2.5,
            "presence_penalty: 2.5 is outside [-2, 2]",
        ),
        (
            |g| g.frequency_penalty = -3.0,
            "frequency_penalty: -3 is outside [-2, 2]",
        ),
        (
            |g| g.frequency_penalty = f32::NAN,
            "frequency_penalty: NaN is outside [-2, 2]",
        ),
        (
            |g| g.repetition_penalty = -0.5,
            "repetition_penalty: -0.5 is outside (0, 2]",
        ),
        (
            |g| g.repetition_penalty = 2.5,
            "repetition_penalty: 2.5 is outside (0, 2]",
        ),
        (
            |g| g.logprobs = Some(21),
            "logprobs: 21 alternatives per token is above this engine's limit of 20",
        ),
        (
            |g| g.stop_token_ids = vec![1, 1_000_000],
            "stop_token_ids[1]: 1000000 is not a token of this model",
        ),
        (
            |g| g.min_tokens = 9,
            "min_tokens: 9 is above the 8 tokens this request may generate",
        ),
        (
            |g| g.n = 2,
            "n: 2 completions per request are not supported",
        ),
    ];
    for (f, want) in cases {
        let e = run(&mut c, request_with("the cat", 8, f))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{want}: {e:?}");
        assert!(e.message().starts_with(want), "{want}: {}", e.message());
    }
    // The limits themselves are accepted, and so are the values that mean off.
    let edge = run(
        &mut c,
        request_with("the cat", 8, |g| {
            g.presence_penalty = -2.0;
            g.frequency_penalty = 2.0;
            g.repetition_penalty = 2.0;
            g.logprobs = Some(20);
            g.min_tokens = 8;
            g.n = 1;
        }),
    )
    .await
    .unwrap();
    assert_eq!(edge.ids.len(), 8);
    let off = run(
        &mut c,
        request_with("the cat", 8, |g| {
            g.repetition_penalty = 1.0;
            g.n = 0;
        }),
    )
    .await
    .unwrap();
    assert_eq!(off.ids, greedy(&mut c, "the cat", 8).await.ids);
}

/// The prompt's own logprobs (what log-likelihood evaluations score): one
/// per prompt token, the first without a distribution, the same numbers
/// decoding reported for the same tokens, the prefix cache not skipping
/// any, and a prompt given as token ids served as its text is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_score_the_prompt_as_decoding_scored_it() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await;
    let mut c = w.client().await;
    let decoded = run(
        &mut c,
        request_with("the cat sat", 6, |g| g.logprobs = Some(3)),
    )
    .await
    .unwrap();
    assert!(decoded.prompt_logprobs.is_none(), "not asked for");

    let score = |ids: Vec<u32>| {
        request_with("unused", 1, move |g| {
            g.input = Some(pb::generate_request::Input::PromptTokens(
                pb::PromptTokens { ids },
            ));
            g.prompt_logprobs = Some(3);
            g.prompt_only = true;
        })
    };
    // The text prompt, scored alone: its token ids come back with it.
    let scored = run(
        &mut c,
        request_with("the cat sat", 6, |g| {
            g.prompt_logprobs = Some(3);
            g.prompt_only = true;
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        (scored.deltas, scored.ids.len()),
        (0, 0),
        "prompt_only generates nothing"
    );
    let usage = scored.final_.usage.unwrap();
    assert_eq!(usage.completion_tokens, 0);
    assert_eq!(scored.final_.finish_reason, pb::FinishReason::Length as i32);
    let prompt = scored.prompt_logprobs.expect("the prompt's logprobs");
    assert_eq!(prompt.len(), usage.prompt_tokens as usize);
    assert_eq!((prompt[0].logprob, prompt[0].top_logprobs.len()), (0.0, 0));
    for lp in &prompt[1..] {
        assert!(lp.logprob <= 0.0 && lp.logprob.is_finite(), "{lp:?}");
        assert_eq!(lp.top_logprobs.len(), 3, "{lp:?}");
        assert!(lp.top_logprobs[0].logprob >= lp.logprob, "{lp:?}");
    }
    let prompt_ids: Vec<u32> = prompt.iter().map(|l| l.token_id).collect();

    // The prompt and the decoded answer, scored as one prompt: each answer
    // token's logprob is the one decoding reported.
    let mut whole = prompt_ids.clone();
    whole.extend(&decoded.ids);
    let rescored = run(&mut c, score(whole.clone())).await.unwrap();
    let rescored = rescored.prompt_logprobs.unwrap();
    assert_eq!(rescored.len(), whole.len());
    assert_eq!(&rescored[..prompt.len()], &prompt[..], "the prompt part");
    for (k, lp) in decoded.logprobs.iter().enumerate() {
        let again = &rescored[prompt.len() + k];
        assert_eq!(again.token_id, lp.token_id);
        assert!(
            (again.logprob - lp.logprob).abs() < 1e-3,
            "token {k}: scored {} decoded {}",
            again.logprob,
            lp.logprob
        );
    }
    // Scoring again reuses no cached prefix: the same numbers, all computed.
    let twice = run(&mut c, score(whole)).await.unwrap();
    assert_eq!(twice.prompt_logprobs.unwrap(), rescored);
    assert_eq!(twice.final_.timings.unwrap().cached_prompt_tokens, 0);

    // Token ids generate what their text generates.
    let by_ids = run(
        &mut c,
        request_with("unused", 6, |g| {
            g.input = Some(pb::generate_request::Input::PromptTokens(
                pb::PromptTokens {
                    ids: prompt_ids.clone(),
                },
            ));
        }),
    )
    .await
    .unwrap();
    assert_eq!(by_ids.ids, decoded.ids);

    // Refusals name the field.
    for (request, field) in [
        (
            request_with("x", 1, |g| g.prompt_only = true),
            "prompt_only: ",
        ),
        (
            request_with("x", 1, |g| g.prompt_logprobs = Some(21)),
            "prompt_logprobs: 21 ",
        ),
        (score(vec![u32::MAX]), "prompt_tokens.ids[0]: "),
    ] {
        let e = run(&mut c, request).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with(field), "{}", e.message());
    }
}
