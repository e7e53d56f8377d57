use super::super::status::card_state_words;
use super::*;

#[test]
fn header_names_version_pid_driver_uptime_and_summary() {
    let table = status_table(&status(), NOW);
    assert_eq!(
        table.lines().next(),
        Some(
            "tt-servingd 0.1.0 (pid 812, driver 2.0.0, inference on 127.0.0.1:50051, \
             OpenAI HTTP on 127.0.0.1:8000, metrics on 127.0.0.1:9464, up 2h03m): 1/2 slots ready"
        )
    );
}

#[test]
fn second_line_says_how_slots_are_contained() {
    let table = status_table(&status(), NOW);
    assert_eq!(
        table.lines().nth(1),
        Some(
            "slots contained by: cgroup v2 at /sys/fs/cgroup/system.slice/tenstorrent-serving.service (memory accounted)"
        )
    );
    // A daemon that does not say (an older one) gets no line.
    let mut older = status();
    if let Some(d) = older.daemon.as_mut() {
        d.containment.clear();
    }
    assert_eq!(status_table(&older, NOW).lines().nth(1), Some(""));
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
        Some("    pid 4242 (python3) has the device open (watching: it does not block the slot)")
    );
    assert_eq!(
        after.next(),
        Some("    pid 4343 (vllm) holds the chip (its tt-umd CHIP_IN_USE lock names it): a second user")
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
fn a_card_whose_reset_hung_reads_apart_from_one_that_failed_its_proof() {
    let mut hung = quarantined_card();
    hung.state_reason = "reset hung: reset did not return within 120s; the host may need a reboot (tt-smi issues 85, 185). No reset of this card is tried automatically".into();
    let mut status = status();
    status.cards = vec![hung.clone(), quarantined_card()];
    status.cards[1].bdf = "0000:05:00.0".into();
    let table = status_table(&status, NOW);
    let row = line_of(&table, "0000:04:00.0  p150a");
    assert!(
        row.trim_end().ends_with("quarantined (reset hung)"),
        "{table}"
    );
    assert!(
        table.contains(
            "reason: reset hung: reset did not return within 120s; the host may need a reboot"
        ),
        "{table}"
    );
    let failed = line_of(&table, "0000:05:00.0  p150a");
    assert_eq!(words(failed).last(), Some(&"quarantined"), "{table}");
    // The words alone, in another state or later in a reason, are no mark.
    let mut resetting = hung.clone();
    resetting.state = CardState::Resetting as i32;
    assert_eq!(card_state_words(&resetting), "resetting");
    let mut quoted = quarantined_card();
    quoted.state_reason = "quarantined after 1 failed reset attempt(s): reset hung: x".into();
    assert_eq!(card_state_words(&quoted), "quarantined");
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
            "12.0",
            "GiB",
            "2",
            "-",
            "-"
        ]
    );
}

#[test]
fn slots_table_shows_the_hit_rate_over_every_request_and_the_trial() {
    let mut on_trial = status();
    on_trial.slots[0].prompt_tokens = 1600;
    on_trial.slots[0].cached_prompt_tokens = 540;
    on_trial.slots[0].trial = "arm b (TTW_KV_F16=1) for issue 17".into();
    let table = status_table(&on_trial, NOW);
    let header = line_of(&table, "NAME  MODEL");
    assert!(header.contains("  INFLIGHT  HIT  LAST ERROR"), "{table}");
    let row = words(line_of(&table, "qwen  qwen"));
    assert_eq!(row[row.len() - 2..], ["34%", "-"], "{table}");
    let mut after = table.lines().skip_while(|l| !l.starts_with("qwen  qwen"));
    after.next();
    assert_eq!(
        after.next(),
        Some(
            "    trial: arm b (TTW_KV_F16=1) for issue 17; the configured definition comes back when the trial ends"
        ),
        "{table}"
    );
    // No trial, no line.
    assert!(!status_table(&status(), NOW).contains("trial:"));
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
