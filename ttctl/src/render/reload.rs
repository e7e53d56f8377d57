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
