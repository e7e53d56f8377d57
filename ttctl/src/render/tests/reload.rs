use tt_serving_proto::v1::{ReloadOutcome, ReloadReport, ReloadStep};

use super::*;

fn step(slot: &str, action: &str, reason: &str, result: &str) -> ReloadStep {
    ReloadStep {
        slot: slot.into(),
        model: slot.into(),
        action: action.into(),
        reason: reason.into(),
        result: result.into(),
    }
}

fn applied() -> ReloadReport {
    ReloadReport {
        outcome: ReloadOutcome::Applied as i32,
        trigger: "ttctl".into(),
        started_unix_ms: 1_000,
        finished_unix_ms: 4_500,
        config_path: "/etc/tt-serving/config.toml".into(),
        steps: vec![
            step("a", "keep", "unchanged", "untouched"),
            step(
                "b",
                "restart",
                "flags.KV: \"0\" → \"1\"",
                "Failed: worker exited with code 3",
            ),
            step("c/1", "start", "added to the config", "Ready (cold start)"),
        ],
        needs_restart: vec!["daemon.listen: \"a\" → \"b\"".into()],
        summary: "1 keep, 1 restart, 1 start".into(),
        ..Default::default()
    }
}

#[test]
fn applied_report_lists_every_slot_its_result_and_restart_only_settings() {
    let text = reload_report_text(&applied());
    assert!(
        text.starts_with("reload applied in 3s: 1 keep, 1 restart, 1 start\n"),
        "{text}"
    );
    assert!(text.contains("  keep     a    unchanged\n"), "{text}");
    assert!(!text.contains("untouched"), "{text}");
    assert!(
        text.contains("  restart  b    flags.KV: \"0\" → \"1\"\n"),
        "{text}"
    );
    assert!(
        text.contains("-> Failed: worker exited with code 3\n"),
        "{text}"
    );
    assert!(
        text.contains("needs a daemon restart (not applied):\n  daemon.listen"),
        "{text}"
    );
    assert_eq!(reload_failed_slots(&applied()), vec!["b".to_string()]);
}

#[test]
fn refused_report_names_each_problem() {
    let report = ReloadReport {
        outcome: ReloadOutcome::Refused as i32,
        config_path: "/etc/c.toml".into(),
        problems: vec!["models.b.tp: 3 is not 1 or 2".into()],
        ..Default::default()
    };
    let text = reload_report_text(&report);
    assert_eq!(
        text,
        "reload refused: 1 problem(s) in /etc/c.toml; the daemon keeps serving its current config\n  models.b.tp: 3 is not 1 or 2\n"
    );
    let line = last_reload_line(&[applied(), report], 10_000);
    assert_eq!(
        line.as_deref(),
        Some("last reload 10s ago by ?: refused (1 problem(s): models.b.tp: 3 is not 1 or 2)")
    );
}

#[test]
fn dry_runs_are_not_the_last_reload() {
    let dry = ReloadReport {
        outcome: ReloadOutcome::DryRun as i32,
        ..applied()
    };
    let line = last_reload_line(&[applied(), dry.clone()], 64_500);
    assert_eq!(
        line.as_deref(),
        Some("last reload 1m00s ago by ttctl: applied: 1 keep, 1 restart, 1 start")
    );
    assert_eq!(last_reload_line(&[dry], 0), None);
}
