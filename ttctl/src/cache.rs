//! `ttctl cache ...`: the tensor cache's variants on disk, and what they
//! mean for a model's next start ([`check`], for `cache verify`).

use std::io::Write;

use tt_serving_proto::v1::{CacheVariant, ListCacheResponse};

use super::client::Daemon;
use super::outcome::{emit, Failure};
use super::render::{cache_json, cache_removed_line, cache_table, cache_verdict, json_text};

/// `ttctl cache ls [--json]`.
pub(super) async fn ls(
    daemon: &mut Daemon,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let cache = daemon.list_cache().await?;
    let text = if json {
        json_text(&cache_json(&cache), true, "the cache listing")?
    } else {
        cache_table(&cache)
    };
    emit(out, &text)
}

/// `ttctl cache verify MODEL`: every complete variant of the model hashed
/// against the content recorded at its build (progress as it goes; a
/// mismatch invalidates the variant), then the model's variants and
/// whether its next start will be warm. Exit 0 when every complete variant
/// verified and the next start is warm; 1 otherwise, saying why; a model
/// the config does not name exits 1 naming the ones it does.
pub(super) async fn verify(
    daemon: &mut Daemon,
    model: &str,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let cache = daemon.list_cache().await?;
    let mut content = None;
    // Only a variant with a marker (complete, or changed since) has
    // recorded content to check.
    if cache
        .variants
        .iter()
        .any(|v| v.model == model && (v.state == "warm" || v.state == "incomplete"))
    {
        let mut stream = daemon.verify_cache(model).await?;
        while let Some(progress) = stream.next().await? {
            emit(out, &format!("{}\n", progress.message))?;
            if progress.finished {
                content = Some(progress.ok);
                break;
            }
        }
    }
    // Verification may have invalidated a variant: list what is now.
    let cache = daemon.list_cache().await?;
    let verdict = cache_verdict(model, &check(model, &cache));
    if !verdict.listing.is_empty() {
        emit(out, &verdict.listing)?;
    }
    match (verdict.outcome, content) {
        (Ok(line), Some(true)) => emit(out, &format!("{line}\n")),
        (Ok(line), _) => {
            emit(out, &format!("{line}\n"))?;
            Err(Failure::Failed(format!(
                "{model}: the content of its cache could not be verified (see above)"
            )))
        }
        (Err(why), _) => Err(Failure::Failed(why)),
    }
}

/// A model's variants on disk and what they mean for its next start.
#[derive(Debug)]
pub struct CacheCheck<'a> {
    /// The model's variants, sorted by key.
    pub variants: Vec<&'a CacheVariant>,
    /// What its next start will be.
    pub next_start: NextStart<'a>,
}

/// Whether a model's next start will be warm, and if not, why.
#[derive(Debug, PartialEq)]
pub enum NextStart<'a> {
    /// No model of the config has that name and nothing of it is on disk:
    /// there is no next start. `models` are the names the config has.
    UnknownModel { models: &'a [String] },
    /// A model of the config with no variant on disk yet: cold.
    NoCache,
    /// Not a model of the config in force: its variants are left from an
    /// earlier config. `models` are the names the config has.
    LeftOver { models: &'a [String] },
    /// None of its variants is the one its slots' config selects: cold.
    NoneSelected,
    /// The selected variant is not complete: cold.
    NotWarm(&'a CacheVariant),
    /// Warm, from these selected variants.
    Warm(Vec<&'a CacheVariant>),
}

/// Judge `model`'s next start from the listing. A start is warm when the
/// variant its slots' current config selects (the one with `used_by` set)
/// is on disk and complete (`warm`), as the supervisor decides at each
/// start; a variant no slot uses is left over from an older config (or
/// worker) and does not count.
pub(super) fn check<'a>(model: &str, cache: &'a ListCacheResponse) -> CacheCheck<'a> {
    let variants: Vec<&CacheVariant> = cache.variants.iter().filter(|v| v.model == model).collect();
    let models = cache.models.as_slice();
    let configured = models.iter().any(|m| m == model);
    let selected: Vec<&CacheVariant> = variants
        .iter()
        .copied()
        .filter(|v| !v.used_by.is_empty())
        .collect();
    let next_start = if !configured && variants.is_empty() {
        NextStart::UnknownModel { models }
    } else if variants.is_empty() {
        NextStart::NoCache
    } else if !configured {
        NextStart::LeftOver { models }
    } else if selected.is_empty() {
        NextStart::NoneSelected
    } else if let Some(bad) = selected.iter().find(|v| v.state != "warm") {
        NextStart::NotWarm(bad)
    } else {
        NextStart::Warm(selected)
    };
    CacheCheck {
        variants,
        next_start,
    }
}

/// `ttctl cache rm VARIANT`. The daemon refuses a variant a running slot
/// uses (FAILED_PRECONDITION) and an unknown key (NOT_FOUND); both exit 1
/// with its message.
pub(super) async fn rm(
    daemon: &mut Daemon,
    variant: &str,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let removed = daemon.remove_cache(variant).await?;
    emit(out, &format!("{}\n", cache_removed_line(&removed)))
}

/// `ttctl cache build MODEL`: one line per progress message; exit 0 when the
/// variant is complete, 1 with the daemon's reason when the build failed.
pub(super) async fn build(
    daemon: &mut Daemon,
    model: &str,
    out: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let mut stream = daemon.build_cache(model).await?;
    while let Some(progress) = stream.next().await? {
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
