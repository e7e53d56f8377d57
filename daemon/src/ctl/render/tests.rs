use super::*;
use serde::Serialize;
use tt_serving_proto::v1::{CardProcess, LockHolder, Telemetry, Timings, Usage};

/// 2025-01-01T00:00:00Z, the "now" every test renders at.
const NOW: u64 = 1_735_689_600_000;

fn daemon() -> DaemonInfo {
    DaemonInfo {
        version: "0.1.0".into(),
        pid: 812,
        started_unix_ms: NOW - 2 * 3600 * 1000 - 3 * 60 * 1000,
        config_path: "/etc/tt-serving/config.toml".into(),
        summary: "1/2 slots ready".into(),
        driver_version: "2.0.0".into(),
        inference_address: "127.0.0.1:50051".into(),
        metrics_address: "127.0.0.1:9464".into(),
        lock_dir: "/run/lock/tenstorrent".into(),
    }
}

fn daemon_lock() -> Option<LockHolder> {
    Some(LockHolder {
        pid: 812,
        purpose: "tt-servingd".into(),
        is_daemon: true,
        ..Default::default()
    })
}

fn ready_card() -> Card {
    Card {
        bdf: "0000:01:00.0".into(),
        index: Some(0),
        card_type: "p150a".into(),
        serial: "0123456789abcdef".into(),
        fw_bundle_version: "18.3.0.0".into(),
        heartbeat: 4242,
        heartbeat_ok: true,
        telemetry: Some(Telemetry {
            temperature_c: Some(45.25),
            power_w: Some(61.0),
            voltage_v: Some(0.82),
            current_a: None,
            fan_rpm: Some(1800),
        }),
        state: CardState::Ready as i32,
        lock_holder: daemon_lock(),
        slot: "qwen".into(),
        aiclk_mhz: 1350,
        m3app_fw_version: "5.10.0.0".into(),
        ..Default::default()
    }
}

fn resetting_card() -> Card {
    Card {
        bdf: "0000:02:00.0".into(),
        index: None,
        card_type: "p150a".into(),
        telemetry: None,
        state: CardState::Resetting as i32,
        lock_holder: daemon_lock(),
        slot: "qwen".into(),
        ..Default::default()
    }
}

fn held_elsewhere_card() -> Card {
    Card {
        bdf: "0000:03:00.0".into(),
        index: Some(2),
        card_type: "p150a".into(),
        heartbeat: 99,
        heartbeat_ok: true,
        telemetry: Some(Telemetry {
            temperature_c: Some(38.0),
            power_w: Some(20.5),
            ..Default::default()
        }),
        state: CardState::HeldElsewhere as i32,
        state_reason: "lock held by pid 4242 (bench-sweep)".into(),
        lock_holder: Some(LockHolder {
            pid: 4242,
            purpose: "bench-sweep".into(),
            is_daemon: false,
            user: "alice".into(),
            ..Default::default()
        }),
        processes: vec![CardProcess {
            pid: 4242,
            command: "python3".into(),
        }],
        ..Default::default()
    }
}

fn quarantined_card() -> Card {
    Card {
        bdf: "0000:04:00.0".into(),
        index: Some(3),
        card_type: "p150a".into(),
        heartbeat: 7,
        heartbeat_ok: false,
        state: CardState::Quarantined as i32,
        state_reason: "3 resets in a row failed: heartbeat did not advance\nafter 5s".into(),
        lock_holder: daemon_lock(),
        reset_failures: 3,
        ..Default::default()
    }
}

fn ready_slot() -> Slot {
    Slot {
        name: "qwen".into(),
        model: "qwen".into(),
        cards: vec!["0000:01:00.0".into(), "0000:02:00.0".into()],
        state: SlotState::Ready as i32,
        since_unix_ms: NOW - (3 * 60 + 12) * 1000,
        reason: "verified".into(),
        cache_mode: "warm".into(),
        attempt: 1,
        worker_pid: 9001,
        worker_rss_bytes: 10 * (1 << 30) + (1 << 29),
        requests_in_flight: 2,
        ..Default::default()
    }
}

fn failed_slot() -> Slot {
    Slot {
        name: "smol".into(),
        model: "smol".into(),
        cards: vec!["0000:04:00.0".into()],
        state: SlotState::Failed as i32,
        since_unix_ms: NOW - 42_000,
        reason: "worker killed by SIGKILL without a stop request (most likely OOM)".into(),
        attempt: 3,
        retry_at_unix_ms: NOW + 30_000,
        last_error: "worker killed by SIGKILL".into(),
        ..Default::default()
    }
}

fn status() -> StatusResponse {
    StatusResponse {
        daemon: Some(daemon()),
        cards: vec![
            ready_card(),
            resetting_card(),
            held_elsewhere_card(),
            quarantined_card(),
        ],
        slots: vec![ready_slot(), failed_slot()],
        reloads: vec![],
        queues: vec![],
    }
}

/// The table line of the card with this BDF.
fn line_of<'a>(table: &'a str, needle: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{table}"))
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn header_names_version_pid_driver_uptime_and_summary() {
    let table = status_table(&status(), NOW);
    assert_eq!(
        table.lines().next(),
        Some(
            "tt-servingd 0.1.0 (pid 812, driver 2.0.0, inference on 127.0.0.1:50051, \
             metrics on 127.0.0.1:9464, up 2h03m): 1/2 slots ready"
        )
    );
}

#[test]
fn card_with_index_and_telemetry_shows_every_column() {
    let table = status_table(&status(), NOW);
    assert!(table.contains("IDX  BDF"), "{table}");
    assert!(
        table.contains("TEMP (°C)  POWER (W)  HEARTBEAT  LOCK"),
        "{table}"
    );
    assert_eq!(
        words(line_of(&table, "0000:01:00.0  p150a")),
        [
            "0",
            "0000:01:00.0",
            "p150a",
            "45.2",
            "61.0",
            "ok",
            "pid",
            "812",
            "daemon",
            "qwen",
            "ready"
        ]
    );
}

#[test]
fn card_mid_reset_has_no_index_no_telemetry_and_no_heartbeat() {
    let table = status_table(&status(), NOW);
    assert_eq!(
        words(line_of(&table, "0000:02:00.0  p150a")),
        [
            "-",
            "0000:02:00.0",
            "p150a",
            "-",
            "-",
            "—",
            "pid",
            "812",
            "daemon",
            "qwen",
            "resetting"
        ]
    );
}

#[test]
fn held_elsewhere_card_names_the_lock_holder_and_open_processes() {
    let table = status_table(&status(), NOW);
    assert_eq!(
        words(line_of(&table, "0000:03:00.0  p150a")),
        [
            "2",
            "0000:03:00.0",
            "p150a",
            "38.0",
            "20.5",
            "ok",
            "pid",
            "4242",
            "alice",
            "bench-sweep",
            "-",
            "held-elsewhere"
        ]
    );
    let mut after = table
        .lines()
        .skip_while(|l| !l.contains("0000:03:00.0  p150a"));
    after.next();
    assert_eq!(
        after.next(),
        Some("    reason: lock held by pid 4242 (bench-sweep)")
    );
    assert_eq!(
        after.next(),
        Some("    pid 4242 (python3) has the device open")
    );
}

#[test]
fn quarantined_card_shows_its_reason_on_one_line() {
    let table = status_table(&status(), NOW);
    let row = words(line_of(&table, "0000:04:00.0  p150a"));
    assert_eq!(row.first(), Some(&"3"));
    assert_eq!(row.last(), Some(&"quarantined"));
    assert!(row.contains(&"stalled"), "{row:?}");
    assert!(table.contains(
        "\n    reason: 3 resets in a row failed: heartbeat did not advance / after 5s\n"
    ));
}

#[test]
fn columns_line_up_despite_multibyte_headers() {
    let table = status_table(&status(), NOW);
    let header = line_of(&table, "IDX");
    let col = |line: &str, needle: &str| {
        line.char_indices()
            .position(|(i, _)| line[i..].starts_with(needle))
            .unwrap()
    };
    let heartbeat_col = col(header, "HEARTBEAT");
    let row = line_of(&table, "0000:02:00.0");
    assert_eq!(col(row, "—"), heartbeat_col, "{table}");
    let row = line_of(&table, "0000:01:00.0  p150a");
    assert_eq!(col(row, "ok"), heartbeat_col, "{table}");
}

#[test]
fn slots_table_shows_cards_by_index_age_and_rss() {
    let table = status_table(&status(), NOW);
    assert!(table.contains("NAME  MODEL"), "{table}");
    assert_eq!(
        words(line_of(&table, "qwen  qwen")),
        [
            "qwen",
            "qwen",
            "0,0000:02:00.0",
            "ready",
            "3m12s",
            "ago",
            "warm",
            "1",
            "9001",
            "10.5",
            "GiB",
            "2",
            "-"
        ]
    );
}

#[test]
fn failed_slot_shows_reason_retry_and_last_error() {
    let table = status_table(&status(), NOW);
    let row = line_of(&table, "smol  smol");
    assert!(row.contains("failed"), "{row}");
    assert!(row.contains("42s ago"), "{row}");
    assert!(row.ends_with("worker killed by SIGKILL"), "{row}");
    assert!(table.contains(
        "    reason: worker killed by SIGKILL without a stop request (most likely OOM) (retry in 30s)"
    ));
}

#[test]
fn empty_status_says_no_slots_configured() {
    let table = status_table(&StatusResponse::default(), NOW);
    assert!(table.contains("no cards found"), "{table}");
    assert!(table.ends_with("no slots configured\n"), "{table}");
}

#[test]
fn state_words_are_lowercase_and_unknown_values_do_not_panic() {
    assert_eq!(
        CardState::word(CardState::HeldElsewhere as i32),
        "held-elsewhere"
    );
    assert_eq!(CardState::word(CardState::Unmanaged as i32), "unmanaged");
    assert_eq!(CardState::word(99), "unknown");
    assert_eq!(SlotState::word(SlotState::Verifying as i32), "verifying");
    assert_eq!(
        SlotState::word(SlotState::Quarantined as i32),
        "quarantined"
    );
    assert_eq!(SlotState::word(-1), "unknown");
}

#[test]
fn durations_and_sizes_read_naturally() {
    assert_eq!(duration_words(0), "0s");
    assert_eq!(duration_words(59_999), "59s");
    assert_eq!(duration_words(192_000), "3m12s");
    assert_eq!(duration_words(3_723_000), "1h02m");
    assert_eq!(duration_words(4 * 86_400_000 + 7 * 3_600_000), "4d07h");
    assert_eq!(bytes_words(0), "-");
    assert_eq!(bytes_words(1000), "1 KiB");
    assert_eq!(bytes_words(812 << 20), "812 MiB");
}

#[test]
fn reset_progress_lines_name_card_and_attempt() {
    let progress = ResetProgress {
        bdf: "0000:01:00.0".into(),
        phase: ResetPhase::RunningTtSmi as i32,
        attempt: 1,
        message: "running tt-smi -r 0000:01:00.0".into(),
        ..Default::default()
    };
    assert_eq!(
        reset_progress_line(&progress),
        "[0000:01:00.0] attempt 1: running tt-smi -r 0000:01:00.0"
    );
    let bare = ResetProgress {
        message: String::new(),
        phase: ResetPhase::CheckingHeartbeat as i32,
        attempt: 2,
        ..progress
    };
    assert_eq!(
        reset_progress_line(&bare),
        "[0000:01:00.0] attempt 2: checking the heartbeat advances"
    );
}

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

fn final_chunk(completion_tokens: u32, ttft_us: u64, decode_us: u64) -> GenerationFinal {
    GenerationFinal {
        finish_reason: FinishReason::Length as i32,
        usage: Some(Usage {
            prompt_tokens: 12,
            completion_tokens,
        }),
        timings: Some(Timings {
            queue_us: 250,
            prefill_us: 30_000,
            decode_us,
            time_to_first_token_us: ttft_us,
        }),
        slot: "qwen/1".into(),
    }
}

#[test]
fn generate_summary_names_reason_tokens_slot_ttft_and_decode_rate() {
    // 64 tokens: the first arrives at the TTFT, the other 63 in 1.5 s.
    assert_eq!(
        generate_summary(&final_chunk(64, 35_240, 1_500_000)),
        "[length] 12 prompt tokens, 64 completion tokens, slot qwen/1, TTFT 35.2 ms, \
         decode 42.0 tok/s"
    );
    assert_eq!(
        generate_summary(&GenerationFinal {
            finish_reason: FinishReason::Stop as i32,
            ..final_chunk(8, 2_345_678, 700_000)
        }),
        "[stop] 12 prompt tokens, 8 completion tokens, slot qwen/1, TTFT 2.35 s, \
         decode 10.0 tok/s"
    );
}

#[test]
fn generate_summary_shows_dashes_for_what_was_not_measured() {
    // One token: nothing was decoded after the first.
    assert_eq!(
        generate_summary(&final_chunk(1, 850, 0)),
        "[length] 12 prompt tokens, 1 completion tokens, slot qwen/1, TTFT 850 us, decode -"
    );
    // A bare final chunk (no usage, timings or slot) still renders.
    assert_eq!(
        generate_summary(&GenerationFinal::default()),
        "[unknown] 0 prompt tokens, 0 completion tokens, slot -, TTFT -, decode -"
    );
    assert_eq!(
        FinishReason::word(FinishReason::Cancelled as i32),
        "cancelled"
    );
    assert_eq!(FinishReason::word(42), "unknown");
}

#[test]
fn log_lines_print_worker_output_as_is_and_tag_daemon_notes() {
    let line = |stream: &str, text: &str| LogLine {
        unix_ms: NOW,
        stream: stream.into(),
        text: text.into(),
    };
    assert_eq!(
        log_line(&line("stdout", "loaded 32 layers")),
        "loaded 32 layers"
    );
    assert_eq!(
        log_line(&line("stderr", "Traceback (most recent call last):")),
        "Traceback (most recent call last):"
    );
    assert_eq!(
        log_line(&line("ttctl", "... 7 lines skipped ...")),
        "[ttctl] ... 7 lines skipped ..."
    );
}

#[test]
fn restart_steps_tell_the_new_worker_from_the_old() {
    let slot = |state: SlotState, starts: u64, since: u64, reason: &str| Slot {
        name: "qwen/1".into(),
        state: state as i32,
        starts,
        since_unix_ms: since,
        worker_pid: 7,
        reason: reason.into(),
        ..Default::default()
    };
    // The request found the slot verifying its first start.
    let before = slot(SlotState::Verifying, 1, 10, "readiness ping");
    assert_eq!(restart_step(&before, &before), RestartStep::Unchanged);
    // That start reaching Ready is the old worker: the restart follows.
    assert_eq!(
        restart_step(&before, &slot(SlotState::Ready, 1, 20, "serving")),
        RestartStep::Unchanged
    );
    assert_eq!(
        restart_step(
            &before,
            &slot(SlotState::Draining, 1, 30, "restart\nrequested")
        ),
        RestartStep::Progress("slot qwen/1: draining: restart / requested".into())
    );
    assert_eq!(
        restart_step(&before, &slot(SlotState::Starting, 2, 40, "")),
        RestartStep::Progress("slot qwen/1: starting".into())
    );
    // Merged snapshots: the next one seen is already the new worker.
    assert_eq!(
        restart_step(&before, &slot(SlotState::Ready, 2, 50, "serving")),
        RestartStep::Done("slot qwen/1 is ready again with a new worker (pid 7): serving".into())
    );
    // The request found it failed (given up): a new failure is news.
    let failed = slot(SlotState::Failed, 3, 10, "gave up");
    assert_eq!(restart_step(&failed, &failed), RestartStep::Unchanged);
    assert!(matches!(
        restart_step(&failed, &slot(SlotState::Failed, 4, 60, "exited with status 3")),
        RestartStep::Failed(m) if m.contains("exited with status 3")
    ));
    assert!(matches!(
        restart_step(&before, &slot(SlotState::Quarantined, 1, 60, "card 0000:01:00.0 is quarantined")),
        RestartStep::Failed(m) if m.starts_with("slot qwen/1 cannot restart: it is quarantined")
    ));
    assert_eq!(
        slot_restart_requested_line(
            &Slot {
                worker_pid: 0,
                ..failed
            },
            RestartFollow::Following
        ),
        "restart of slot qwen/1 requested (it was failed); following it until a new worker is ready (Ctrl-C stops following, not the restart)"
    );
}

fn cache_variant(model: &str, key: &str, state: &str, used_by: &[&str]) -> CacheVariant {
    CacheVariant {
        model: model.into(),
        key: key.into(),
        state: state.into(),
        reason: String::new(),
        bytes: 0,
        files: 0,
        used_by: used_by.iter().map(|s| s.to_string()).collect(),
        inputs: Default::default(),
    }
}

fn cache() -> ListCacheResponse {
    ListCacheResponse {
        cache_dir: "/var/cache/tt-serving".into(),
        variants: vec![
            CacheVariant {
                reason: "weights/l3.bin: expected 4096 bytes, found 0\n(truncated)".into(),
                bytes: 812 << 20,
                ..cache_variant("llama", "1111222233334444", "incomplete", &["llama"])
            },
            CacheVariant {
                bytes: 10 * (1 << 30) + (1 << 29),
                files: 240,
                inputs: [
                    ("tp".to_string(), "2".to_string()),
                    (
                        "checkpoint".to_string(),
                        "/m/q.gguf size=1 mtime=2".to_string(),
                    ),
                ]
                .into(),
                ..cache_variant("qwen", "3f2a9c0d1e2b4a5c", "warm", &["qwen/0", "qwen/1"])
            },
            cache_variant("qwen", "ffff000000000000", "cold", &[]),
        ],
        models: vec!["llama".into(), "qwen".into(), "smol".into()],
    }
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
    let verdict = cache_verdict("qwen", &cache());
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
    let incomplete = cache_verdict("llama", &cache());
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
    let cold = cache_verdict("qwen", &listing);
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
    let stale = cache_verdict("qwen", &listing);
    assert_eq!(
        stale.outcome,
        Err(
            "qwen: none of its 2 cache variant(s) on disk is the one its current config \
             selects (no slot uses them): a cold build will happen at the next start"
                .to_string()
        )
    );

    let none = cache_verdict("smol", &cache());
    assert_eq!(none.listing, "");
    assert_eq!(
        none.outcome,
        Err("no cache for smol yet: the next start builds it cold".to_string())
    );
}

#[test]
fn cache_verdict_of_a_name_the_config_lacks_names_the_models_it_has() {
    let unknown = cache_verdict("ghost", &cache());
    assert_eq!(unknown.listing, "");
    assert_eq!(
        unknown.outcome,
        Err("unknown model `ghost`; the config names these models: llama, qwen, smol".to_string())
    );
    let mut none = cache();
    none.models.clear();
    assert_eq!(
        cache_verdict("ghost", &none).outcome,
        Err("unknown model `ghost`; the config names no models".to_string())
    );

    // A model removed from the config: its variants are still listed, and
    // the verdict says they are left over, with the command that frees them.
    let mut removed = cache();
    removed.models.retain(|m| m != "qwen");
    let verdict = cache_verdict("qwen", &removed);
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

/// Everything `status --json` has to show or leave out: every card shape
/// above, a card in a state this ttctl does not know, slot counters,
/// fields the JSON never had (`lock_dir`, `starts`, `queues`) and a reload.
fn json_sample() -> StatusResponse {
    use tt_serving_proto::v1::{ModelQueue, ReloadOutcome, ReloadReport, ReloadStep};
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
