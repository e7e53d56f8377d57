use super::*;
use tt_serving_proto::v1::{CardProcess, LockHolder, Telemetry};

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
    }
}

fn daemon_lock() -> Option<LockHolder> {
    Some(LockHolder {
        pid: 812,
        purpose: "tt-servingd".into(),
        is_daemon: true,
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
            "tt-servingd 0.1.0 (pid 812, driver 2.0.0, inference on 127.0.0.1:50051, up 2h03m): \
              1/2 slots ready"
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
        card_state_word(CardState::HeldElsewhere as i32),
        "held-elsewhere"
    );
    assert_eq!(card_state_word(CardState::Unmanaged as i32), "unmanaged");
    assert_eq!(card_state_word(99), "unknown");
    assert_eq!(slot_state_word(SlotState::Verifying as i32), "verifying");
    assert_eq!(
        slot_state_word(SlotState::Quarantined as i32),
        "quarantined"
    );
    assert_eq!(slot_state_word(-1), "unknown");
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
    let text = serde_json::to_string(&status_json(&status())).unwrap();
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
    let json = status_json(&StatusResponse {
        cards: vec![unmanaged],
        ..Default::default()
    });
    let v = serde_json::to_value(&json).unwrap();
    assert_eq!(v["cards"][0]["lock_holder"], serde_json::Value::Null);
    assert_eq!(v["cards"][0]["state"], "unmanaged");
    assert_eq!(v["slots"], serde_json::json!([]));
}

#[test]
fn json_round_trips_through_the_public_types() {
    let json = status_json(&status());
    let text = serde_json::to_string_pretty(&json).unwrap();
    let back: StatusJson = serde_json::from_str(&text).unwrap();
    assert_eq!(back, json);
}
