//! The renderers' tests, one file per command, on the samples below (and
//! the pinned JSON in `testdata/`).

use tt_serving_proto::v1::{
    CacheVariant, Card, CardProcess, CardState, DaemonInfo, ListCacheResponse, LockHolder, Slot,
    SlotState, StatusResponse, Telemetry,
};
use tt_serving_proto::Word;

use super::*;

mod cache;
mod card;
mod generate;
mod json;
mod logs;
mod reload;
mod slot;
mod status;
mod top;

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
        openai_address: "127.0.0.1:8000".into(),
        lock_dir: "/run/lock/tenstorrent".into(),
        containment: "cgroup v2 at /sys/fs/cgroup/system.slice/tenstorrent-serving.service (memory accounted)".into(),
        hardware: "cards".into(),
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
        processes: vec![
            CardProcess {
                pid: 4242,
                command: "python3".into(),
                holds_chip: false,
            },
            CardProcess {
                pid: 4343,
                command: "vllm".into(),
                holds_chip: true,
            },
        ],
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
        worker_memory_peak_bytes: 12 * (1 << 30),
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
        accuracy: vec![],
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
