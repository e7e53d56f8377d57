use tt_serving_proto::v1::RemoveCacheResponse;

use super::super::super::cache::check;
use super::super::cache::CacheVerdict;
use super::*;

fn verify(model: &str, listing: &ListCacheResponse) -> CacheVerdict {
    cache_verdict(model, &check(model, listing))
}

#[test]
fn cache_table_shows_state_size_files_users_and_reasons() {
    let table = cache_table(&cache());
    assert_eq!(
        table,
        "MODEL  VARIANT           STATE       SIZE      FILES  USED BY\n\
         llama  1111222233334444  incomplete  812 MiB   -      llama\n\
         \x20   reason: weights/l3.bin: expected 4096 bytes, found 0 / (truncated)\n\
         qwen   3f2a9c0d1e2b4a5c  warm        10.5 GiB  240    qwen/0,qwen/1\n\
         qwen   ffff000000000000  cold        -         -      -\n"
    );
}

#[test]
fn empty_cache_says_where_it_looked() {
    let empty = ListCacheResponse {
        cache_dir: "/var/cache/tt-serving".into(),
        variants: vec![],
        models: vec![],
    };
    assert_eq!(
        cache_table(&empty),
        "no cache variants in /var/cache/tt-serving\n"
    );
}

#[test]
fn cache_json_mirrors_the_listing_with_sorted_inputs() {
    let listing = cache();
    let json = cache_json(&listing);
    let v = serde_json::to_value(&json).unwrap();
    assert_eq!(v["cache_dir"], "/var/cache/tt-serving");
    let qwen = &v["variants"][1];
    for field in [
        "model", "key", "state", "reason", "bytes", "files", "used_by", "inputs",
    ] {
        assert!(!qwen[field].is_null(), "{field} missing: {qwen}");
    }
    assert_eq!(qwen["state"], "warm");
    assert_eq!(qwen["files"], 240);
    assert_eq!(qwen["used_by"], serde_json::json!(["qwen/0", "qwen/1"]));
    assert_eq!(qwen["inputs"]["tp"], "2");
    let text = serde_json::to_string(&json).unwrap();
    assert!(
        text.find("\"checkpoint\"").unwrap() < text.find("\"tp\"").unwrap(),
        "inputs are sorted: {text}"
    );
    assert_eq!(v["variants"][0]["state"], "incomplete");
    assert!(v["variants"][0]["reason"]
        .as_str()
        .unwrap()
        .starts_with("weights/l3.bin"));
}

#[test]
fn cache_verdict_is_warm_only_for_the_variant_the_slots_use() {
    let verdict = verify("qwen", &cache());
    assert_eq!(
        verdict.outcome,
        Ok(
            "qwen: variant 3f2a9c0d1e2b4a5c is warm: the next start of qwen/0, qwen/1 is warm"
                .to_string()
        )
    );
    assert_eq!(
        verdict.listing,
        "VARIANT           STATE  SIZE      FILES  USED BY\n\
         3f2a9c0d1e2b4a5c  warm   10.5 GiB  240    qwen/0,qwen/1\n\
         ffff000000000000  cold   -         -      - (not selected by the current config)\n"
    );
}

#[test]
fn cache_verdict_explains_every_cold_next_start() {
    let incomplete = verify("llama", &cache());
    assert_eq!(
        incomplete.outcome,
        Err(
            "llama: variant 1111222233334444 (used by llama) is incomplete: weights/l3.bin: \
             expected 4096 bytes, found 0 / (truncated); a cold build will happen at the next \
             start"
                .to_string()
        )
    );
    assert!(incomplete.listing.contains("\n    reason: weights/l3.bin"));

    let mut listing = cache();
    listing.variants[1].state = "cold".into();
    let cold = verify("qwen", &listing);
    assert_eq!(
        cold.outcome,
        Err(
            "qwen: variant 3f2a9c0d1e2b4a5c (used by qwen/0, qwen/1) is cold, its build never \
             completed: a cold build will happen at the next start"
                .to_string()
        )
    );

    // The config changed: what is on disk is no longer what the slots use.
    listing.variants[1].used_by.clear();
    listing.variants[1].state = "warm".into();
    let stale = verify("qwen", &listing);
    assert_eq!(
        stale.outcome,
        Err(
            "qwen: none of its 2 cache variant(s) on disk is the one its current config \
             selects (no slot uses them): a cold build will happen at the next start"
                .to_string()
        )
    );

    let none = verify("smol", &cache());
    assert_eq!(none.listing, "");
    assert_eq!(
        none.outcome,
        Err("no cache for smol yet: the next start builds it cold".to_string())
    );
}

#[test]
fn cache_verdict_of_a_name_the_config_lacks_names_the_models_it_has() {
    let unknown = verify("ghost", &cache());
    assert_eq!(unknown.listing, "");
    assert_eq!(
        unknown.outcome,
        Err("unknown model `ghost`; the config names these models: llama, qwen, smol".to_string())
    );
    let mut none = cache();
    none.models.clear();
    assert_eq!(
        verify("ghost", &none).outcome,
        Err("unknown model `ghost`; the config names no models".to_string())
    );

    // A model removed from the config: its variants are still listed, and
    // the verdict says they are left over, with the command that frees them.
    let mut removed = cache();
    removed.models.retain(|m| m != "qwen");
    let verdict = verify("qwen", &removed);
    assert!(
        verdict.listing.contains("3f2a9c0d1e2b4a5c"),
        "{}",
        verdict.listing
    );
    assert_eq!(
        verdict.outcome,
        Err(
            "qwen is not a model of the config in force, which names llama, smol; its 2 cache \
             variant(s) on disk are left from an earlier config: `ttctl cache rm VARIANT` \
             removes one"
                .to_string()
        )
    );
}

#[test]
fn cache_removed_line_names_the_path_and_the_bytes() {
    assert_eq!(
        cache_removed_line(&RemoveCacheResponse {
            path: "/var/cache/tt-serving/qwen/ffff000000000000".into(),
            bytes: 812 << 20,
        }),
        "removed /var/cache/tt-serving/qwen/ffff000000000000: freed 812 MiB (851443712 bytes)"
    );
    assert_eq!(
        cache_removed_line(&RemoveCacheResponse {
            path: "/c/m/k".into(),
            bytes: 0,
        }),
        "removed /c/m/k: freed 0 bytes"
    );
}
