use tt_serving_proto::v1::{ModelQueue, SlotKvMemory};

use super::*;

fn snapshot(tokens: u64, requests: u64) -> StatusResponse {
    StatusResponse {
        slots: vec![Slot {
            name: "m/0".into(),
            model: "m".into(),
            state: SlotState::Ready as i32,
            requests_in_flight: 3,
            generated_tokens: tokens,
            requests_served: requests,
            ttft_p50_ms: 41.7,
            itl_p50_ms: 5.25,
            worker_rss_bytes: 158 << 20,
            kv: Some(SlotKvMemory {
                budget_bytes: 512 << 20,
                block_tokens: 16,
                blocks_total: 1024,
                prefix_cache: true,
                blocks_in_use: 256,
                blocks_cached: 300,
            }),
            ..Default::default()
        }],
        queues: vec![ModelQueue {
            model: "m".into(),
            waiting: 2,
            max_queue: 64,
        }],
        ..Default::default()
    }
}

#[test]
fn rates_come_from_the_difference_between_two_snapshots() {
    let before = snapshot(1000, 10);
    let now = snapshot(1400, 12);
    let frame = top_frame(&now, Some((&before, 2.0)), 0);
    let row = frame
        .lines()
        .find(|l| l.starts_with("m/0"))
        .unwrap_or_default()
        .to_string();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "m/0", "ready", "3", "2/64", "200.0", "1.00", "42", "ms", "5.25", "ms", "-", "25%",
            "1400", "158", "MiB"
        ],
        "{frame}"
    );
    assert!(frame.contains("total: 200.0 tokens/s"), "{frame}");
}

#[test]
fn the_first_frame_has_no_rates() {
    let frame = top_frame(&snapshot(5, 1), None, 0);
    let row = frame
        .lines()
        .find(|l| l.starts_with("m/0"))
        .unwrap_or_default();
    assert!(row.contains(" - "), "{frame}");
    assert!(!frame.contains("total:"), "{frame}");
}

/// `snapshot` with these prompt-token counters.
fn prompts(prompt: u64, cached: u64) -> StatusResponse {
    let mut s = snapshot(1000, 10);
    s.slots[0].prompt_tokens = prompt;
    s.slots[0].cached_prompt_tokens = cached;
    s
}

/// The cells of the `m/0` row under `header`.
fn cell(frame: &str, header: &str) -> String {
    let lines: Vec<&str> = frame.lines().collect();
    let head = lines.iter().find(|l| l.starts_with("SLOT")).unwrap();
    let row = lines.iter().find(|l| l.starts_with("m/0")).unwrap();
    let start = head.find(header).unwrap();
    row[start..].split("  ").next().unwrap().trim().to_string()
}

#[test]
fn the_hit_rate_is_over_the_prompts_between_frames_when_there_were_any() {
    // 600 prompt tokens finished between the frames, 540 of them cached;
    // over all requests it would be 540 of 1600.
    let frame = top_frame(&prompts(1600, 540), Some((&prompts(1000, 0), 2.0)), 0);
    assert!(frame.contains("  HIT  "), "{frame}");
    assert_eq!(cell(&frame, "HIT"), "90%", "{frame}");
}

#[test]
fn without_new_prompts_the_hit_rate_is_over_every_request_else_a_dash() {
    let now = prompts(1600, 540);
    // The first frame, no request between frames, a slot whose counters
    // started again (replaced by a reload): the running total.
    assert_eq!(cell(&top_frame(&now, None, 0), "HIT"), "34%");
    assert_eq!(cell(&top_frame(&now, Some((&now, 2.0)), 0), "HIT"), "34%");
    let replaced = top_frame(&prompts(100, 50), Some((&now, 2.0)), 0);
    assert_eq!(cell(&replaced, "HIT"), "50%");
    // No prompt yet.
    assert_eq!(cell(&top_frame(&prompts(0, 0), None, 0), "HIT"), "-");
}

#[test]
fn kv_is_the_share_of_blocks_running_sequences_hold_or_a_dash() {
    let mut now = snapshot(1000, 10);
    assert_eq!(cell(&top_frame(&now, None, 0), "KV"), "25%");
    // An engine that does not report its KV memory (or a slot not Ready).
    now.slots[0].kv = None;
    assert_eq!(cell(&top_frame(&now, None, 0), "KV"), "-");
}
