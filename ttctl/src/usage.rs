//! `ttctl usage`: usage per API key and model, summed from the daemon's
//! usage ledger.

use std::io::Write;

use tt_serving_proto::v1::UsageRequest;

use super::args::UsageArgs;
use super::client::Daemon;
use super::outcome::{emit, emit_skipped, Failure};
use super::render::{json_text, usage_table};

/// Print one row per key and model (or one JSON object each, with nothing
/// else, for scripts); ledger lines the daemon could not read are counted
/// after the table.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: &UsageArgs,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let answer = daemon
        .usage(UsageRequest {
            since_unix_ms: args.since.unwrap_or(0),
            key: args.key.clone().unwrap_or_default(),
        })
        .await?;
    if args.json {
        for usage in &answer.usage {
            emit(out, &json_text(usage, false, "the usage")?)?;
        }
        return Ok(());
    }
    emit(out, &usage_table(&answer.usage))?;
    emit_skipped(out, answer.skipped, &answer.path)?;
    Ok(())
}
