//! Chaos scenarios: a real daemon and real `tt-worker` processes with the
//! tiny model, at TP=1 and TP=2 on fake cards, while faults are injected
//! (worker kills, hangs, start failures, lying resets, frozen heartbeats, a
//! full cache disk, the daemon itself killed). After each scenario the
//! shared invariant checker (`chaos_support::check_invariants`) runs: every
//! slot settled, the daemon's children exactly its live workers, no orphan
//! worker, file descriptors and threads back to the baseline, no stale card
//! or build lock, no cache variant marked complete that is not, status and
//! metrics agreeing. Each scenario also checks that every client request
//! ended (answer or clear error) within its deadline plus the stall timeout,
//! and that the failure shows in `ttctl status` and `/metrics`.
//!
//! The long soak (thousands of requests) is `bench/soak`, not a test.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::Code;
use tt_fakehw::Fault;
use tt_serving_tests::chaos_support::{
    self as chaos, baseline, check_gone, check_invariants, run_request, End, RequestRecord,
    RequestSpec, MARKER,
};
use tt_serving_tests::{
    model_table, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw,
};

/// Slack over `deadline + stall` for a loaded 2-core machine; the bound is
/// an invariant (nothing hangs), not a speed claim.
const SLACK: Duration = Duration::from_secs(5);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// A daemon with `one` (TP=1 on card 0) and `two` (TP=2 on cards 1 and 2),
/// both with `extra` in their tables and `[restart]` settings `restart`.
struct Rig {
    hw: FakeHw,
    daemon: Daemon,
    model: PathBuf,
    _dir: tempfile::TempDir,
}

fn tables(model: &Path, extra: &str, restart: &str) -> String {
    // One readiness ping at a time: the workers' faults count every token
    // generated (TTW_FAULT_*_AFTER_TOKENS), the pings' included.
    let section = |name: &str| {
        format!("{extra}\n[models.{name}.restart]\n{restart}\n[models.{name}.readiness]\nconcurrency = 1\n")
    };
    // The pair resets only after unclean ends here (not before every
    // start, its default): the tests count the resets kills cause.
    model_table("one", 1, &[0], model, &section("one"))
        + &model_table(
            "two",
            2,
            &[1, 2],
            model,
            &format!("reset_before_start = \"if-unclean\"\n{}", section("two")),
        )
}

fn rig(extra: &str, restart: &str, policy: &'static str) -> Rig {
    let hw = FakeHw::new(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let model = tiny_model(dir.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            policy,
            come_back_secs: 2,
            extra: tables(&model, extra, restart),
            ..Default::default()
        },
    );
    Rig {
        hw,
        daemon,
        model,
        _dir: dir,
    }
}

impl Rig {
    fn worker_pid(&self, slot: &str) -> i32 {
        let pid = self.daemon.slot(slot)["worker_pid"].as_u64().unwrap_or(0);
        assert!(
            pid > 0,
            "slot {slot} has no worker: {:#}",
            self.daemon.slot(slot)
        );
        pid as i32
    }

    /// Wait until the slot is Ready with a worker other than `old`.
    fn wait_new_worker(&self, slot: &str, old: i32) -> i32 {
        wait_until(
            &format!("slot {slot} to be ready with a new worker"),
            || {
                let s = self.daemon.slot(slot);
                let pid = s["worker_pid"].as_u64().unwrap_or(0) as i32;
                (s["state"] == "ready" && pid != 0 && pid != old).then_some(pid)
            },
        )
    }

    fn reload_with(&self, extra: &str, restart: &str) {
        self.daemon.rewrite_config(
            &self.hw,
            &DaemonOptions {
                come_back_secs: 2,
                extra: tables(&self.model, extra, restart),
                ..Default::default()
            },
        );
        let out = self.daemon.ttctl(&["reload"]);
        assert!(out.status.success(), "reload: {}", output_text(&out));
    }
}

fn spec(model: &str, deadline: Duration) -> RequestSpec {
    RequestSpec {
        model: model.into(),
        prompt: "tell me a long story about cards".into(),
        max_tokens: 64,
        deadline,
        cancel_after: None,
        guard: Duration::from_secs(60),
    }
}

/// Send `n` requests at once; returns their handles and a receiver told of
/// each first chunk.
fn send(
    rt: &tokio::runtime::Runtime,
    address: &str,
    n: usize,
    spec: &RequestSpec,
) -> (
    Vec<tokio::task::JoinHandle<RequestRecord>>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let handles = (0..n)
        .map(|_| {
            let (address, spec, tx) = (address.to_string(), spec.clone(), tx.clone());
            rt.spawn(async move {
                match chaos::connect(&address).await {
                    Ok(channel) => run_request(channel, &spec, Some(tx)).await,
                    Err(status) => RequestRecord {
                        end: End::Errored {
                            code: status.code(),
                            message: status.message().into(),
                        },
                        took: Duration::ZERO,
                        deadline: spec.deadline,
                    },
                }
            })
        })
        .collect();
    (handles, rx)
}

fn finish(
    rt: &tokio::runtime::Runtime,
    handles: Vec<tokio::task::JoinHandle<RequestRecord>>,
) -> Vec<RequestRecord> {
    handles
        .into_iter()
        .map(|h| rt.block_on(h).expect("request task"))
        .collect()
}

fn kill(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal the worker");
}

fn series(name: &str, labels: &str) -> String {
    format!("{name}{{{labels}}}")
}

/// Every request a model received is in `tt_serving_requests_total` once.
fn assert_counted(metrics: &chaos::Scrape, model: &str, sent: usize) {
    let counted = metrics.sum("tt_serving_requests_total", &[("model", model)]);
    assert_eq!(
        counted, sent as f64,
        "requests to {model} counted in the metrics:\n{}",
        metrics.text
    );
}

/// What the clients saw is what the metrics count, outcome by outcome.
fn assert_outcomes_match(m: &chaos::Scrape, records: &[RequestRecord]) {
    let seen = |kind: &str| records.iter().filter(|r| r.kind() == kind).count() as f64;
    let counted = |o: &str| m.sum("tt_serving_requests_total", &[("outcome", o)]);
    let pairs = [
        (counted("ok"), seen("ok"), "ok"),
        (counted("deadline"), seen("DeadlineExceeded"), "deadline"),
        (
            counted("worker_error") + counted("unavailable"),
            seen("Unavailable"),
            "worker_error + unavailable",
        ),
        (counted("cancelled"), seen("client_cancelled"), "cancelled"),
    ];
    for (counted, seen, outcome) in pairs {
        assert_eq!(
            counted, seen,
            "requests ending {outcome}: metrics vs clients {records:?}\n{}",
            m.text
        );
    }
}

/// Both slots Ready, their workers hanging after `hang_after` tokens (so
/// streams stay open), with a watchdog stall timeout of `stall_secs`.
fn hanging_rig(hang_after: u32, stall_secs: u64) -> (Rig, Duration) {
    let rig = rig(
        &format!(
            "env = {{ TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"{hang_after}\" }}"
        ),
        &format!("backoff_ms = 50\nstall_timeout_secs = {stall_secs}"),
        "never",
    );
    rig.daemon.wait_slot_state("one", "ready");
    rig.daemon.wait_slot_state("two", "ready");
    (rig, Duration::from_secs(stall_secs))
}

#[test]
fn workers_killed_mid_stream_repeatedly_end_their_streams_and_recover() {
    // The hang keeps every stream open after a few tokens, so each kill
    // lands mid-stream; the stall timeout is long so the watchdog stays out
    // of it.
    let (rig, stall) = hanging_rig(12, 30);
    let base = baseline(&rig.daemon);
    let address = rig.daemon.inference_address();
    let rt = runtime();
    let mut records = Vec::new();
    let mut sent = [0usize; 2];
    for (round, slot) in ["one", "two", "one", "two"].into_iter().enumerate() {
        let pid = rig.worker_pid(slot);
        let (handles, mut started) = send(&rt, &address, 2, &spec(slot, Duration::from_secs(20)));
        sent[round % 2] += 2;
        rt.block_on(started.recv()).expect("a stream started");
        wait_until("both requests to be on the worker", || {
            (rig.daemon.slot(slot)["requests_in_flight"] == 2).then_some(())
        });
        kill(pid, nix::sys::signal::Signal::SIGKILL);
        let ended = finish(&rt, handles);
        for r in &ended {
            match &r.end {
                End::Errored { code, message } => {
                    assert_eq!(*code, Code::Unavailable, "{r:?}");
                    assert!(message.contains(&format!("slot {slot}")), "{r:?}");
                    // With the hint from the slot's last start.
                    assert!(message.contains("retry in about"), "{r:?}");
                }
                other => panic!("a stream whose worker was killed ended {other:?}"),
            }
        }
        records.extend(ended);
        rig.wait_new_worker(slot, pid);
    }
    chaos::assert_bounded(&records, stall, SLACK);

    let report = check_invariants(&rig.daemon, &base);
    let m = &report.metrics;
    for slot in ["one", "two"] {
        assert_eq!(
            m.sum(
                "tt_serving_worker_restarts_total",
                &[("slot", slot), ("cause", "signal")]
            ),
            2.0,
            "{}",
            m.text
        );
        let s = rig.daemon.slot(slot);
        assert!(
            s["last_error"].as_str().unwrap_or("").contains("SIGKILL"),
            "{s:#}"
        );
    }
    for card in 0..3 {
        let bdf = FakeHw::bdf(card);
        assert_eq!(
            m.get(&series(
                "tt_serving_card_resets_total",
                &format!("card=\"{bdf}\",outcome=\"proven\"")
            )),
            Some(2.0),
            "each kill resets the slot's cards: {}",
            m.text
        );
    }
    assert_counted(m, "one", sent[0]);
    assert_counted(m, "two", sent[1]);
    assert_eq!(
        m.sum("tt_serving_requests_total", &[("outcome", "worker_error")]),
        (sent[0] + sent[1]) as f64
    );
    assert_outcomes_match(m, &records);
}

#[test]
fn hung_and_frozen_workers_end_every_request_within_its_bound() {
    let (rig, stall) = hanging_rig(8, 2);
    let base = baseline(&rig.daemon);
    let address = rig.daemon.inference_address();
    let rt = runtime();
    // A worker that stops decoding (its RPCs still answer): the watchdog
    // kills it, long deadlines end with UNAVAILABLE, a short one with
    // DEADLINE_EXCEEDED.
    let old = [rig.worker_pid("one"), rig.worker_pid("two")];
    let (mut handles, _) = send(&rt, &address, 2, &spec("one", Duration::from_secs(20)));
    handles.extend(send(&rt, &address, 2, &spec("two", Duration::from_secs(20))).0);
    handles.extend(send(&rt, &address, 1, &spec("two", Duration::from_secs(1))).0);
    let mut records = finish(&rt, handles);
    chaos::assert_bounded(&records, stall, SLACK);
    let codes: Vec<String> = records.iter().map(RequestRecord::kind).collect();
    assert_eq!(
        codes[..4].iter().filter(|c| *c == "Unavailable").count(),
        4,
        "{records:?}"
    );
    // Its deadline passes before the watchdog acts (unless the machine is
    // so loaded that it arrived after the kill).
    assert!(
        ["DeadlineExceeded", "Unavailable"].contains(&codes[4].as_str()),
        "{records:?}"
    );
    let new_one = rig.wait_new_worker("one", old[0]);
    rig.wait_new_worker("two", old[1]);

    // A worker frozen altogether (SIGSTOP: not even its RPCs answer): the
    // request's deadline still holds, and the watchdog kills the worker.
    kill(new_one, nix::sys::signal::Signal::SIGSTOP);
    let (handles, _) = send(&rt, &address, 1, &spec("one", Duration::from_secs(2)));
    let frozen = finish(&rt, handles);
    chaos::assert_bounded(&frozen, stall, SLACK);
    assert_eq!(frozen[0].kind(), "DeadlineExceeded", "{frozen:?}");
    records.extend(frozen);
    rig.wait_new_worker("one", new_one);

    let report = check_invariants(&rig.daemon, &base);
    let m = &report.metrics;
    for (slot, kills) in [("one", 2.0), ("two", 1.0)] {
        // A frozen worker is the watchdog's (unanswered Health), a hung
        // decode the stall's.
        let watchdog = ["watchdog", "stalled"]
            .iter()
            .map(|cause| {
                m.sum(
                    "tt_serving_worker_restarts_total",
                    &[("slot", slot), ("cause", cause)],
                )
            })
            .sum::<f64>();
        assert!(watchdog >= kills, "{slot}: {}", m.text);
    }
    assert!(
        rig.daemon.slot("one")["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("hung"),
        "{:#}",
        rig.daemon.slot("one")
    );
    assert_counted(m, "one", 3);
    assert_counted(m, "two", 3);
    assert_outcomes_match(m, &records);
}

#[test]
fn workers_that_exit_at_start_give_up_answer_unavailable_and_recover_after_a_fix() {
    let rig = rig(
        "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_EXIT_AT_START = \"3\" }",
        "max_attempts = 3\nbackoff_ms = 50",
        "never",
    );
    let base = baseline(&rig.daemon);
    for slot in ["one", "two"] {
        let s = rig.daemon.slot(slot);
        assert_eq!(s["state"], "failed", "{s:#}");
        let reason = s["reason"].as_str().unwrap_or("");
        assert!(reason.contains("gave up"), "{reason}");
        assert!(reason.contains("exited with status 3"), "{reason}");
    }
    let address = rig.daemon.inference_address();
    let rt = runtime();
    let (mut handles, _) = send(&rt, &address, 2, &spec("one", Duration::from_secs(5)));
    handles.extend(send(&rt, &address, 2, &spec("two", Duration::from_secs(5))).0);
    let records = finish(&rt, handles);
    chaos::assert_bounded(&records, Duration::ZERO, SLACK);
    for r in &records {
        match &r.end {
            End::Errored { code, message } => {
                assert_eq!(*code, Code::Unavailable, "{r:?}");
                assert!(message.contains("has no ready slot"), "{r:?}");
            }
            other => panic!("a request to a failed model ended {other:?}"),
        }
    }
    let report = check_invariants(&rig.daemon, &base);
    assert!(report.workers.is_empty());
    let m = &report.metrics;
    for slot in ["one", "two"] {
        // The same exit twice gives up (restart.max_identical, default 2)
        // before max_attempts (3) would: a deterministic failure is not
        // retried for its own sake.
        assert_eq!(
            m.sum(
                "tt_serving_worker_restarts_total",
                &[("slot", slot), ("cause", "start_failed")]
            ),
            2.0,
            "{}",
            m.text
        );
        assert_eq!(
            m.sum(
                "tt_serving_slot_state",
                &[("slot", slot), ("state", "failed")]
            ),
            1.0
        );
    }
    assert_eq!(
        m.sum("tt_serving_requests_total", &[("outcome", "unavailable")]),
        4.0,
        "{}",
        m.text
    );

    // The fix: the fault removed from the config, reloaded.
    assert_outcomes_match(m, &records);
    rig.reload_with("", "backoff_ms = 50");
    rig.daemon.wait_slot_state("one", "ready");
    rig.daemon.wait_slot_state("two", "ready");
    // Two workers now run; compare with a baseline that has them.
    let with_workers = baseline(&rig.daemon);
    check_invariants(&rig.daemon, &with_workers);
}

#[test]
fn a_reset_that_lies_quarantines_the_card_and_nothing_hangs() {
    let rig = rig("", "backoff_ms = 50", "never");
    rig.daemon.wait_slot_state("one", "ready");
    rig.daemon.wait_slot_state("two", "ready");
    let base = baseline(&rig.daemon);
    let bdf = FakeHw::bdf(0);
    // tt-smi -r exits 0, but the card never comes back.
    rig.hw
        .root
        .set_fault(&bdf, Fault::NeverReturns)
        .expect("set the fault");
    let pid = rig.worker_pid("one");
    kill(pid, nix::sys::signal::Signal::SIGKILL);
    let card = rig.daemon.wait_card_state(&bdf, "quarantined");
    assert!(
        card["state_reason"]
            .as_str()
            .unwrap_or("")
            .contains("quarantined after"),
        "{card:#}"
    );
    let slot = rig.daemon.wait_slot_state("one", "quarantined");
    assert!(
        slot["reason"].as_str().unwrap_or("").contains(&bdf),
        "{slot:#}"
    );
    let address = rig.daemon.inference_address();
    let rt = runtime();
    let (mut handles, _) = send(&rt, &address, 2, &spec("one", Duration::from_secs(5)));
    handles.extend(send(&rt, &address, 1, &spec("two", Duration::from_secs(20))).0);
    let records = finish(&rt, handles);
    chaos::assert_bounded(&records, Duration::ZERO, SLACK);
    assert_eq!(records[0].kind(), "Unavailable", "{records:?}");
    assert_eq!(records[1].kind(), "Unavailable", "{records:?}");
    assert_eq!(
        records[2].kind(),
        "ok",
        "the other slot serves: {records:?}"
    );
    let report = check_invariants(&rig.daemon, &base);
    let m = &report.metrics;
    assert_outcomes_match(m, &records);
    assert_eq!(
        m.get(&series(
            "tt_serving_card_resets_total",
            &format!("card=\"{bdf}\",outcome=\"failed\"")
        )),
        Some(1.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(
            "tt_serving_slot_state",
            &[("slot", "one"), ("state", "quarantined")]
        ),
        1.0
    );
    // The quarantined card stays locked by the daemon (nobody else may pick
    // it up), and the record survives in the state dir.
    assert_eq!(
        rig.daemon.card(&bdf)["lock_holder"]["pid"],
        rig.daemon.pid(),
        "{:#}",
        rig.daemon.card(&bdf)
    );
    assert!(rig
        .daemon
        .dir
        .join(format!("state/quarantine/{bdf}.reason"))
        .exists());
    let table = output_text(&rig.daemon.ttctl(&["status"]));
    assert!(table.contains("quarantined"), "{table}");

    // Fixed: the card answers again and an operator reset lifts quarantine.
    rig.hw.root.clear_fault(&bdf).expect("clear the fault");
    wait_until("an operator reset of the card to be proven", || {
        rig.daemon
            .ttctl(&["card", "reset", &bdf])
            .status
            .success()
            .then_some(())
    });
    rig.wait_new_worker("one", pid);
    check_invariants(&rig.daemon, &base);
}

#[test]
fn a_frozen_heartbeat_under_a_hung_tp2_worker_quarantines_the_slot() {
    let rig = rig(
        "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"8\" }",
        "backoff_ms = 50\nstall_timeout_secs = 2",
        "never",
    );
    rig.daemon.wait_slot_state("one", "ready");
    rig.daemon.wait_slot_state("two", "ready");
    let base = baseline(&rig.daemon);
    let frozen = FakeHw::bdf(2);
    rig.hw
        .root
        .set_fault(&frozen, Fault::FrozenHeartbeat)
        .expect("set the fault");
    let address = rig.daemon.inference_address();
    let rt = runtime();
    let (handles, _) = send(&rt, &address, 2, &spec("two", Duration::from_secs(20)));
    let records = finish(&rt, handles);
    chaos::assert_bounded(&records, Duration::from_secs(2), SLACK);
    for r in &records {
        assert_eq!(r.kind(), "Unavailable", "{r:?}");
    }
    let card = rig.daemon.wait_card_state(&frozen, "quarantined");
    assert!(
        card["state_reason"]
            .as_str()
            .unwrap_or("")
            .contains("heartbeat"),
        "{card:#}"
    );
    rig.daemon.wait_slot_state("two", "quarantined");
    let report = check_invariants(&rig.daemon, &base);
    let m = &report.metrics;
    assert_eq!(
        m.get(&series(
            "tt_serving_card_resets_total",
            &format!("card=\"{frozen}\",outcome=\"failed\"")
        )),
        Some(1.0),
        "{}",
        m.text
    );
    assert!(
        m.get(&series(
            "tt_serving_card_reset_proof_failures_total",
            &format!("card=\"{frozen}\"")
        ))
        .is_some_and(|v| v >= 1.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.sum(
            "tt_serving_worker_restarts_total",
            &[("slot", "two"), ("cause", "watchdog")]
        ) + m.sum(
            "tt_serving_worker_restarts_total",
            &[("slot", "two"), ("cause", "stalled")]
        ),
        1.0
    );
    assert_eq!(
        m.sum(
            "tt_serving_slot_state",
            &[("slot", "two"), ("state", "quarantined")]
        ),
        1.0
    );
    // The TP=1 slot on another card is untouched.
    assert_eq!(rig.daemon.slot("one")["state"], "ready");
}

#[test]
fn a_full_cache_disk_fails_the_cold_build_without_a_marker_and_a_fixed_start_completes() {
    let rig = rig(
        "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_CACHE_WRITE_ERROR = \"3\" }",
        "max_attempts = 2\nbackoff_ms = 50",
        "never",
    );
    let base = baseline(&rig.daemon);
    let cache = rig.daemon.dir.join("cache");
    for slot in ["one", "two"] {
        let s = rig.daemon.slot(slot);
        assert_eq!(s["state"], "failed", "{s:#}");
        let reason = s["reason"].as_str().unwrap_or("");
        assert!(reason.contains("gave up"), "{reason}");
        assert!(reason.contains("No space left on device"), "{reason}");
        assert_eq!(s["cache_mode"], "cold", "{s:#}");
    }
    let variants = chaos::variant_dirs(&cache);
    assert_eq!(variants.len(), 2, "one variant per TP: {variants:?}");
    for v in &variants {
        assert!(
            !v.join(MARKER).exists(),
            "a failed build must not be marked complete: {}",
            v.display()
        );
        let temporaries: Vec<PathBuf> = chaos::files_under(v)
            .into_iter()
            .filter(|f| f.to_string_lossy().contains(".tmp."))
            .collect();
        assert!(temporaries.is_empty(), "{temporaries:?}");
    }
    let report = check_invariants(&rig.daemon, &base);
    let m = &report.metrics;
    for model in ["one", "two"] {
        assert_eq!(
            m.sum(
                "tt_serving_cache_builds_total",
                &[("model", model), ("outcome", "failed")]
            ),
            2.0,
            "{}",
            m.text
        );
        assert_eq!(
            m.sum(
                "tt_serving_worker_restarts_total",
                &[("slot", model), ("cause", "start_failed")]
            ),
            2.0
        );
    }

    // Space again: the next start builds cold and completes.
    rig.reload_with("", "backoff_ms = 50");
    for slot in ["one", "two"] {
        let s = rig.daemon.wait_slot_state(slot, "ready");
        assert_eq!(s["cache_mode"], "cold", "{s:#}");
    }
    for v in chaos::variant_dirs(&cache) {
        assert!(v.join(MARKER).exists(), "{}", v.display());
    }
    let with_workers = baseline(&rig.daemon);
    let m = check_invariants(&rig.daemon, &with_workers).metrics;
    assert_eq!(
        m.sum("tt_serving_cache_builds_total", &[("outcome", "ok")]),
        2.0
    );
}

#[test]
fn a_daemon_killed_with_workers_running_takes_them_along_and_its_successor_resets_and_recovers() {
    // reset.policy = "never": only the dirty record written while the
    // workers ran can make the next daemon reset the cards.
    let mut rig = rig(
        "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"12\" }",
        "backoff_ms = 50\nstall_timeout_secs = 30",
        "never",
    );
    rig.daemon.wait_slot_state("one", "ready");
    rig.daemon.wait_slot_state("two", "ready");
    let workers = [rig.worker_pid("one"), rig.worker_pid("two")];
    let first_pid = rig.daemon.pid();
    let address = rig.daemon.inference_address();
    let rt = runtime();
    let (mut handles, mut started) = send(&rt, &address, 1, &spec("one", Duration::from_secs(20)));
    let (more, mut started_two) = send(&rt, &address, 1, &spec("two", Duration::from_secs(20)));
    handles.extend(more);
    rt.block_on(started.recv())
        .expect("a stream to one started");
    rt.block_on(started_two.recv())
        .expect("a stream to two started");
    assert!(rig.hw.smi_calls().is_empty(), "{:?}", rig.hw.smi_calls());

    rig.daemon.kill9();
    let records = finish(&rt, handles);
    chaos::assert_bounded(&records, Duration::ZERO, SLACK);
    for r in &records {
        assert!(
            matches!(r.end, End::Errored { .. }),
            "a stream through a killed daemon ended {r:?}"
        );
    }
    // The workers die with the daemon (parent-death signal); no lock is
    // left behind.
    // (check_gone waits for every live worker of this daemon to be gone; a
    // dead one may linger as a zombie where pid 1 does not reap.)
    check_gone(&rig.daemon.dir, &rig.daemon.lock_dir);
    assert_eq!(workers.len(), 2);
    let dirty = chaos::files_under(&rig.daemon.dir.join("state/dirty"));
    assert_eq!(
        dirty.len(),
        3,
        "every card in use is recorded dirty: {dirty:?}"
    );

    rig.daemon.spawn(&[]);
    assert_ne!(rig.daemon.pid(), first_pid);
    rig.daemon.wait_slot_state("one", "ready");
    rig.daemon.wait_slot_state("two", "ready");
    let calls = rig.hw.smi_calls();
    assert!(
        calls.iter().any(|c| c == "--no_reinit -r 0000:01:00.0"),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c == "--no_reinit -r 0000:02:00.0,0000:03:00.0"),
        "{calls:?}"
    );
    let base = baseline(&rig.daemon);
    let report = check_invariants(&rig.daemon, &base);
    for slot in ["one", "two"] {
        assert_eq!(report.status["slots"].as_array().map(Vec::len), Some(2));
        let s = rig.daemon.slot(slot);
        assert_eq!(s["cache_mode"], "warm", "{s:#}");
    }
    for card in 0..3 {
        assert_eq!(
            report.metrics.get(&series(
                "tt_serving_card_resets_total",
                &format!("card=\"{}\",outcome=\"proven\"", FakeHw::bdf(card))
            )),
            Some(1.0),
            "{}",
            report.metrics.text
        );
    }
    // A clean stop leaves clean cards: no dirty record, and the locks go.
    let (dir, locks) = (rig.daemon.dir.clone(), rig.daemon.lock_dir.clone());
    assert_eq!(rig.daemon.terminate(), Some(0));
    check_gone(&dir, &locks);
    assert!(chaos::files_under(&dir.join("state/dirty")).is_empty());
}

#[test]
fn requests_abandoned_while_queued_are_counted() {
    // One request at a time; the hang keeps it in flight so the next ones
    // wait for admission.
    let rig = rig(
        "max_in_flight = 1\nenv = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"8\" }",
        "stall_timeout_secs = 600",
        "never",
    );
    rig.daemon.wait_slot_state("one", "ready");
    let address = rig.daemon.inference_address();
    let rt = runtime();
    let (busy, mut started) = send(&rt, &address, 1, &spec("one", Duration::from_secs(60)));
    rt.block_on(started.recv())
        .expect("the first request streams");
    // Waits for the slot, then its client goes away.
    let (queued, _) = send(&rt, &address, 1, &spec("one", Duration::from_secs(60)));
    wait_until("the second request to wait in the queue", || {
        let m = chaos::scrape(&rig.daemon);
        (m.sum("tt_serving_num_requests_waiting", &[("model", "one")]) == 1.0).then_some(())
    });
    queued.into_iter().for_each(|h| h.abort());
    // Waits past its deadline.
    let (late, _) = send(&rt, &address, 1, &spec("one", Duration::from_millis(500)));
    let late = finish(&rt, late);
    assert_eq!(late[0].kind(), "DeadlineExceeded", "{late:?}");
    busy.into_iter().for_each(|h| h.abort());
    wait_until("all three requests to be counted", || {
        let m = chaos::scrape(&rig.daemon);
        let counted = |o: &str| {
            m.sum(
                "tt_serving_requests_total",
                &[("model", "one"), ("outcome", o)],
            )
        };
        (counted("cancelled") == 2.0 && counted("deadline") == 1.0).then_some(())
    });
}
