//! `ttctl reload`: have the daemon re-read its config and apply what
//! changed, and show the plan and each slot's result.

use std::io::Write;

use tt_serving_proto::v1::{ReloadOutcome, ReloadRequest};

use super::args::ReloadArgs;
use super::client::Daemon;
use super::render::{json_text, reload_failed_slots, reload_report_text};
use super::{emit, Failure};

/// Ask for the reload and wait for the report: with waiting, the daemon
/// answers once the started slots are Ready or have failed, which for a
/// cold build can take as long as the build. No timeout on our side.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: ReloadArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let report = daemon
        .reload(ReloadRequest {
            dry_run: args.dry_run,
            no_wait: args.no_wait,
        })
        .await?;
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
