//! `ttctl reload`: have the daemon re-read its config and apply what
//! changed, and show the plan and each slot's result.

use std::io::Write;

use tt_serving_proto::v1::{ReloadOutcome, ReloadRequest};

use super::args::ReloadArgs;
use super::client::Daemon;
use super::outcome::{emit, Failure};
use super::render::{json_text, reload_failed_slots, reload_report_text};

/// Ask for the reload and wait for the report: with waiting, the daemon
/// answers once the started slots are Ready or have failed, which for a
/// cold build can take as long as the build. No timeout on our side.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: ReloadArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let request = ReloadRequest {
        dry_run: args.dry_run,
        no_wait: args.no_wait,
    };
    // A reload that restarts slots answers only when they are up (a cold
    // build: minutes): meanwhile each slot's state change is a line, from
    // the status stream beside the call. Not with --json (one document)
    // nor for a dry run (nothing moves).
    let report = if args.json || args.dry_run {
        daemon.reload(request).await?
    } else {
        let mut watcher = daemon.another();
        // The slots as they stand before the reload, so that every change
        // the reload makes is one.
        let mut seen = std::collections::BTreeMap::new();
        let mut updates = match watcher.watch_status().await {
            Ok(mut updates) => match updates.next().await {
                Ok(Some(status)) => {
                    progress_lines(&mut seen, &status.slots, true);
                    Some(updates)
                }
                _ => None,
            },
            Err(_) => None,
        };
        let reload = daemon.reload(request);
        tokio::pin!(reload);
        loop {
            let Some(stream) = updates.as_mut() else {
                break reload.await?;
            };
            tokio::select! {
                // Changes that arrived before the report are printed first.
                biased;
                update = stream.next() => match update {
                    Ok(Some(status)) => {
                        for line in progress_lines(&mut seen, &status.slots, false) {
                            emit(out, &format!("  {line}\n"))?;
                        }
                    }
                    // The report still comes; only the lines stop.
                    Ok(None) | Err(_) => updates = None,
                },
                report = &mut reload => break report?,
            }
        }
    };
    let text = if args.json {
        json_text(&report, true, "the report")?
    } else {
        reload_report_text(&report)
    };
    if report.outcome == ReloadOutcome::Refused as i32 {
        if args.json {
            emit(out, &text)?;
        }
        return Err(Failure::Failed(text.trim_end().to_string()));
    }
    emit(out, &text)?;
    let failed = reload_failed_slots(&report);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "the reload was applied but slot(s) {} did not come up; see `ttctl status` and `ttctl logs SLOT`",
            failed.join(", ")
        )))
    }
}

/// Lines for the slots whose state or reason changed since `seen` (the
/// first snapshot only records them), and slots that appeared.
fn progress_lines(
    seen: &mut std::collections::BTreeMap<String, (i32, String)>,
    slots: &[tt_serving_proto::v1::Slot],
    first: bool,
) -> Vec<String> {
    use tt_serving_proto::Word;
    let mut lines = Vec::new();
    for slot in slots {
        let now = (slot.state, slot.reason.clone());
        if seen.get(&slot.name) == Some(&now) {
            continue;
        }
        if !first {
            let state = tt_serving_proto::v1::SlotState::word(slot.state);
            let reason = super::render::one_line(&slot.reason);
            lines.push(if reason.is_empty() {
                format!("slot {}: {state}", slot.name)
            } else {
                format!("slot {}: {state}: {reason}", slot.name)
            });
        }
        seen.insert(slot.name.clone(), now);
    }
    lines
}
