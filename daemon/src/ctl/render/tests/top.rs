use tt_serving_proto::v1::ModelQueue;

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
            "m/0", "ready", "3", "2/64", "200.0", "1.00", "42", "ms", "5.25", "ms", "1400", "158",
            "MiB"
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
