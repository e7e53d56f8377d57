use serde::Serialize;
use tt_serving_proto::v1::{ModelQueue, ReloadOutcome, ReloadReport, ReloadStep, SlotKvMemory};

use super::*;

#[test]
fn json_mirrors_proto_fields_with_state_words_and_nulls() {
    let text = serde_json::to_string(&status()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();

    assert_eq!(v["daemon"]["pid"], 812);
    assert_eq!(v["daemon"]["driver_version"], "2.0.0");
    assert_eq!(v["daemon"]["config_path"], "/etc/tt-serving/config.toml");
    assert_eq!(v["daemon"]["inference_address"], "127.0.0.1:50051");

    let cards = v["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 4);
    assert_eq!(cards[0]["index"], 0);
    assert_eq!(cards[0]["state"], "ready");
    assert_eq!(cards[0]["telemetry"]["temperature_c"], 45.25);
    assert_eq!(cards[0]["telemetry"]["current_a"], serde_json::Value::Null);
    assert_eq!(cards[0]["telemetry"]["fan_rpm"], 1800);
    assert_eq!(cards[0]["lock_holder"]["is_daemon"], true);
    assert_eq!(cards[0]["aiclk_mhz"], 1350);

    assert_eq!(cards[1]["index"], serde_json::Value::Null);
    assert_eq!(cards[1]["state"], "resetting");
    assert_eq!(
        cards[1]["telemetry"]["temperature_c"],
        serde_json::Value::Null
    );
    assert_eq!(cards[1]["telemetry"]["power_w"], serde_json::Value::Null);

    assert_eq!(cards[2]["state"], "held-elsewhere");
    assert_eq!(cards[2]["lock_holder"]["pid"], 4242);
    assert_eq!(cards[2]["lock_holder"]["purpose"], "bench-sweep");
    assert_eq!(cards[2]["lock_holder"]["user"], "alice");
    assert_eq!(cards[2]["processes"][0]["command"], "python3");

    assert_eq!(cards[3]["state"], "quarantined");
    assert_eq!(cards[3]["reset_failures"], 3);

    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots[0]["state"], "ready");
    assert_eq!(slots[0]["cards"][1], "0000:02:00.0");
    assert_eq!(slots[1]["state"], "failed");
    assert_eq!(slots[1]["retry_at_unix_ms"], NOW + 30_000);
    // No KV memory reported: null, not an object of zeroes.
    assert_eq!(slots[0]["kv"], serde_json::Value::Null);
    assert_eq!(slots[0]["prompt_tokens"], 0);
    assert_eq!(slots[0]["trial"], "");
}

#[test]
fn json_lock_holder_is_null_when_nobody_holds_the_card() {
    let unmanaged = Card {
        bdf: "0000:05:00.0".into(),
        state: CardState::Unmanaged as i32,
        ..Default::default()
    };
    let json = StatusResponse {
        cards: vec![unmanaged],
        ..Default::default()
    };
    let v = serde_json::to_value(&json).unwrap();
    assert_eq!(v["cards"][0]["lock_holder"], serde_json::Value::Null);
    assert_eq!(v["cards"][0]["state"], "unmanaged");
    assert_eq!(v["slots"], serde_json::json!([]));
}

/// Everything `status --json` has to show or leave out: every card shape
/// above, a card in a state this ttctl does not know, slot counters, the
/// engine, variant, flags and trial of a slot, its prefix-cache and
/// affinity counters, its KV memory (an object while the engine says, else
/// null), fields the JSON never had (`lock_dir`, `starts`, `queues`) and a
/// reload.
fn json_sample() -> StatusResponse {
    let mut sample = status();
    sample.cards.push(Card {
        bdf: "0000:06:00.0".into(),
        state: 99,
        ..Default::default()
    });
    sample.slots[0].starts = 3;
    sample.slots[0].generated_tokens = 1234;
    sample.slots[0].requests_served = 12;
    sample.slots[0].ttft_p50_ms = 41.5;
    sample.slots[0].itl_p50_ms = 5.25;
    sample.slots[0].engine_version = "tt-worker 0.1.0".into();
    sample.slots[0].cache_variant = "3f2a9c0d1e2b4a5c".into();
    // Flags print sorted (a BTreeMap).
    sample.slots[0].flags = [("TTW_KV_F16".to_string(), "1".to_string())].into();
    sample.slots[0].trial = "arm b (TTW_KV_F16=1) for issue 17".into();
    sample.slots[0].banners_engaged = vec!["TTW_KV_F16".into()];
    sample.slots[0].prompt_tokens = 1600;
    sample.slots[0].cached_prompt_tokens = 540;
    sample.slots[0].affinity_affine = 9;
    sample.slots[0].affinity_fallback = 1;
    sample.slots[0].kv = Some(SlotKvMemory {
        budget_bytes: 512 << 20,
        block_tokens: 16,
        blocks_total: 1024,
        prefix_cache: true,
        blocks_in_use: 256,
        blocks_cached: 300,
    });
    sample.slots[1].outdated_keys = vec!["flags.KV".into()];
    sample.queues = vec![ModelQueue {
        model: "qwen".into(),
        waiting: 2,
        max_queue: 64,
    }];
    sample.reloads = vec![ReloadReport {
        outcome: ReloadOutcome::Applied as i32,
        trigger: "SIGHUP".into(),
        started_unix_ms: NOW - 5_000,
        finished_unix_ms: NOW - 1_000,
        config_path: "/etc/tt-serving/config.toml".into(),
        problems: vec![],
        steps: vec![ReloadStep {
            slot: "smol".into(),
            model: "smol".into(),
            action: "restart".into(),
            reason: "flags.KV: \"0\" → \"1\"".into(),
            result: "Failed: worker exited with code 3".into(),
        }],
        needs_restart: vec!["daemon.listen: \"a\" → \"b\"".into()],
        summary: "1 restart".into(),
    }];
    sample
}

/// `status --json` and `cache ls --json` are contracts scripts read: these
/// files hold the exact text ttctl printed for the samples when the JSON
/// was last changed on purpose. A difference here is a contract change.
#[test]
fn json_output_is_exactly_the_pinned_text() {
    fn pretty(value: &impl Serialize) -> String {
        serde_json::to_string_pretty(value).unwrap()
    }
    assert_eq!(
        pretty(&json_sample()),
        include_str!("testdata/status.json").trim_end()
    );
    assert_eq!(
        pretty(&StatusResponse::default()),
        include_str!("testdata/status-no-daemon-info.json").trim_end()
    );
    assert_eq!(
        pretty(&cache_json(&cache())),
        include_str!("testdata/cache.json").trim_end()
    );
}
