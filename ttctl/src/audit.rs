//! `ttctl audit`: the daemon's trail of control actions.

use std::io::Write;

use tt_serving_proto::v1::AuditRequest;

use super::args::AuditArgs;
use super::client::Daemon;
use super::outcome::{emit, emit_skipped, Failure};
use super::render::{audit_line, json_text};

/// Print the records the daemon returns, oldest first, one line each (or
/// one JSON object each, with nothing else, for scripts); lines of the file
/// the daemon could not read are counted after the records.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: &AuditArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let answer = daemon
        .audit(AuditRequest {
            since_unix_ms: args.since.unwrap_or(0),
            limit: args.lines,
        })
        .await?;
    for record in &answer.records {
        let line = if args.json {
            json_text(record, false, "the audit record")?
        } else {
            format!("{}\n", audit_line(record))
        };
        emit(out, &line)?;
    }
    if !args.json {
        emit_skipped(out, answer.skipped, &answer.path)?;
    }
    Ok(())
}
