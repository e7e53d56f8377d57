//! Rendering reload reports: `ttctl reload` and the reload line of
//! `ttctl status`.

use tt_serving_proto::v1::{ReloadOutcome, ReloadReport};
use tt_serving_proto::Word;

use super::{duration_words, one_line};

/// Whether a started or restarted slot did not come up. Result texts start
/// with the slot state the daemon saw (`Ready (...)`, `Failed: ...`).
pub fn reload_failed_slots(report: &ReloadReport) -> Vec<String> {
    report
        .steps
        .iter()
        .filter(|s| s.action == "start" || s.action == "restart")
        .filter(|s| {
            !s.result.is_empty()
                && !s.result.starts_with("Ready")
                && !s.result.starts_with("started;")
        })
        .map(|s| s.slot.clone())
        .collect()
}

/// The report as an operator reads it: a headline, one line per slot (and
/// its result under it), then the settings that wait for a restart.
pub fn reload_report_text(report: &ReloadReport) -> String {
    let took = report
        .finished_unix_ms
        .saturating_sub(report.started_unix_ms);
    let mut out = String::new();
    match ReloadOutcome::try_from(report.outcome) {
        Ok(ReloadOutcome::Refused) => {
            out.push_str(&format!(
                "reload refused: {} problem(s) in {}; the daemon keeps serving its current config\n",
                report.problems.len(),
                report.config_path
            ));
            for p in &report.problems {
                out.push_str(&format!("  {}\n", one_line(p)));
            }
            return out;
        }
        Ok(ReloadOutcome::DryRun) => out.push_str(&format!(
            "reload plan for {} (dry run: nothing applied): {}\n",
            report.config_path, report.summary
        )),
        Ok(ReloadOutcome::Unchanged) => out.push_str(&format!(
            "reload: nothing to do, no slot changes ({})\n",
            report.summary
        )),
        _ => out.push_str(&format!(
            "reload applied in {}: {}\n",
            duration_words(took),
            report.summary
        )),
    }
    let width = report
        .steps
        .iter()
        .map(|s| s.slot.chars().count())
        .max()
        .unwrap_or(0);
    for step in &report.steps {
        out.push_str(&format!(
            "  {:<7}  {:<width$}  {}\n",
            step.action,
            step.slot,
            one_line(&step.reason)
        ));
        if !step.result.is_empty() && step.action != "keep" {
            out.push_str(&format!(
                "  {:<7}  {:<width$}  -> {}\n",
                "",
                "",
                one_line(&step.result)
            ));
        }
    }
    if !report.needs_restart.is_empty() {
        out.push_str("needs a daemon restart (not applied):\n");
        for line in &report.needs_restart {
            out.push_str(&format!("  {}\n", one_line(line)));
        }
    }
    out
}

/// The line `ttctl status` prints about the last reload.
pub fn last_reload_line(reloads: &[ReloadReport], now_unix_ms: u64) -> Option<String> {
    let last = reloads
        .iter()
        .rev()
        .find(|r| r.outcome != ReloadOutcome::DryRun as i32)?;
    let ago = duration_words(now_unix_ms.saturating_sub(last.finished_unix_ms));
    let what = match ReloadOutcome::try_from(last.outcome) {
        Ok(ReloadOutcome::Refused) => format!(
            "refused ({} problem(s): {})",
            last.problems.len(),
            last.problems
                .first()
                .map(|p| one_line(p))
                .unwrap_or_default()
        ),
        _ => format!("{}: {}", ReloadOutcome::word(last.outcome), last.summary),
    };
    Some(format!(
        "last reload {ago} ago by {}: {what}",
        if last.trigger.is_empty() {
            "?"
        } else {
            &last.trigger
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tt_serving_proto::v1::ReloadStep;

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
}
