use super::fake::cache_listing;
use super::*;
use crate::cache::{check, NextStart};

#[tokio::test]
async fn cache_ls_prints_the_table_or_json() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["cache", "ls"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(
        out.starts_with("MODEL  VARIANT           STATE       SIZE     FILES  USED BY\n"),
        "{out}"
    );
    assert!(
        out.contains("    reason: weights/layer3.bin is missing\n"),
        "{out}"
    );
    assert!(
        out.contains("    built with: vllm-tt, tt-umd 0.9.14, ttnn 0.81.1, tt-worker-openai 0.1.0, cards p150a (1,1)\n"),
        "what the variant was built with: {out}"
    );

    let (out, failure) = ttctl(&h.socket, &["cache", "ls", "--json"]).await;
    assert!(failure.is_none(), "{failure:?}");
    let cache: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cache["cache_dir"], "/var/cache/tt-serving");
    assert_eq!(cache["variants"].as_array().unwrap().len(), 7);
    let qwen = &cache["variants"][4];
    assert_eq!(
        (&qwen["model"], &qwen["key"]),
        (&"qwen".into(), &"3f2a9c0d1e2b4a5c".into())
    );
    assert_eq!(qwen["used_by"], serde_json::json!(["qwen"]));
    assert_eq!(qwen["inputs"]["tp"], "1");
}

#[tokio::test]
async fn cache_verify_exits_0_only_when_the_used_variant_is_warm() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["cache", "verify", "qwen"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(out.contains("3f2a9c0d1e2b4a5c  warm"), "{out}");
    assert!(out.contains("ffff000000000000  cold"), "{out}");
    assert!(
        out.ends_with("qwen: variant 3f2a9c0d1e2b4a5c is warm: the next start of qwen is warm\n"),
        "{out}"
    );

    for (model, says) in [
        ("smol", "is cold"),
        ("mixed", "(used by mixed/0, mixed/1) is cold"),
        ("big", "is incomplete: weights/layer3.bin is missing"),
        ("old", "no slot uses them"),
    ] {
        let (out, failure) = ttctl(&h.socket, &["cache", "verify", model]).await;
        assert!(
            out.contains("VARIANT"),
            "{model}: the variants are listed: {out}"
        );
        let failure = failure.unwrap();
        assert_eq!(failure.exit_code(), 1, "{model}: {failure:?}");
        assert!(failure.message().contains(says), "{model}: {failure:?}");
        assert!(
            failure
                .message()
                .ends_with("a cold build will happen at the next start"),
            "{model}: {failure:?}"
        );
    }

    let (out, failure) = ttctl(&h.socket, &["cache", "verify", "fresh"]).await;
    assert_eq!(out, "");
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no cache for fresh yet: the next start builds it cold")
    );

    // A name no model has is not "a cold build at the next start": there
    // is no next start. The error names the models there are.
    let (out, failure) = ttctl(&h.socket, &["cache", "verify", "ghost"]).await;
    assert_eq!(out, "");
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (
            1,
            "unknown model `ghost`; the config names these models: big, fresh, mixed, old, qwen, smol"
        )
    );
}

#[tokio::test]
async fn cache_rm_prints_what_it_freed_and_passes_refusals_on() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["cache", "rm", "0000000000000001"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "removed /var/cache/tt-serving/old/0000000000000001: freed 3.0 GiB (3221225472 bytes)\n"
    );

    let (_, failure) = ttctl(&h.socket, &["cache", "rm", "3f2a9c0d1e2b4a5c"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(
        failure
            .message()
            .starts_with("cache variant 3f2a9c0d1e2b4a5c is in use by slot(s) qwen"),
        "{failure:?}"
    );

    let (_, failure) = ttctl(&h.socket, &["cache", "rm", "nope"]).await;
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no cache variant `nope`; `ttctl cache ls` lists them")
    );
}

#[test]
fn next_start_is_warm_only_from_the_variant_the_config_selects() {
    let listing = cache_listing();
    let judged = |model: &str| check(model, &listing).next_start;
    let variant = |key: &str| listing.variants.iter().find(|v| v.key == key).unwrap();
    assert_eq!(
        judged("qwen"),
        NextStart::Warm(vec![variant("3f2a9c0d1e2b4a5c")])
    );
    assert_eq!(
        judged("smol"),
        NextStart::NotWarm(variant("5000000000000001"))
    );
    assert_eq!(
        judged("mixed"),
        NextStart::NotWarm(variant("a000000000000002"))
    );
    assert_eq!(
        judged("big"),
        NextStart::NotWarm(variant("b000000000000001"))
    );
    // `old` is configured but no slot uses its variant.
    assert_eq!(judged("old"), NextStart::NoneSelected);
    assert_eq!(judged("fresh"), NextStart::NoCache);
    assert_eq!(
        judged("ghost"),
        NextStart::UnknownModel {
            models: &listing.models
        }
    );
    let mut removed = cache_listing();
    removed.models.retain(|m| m != "qwen");
    let check = check("qwen", &removed);
    assert_eq!(check.variants.len(), 2);
    assert_eq!(
        check.next_start,
        NextStart::LeftOver {
            models: &removed.models
        }
    );
}
