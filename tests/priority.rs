//! Priorities and fair share in a saturated model's queue (#45), end to
//! end over the OpenAI door: one slot of one place, held busy by the test
//! worker's hold file (`TTW_FAULT_HOLD_FILE`: the engine takes no step
//! while it exists), requests queued behind it in a known order, then the
//! hold released: the slot serves them one at a time, each prefill
//! stalled 300 ms (`TTW_FAULT_PREFILL_STALL_MS`), so the order they finish
//! in is the order the queue served them.

use std::path::Path;
use std::sync::{Arc, Mutex};
use tt_serving_tests::chaos_support as chaos;
use tt_serving_tests::{
    curl, model_table, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw,
};

/// Key A and C: the default limit (0); key B may ask down to -5.
const A: &str = "sk-priority-a-0001";
const B: &str = "sk-priority-b-0002";
const C: &str = "sk-priority-c-0003";

fn start(hw: &FakeHw, dir: &Path, hold: &Path) -> Daemon {
    use std::os::unix::fs::PermissionsExt;
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("{A} team-a\n{B} team-b min_priority=-5\n{C} team-c\n"),
    )
    .expect("write tokens");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let model = tiny_model(dir);
    let table = format!(
        "max_in_flight = 1\nmax_queue = 16\nenv = {{ TTW_TEST_FAULTS = \"1\", TTW_FAULT_PREFILL_STALL_MS = \"300\", TTW_FAULT_HOLD_FILE = \"{}\" }}\n",
        hold.display()
    );
    let daemon = Daemon::start(
        hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n\n[inference]\ntokens_file = \"{}\"\n\n{}",
                tokens.display(),
                model_table("m", 1, &[0], &model, &table)
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    daemon
}

fn base(daemon: &Daemon) -> String {
    let address = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!address.is_empty(), "no openai_address in status");
    format!("http://{address}")
}

fn body(priority: i32) -> String {
    format!(
        r#"{{"model":"m","prompt":"hello","max_tokens":2,"temperature":0,"priority":{priority}}}"#
    )
}

/// Hold the slot, queue `requests` (label, token, priority) one after the
/// other (each seen waiting before the next is sent), release the slot:
/// the labels in the order their answers came.
fn served_order(
    daemon: &Daemon,
    hold: &Path,
    requests: &[(&'static str, &str, i32)],
) -> Vec<&'static str> {
    let base = base(daemon);
    let waiting =
        || chaos::scrape(daemon).sum("tt_serving_num_requests_waiting", &[("model", "m")]);
    std::fs::write(hold, "").expect("create the hold file");
    let order = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        // The blocker: admitted by the slot, which then takes no step.
        let blocker = {
            let base = base.clone();
            s.spawn(move || {
                curl(
                    "POST",
                    &format!("{base}/v1/completions"),
                    Some(A),
                    Some(&body(0)),
                )
            })
        };
        wait_until("the blocker to run", || {
            (chaos::scrape(daemon).sum("tt_serving_num_requests_running", &[("model", "m")]) == 1.0)
                .then_some(())
        });
        for (n, (label, token, priority)) in requests.iter().enumerate() {
            let (base, order) = (base.clone(), order.clone());
            let (label, token, priority) = (*label, token.to_string(), *priority);
            s.spawn(move || {
                let answer = curl(
                    "POST",
                    &format!("{base}/v1/completions"),
                    Some(&token),
                    Some(&body(priority)),
                );
                assert_eq!(answer.status, 200, "{label}: {answer:?}");
                order.lock().unwrap().push(label);
            });
            wait_until(&format!("{label} to wait in the queue"), || {
                (waiting() == (n + 1) as f64).then_some(())
            });
        }
        std::fs::remove_file(hold).expect("release the hold");
        let answer = blocker.join().expect("blocker thread");
        assert_eq!(answer.status, 200, "{answer:?}");
    });
    let order = order.lock().unwrap().clone();
    order
}

#[test]
fn a_more_urgent_request_is_served_before_a_burst_and_keys_at_one_priority_alternate() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold");
    let daemon = start(&hw, dir.path(), &hold);

    // A burst of low-priority (lax) requests from key A, then one urgent
    // request from key B: B first.
    let order = served_order(
        &daemon,
        &hold,
        &[
            ("a1", A, 2),
            ("a2", A, 2),
            ("a3", A, 2),
            ("a4", A, 2),
            ("b", B, -5),
        ],
    );
    assert_eq!(order, ["b", "a1", "a2", "a3", "a4"]);

    // Two keys at the same priority take turns, whoever sent first.
    let order = served_order(
        &daemon,
        &hold,
        &[
            ("a1", A, 0),
            ("a2", A, 0),
            ("a3", A, 0),
            ("c1", C, 0),
            ("c2", C, 0),
        ],
    );
    assert_eq!(order, ["a1", "c1", "a2", "c2", "a3"]);

    // More urgent than the key may ask: refused, naming the limit and the
    // key, never clamped.
    let refused = curl(
        "POST",
        &format!("{}/v1/completions", base(&daemon)),
        Some(A),
        Some(&body(-1)),
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    let message = refused.error()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("min_priority=0"), "{message}");
    assert!(message.contains("team-a"), "{message}");

    // `ttctl generate --priority`: the control socket's request has no
    // token, so it is key `anonymous`, limit 0: later is allowed, sooner
    // refused naming the key and the limit.
    let out = daemon.ttctl(&[
        "generate",
        "m",
        "hello",
        "--max-tokens",
        "2",
        "--priority",
        "3",
    ]);
    assert!(out.status.success(), "{}", output_text(&out));
    let out = daemon.ttctl(&["generate", "m", "hello", "--priority", "-1"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("priority: -1") && text.contains("min_priority=0"),
        "{text}"
    );
    assert!(text.contains("`anonymous`"), "{text}");
    // No tokens file line to change for a request without a token.
    assert!(text.contains("with the token of a key"), "{text}");

    // The queue by priority while it waits.
    std::fs::write(&hold, "").expect("create the hold file");
    let base = base(&daemon);
    std::thread::scope(|s| {
        for (token, priority) in [(A, 0), (A, 1), (B, -5), (B, -5)] {
            let base = base.clone();
            s.spawn(move || {
                curl(
                    "POST",
                    &format!("{base}/v1/completions"),
                    Some(token),
                    Some(&body(priority)),
                )
            });
        }
        wait_until("three requests waiting by priority", || {
            let m = chaos::scrape(&daemon);
            let by = |p: &str| {
                m.sum(
                    "tt_serving_num_requests_waiting_by_priority",
                    &[("model", "m"), ("priority", p)],
                )
            };
            (by("-5") + by("0") + by("1") == 3.0).then_some(())
        });
        std::fs::remove_file(&hold).expect("release the hold");
    });
}
