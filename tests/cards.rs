//! Cards end to end: discovery, locks shared with outside processes, and
//! resets whose success must be proven, on a fake hardware root.

use std::process::{Command, Stdio};
use tt_fakehw::Fault;
use tt_serving_tests::{output_text, wait_until, Daemon, DaemonOptions, FakeHw};

#[test]
fn discovers_one_two_and_four_cards_by_bdf() {
    for n in [1usize, 2, 4] {
        let hw = FakeHw::new(n);
        let daemon = Daemon::start(&hw, DaemonOptions::default());
        let status = daemon.status();
        let cards = status["cards"].as_array().expect("cards array");
        assert_eq!(cards.len(), n, "{status:#}");
        for (i, card) in cards.iter().enumerate() {
            assert_eq!(card["bdf"], FakeHw::bdf(i));
            assert_eq!(card["index"], i as u64);
            assert_eq!(card["card_type"], "p150a");
            assert_eq!(card["serial"].as_str().map(str::len), Some(16));
            assert!(card["telemetry"]["temperature_c"]
                .as_f64()
                .is_some_and(|t| t > 20.0 && t < 100.0));
            assert!(card["telemetry"]["power_w"]
                .as_f64()
                .is_some_and(|p| p > 0.0));
            // No models configured: the daemon manages every card.
            assert_eq!(card["state"], "idle", "{card:#}");
            assert_eq!(card["lock_holder"]["is_daemon"], true);
        }
        assert!(!status["daemon"]["driver_version"]
            .as_str()
            .unwrap_or("")
            .is_empty());
        // The heartbeat is seen advancing by the daemon's tick.
        daemon_sees_heartbeat(&daemon, &FakeHw::bdf(0));
    }
}

fn daemon_sees_heartbeat(daemon: &Daemon, bdf: &str) {
    wait_until("the heartbeat to be seen advancing", || {
        (daemon.card(bdf)["heartbeat_ok"] == true).then_some(())
    });
}

#[test]
fn externally_locked_card_is_skipped_and_holder_shown() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let opts = DaemonOptions {
        policy: "always",
        ..Default::default()
    };
    let mut daemon = Daemon::configure(&hw, dir.path(), &opts);
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    let lock_file = daemon.lock_dir.join(format!("{}.lock", FakeHw::bdf(0)));
    // A benchmark script holding card 0 the documented way: flock(1).
    let mut holder = Command::new("flock")
        .arg("-x")
        .arg(&lock_file)
        .arg("cat")
        .stdin(Stdio::piped())
        .spawn()
        .expect("flock(1)");
    wait_until("flock to hold the lock", || {
        tt_servingd::cards::lock::try_lock(
            &daemon.lock_dir,
            &FakeHw::bdf(0),
            "probe",
            tt_servingd::cards::lock::LockPolicy::default(),
        )
        .err()
        .map(|_| ())
    });
    daemon.spawn(&[]);
    let card = daemon.wait_card_state(&FakeHw::bdf(0), "held-elsewhere");
    assert_eq!(card["lock_holder"]["pid"], holder.id());
    assert_eq!(card["lock_holder"]["is_daemon"], false);
    // The startup reset (policy always) touched only the card it owns.
    daemon.wait_card_state(&FakeHw::bdf(1), "idle");
    let calls = hw.smi_calls();
    assert!(
        calls.iter().any(|c| c == "--no_reinit -r 0000:02:00.0"),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.contains("/dev/tenstorrent/0")),
        "{calls:?}"
    );
    // The table names the holder too.
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(table.contains(&holder.id().to_string()), "{table}");
    // When the script lets go, the daemon takes the card.
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let card = daemon.wait_card_state(&FakeHw::bdf(0), "idle");
    assert_eq!(card["lock_holder"]["pid"], daemon.pid());
}

#[test]
fn killed_daemon_leaves_no_stale_lock_and_restart_resets_and_retakes_cards() {
    let hw = FakeHw::new(2);
    let opts = DaemonOptions {
        policy: "if-unclean",
        ..Default::default()
    };
    let mut daemon = Daemon::start(&hw, opts.clone());
    daemon.wait_card_state(&FakeHw::bdf(0), "idle");
    daemon.wait_card_state(&FakeHw::bdf(1), "idle");
    // Clean stop: the record lets the next start skip the resets.
    assert_eq!(daemon.terminate(), Some(0));
    let resets_before = hw.smi_calls().len();
    daemon.spawn(&[]);
    daemon.wait_card_state(&FakeHw::bdf(0), "idle");
    daemon.wait_log("no startup reset");
    assert_eq!(
        hw.smi_calls().len(),
        resets_before,
        "clean restart must not reset"
    );

    // kill -9: the kernel drops the flocks with the process.
    daemon.kill9();
    for i in 0..2 {
        tt_servingd::cards::lock::try_lock(
            &daemon.lock_dir,
            &FakeHw::bdf(i),
            "test",
            tt_servingd::cards::lock::LockPolicy::default(),
        )
        .expect("no stale lock after kill -9");
    }
    // The restart sees an unclean stop, resets both cards and takes them back.
    daemon.spawn(&[]);
    wait_until("both cards reset after the unclean stop", || {
        let calls = hw.smi_calls();
        (calls.len() >= resets_before + 2).then_some(())
    });
    for i in 0..2 {
        let card = daemon.wait_card_state(&FakeHw::bdf(i), "idle");
        assert_eq!(card["lock_holder"]["pid"], daemon.pid());
    }
}

#[test]
fn reset_succeeds_and_is_proven() {
    let hw = FakeHw::new(2);
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", "0"]);
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("proven back"), "{text}");
    assert!(
        text.contains("heartbeat"),
        "progress shows the heartbeat check: {text}"
    );
    assert_eq!(
        hw.smi_calls(),
        vec!["--no_reinit -r 0000:01:00.0".to_string()]
    );
    daemon.wait_card_state(&FakeHw::bdf(0), "idle");
}

#[test]
fn lying_reset_is_detected_and_reported() {
    let hw = FakeHw::new(2);
    hw.root
        .set_fault(&FakeHw::bdf(1), Fault::NeverReturns)
        .unwrap();
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", &FakeHw::bdf(1)]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("did not come back"), "{text}");
    assert!(text.contains("exit code is not proof"), "{text}");
    let card = daemon.wait_card_state(&FakeHw::bdf(1), "quarantined");
    assert!(card["state_reason"]
        .as_str()
        .unwrap_or("")
        .contains("did not come back"));
    // The other card was never touched.
    assert_eq!(daemon.card(&FakeHw::bdf(0))["state"], "idle");
}

#[test]
fn new_index_after_reset_is_followed_by_bdf() {
    let hw = FakeHw::new(2);
    hw.root.set_fault(&FakeHw::bdf(0), Fault::NewIndex).unwrap();
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", "0"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let new_index = hw.root.index_of(&FakeHw::bdf(0)).expect("card is back");
    assert_ne!(new_index, 0);
    let card = daemon.wait_card_state(&FakeHw::bdf(0), "idle");
    assert_eq!(card["index"], new_index);
    // The operator can reach it under its new index.
    let out = daemon.ttctl(&["card", "reset", &new_index.to_string()]);
    assert!(out.status.success(), "{}", output_text(&out));
}

#[test]
fn repeated_failures_quarantine_until_an_operator_reset_succeeds() {
    let hw = FakeHw::new(1);
    let bdf = FakeHw::bdf(0);
    hw.root.set_fault(&bdf, Fault::SmiExit1).unwrap();
    let opts = DaemonOptions {
        attempts: 2,
        ..Default::default()
    };
    let mut daemon = Daemon::start(&hw, opts);
    let out = daemon.ttctl(&["card", "reset", "0"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("exited with 1"), "{text}");
    assert_eq!(
        hw.smi_calls().len(),
        2,
        "two attempts: {:?}",
        hw.smi_calls()
    );
    let card = daemon.wait_card_state(&bdf, "quarantined");
    assert!(card["state_reason"]
        .as_str()
        .unwrap_or("")
        .contains("quarantined after 2"));
    // The daemon keeps a quarantined card locked so nobody else picks it up.
    assert_eq!(card["lock_holder"]["is_daemon"], true);
    // Quarantine survives a daemon restart.
    daemon.terminate();
    daemon.spawn(&[]);
    daemon.wait_card_state(&bdf, "quarantined");
    // The operator fixes the card and proves it back.
    hw.root.clear_fault(&bdf).unwrap();
    let out = daemon.ttctl(&["card", "reset", &bdf]);
    assert!(out.status.success(), "{}", output_text(&out));
    daemon.wait_card_state(&bdf, "idle");
}

#[test]
fn frozen_heartbeat_fails_the_proof() {
    let hw = FakeHw::new(1);
    let bdf = FakeHw::bdf(0);
    hw.root.set_fault(&bdf, Fault::FrozenHeartbeat).unwrap();
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", "0"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("heartbeat did not advance"), "{text}");
    let card = daemon.wait_card_state(&bdf, "quarantined");
    assert_eq!(card["heartbeat_ok"], false);
}

#[test]
fn foreign_processes_on_a_card_are_shown() {
    let hw = FakeHw::new(2);
    let me = std::process::id();
    hw.root.set_pids(1, &[me]).unwrap();
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let card = wait_until("the foreign pid to show", || {
        let card = daemon.card(&FakeHw::bdf(1));
        (card["processes"][0]["pid"] == me).then_some(card)
    });
    assert!(!card["processes"][0]["command"]
        .as_str()
        .unwrap_or("")
        .is_empty());
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(table.contains(&me.to_string()), "{table}");
}

#[test]
fn unknown_card_reset_is_refused_with_a_hint() {
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", "7"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("no card 7"), "{text}");
    assert!(hw.smi_calls().is_empty());
}

#[test]
fn configured_models_lock_only_their_cards() {
    let hw = FakeHw::new(3);
    let opts = DaemonOptions {
        extra: format!(
            "[models.pair]\ntp = 2\ncards = [\"{}\", \"{}\"]\ncheckpoint = \"/m/pair.gguf\"\n",
            FakeHw::bdf(0),
            FakeHw::bdf(1)
        ),
        policy: "always",
        ..Default::default()
    };
    let daemon = Daemon::start(&hw, opts);
    for i in 0..2 {
        let card = daemon.wait_card_state(&FakeHw::bdf(i), "ready");
        assert_eq!(card["slot"], "pair");
    }
    // The spare card is left free for others.
    let spare = daemon.wait_card_state(&FakeHw::bdf(2), "unmanaged");
    assert_eq!(spare["lock_holder"], serde_json::Value::Null);
    // A TP=2 slot's cards are reset together in one tt-smi call.
    wait_until("the slot's startup reset", || {
        hw.smi_calls()
            .contains(&"--no_reinit -r 0000:01:00.0,0000:02:00.0".to_string())
            .then_some(())
    });
    let slot = &daemon.status()["slots"][0];
    assert_eq!(slot["name"], "pair");
    assert_eq!(slot["cards"][0], FakeHw::bdf(0));
    assert_eq!(slot["cards"][1], FakeHw::bdf(1));
}

#[test]
fn reset_of_a_card_that_never_returns_shows_the_wait_while_it_runs() {
    use std::io::BufRead;
    let hw = FakeHw::new(2);
    let bdf = FakeHw::bdf(1);
    hw.root.set_fault(&bdf, Fault::NeverReturns).unwrap();
    // Long enough that a silent wait is unmistakable.
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            come_back_secs: 12,
            ..Default::default()
        },
    );
    let mut ttctl = Command::new(tt_serving_tests::bin("ttctl"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["card", "reset", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ttctl");
    // Read ttctl's stdout line by line as it arrives.
    let stdout = ttctl.stdout.take().expect("piped stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let waiting = loop {
        let line = lines
            .recv_timeout(tt_serving_tests::DEADLINE)
            .unwrap_or_else(|_| panic!("ttctl printed no waiting line; it printed {seen:#?}"));
        seen.push(line.clone());
        if line.contains("to come back (") {
            break line;
        }
    };
    // The line arrived while the reset was still running: the card is
    // still being proven, not yet quarantined.
    let card = daemon.card(&bdf);
    assert_eq!(card["state"], "probing", "{card:#}\n{seen:#?}");
    assert!(
        waiting.contains("/dev/tenstorrent/1") && waiting.contains(" s of 12)"),
        "the line names the awaited node and the time spent of the limit: {waiting}"
    );
    // Each phase was shown as it began, before the wait.
    assert!(seen[0].contains("running"), "{seen:#?}");
    assert!(seen[1].contains("waiting up to 12 s"), "{seen:#?}");
    // The status shows the same progress.
    assert!(
        card["state_reason"]
            .as_str()
            .unwrap_or("")
            .contains(" s of 12)"),
        "{card:#}"
    );
    let out = ttctl.wait_with_output().expect("ttctl ends");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not come back within 12s"), "{err}");
    daemon.wait_card_state(&bdf, "quarantined");
}

// ---- Cards as the real stack behaves (tt-smi 6.8, tt-kmd by version) ----

use std::time::{Duration, Instant};
use tt_serving_tests::{generate, model_table, tiny_model};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Every card any tt-smi call reset so far.
fn reset_cards(hw: &FakeHw) -> Vec<String> {
    hw.smi_resets().into_iter().flatten().collect()
}

#[test]
fn an_unplugged_card_fails_its_slot_alone_and_no_reset_touches_another_card() {
    let hw = FakeHw::new(3);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // b's requests stall 2 s in prefill, so one is in flight across the unplug.
    let extra = format!(
        "{}{}",
        model_table("a", 1, &[0], &model, ""),
        model_table(
            "b",
            1,
            &[1],
            &model,
            "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_PREFILL_STALL_MS = \"2000\" }"
        )
    );
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra,
            ..Default::default()
        },
    );
    daemon.wait_slot_state("a", "ready");
    let b_pid = daemon.wait_slot_state("b", "ready")["worker_pid"].clone();
    let address = daemon.inference_address();
    let rt = runtime();
    let stream = rt.spawn(async move { generate(&address, "b", "hello there", 16).await });
    std::thread::sleep(Duration::from_millis(300));

    let (card0, card1, card2) = (FakeHw::bdf(0), FakeHw::bdf(1), FakeHw::bdf(2));
    hw.root.unplug(&card0).unwrap();
    let a = wait_until("slot a to name its missing card", || {
        let slot = daemon.slot("a");
        (slot["state"] != "ready"
            && slot["reason"]
                .as_str()?
                .contains(&format!("card {card0} is missing")))
        .then_some(slot)
    });
    assert_ne!(a["state"], "quarantined", "{a}");
    // The stream on b went on, its worker is the same, b still serves.
    let done = rt.block_on(stream).unwrap().expect("b's stream");
    assert_eq!(done.tokens.len(), 16, "{done:?}");
    let b = daemon.slot("b");
    assert_eq!(b["state"], "ready", "{b}");
    assert_eq!(b["worker_pid"], b_pid, "{b}");
    // Card 0 is gone, so no reset was attempted at all: nothing that could
    // have widened to the other cards.
    assert_eq!(reset_cards(&hw), Vec::<String>::new());
    assert_eq!(daemon.card(&card0)["state"], "missing");

    // Back on the bus: the slot resets its own card, and only it.
    hw.root.plug(&card0).unwrap();
    daemon.wait_slot_state("a", "ready");
    let resets = reset_cards(&hw);
    assert_eq!(resets, vec![card0.clone()], "{resets:?}");
    assert!(!resets.contains(&card1) && !resets.contains(&card2));
    assert_eq!(daemon.slot("b")["worker_pid"], b_pid);
}

#[test]
fn a_tp2_slot_missing_one_card_resets_neither_and_quarantines_neither() {
    let hw = FakeHw::new(3);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("pair", 2, &[0, 1], &model, ""),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("pair", "ready");
    let (card0, card1) = (FakeHw::bdf(0), FakeHw::bdf(1));
    // A two-card slot resets both cards before every start
    // (reset_before_start): one call, both cards.
    assert_eq!(hw.smi_resets(), vec![vec![card0.clone(), card1.clone()]]);
    hw.root.unplug(&card1).unwrap();
    let slot = wait_until("the pair to name its missing card", || {
        let slot = daemon.slot("pair");
        (slot["state"] != "ready"
            && slot["reason"]
                .as_str()?
                .contains(&format!("card {card1} is missing")))
        .then_some(slot)
    });
    assert_ne!(slot["state"], "quarantined", "{slot}");
    // Give the supervisor time to try: it must not call tt-smi with half a
    // slot (a mixed or partial list).
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(hw.smi_resets().len(), 1, "{:?}", hw.smi_resets());
    assert_ne!(daemon.card(&card0)["state"], "quarantined");
    hw.root.plug(&card1).unwrap();
    daemon.wait_slot_state("pair", "ready");
    // Both cards in one call, and nothing else.
    assert_eq!(
        hw.smi_resets(),
        vec![vec![card0.clone(), card1.clone()], vec![card0, card1]]
    );
}

/// A two-card slot's reset in which one card comes back wrong: that card
/// is quarantined; the other, proven back by the same reset, is not.
#[test]
fn a_two_card_reset_quarantines_only_the_card_that_did_not_come_back() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let (card0, card1) = (FakeHw::bdf(0), FakeHw::bdf(1));
    hw.root.set_fault(&card1, Fault::Downtrained).unwrap();
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("pair", 2, &[0, 1], &model, ""),
            ..Default::default()
        },
    );
    let card = daemon.wait_card_state(&card1, "quarantined");
    let reason = card["state_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("downtrained") && reason.contains(&card1),
        "{card}"
    );
    assert!(
        !reason.contains(&card0),
        "card 1's reason blames card 0: {card}"
    );
    // Both cards went through tt-smi in one call.
    assert_eq!(hw.smi_resets()[0], vec![card0.clone(), card1.clone()]);
    let other = daemon.card(&card0);
    assert_ne!(other["state"], "quarantined", "{other}");
    assert_eq!(other["reset_failures"], 0, "{other}");
    let slot = daemon.slot("pair");
    assert_ne!(slot["state"], "ready", "{slot}");
}

#[test]
fn a_reset_of_a_missing_card_is_refused_without_calling_tt_smi() {
    let hw = FakeHw::new(2);
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let card0 = FakeHw::bdf(0);
    hw.root.unplug(&card0).unwrap();
    daemon.wait_card_state(&card0, "missing");
    let calls = hw.smi_calls().len();
    let out = daemon.ttctl(&["card", "reset", &card0]);
    let text = output_text(&out);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("card {card0} is missing")) && text.contains("not attempted"),
        "{text}"
    );
    assert_eq!(hw.smi_calls().len(), calls, "tt-smi was called");
    assert_ne!(daemon.card(&card0)["state"], "quarantined");
}

#[test]
fn resets_name_cards_by_full_address_and_skip_re_initialisation() {
    let hw = FakeHw::new(2);
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    assert_eq!(
        hw.smi_calls(),
        vec![format!("--no_reinit -r {}", FakeHw::bdf(1))]
    );
    assert_eq!(hw.smi_resets(), vec![vec![FakeHw::bdf(1)]]);
}

/// Reset card 0 with these faults on and return the failure text.
fn failed_reset(faults: &[Fault]) -> (FakeHw, Daemon, String) {
    let hw = FakeHw::new(1);
    let bdf = FakeHw::bdf(0);
    for fault in faults {
        hw.root.set_fault(&bdf, *fault).unwrap();
    }
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "reset", "0"]);
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    (hw, daemon, text)
}

#[test]
fn a_reset_whose_ioctl_failed_fails_although_tt_smi_exited_0() {
    let (_hw, daemon, text) = failed_reset(&[Fault::IoctlFails]);
    assert!(
        text.contains("exited 0 but printed")
            && text.contains("Sending reset ioctl to device 0 failed"),
        "{text}"
    );
    daemon.wait_card_state(&FakeHw::bdf(0), "quarantined");
}

#[test]
fn a_reset_that_lost_a_card_fails_on_reset_failed_with_exit_0() {
    let (_hw, _daemon, text) = failed_reset(&[Fault::HotPlug, Fault::NeverReturns]);
    assert!(
        text.contains("exited 0 but printed") && text.contains("Reset failed."),
        "{text}"
    );
}

#[test]
fn a_card_whose_link_comes_back_downtrained_is_not_ready() {
    let (_hw, daemon, text) = failed_reset(&[Fault::Downtrained]);
    assert!(
        text.contains("PCIe link at 8.0 GT/s x4") && text.contains("32.0 GT/s x16"),
        "{text}"
    );
    let card = daemon.wait_card_state(&FakeHw::bdf(0), "quarantined");
    assert!(
        card["state_reason"]
            .as_str()
            .unwrap()
            .contains("downtrained"),
        "{card}"
    );
}

#[test]
fn a_thermal_trip_during_the_reset_fails_it() {
    let (_hw, _daemon, text) = failed_reset(&[Fault::ThermTrip]);
    assert!(text.contains("tt_therm_trip_count 0 -> 1"), "{text}");
}

#[test]
fn resets_are_proven_with_what_an_old_driver_offers_and_no_healthy_card_is_quarantined() {
    for driver in ["2.4.1", "2.6.0"] {
        let hw = FakeHw::with_versions(1, driver, "6.8.0");
        let daemon = Daemon::start(&hw, DaemonOptions::default());
        let out = daemon.ttctl(&["card", "reset", "0"]);
        let text = output_text(&out);
        assert_eq!(out.status.code(), Some(0), "driver {driver}: {text}");
        let card = daemon.wait_card_state(&FakeHw::bdf(0), "idle");
        assert_eq!(card["reset_failures"], 0, "{card}");
        // check-config says what the proof rests on.
        let out = Command::new(tt_serving_tests::bin("tt-servingd"))
            .arg("check-config")
            .arg(&daemon.config)
            .output()
            .unwrap();
        let text = output_text(&out);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains(&format!("tenstorrent driver {driver} has no tt_heartbeat"))
                && text.contains("probe_command"),
            "{text}"
        );
    }
}

#[test]
fn a_driver_too_old_for_tt_umd_and_an_old_tt_smi_are_refused_by_name() {
    for (driver, tt_smi, said) in [
        (
            "1.33.0",
            "6.8.0",
            "tenstorrent driver 1.33.0 is older than 2.0.0",
        ),
        ("2.10.0", "4.1.2", "tt-smi 4.1.2"),
    ] {
        let hw = FakeHw::with_versions(1, driver, tt_smi);
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::configure(&hw, dir.path(), &DaemonOptions::default());
        let out = Command::new(tt_serving_tests::bin("tt-servingd"))
            .arg("check-config")
            .arg(&daemon.config)
            .output()
            .unwrap();
        let text = output_text(&out);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(text.contains(said), "{text}");
        // The daemon refuses to start the same way.
        let text = tt_serving_tests::run_to_exit(&daemon.config);
        assert!(text.contains(said), "{text}");
        if tt_smi == "4.1.2" {
            assert!(text.contains("4.2.0"), "{text}");
        }
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn waiting_on_a_failed_card_costs_the_daemon_next_to_no_cpu() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut daemon = Daemon::configure(
        &hw,
        dir.path(),
        &DaemonOptions {
            extra: model_table("tiny", 1, &[0], &model, ""),
            ..Default::default()
        },
    );
    // A lock path the daemon rightly refuses (a planted link): the card is
    // Failed and the slot waits for it.
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("elsewhere"),
        daemon.lock_dir.join(format!("{}.lock", FakeHw::bdf(0))),
    )
    .unwrap();
    daemon.spawn(&[]);
    wait_until("the slot to wait for its card", || {
        (daemon.slot("tiny")["state"] == "locking").then_some(())
    });
    let pid = daemon.pid();
    let hz: f64 = String::from_utf8(
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let before = cpu_ticks(pid);
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let cpu_s = (cpu_ticks(pid) - before) as f64 / hz;
    let wall_s = began.elapsed().as_secs_f64();
    eprintln!("daemon CPU while waiting: {cpu_s:.2} s in {wall_s:.1} s");
    // A tick (100 ms here) re-reads the cards; the rest of the time the
    // daemon sleeps. The busy loop this replaces used 9.7 s of CPU in 10 s.
    assert!(
        cpu_s < 0.5,
        "the daemon used {cpu_s:.2} s of CPU in {wall_s:.1} s while a slot waited on a failed card"
    );
    assert_eq!(daemon.slot("tiny")["state"], "locking");
}

/// The real tt-umd 0.9.14 (`TT_TTNN_PYTHON`, the venv's python from
/// `scripts/ttnn.sh`), runnable here: its lock lives in `/dev/shm` always,
/// so it runs in a private mount namespace (root, `unshare -m`) with the
/// fake root's `dev/shm` bound there. None: SKIPPED; CI must have it.
fn real_umd_python() -> Option<std::path::PathBuf> {
    let python = std::env::var_os("TT_TTNN_PYTHON").filter(|s| !s.is_empty());
    let usable =
        tt_serving_tests::is_root() && Command::new("unshare").arg("--help").output().is_ok();
    match python {
        Some(p) if usable => Some(p.into()),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI must set TT_TTNN_PYTHON (scripts/ttnn.sh) and run as root (unshare -m)")
        }
        _ => {
            eprintln!("SKIPPED: run as root with TT_TTNN_PYTHON=$(scripts/ttnn.sh) and unshare (util-linux)");
            None
        }
    }
}

/// `tests/engines/umd_lock.py`: tt-umd's own `RobustMutex` taking card
/// `index`'s chip lock in the fake root's `dev/shm`, listed by the fake
/// driver as having the card open (as an engine has). Killed when dropped.
struct UmdHolder<'a> {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    pid: u32,
    hw: &'a FakeHw,
    index: u32,
}

impl<'a> UmdHolder<'a> {
    fn start(hw: &'a FakeHw, python: &std::path::Path, index: u32) -> UmdHolder<'a> {
        use std::io::BufRead;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/umd_lock.py");
        let mut child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind \"$0\" /dev/shm || exit 99; exec \"$1\" \"$2\" \"$3\"")
            .arg(hw.root.shm_dir())
            .arg(python)
            .arg(script)
            .arg(index.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        // tt-umd's own log lines come on stdout too; a reader thread keeps
        // a wait for a line bounded.
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut holder = UmdHolder {
            child,
            stdin,
            lines,
            pid: 0,
            hw,
            index,
        };
        let held = holder.expect("held");
        holder.pid = held.split_whitespace().nth(1).unwrap().parse().unwrap();
        // The node open, as every tt-umd process has it.
        hw.root.add_pid(index, holder.pid).unwrap();
        holder
    }

    /// The next line starting with `word`.
    fn expect(&mut self, word: &str) -> String {
        let deadline = Instant::now() + tt_serving_tests::DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.split_whitespace().next() == Some(word) => return line,
                Ok(other) => eprintln!("umd_lock.py: {other}"),
                Err(e) => panic!(
                    "umd_lock.py said no `{word}` line ({e}); exit: {:?}",
                    self.child.try_wait()
                ),
            }
        }
    }

    fn send(&mut self, word: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{word}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The driver drops a dead process's lines.
        let _ = self.hw.root.remove_pid(self.index, self.pid);
    }
}

impl Drop for UmdHolder<'_> {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A daemon with a `tiny` slot on card 0.
fn tiny_daemon(hw: &FakeHw, dir: &std::path::Path) -> Daemon {
    let model = tiny_model(dir);
    Daemon::start(
        hw,
        DaemonOptions {
            extra: model_table("tiny", 1, &[0], &model, ""),
            ..Default::default()
        },
    )
}

/// The slot waits, naming `pid` as the card's second user.
fn wait_blocked_by(daemon: &Daemon, pid: u32) -> serde_json::Value {
    let slot = wait_until("the slot to name the chip's holder", || {
        let slot = daemon.slot("tiny");
        slot["reason"]
            .as_str()?
            .contains(&format!("pid {pid}"))
            .then_some(slot)
    });
    assert_eq!(slot["state"], "locking", "{slot}");
    slot
}

/// Card 0's process entry for `pid`, once the daemon lists it.
fn card_process(daemon: &Daemon, pid: u32) -> serde_json::Value {
    wait_until(&format!("pid {pid} among card 0's processes"), || {
        daemon.card(&FakeHw::bdf(0))["processes"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["pid"] == pid).cloned())
    })
}

#[test]
fn a_real_tt_umd_holder_blocks_the_slot_until_it_releases_the_chip_though_it_keeps_it_mapped() {
    let Some(python) = real_umd_python() else {
        return;
    };
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let mut holder = UmdHolder::start(&hw, &python, 0);
    let daemon = tiny_daemon(&hw, dir.path());
    wait_blocked_by(&daemon, holder.pid);
    assert_eq!(card_process(&daemon, holder.pid)["holds_chip"], true);
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(
        table.contains(&format!("pid {}", holder.pid)) && table.contains("holds the chip"),
        "{table}"
    );

    // Released, alive, the file still mapped (tt-umd keeps it for the
    // process's life) and the node open: a watcher now.
    holder.send("release");
    holder.expect("released");
    daemon.wait_slot_state("tiny", "ready");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", holder.pid)).unwrap();
    assert!(maps.contains("TT_UMD_LOCK.CHIP_IN_USE_0_PCIe"), "{maps}");
    assert_eq!(card_process(&daemon, holder.pid)["holds_chip"], false);
    let table = output_text(&daemon.ttctl(&["status"]));
    assert!(table.contains("watching"), "{table}");
}

#[test]
fn a_real_tt_umd_holder_killed_holding_the_chip_leaves_it_free() {
    let Some(python) = real_umd_python() else {
        return;
    };
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let mut holder = UmdHolder::start(&hw, &python, 0);
    let daemon = tiny_daemon(&hw, dir.path());
    wait_blocked_by(&daemon, holder.pid);
    holder.kill9();
    // The kernel marked the owner dead; tt-umd's record names the dead.
    let bytes = std::fs::read(hw.root.chip_lock(0)).unwrap();
    let word = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    assert_eq!(word & 0x7fff_ffff, 0x4000_0000, "{bytes:?}");
    daemon.wait_slot_state("tiny", "ready");
    // The next tt-umd taker recovers it silently.
    let again = UmdHolder::start(&hw, &python, 0);
    assert_eq!(card_process(&daemon, again.pid)["holds_chip"], true);
}

/// A model table for slot `name` on card `card`: tt-worker-openai in front
/// of the vLLM stand-in, with `env` (TOML inline-table entries).
fn standin_table(name: &str, card: usize, checkpoint: &std::path::Path, env: &str) -> String {
    let standin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/vllm_standin.py");
    format!(
        "\n[models.{name}]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\nworker = [\"{}\", \"--\", \"python3\", \"{}\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"--max-model-len\", \"4096\"]\ndrain_timeout_secs = 5\nenv = {{ {env} }}\n",
        FakeHw::bdf(card),
        checkpoint.display(),
        tt_serving_tests::bin("tt-worker-openai").display(),
        standin.display(),
    )
}

/// The `sm_segment.*` entries of `dir`, sorted.
fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sm_segment."))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// Restart `slot` and wait for its next worker to be ready.
fn restart(daemon: &Daemon, slot: &str) {
    let before = daemon.slot(slot)["worker_pid"].clone();
    let out = daemon.ttctl(&["slot", "restart", slot]);
    assert!(out.status.success(), "{}", output_text(&out));
    wait_until(&format!("slot {slot}'s next worker"), || {
        let now = daemon.slot(slot);
        (now["state"] == "ready" && now["worker_pid"] != before).then_some(())
    });
}

#[test]
fn a_workers_open_mpi_segments_and_its_cards_stale_hugepages_go_and_nothing_else_does() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let hw = FakeHw::new(3);
    let dir = tempfile::tempdir().unwrap();
    let (shm, huge) = (hw.root.shm_dir(), hw.root.hugepages_dir());
    let outside = dir.path().join("outside");
    std::fs::write(&outside, "not a segment").unwrap();
    // tt-umd's hugepage files left on card 0 (slot a's) and card 2 (no
    // slot's), a link named like card 0's, and a segment older than any
    // worker (the clock's slack is 1 s).
    let stale = huge.join("device_0_0000:01:00.0_a");
    let other_card = huge.join("device_2_0000:03:00.0_a");
    let huge_link = huge.join("device_0_link");
    std::fs::write(&stale, "").unwrap();
    std::fs::write(&other_card, "").unwrap();
    symlink(&outside, &huge_link).unwrap();
    let older = shm.join("sm_segment.older.0.10000.0");
    std::fs::write(&older, "").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // Card 0 open by a monitoring tool: its hugepages are not stale yet.
    let watcher = hw.watcher(0);
    let checkpoint = dir.path().join("standin-model");
    std::fs::write(&checkpoint, "stand-in weights").unwrap();
    // Slot a's engine puts its segment where Open MPI is told; slot b's
    // ignores that and writes into the shared directory.
    let extra = standin_table("a", 0, &checkpoint, "STANDIN_SM_SEGMENT = \"1\"")
        + &standin_table(
            "b",
            1,
            &checkpoint,
            &format!("STANDIN_SM_SEGMENT_DIR = \"{}\"", shm.display()),
        );
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra,
            ..Default::default()
        },
    );
    daemon.wait_slot_state("a", "ready");
    daemon.wait_slot_state("b", "ready");
    let own = shm.join("tt-serving/a");
    let mode = std::fs::symlink_metadata(&own)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let a_first = segments(&own);
    assert_eq!(a_first.len(), 1, "{a_first:?}");
    let b_first: Vec<_> = segments(&shm).into_iter().filter(|p| p != &older).collect();
    assert_eq!(b_first.len(), 1, "{b_first:?}");
    assert!(stale.exists());
    daemon.wait_log("hugepage files of the card kept");

    // Made after the workers started: another user's segment, a link
    // named like a segment, tt-umd's lock of card 2.
    let theirs = shm.join("sm_segment.theirs.65534.20000.0");
    std::fs::write(&theirs, "").unwrap();
    if tt_serving_tests::is_root() {
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    }
    let link = shm.join("sm_segment.link.0.30000.0");
    symlink(&outside, &link).unwrap();
    let lock = hw.root.chip_lock(2);
    std::fs::write(&lock, [7u8; 56]).unwrap();
    drop(watcher);

    restart(&daemon, "a");
    // a's segment went with its worker; b's is mapped by its live engine.
    assert!(!a_first[0].exists(), "{a_first:?}");
    assert_eq!(segments(&own).len(), 1);
    assert!(b_first[0].exists(), "a live engine's segment was removed");
    // Nobody has card 0 open now: its hugepage file went, as files; the
    // link and the other card's file stayed.
    assert!(!stale.exists());
    assert!(other_card.exists());
    assert!(std::fs::symlink_metadata(&huge_link).is_ok());

    restart(&daemon, "b");
    assert!(!b_first[0].exists(), "{b_first:?}");
    // The link went as a link; everything not a worker's stayed.
    assert!(std::fs::symlink_metadata(&link).is_err());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "not a segment");
    assert!(older.exists() && theirs.exists());
    assert_eq!(std::fs::read(&lock).unwrap(), [7u8; 56]);
    let log = daemon.log_text();
    assert!(
        log.contains("file(s) the worker left in its directory"),
        "{log}"
    );
    assert!(log.contains("Open MPI segment(s) the worker left"), "{log}");
    assert!(log.contains("stale hugepage file"), "{log}");
}

// ---- A tt-smi that never returns (tt-smi issues 85, 185) ----

/// Whether `pid` runs (a zombie has ended: an orphan's zombie waits for an
/// init that may never reap it).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(!matches!(state, 'Z' | 'X'))
        })
        .unwrap_or(false)
}

#[test]
fn a_reset_whose_tt_smi_never_returns_is_cut_at_its_deadline_and_only_an_operator_tries_again() {
    let hw = FakeHw::new(1);
    let bdf = FakeHw::bdf(0);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // `extra` goes into the [reset] table first: a 2 s deadline for tt-smi.
    let table = model_table(
        "m",
        1,
        &[0],
        &model,
        "[models.m.restart]\nbackoff_ms = 50\n",
    );
    let mut daemon = Daemon::start(
        &hw,
        DaemonOptions {
            // Every start resets the slot's cards: the restart below must
            // refuse to.
            policy: "always",
            extra: format!("tt_smi_timeout_secs = 2\n{table}"),
            ..Default::default()
        },
    );
    let worker = daemon.wait_slot_state("m", "ready")["worker_pid"]
        .as_u64()
        .unwrap_or(0);
    assert!(worker > 0, "{:#}", daemon.slot("m"));
    hw.root.set_fault(&bdf, Fault::SmiHangs).unwrap();
    let resets_before = hw.smi_resets().len();
    let began = Instant::now();
    // The worker dies uncleanly: the slot resets its card, and that
    // tt-smi never returns.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    let card = daemon.wait_card_state(&bdf, "quarantined");
    assert!(began.elapsed() >= Duration::from_secs(2), "{card:#}");
    let reason = card["state_reason"].as_str().unwrap_or("").to_string();
    assert!(
        reason.starts_with(
            "reset hung: reset did not return within 2s; the host may need a reboot (tt-smi issues 85, 185)"
        ),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("reboot the host, then `ttctl card reset {bdf}`")),
        "{reason}"
    );
    // It was killed with its process group: neither tt-smi nor the child
    // it started runs any more.
    let hung: Vec<_> = hw
        .root
        .tt_smi_log()
        .unwrap()
        .into_iter()
        .filter(|i| i.hung)
        .collect();
    assert_eq!(hung.len(), 1, "{hung:?}");
    assert_eq!(hung[0].pids.len(), 2, "{hung:?}");
    for pid in &hung[0].pids {
        assert!(!runs(*pid), "tt-smi's process {pid} outlived its deadline");
    }
    // `ttctl status` tells it apart from a failed proof, with the hint.
    let text = output_text(&daemon.ttctl(&["status"]));
    let row = text.lines().find(|l| l.contains(&bdf)).unwrap_or_default();
    assert!(
        row.trim_end().ends_with("quarantined (reset hung)"),
        "{text}"
    );
    assert!(
        text.contains("the host may need a reboot (tt-smi issues 85, 185)"),
        "{text}"
    );
    let slot = daemon.wait_slot_state("m", "quarantined");
    assert!(
        slot["reason"].as_str().unwrap_or("").contains("reset hung"),
        "{slot:#}"
    );
    let hung_resets = tt_serving_tests::chaos_support::scrape(&daemon).sum(
        "tt_serving_card_resets_total",
        &[("card", bdf.as_str()), ("outcome", "hung")],
    );
    assert_eq!(hung_resets, 1.0);

    // The slot wants its card back, but no second reset is tried: not by
    // the slot, and not by a restarted daemon's start-up reset.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        hw.smi_resets().len(),
        resets_before + 1,
        "{:?}",
        hw.smi_calls()
    );
    let refusal = format!("automatic reset of {bdf} refused");
    let refusals = daemon.log_text().matches(&refusal).count();
    daemon.terminate();
    daemon.spawn(&[]);
    wait_until("the start-up reset to be refused", || {
        (daemon.log_text().matches(&refusal).count() > refusals).then_some(())
    });
    assert_eq!(hw.smi_resets().len(), resets_before + 1);
    let card = daemon.wait_card_state(&bdf, "quarantined");
    assert!(
        card["state_reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("reset hung: "),
        "{card:#}"
    );
    daemon.wait_slot_state("m", "quarantined");

    // The operator (after the reboot the hint asks for) may still reset
    // it; proven back, the quarantine lifts and the slot serves again.
    hw.root.clear_fault(&bdf).unwrap();
    let out = daemon.ttctl(&["card", "reset", &bdf]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(hw.smi_resets().len() > resets_before + 1);
    daemon.wait_slot_state("m", "ready");
    assert_eq!(daemon.card(&bdf)["state"], "ready");
}

/// A lock file made readable by everyone (a root script's `flock(1)` with
/// umask 022) lets any local user open it, and `flock` needs no write
/// access: that user could take the card whenever it is free, and the
/// daemon's later chmod does not revoke the descriptor. The daemon refuses
/// the card while such a descriptor is open, naming the process and the
/// fix, and takes it once the process is gone.
#[test]
fn a_lock_file_opened_by_a_user_who_may_not_hold_cards_is_refused_until_that_process_ends() {
    tt_serving_tests::needs_root!();
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut daemon = Daemon::configure(&hw, dir.path(), &DaemonOptions::default());
    std::fs::create_dir_all(&daemon.lock_dir).unwrap();
    std::fs::set_permissions(&daemon.lock_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lock_file = daemon.lock_dir.join(format!("{}.lock", FakeHw::bdf(0)));
    std::fs::write(&lock_file, "").unwrap();
    std::fs::set_permissions(&lock_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    // nobody opens it read-only while it is readable, and keeps it open.
    let mut stranger = Command::new("sh")
        .arg("-c")
        .arg("exec 3<\"$0\" && echo opened && exec sleep 300")
        .arg(&lock_file)
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh as nobody");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(stranger.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "opened");
    daemon.spawn(&[]);
    let card = daemon.wait_card_state(&FakeHw::bdf(0), "held-elsewhere");
    let reason = card["state_reason"].as_str().unwrap_or("");
    assert!(
        reason.contains(&format!(
            "is open in pid {} (nobody: sleep 300)",
            stranger.id()
        )) && reason.contains("of a user who may not hold card locks")
            && reason.contains(&format!("kill {}", stranger.id())),
        "{card:#}"
    );
    assert_eq!(card["lock_holder"]["pid"], stranger.id());
    // The mode was repaired on the way: no one else opens it now.
    let mode = std::fs::metadata(&lock_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    stranger.kill().unwrap();
    stranger.wait().unwrap();
    let card = daemon.wait_card_state(&FakeHw::bdf(0), "idle");
    assert_eq!(card["lock_holder"]["pid"], daemon.pid());
}
