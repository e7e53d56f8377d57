//! The audit trail of control actions (`<state_dir>/audit.jsonl`,
//! `ttctl audit`): every destructive call leaves exactly one record with
//! the caller's uid and its outcome, a refused one too, and a link planted
//! where the trail goes is not written through. Real daemon on fake cards,
//! real `ttctl`; the test that switches users needs root.

use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use tt_serving_tests::{
    model_table, needs_root, output_text, tiny_model, Daemon, DaemonOptions, FakeHw,
};

/// `nobody`/`nogroup`, as in tests/security.rs.
const NOBODY: u32 = 65534;
const NOGROUP: &str = "nogroup";

/// `ttctl audit --json` as the given output's records.
fn records(out: &std::process::Output) -> Vec<Value> {
    assert!(out.status.success(), "{}", output_text(out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON record per line"))
        .collect()
}

#[test]
fn every_control_action_leaves_one_record_with_the_callers_uid() {
    let hw = FakeHw::new(2);
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[1], &model, ""),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");

    let reset = daemon.ttctl(&["card", "reset", "0"]);
    assert!(reset.status.success(), "{}", output_text(&reset));
    let restart = daemon.ttctl(&["slot", "restart", "m"]);
    assert!(restart.status.success(), "{}", output_text(&restart));
    let unknown = daemon.ttctl(&["slot", "restart", "no-such-slot"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", output_text(&unknown));
    // Read-only calls leave no record.
    daemon.status();
    assert!(daemon.ttctl(&["cache", "ls"]).status.success());
    assert!(daemon.ttctl(&["reload", "--dry-run"]).status.success());
    assert!(daemon.ttctl(&["audit"]).status.success());

    let records = records(&daemon.ttctl(&["audit", "--json"]));
    let summary: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["operation"].as_str().unwrap_or(""),
                r["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("ttctl card reset", "ok"),
            ("ttctl slot restart", "ok"),
            ("ttctl slot restart", "failed"),
        ],
        "{records:#?}"
    );
    for record in &records {
        assert_eq!(record["uid"], 0, "{record}");
        assert_eq!(record["user"], "root", "{record}");
        assert_eq!(record["admitted"], "root", "{record}");
        assert!(record["pid"].as_u64().is_some_and(|p| p > 0), "{record}");
        assert!(record["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    }
    assert_eq!(records[0]["args"]["card"], "0");
    assert!(records[0]["detail"]
        .as_str()
        .is_some_and(|d| d.contains("proven back")));
    assert_eq!(records[1]["args"]["slot"], "m");
    assert!(records[2]["detail"]
        .as_str()
        .is_some_and(|d| d.contains("no-such-slot")));

    // The file: one line per record, the daemon's alone.
    let file = daemon.dir.join("state").join("audit.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());

    // The plain listing: one line per record; --since in the future and
    // -n narrow it.
    let plain = daemon.ttctl(&["audit"]);
    let plain_text = output_text(&plain);
    assert!(plain.status.success(), "{plain_text}");
    assert_eq!(plain_text.lines().count(), 3, "{plain_text}");
    assert!(
        plain_text
            .lines()
            .next()
            .is_some_and(|l| l.contains("uid 0 (root) [root] ttctl card reset card=0: ok: ")),
        "{plain_text}"
    );
    assert!(records_of(&daemon, &["--since", "2999-01-01T00:00:00Z"]).is_empty());
    assert_eq!(records_of(&daemon, &["--since", "1h"]).len(), 3);
    let last = records_of(&daemon, &["-n", "1"]);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["outcome"], "failed");
    let bad = daemon.ttctl(&["audit", "--since", "yesterday"]);
    assert_eq!(bad.status.code(), Some(2), "{}", output_text(&bad));
}

fn records_of(daemon: &Daemon, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", "--json"];
    all.extend_from_slice(args);
    records(&daemon.ttctl(&all))
}

#[test]
fn a_refused_action_is_recorded_as_refused_with_the_callers_uid() {
    needs_root!();
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            daemon_extra: format!("control_socket_group = \"{NOGROUP}\"\n"),
            ..Default::default()
        },
    );
    std::fs::set_permissions(&daemon.dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let reset = daemon.ttctl_as(NOBODY, NOBODY, &["card", "reset", "0"]);
    assert_eq!(reset.status.code(), Some(1), "{}", output_text(&reset));
    assert!(hw.smi_calls().is_empty(), "a refused reset runs nothing");

    // Reading the trail is open to whoever may connect, as status is.
    let records = records(&daemon.ttctl_as(NOBODY, NOBODY, &["audit", "--json"]));
    assert_eq!(records.len(), 1, "{records:#?}");
    let record = &records[0];
    assert_eq!(record["uid"], NOBODY, "{record}");
    assert_eq!(record["user"], "nobody", "{record}");
    assert_eq!(record["operation"], "ttctl card reset", "{record}");
    assert_eq!(record["outcome"], "refused", "{record}");
    assert_eq!(record["admitted"], "refused", "{record}");
    assert_eq!(record["args"]["card"], "0", "{record}");
    assert!(
        record["detail"]
            .as_str()
            .is_some_and(|d| d.contains("needs root")),
        "{record}"
    );
}

#[test]
fn a_link_planted_at_the_trail_is_not_followed() {
    let hw = FakeHw::new(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::configure(&hw, tmp.path(), &DaemonOptions::default());
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let trail = state.join("audit.jsonl");
    std::os::unix::fs::symlink(&victim, &trail).unwrap();
    daemon.spawn(&[]);

    // The action itself goes on; the trail refuses the link and says so.
    let reset = daemon.ttctl(&["card", "reset", "0"]);
    assert!(reset.status.success(), "{}", output_text(&reset));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(std::fs::symlink_metadata(&trail)
        .unwrap()
        .file_type()
        .is_symlink());
    daemon.wait_log("cannot append to the audit trail");
    // The journal still has the record's fields.
    let log = daemon.log_text();
    assert!(
        log.lines().any(|l| l.contains("audit: control action")
            && l.contains("uid=0")
            && l.contains("ttctl card reset")),
        "{log}"
    );
    let read = daemon.ttctl(&["audit"]);
    let text = output_text(&read);
    assert_eq!(read.status.code(), Some(1), "{text}");
    assert!(text.contains("symbolic link"), "{text}");
}

#[test]
fn stop_start_reload_and_cache_removal_are_recorded_too() {
    let hw = FakeHw::new(1);
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, ""),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    for args in [
        &["slot", "stop", "m"][..],
        &["slot", "start", "m"],
        &["reload"],
    ] {
        let out = daemon.ttctl(args);
        assert!(out.status.success(), "{args:?}: {}", output_text(&out));
    }
    let rm = daemon.ttctl(&["cache", "rm", "no-such-variant"]);
    assert_eq!(rm.status.code(), Some(1), "{}", output_text(&rm));

    let records = records(&daemon.ttctl(&["audit", "--json"]));
    let summary: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["operation"].as_str().unwrap_or(""),
                r["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("ttctl slot stop", "ok"),
            ("ttctl slot start", "ok"),
            ("ttctl reload", "ok"),
            ("ttctl cache rm", "failed"),
        ],
        "{records:#?}"
    );
    assert!(records.iter().all(|r| r["uid"] == 0), "{records:#?}");
    assert_eq!(records[2]["args"]["dry_run"], "false");
    assert_eq!(records[3]["args"]["key"], "no-such-variant");
}

#[test]
fn an_admin_group_member_is_recorded_as_admitted_by_the_group() {
    needs_root!();
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            daemon_extra: format!(
                "control_socket_group = \"{NOGROUP}\"\ncontrol_admin_group = \"{NOGROUP}\"\n"
            ),
            ..Default::default()
        },
    );
    std::fs::set_permissions(&daemon.dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let reset = daemon.ttctl_as(NOBODY, NOBODY, &["card", "reset", "0"]);
    assert!(reset.status.success(), "{}", output_text(&reset));
    let records = records(&daemon.ttctl(&["audit", "--json"]));
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["uid"], NOBODY);
    assert_eq!(records[0]["admitted"], format!("group {NOGROUP}"));
    assert_eq!(records[0]["outcome"], "ok");
}

#[test]
fn a_borrow_is_recorded_when_the_cards_are_back() {
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(&hw, DaemonOptions::default());
    let out = daemon.ttctl(&["card", "borrow", "0", "--", "true"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let records = records(&daemon.ttctl(&["audit", "--json"]));
    assert_eq!(records.len(), 1, "{records:#?}");
    let record = &records[0];
    assert_eq!(record["operation"], "ttctl card borrow", "{record}");
    assert_eq!(record["outcome"], "ok", "{record}");
    assert_eq!(record["uid"], 0, "{record}");
    assert_eq!(record["args"]["cards"], "0", "{record}");
}
