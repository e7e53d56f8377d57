//! `ttctl cache ...`: the tensor cache's variants on disk.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tonic::transport::Channel;
use tt_serving_proto::v1::control_client::ControlClient;
use tt_serving_proto::v1::{ListCacheRequest, ListCacheResponse, RemoveCacheRequest};

use super::render::{cache_json, cache_removed_line, cache_table, cache_verdict, json_text};
use super::{answer_within, emit, Failure};

/// Listing walks every variant dir to add up sizes, which takes a moment on
/// a big cache but not minutes.
const LIST_TIMEOUT: Duration = Duration::from_secs(120);

async fn list(
    client: &mut ControlClient<Channel>,
    socket: &Path,
) -> Result<ListCacheResponse, Failure> {
    answer_within(LIST_TIMEOUT, client.list_cache(ListCacheRequest {}), socket).await
}

/// `ttctl cache ls [--json]`.
pub(super) async fn ls(
    client: &mut ControlClient<Channel>,
    json: bool,
    socket: &Path,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let cache = list(client, socket).await?;
    let text = if json {
        json_text(&cache_json(&cache), true, "the cache listing")?
    } else {
        cache_table(&cache)
    };
    emit(out, &text)
}

/// `ttctl cache verify MODEL`: the model's variants, then whether its next
/// start will be warm (exit 0) or cold (exit 1, saying why); a model the
/// config does not name exits 1 naming the ones it does.
pub(super) async fn verify(
    client: &mut ControlClient<Channel>,
    model: &str,
    socket: &Path,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let cache = list(client, socket).await?;
    let verdict = cache_verdict(model, &cache);
    if !verdict.listing.is_empty() {
        emit(out, &verdict.listing)?;
    }
    match verdict.outcome {
        Ok(line) => emit(out, &format!("{line}\n")),
        Err(why) => Err(Failure::Failed(why)),
    }
}

/// `ttctl cache rm VARIANT`. The daemon refuses a variant a running slot
/// uses (FAILED_PRECONDITION) and an unknown key (NOT_FOUND); both exit 1
/// with its message. No deadline: deleting a large variant takes as long
/// as the disk needs.
pub(super) async fn rm(
    client: &mut ControlClient<Channel>,
    variant: &str,
    socket: &Path,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let removed = client
        .remove_cache(RemoveCacheRequest {
            key: variant.to_string(),
        })
        .await
        .map_err(|status| Failure::from_status(status, socket))?
        .into_inner();
    emit(out, &format!("{}\n", cache_removed_line(&removed)))
}

/// `ttctl cache build MODEL`: one line per progress message; exit 0 when the
/// variant is complete, 1 with the daemon's reason when the build failed.
pub(super) async fn build(
    client: &mut ControlClient<Channel>,
    model: &str,
    socket: &Path,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let mut stream = client
        .build_cache(tt_serving_proto::v1::BuildCacheRequest {
            model: model.to_string(),
        })
        .await
        .map_err(|status| Failure::from_status(status, socket))?
        .into_inner();
    while let Some(progress) = stream
        .message()
        .await
        .map_err(|status| Failure::from_status(status, socket))?
    {
        if progress.finished {
            return if progress.ok {
                emit(out, &format!("{}\n", progress.message))
            } else {
                Err(Failure::Failed(progress.message))
            };
        }
        emit(out, &format!("{}\n", progress.message))?;
    }
    Err(Failure::Failed(format!(
        "tt-servingd ended the cache build of {model} without a result; see 'ttctl status'"
    )))
}
