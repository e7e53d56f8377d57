//! The tensor cache: variants, completeness markers, the build lock and the
//! warm-start guard.
//!
//! Converting a checkpoint into device layout (a cold build) takes many
//! minutes; reusing the result (a warm start) is much faster. Files live in
//! `<cache_dir>/<model>/<variant>/`, where the variant key hashes everything
//! that changes the files: checkpoint identity, TP, the cache-affecting flags
//! and the worker's identity. A marker lists every file with its size; a
//! variant is warm only when the marker is present and every file matches.
//!
//! With `cache_layout = "shared"` the cache flags' values (the arm) stay
//! out of the key: every arm of a model shares one directory, whose marker
//! lists the arms built cold and the union of their files. An arm not yet
//! built starts cold into the directory, keeping the other arms' files; a
//! built arm starts warm. This suits engines whose cache file names carry
//! what the flags change (ttnn: dtype and layout in every name); a cold
//! build that rewrites another arm's file is caught and that arm is
//! forgotten (built again cold next time).
//!
//! The dangerous case from the field: a warm start that meets a missing file
//! fills it from placeholders and serves a model of NaNs. ttnn also rebuilds
//! a file it fails to load in place, under the same name, from the tensor it
//! was given (a placeholder on a warm start). So the marker records each
//! file's stamp ([`stamp`]: size, mtime, ctime, inode), and after a warm
//! start the guard refuses the slot when any file the marker does not list
//! appeared (deleted) or any listed file changed, naming them, and
//! invalidates the variant: the next start is cold. Content hashes
//! ([`digest`]) are recorded after a cold build and checked on demand.

pub mod digest;
pub mod stamp;

use crate::config::{CacheLayout, ModelConfig};
use crate::hostfs;
use sha2::{Digest, Sha256};
use stamp::{Entry, Stamp};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Name of the completeness marker inside a variant dir.
pub const MARKER: &str = ".tt-serving-complete.json";
/// Human-readable description of what the variant key hashes.
pub const DESCRIPTION: &str = ".tt-serving-variant.json";

/// One cache variant of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// The model name.
    pub model: String,
    /// The variant key (16 hex digits).
    pub key: String,
    /// `<cache_dir>/<model>/<key>`.
    pub dir: PathBuf,
    /// What went into the key, for people.
    pub inputs: BTreeMap<String, String>,
    /// In the shared layout, this start's arm (`FLAG=value,...`): the
    /// cache flags' values, which are not in the key.
    pub arm: Option<String>,
}

/// Whether a variant can be used warm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheState {
    /// Marker present, every listed file matches.
    Warm {
        /// Files listed.
        files: usize,
        /// Their total size.
        bytes: u64,
    },
    /// No marker: never completed.
    Cold,
    /// Marker present but a file is missing or has the wrong size.
    Incomplete {
        /// What is wrong.
        reason: String,
    },
}

pub use tt_serving_proto::CacheMode;

/// What ttnn prints when it writes a tensor cache file instead of reading
/// it: `Generating cache for <path>` when the file is absent, `Failed to
/// load cache for <path>` when it cannot be read back (then it rebuilds the
/// file in place from the tensor it was given). On a warm start the tensor
/// is a placeholder, so either line means the engine may serve garbage.
/// Source: ttnn 0.81.1 `ttnn/operations/core.py` as_tensor (docs/HARDWARE.md).
pub const REBUILD_LINES: &[&str] = &["Generating cache for", "Failed to load cache"];

/// Whether an engine's output line says it built a cache file.
pub fn is_rebuild_line(line: &str) -> bool {
    REBUILD_LINES.iter().any(|needle| line.contains(needle))
}

/// The file a rebuild line names: ttnn writes `... cache for <path> of
/// shape ...` and `... cache for <path>: <error>`.
pub fn rebuild_line_path(line: &str) -> Option<&str> {
    let (_, rest) = line.split_once(" cache for ")?;
    let end = [" of shape", ": "]
        .iter()
        .filter_map(|stop| rest.find(stop))
        .min()
        .unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// The files an engine declares it writes into the cache dir at every
/// start that are not weights (Engine.Info `runtime_cache_files`): a cold
/// start leaves them out of the marker, a warm start that writes them
/// passes the guard. tt_transformers names its paged-attention KV buffers
/// by the scheduler's shape, which is not in the variant key, so a tuned
/// `--max-num-seqs` writes a new one on a warm start of healthy weights.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeFiles {
    patterns: Vec<String>,
}

impl RuntimeFiles {
    /// Check the engine's declaration: every pattern must name a file. A
    /// pattern of only `*` and `/` would switch the guard off.
    pub fn new(patterns: Vec<String>) -> Result<Self, String> {
        if let Some(p) = patterns
            .iter()
            .find(|p| p.chars().all(|c| c == '*' || c == '/'))
        {
            return Err(format!(
                "the worker declares runtime_cache_files pattern {p:?}, which matches every file and would switch the warm-start guard off; a pattern must name the engine's runtime files (e.g. \"*empty_kcache_paged_attention*\")"
            ));
        }
        Ok(RuntimeFiles { patterns })
    }

    /// Whether an engine's rebuild line is about one of them (a KV buffer
    /// of a new scheduler shape, allocated through the tensor cache on a
    /// warm start as on a cold one), given the variant's directory.
    pub fn excuses(&self, line: &str, variant_dir: &Path) -> bool {
        rebuild_line_path(line)
            .and_then(|path| Path::new(path).strip_prefix(variant_dir).ok())
            .is_some_and(|rel| self.matches(&rel.to_string_lossy()))
    }

    /// Whether `rel` (a path relative to the variant dir) is one of them.
    pub fn matches(&self, rel: &str) -> bool {
        self.patterns
            .iter()
            .any(|p| crate::worker::banners::glob_match(p, rel))
    }
}

/// The lock that serialises cold builds of one variant, held for the
/// whole cold start; dropping it lets a waiting replica start warm.
#[derive(Debug)]
pub struct BuildLock {
    _file: fs::File,
}

/// Decide warm or cold for a start on `variant`. Warm when the variant is
/// complete (and `force_cold` is not set). Otherwise take the variant's
/// build lock, waiting for another replica's cold build if one runs
/// (`on_wait` is called once before waiting), then look again: a build
/// that finished meanwhile makes this start warm; else the variant dir is
/// emptied and the start is cold, holding the lock.
pub async fn claim(
    variant: &Variant,
    force_cold: bool,
    on_wait: impl FnOnce(),
) -> Result<Claim, String> {
    use fs2::FileExt;
    if let (CacheState::Warm { .. }, false) = (variant.state(), force_cold) {
        return Ok(Claim {
            mode: CacheMode::Warm,
            build_lock: None,
            why_cold: None,
        });
    }
    let lock_path = variant.build_lock_path();
    if let Some(parent) = lock_path.parent() {
        hostfs::create_dir_all_no_follow(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let file = hostfs::open_in_place(&lock_path, 0o600).map_err(|e| {
        format!(
            "cannot open the cache build lock {}: {e}",
            lock_path.display()
        )
    })?;
    let file = if file.try_lock_exclusive().is_ok() {
        file
    } else {
        on_wait();
        tokio::task::spawn_blocking(move || file.lock_exclusive().map(|_| file))
            .await
            .map_err(|e| format!("cache build lock task failed: {e}"))?
            .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?
    };
    let why_cold = match variant.state() {
        CacheState::Warm { .. } if !force_cold => {
            return Ok(Claim {
                mode: CacheMode::Warm,
                build_lock: None,
                why_cold: None,
            })
        }
        _ if force_cold => "a cold build was asked for".to_string(),
        CacheState::Incomplete { reason } => {
            tracing::warn!(variant = %variant.key, %reason, "cache variant incomplete; rebuilding cold");
            format!("the variant was not as built: {reason}")
        }
        CacheState::Cold | CacheState::Warm { .. } => "the variant was never completed".to_string(),
    };
    variant
        .prepare_cold()
        .map_err(|e| format!("cannot prepare cache dir {}: {e}", variant.dir.display()))?;
    Ok(Claim {
        mode: CacheMode::Cold,
        build_lock: Some(BuildLock { _file: file }),
        why_cold: Some(why_cold),
    })
}

/// What [`claim`] decided.
#[derive(Debug)]
pub struct Claim {
    /// Warm or cold.
    pub mode: CacheMode,
    /// Held by a cold start until its marker is written.
    pub build_lock: Option<BuildLock>,
    /// Why a cold start is cold, in words.
    pub why_cold: Option<String>,
}

/// Remove a variant's directory (`ttctl cache rm`); returns the bytes it
/// held. The caller checks first that no slot runs on it.
pub fn remove(dir: &Path) -> io::Result<u64> {
    let bytes = dir_size(dir);
    // remove_dir_all never follows links inside the tree.
    fs::remove_dir_all(dir)?;
    Ok(bytes)
}

/// The bytes of the regular files under `dir` (links not followed).
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(t) if t.is_file() => total += entry.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

/// The marker's contents.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    /// Relative path -> what proves the file untouched since the build.
    pub files: BTreeMap<String, Entry>,
    /// When the cold build that made it finished.
    pub created_unix_ms: u64,
    /// Shared layout: the arms built cold into this directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arms: Vec<String>,
}

/// Identity of a file for the variant key: canonical path, size, mtime.
/// Hashing the contents of a 50 GB checkpoint at every start would cost
/// minutes; a replaced file changes its size or mtime.
fn file_identity(path: &Path) -> String {
    let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match fs::metadata(&canonical) {
        Ok(meta) if meta.is_dir() => directory_identity(&canonical),
        Ok(meta) => format!(
            "{} size={} mtime={}",
            canonical.display(),
            meta.len(),
            mtime_secs(&meta)
        ),
        Err(_) => format!("{} (unreadable)", canonical.display()),
    }
}

fn mtime_secs(meta: &fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Deepest directory level, and most entries, read for a checkpoint
/// directory's identity (a Hugging Face snapshot is two levels deep and
/// holds tens of files).
const IDENTITY_MAX_DEPTH: usize = 8;
const IDENTITY_MAX_ENTRIES: usize = 100_000;

/// A checkpoint directory (Hugging Face layout, hundreds of GB) is known by
/// its files' relative names, sizes and mtimes, never by hashing their
/// contents: replacing, adding, growing or touching a file makes a new
/// variant. Links are followed for the sizes (a Hugging Face cache's
/// snapshot links into its blobs); nothing is written.
fn directory_identity(dir: &Path) -> String {
    let mut listing = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    let mut truncated = false;
    while let Some((at, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&at) else {
            listing.push(format!("{} (unreadable)", at.display()));
            continue;
        };
        for entry in entries.flatten() {
            if listing.len() >= IDENTITY_MAX_ENTRIES {
                truncated = true;
                break;
            }
            let path = entry.path();
            let relative = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            match fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    if depth + 1 < IDENTITY_MAX_DEPTH {
                        stack.push((path, depth + 1));
                    }
                }
                Ok(meta) => listing.push(format!(
                    "{relative} size={} mtime={}",
                    meta.len(),
                    mtime_secs(&meta)
                )),
                Err(_) => listing.push(format!("{relative} (unreadable)")),
            }
        }
    }
    listing.sort();
    let mut hash = Sha256::new();
    for line in &listing {
        hash.update(line.as_bytes());
        hash.update([0]);
    }
    let digest: String = hash
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{} directory files={}{} listing={digest}",
        dir.display(),
        listing.len(),
        if truncated {
            " (listing truncated)"
        } else {
            ""
        }
    )
}

impl Variant {
    /// The variant a model's config selects with this worker command.
    pub fn for_model(cache_dir: &Path, model: &str, m: &ModelConfig, worker: &[String]) -> Variant {
        let mut inputs = BTreeMap::new();
        inputs.insert("checkpoint".to_string(), file_identity(&m.checkpoint));
        inputs.insert("tp".to_string(), m.tp.to_string());
        let mut arm = Vec::new();
        for flag in &m.cache_flags {
            let value = m
                .flags
                .get(flag)
                .cloned()
                .unwrap_or_else(|| "(unset)".into());
            arm.push(format!("{flag}={value}"));
            match m.cache_layout {
                CacheLayout::PerVariant => inputs.insert(format!("flag {flag}"), value),
                CacheLayout::Shared => {
                    inputs.insert(format!("flag {flag}"), "(shared: every arm)".into())
                }
            };
        }
        // vLLM-TT settings that change the weights written (`optimizations`
        // picks each layer's precision).
        for key in tt_worker_contract::tt_config::TT_CACHE_KEYS {
            if let Some(value) = m.tt.get(*key) {
                inputs.insert(format!("tt {key}"), value.to_string());
            }
        }
        let arm = (m.cache_layout == CacheLayout::Shared).then(|| arm.join(","));
        if arm.is_some() {
            inputs.insert("layout".to_string(), "shared".to_string());
        }
        if let Some(program) = worker.first() {
            inputs.insert("worker".to_string(), file_identity(Path::new(program)));
        }
        let mut variant = Variant {
            model: model.to_string(),
            dir: PathBuf::new(),
            key: String::new(),
            inputs,
            arm,
        };
        variant.rekey(cache_dir);
        variant
    }

    /// The same variant for the engine and cards this start runs on:
    /// `engine` is the worker's identity-step answer (or why there is
    /// none), `cards` the slot's card types in rank order, and the mesh.
    /// Each becomes an input of the key, so an engine upgrade or another
    /// architecture is a new variant, built cold once.
    pub fn on_engine(
        mut self,
        cache_dir: &Path,
        engine: &crate::worker::identity::Identity,
        cards: &[String],
        mesh: &str,
    ) -> Variant {
        use crate::worker::identity::Identity;
        match engine {
            Identity::Answered(identity) => {
                for (k, v) in identity {
                    self.inputs.insert(format!("engine {k}"), v.clone());
                }
            }
            // The worker program's file identity stays the only word on
            // the engine, as before the identity step.
            Identity::Unanswered(_) => {
                self.inputs
                    .insert("engine".into(), "(no identity step answer)".into());
            }
        }
        self.inputs.insert("cards".into(), cards.join(","));
        self.inputs.insert("mesh".into(), mesh.to_string());
        self.rekey(cache_dir);
        self
    }

    /// Key and directory from the inputs.
    fn rekey(&mut self, cache_dir: &Path) {
        let mut hash = Sha256::new();
        for (k, v) in &self.inputs {
            hash.update(k.as_bytes());
            hash.update([0]);
            hash.update(v.as_bytes());
            hash.update([0]);
        }
        let digest = hash.finalize();
        self.key = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        self.dir = cache_dir.join(&self.model).join(&self.key);
    }

    /// The lock that serialises cold builds of this variant.
    pub fn build_lock_path(&self) -> PathBuf {
        self.dir.with_extension("build.lock")
    }

    /// Whether the variant is warm, cold or incomplete. In the shared
    /// layout a complete directory is warm only for an arm it has built.
    pub fn state(&self) -> CacheState {
        let state = state_of(&self.dir);
        match (&state, &self.arm) {
            (CacheState::Warm { .. }, Some(arm)) => match read_marker(&self.dir) {
                Ok(marker) if marker.arms.contains(arm) => state,
                _ => CacheState::Cold,
            },
            _ => state,
        }
    }

    /// Prepare for a cold build: an empty variant dir (leftovers of a failed
    /// build must not end up in the marker) plus the description file. In
    /// the shared layout a complete directory keeps its files (the other
    /// arms'); only an incomplete one is emptied.
    pub fn prepare_cold(&self) -> io::Result<()> {
        if self.arm.is_some() && matches!(state_of(&self.dir), CacheState::Warm { .. }) {
            return Ok(());
        }
        // remove_dir_all never follows links inside (std guarantees it
        // since 1.58.1); a link at the variant's own path is removed, not
        // followed.
        match fs::symlink_metadata(&self.dir) {
            Ok(meta) if meta.is_dir() => fs::remove_dir_all(&self.dir)?,
            Ok(_) => fs::remove_file(&self.dir)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        hostfs::create_dir_all_no_follow(&self.dir)?;
        let description = serde_json::to_vec_pretty(&self.inputs).map_err(io::Error::other)?;
        atomic_write(&self.dir.join(DESCRIPTION), &description)
    }

    /// After a cold start passed readiness: list every file with its size in
    /// the marker, written atomically. The engine's runtime files are not
    /// part of the variant: a warm start does not need them.
    pub fn write_marker(&self, runtime: &RuntimeFiles) -> io::Result<Marker> {
        let mut files = list_files(&self.dir)?;
        files.retain(|name, _| !runtime.matches(name));
        let files: BTreeMap<String, Entry> = files
            .into_iter()
            .map(|(name, stamp)| (name, Entry::Stamped(stamp)))
            .collect();
        let arms = match &self.arm {
            None => Vec::new(),
            Some(arm) => {
                // The arms built before this one keep their place only if
                // this build left every file of theirs as it was.
                let mut arms = match read_marker(&self.dir) {
                    Ok(before) => {
                        let rewritten: Vec<&String> = before
                            .files
                            .iter()
                            .filter(|(name, entry)| match files.get(*name) {
                                Some(Entry::Stamped(now)) => entry.differs(now).is_some(),
                                _ => true,
                            })
                            .map(|(name, _)| name)
                            .collect();
                        if rewritten.is_empty() {
                            before.arms
                        } else {
                            tracing::warn!(
                                variant = %self.key,
                                arm = %arm,
                                files = ?rewritten,
                                forgotten = ?before.arms,
                                "the cold build of this arm rewrote files of the arms built before it; they will be built again cold. This engine's cache file names do not carry what the cache flags change: use cache_layout = \"per-variant\""
                            );
                            Vec::new()
                        }
                    }
                    Err(_) => Vec::new(),
                };
                if !arms.contains(arm) {
                    arms.push(arm.clone());
                }
                arms
            }
        };
        let marker = Marker {
            files,
            created_unix_ms: tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
            arms,
        };
        let text = serde_json::to_vec_pretty(&marker).map_err(io::Error::other)?;
        atomic_write(&self.dir.join(MARKER), &text)?;
        Ok(marker)
    }

    /// After a warm start: every file the marker lists must be as the
    /// build left it, and no other file may have appeared (links included:
    /// a link is removed, never followed). New files are deleted; the
    /// engine's declared runtime files are expected (a link is never one
    /// of them). A guard that finds anything invalidates the variant, so
    /// the next start is cold.
    pub fn guard(&self, runtime: &RuntimeFiles) -> io::Result<GuardReport> {
        let marker = read_marker(&self.dir)?;
        let mut report = GuardReport::default();
        let found = list_files(&self.dir)?;
        for (name, now) in &found {
            match marker.files.get(name) {
                Some(entry) => {
                    if let Some(why) = entry.differs(now) {
                        report.changed.push(format!("{name} {why}"));
                    }
                }
                None if runtime.matches(name) => {}
                None => report.generated.push(name.clone()),
            }
        }
        for name in marker.files.keys() {
            if !found.contains_key(name) {
                report.changed.push(format!("{name} is missing"));
            }
        }
        report.generated.extend(list_links(&self.dir)?);
        for name in &report.generated {
            hostfs::remove_file(&self.dir.join(name))?;
        }
        report.generated.sort();
        report.changed.sort();
        if !report.passed() {
            invalidate(&self.dir, &report.describe())?;
        }
        Ok(report)
    }
}

/// What the warm-start guard found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardReport {
    /// Files the marker does not list (deleted).
    pub generated: Vec<String>,
    /// Listed files that changed or went missing, each with how.
    pub changed: Vec<String>,
}

impl GuardReport {
    /// Whether the warm start left the variant as it was built.
    pub fn passed(&self) -> bool {
        self.generated.is_empty() && self.changed.is_empty()
    }

    /// What was found, in words.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.changed.is_empty() {
            parts.push(format!(
                "cached files changed during the warm start: {}",
                self.changed.join("; ")
            ));
        }
        if !self.generated.is_empty() {
            parts.push(format!(
                "cache files generated that it should have read: {} (deleted)",
                self.generated.join(", ")
            ));
        }
        parts.join("; ")
    }
}

/// Make a variant cold: its marker and digests go, so no start uses it
/// warm and the next one builds it again. Its files stay until that build.
pub fn invalidate(dir: &Path, why: &str) -> io::Result<()> {
    hostfs::remove_file(&dir.join(MARKER))?;
    hostfs::remove_file(&dir.join(digest::DIGESTS))?;
    tracing::warn!(variant = %dir.display(), %why, "cache variant invalidated: the next start builds it cold");
    Ok(())
}

/// The state of a variant dir.
pub fn state_of(dir: &Path) -> CacheState {
    let marker = match read_marker(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return CacheState::Cold,
        Err(e) => {
            return CacheState::Incomplete {
                reason: format!("marker unreadable: {e}"),
            }
        }
    };
    let mut bytes = 0;
    for (name, entry) in &marker.files {
        // A link where the marker lists a file is not that file.
        let reason = match fs::symlink_metadata(dir.join(name)) {
            Ok(meta) if !meta.is_file() => format!("{name} is not a regular file"),
            Ok(meta) => match entry.differs(&Stamp::of(&meta)) {
                None => {
                    bytes += entry.size();
                    continue;
                }
                Some(why) => format!("{name} {why}"),
            },
            Err(_) => format!("{name} is missing"),
        };
        return CacheState::Incomplete { reason };
    }
    CacheState::Warm {
        files: marker.files.len(),
        bytes,
    }
}

/// The arms a shared directory has built (empty for a per-variant one).
pub fn built_arms(dir: &Path) -> Vec<String> {
    read_marker(dir).map(|m| m.arms).unwrap_or_default()
}

/// The marker of a variant dir.
pub fn read_marker(dir: &Path) -> io::Result<Marker> {
    let text = hostfs::read(&dir.join(MARKER))?;
    serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Every regular file under `dir` (relative paths), except our own marker,
/// description and digests, with their stamps.
fn list_files(dir: &Path) -> io::Result<BTreeMap<String, Stamp>> {
    let mut out = BTreeMap::new();
    for (rel, kind, meta) in walk(dir)? {
        let ours = |name: &str| rel == name || rel.starts_with(&format!(".{name}.tmp."));
        if kind.is_file() && !ours(MARKER) && !ours(DESCRIPTION) && !ours(digest::DIGESTS) {
            out.insert(rel, Stamp::of(&meta));
        }
    }
    Ok(out)
}

/// Every symbolic link under `dir` (relative paths).
fn list_links(dir: &Path) -> io::Result<Vec<String>> {
    Ok(walk(dir)?
        .into_iter()
        .filter(|(_, kind, _)| kind.is_symlink())
        .map(|(rel, _, _)| rel)
        .collect())
}

/// Every entry under `dir` but directories: relative path, type and
/// metadata, never following a link.
fn walk(dir: &Path) -> io::Result<Vec<(String, fs::FileType, fs::Metadata)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in fs::read_dir(&current)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .map_err(io::Error::other)?
                .to_string_lossy()
                .into_owned();
            out.push((rel, kind, entry.metadata()?));
        }
    }
    Ok(out)
}

/// Write a file so that readers see the old contents or the new, never a
/// torn mix, and never through a link (see `hostfs::write_atomic`).
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    hostfs::write_atomic(path, bytes, 0o644)
}

/// Every variant dir of every model under the cache root, as
/// `(model, key, dir)`.
pub fn list_variants(cache_dir: &Path) -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(models) = fs::read_dir(cache_dir) else {
        return out;
    };
    for model in models.flatten().filter(|e| e.path().is_dir()) {
        let Ok(variants) = fs::read_dir(model.path()) else {
            continue;
        };
        // `kernels-<variant>`: tt-worker-openai's compiled-kernel cache
        // (TT_METAL_CACHE), kept beside the variants, not one of them.
        let is_variant = |e: &fs::DirEntry| {
            e.path().is_dir() && !e.file_name().to_string_lossy().starts_with("kernels-")
        };
        for variant in variants.flatten().filter(is_variant) {
            out.push((
                model.file_name().to_string_lossy().into_owned(),
                variant.file_name().to_string_lossy().into_owned(),
                variant.path(),
            ));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_engine_kernel_cache_beside_the_variants_is_not_listed_as_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("m/0123456789abcdef")).unwrap();
        std::fs::create_dir_all(dir.path().join("m/kernels-0123456789abcdef")).unwrap();
        let listed: Vec<String> = super::list_variants(dir.path())
            .into_iter()
            .map(|(_, v, _)| v)
            .collect();
        assert_eq!(listed, ["0123456789abcdef"]);
    }

    #[test]
    fn a_checkpoint_directory_is_known_by_its_files_names_sizes_and_mtimes() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("Qwen");
        std::fs::create_dir_all(model.join("sub")).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        std::fs::write(model.join("sub/model-00001.safetensors"), "weights").unwrap();
        let first = super::file_identity(&model);
        assert!(first.contains("directory files=2"), "{first}");
        assert_eq!(super::file_identity(&model), first, "stable");
        std::fs::write(model.join("sub/model-00001.safetensors"), "new weights").unwrap();
        let grown = super::file_identity(&model);
        assert_ne!(grown, first, "a file that changed size");
        std::fs::write(model.join("tokenizer.json"), "{}").unwrap();
        let added = super::file_identity(&model);
        assert_ne!(added, grown, "a file added");
        assert!(added.contains("files=3"), "{added}");
    }

    use super::*;

    fn model(dir: &Path, flags: &[(&str, &str)], cache_flags: &[&str]) -> ModelConfig {
        let checkpoint = dir.join("m.gguf");
        // Written once: its identity includes its mtime, and a second write
        // could land in another tick and make "the same" variant differ.
        if !checkpoint.exists() {
            fs::write(&checkpoint, b"weights").unwrap();
        }
        let text = format!(
            "tp = 1\ncards = [0]\ncheckpoint = \"{}\"\n",
            checkpoint.display()
        );
        let mut m: ModelConfig = toml::from_str(&text).unwrap();
        m.flags = flags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        m.cache_flags = cache_flags.iter().map(|s| s.to_string()).collect();
        m
    }

    #[test]
    fn cache_flags_change_the_variant_and_other_flags_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let worker = vec!["/bin/true".to_string()];
        let base = Variant::for_model(
            dir.path(),
            "m",
            &model(dir.path(), &[("Q", "0"), ("X", "1")], &["Q"]),
            &worker,
        );
        let same = Variant::for_model(
            dir.path(),
            "m",
            &model(dir.path(), &[("Q", "0"), ("X", "0")], &["Q"]),
            &worker,
        );
        let other = Variant::for_model(
            dir.path(),
            "m",
            &model(dir.path(), &[("Q", "1"), ("X", "1")], &["Q"]),
            &worker,
        );
        assert_eq!(base.key, same.key);
        assert_ne!(base.key, other.key);
        assert_eq!(base.key.len(), 16);
    }

    /// The field's dtype A/B: two arms of one flag in one shared
    /// directory, each built cold once, then warm both ways; a build that
    /// rewrites another arm's file makes that arm cold again.
    #[test]
    fn shared_layout_arms_build_cold_once_then_switch_warm_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let arm = |value: &str| {
            let mut m = model(dir.path(), &[("BFP8", value)], &["BFP8"]);
            m.cache_layout = CacheLayout::Shared;
            Variant::for_model(dir.path(), "m", &m, &[])
        };
        let (a, b) = (arm("0"), arm("1"));
        assert_eq!(a.key, b.key, "one directory for every arm");
        assert_eq!(a.arm.as_deref(), Some("BFP8=0"));
        let build = |v: &Variant, file: &str| {
            assert_eq!(v.state(), CacheState::Cold, "{:?} before its build", v.arm);
            v.prepare_cold().unwrap();
            fs::write(v.dir.join(file), b"tensor").unwrap();
            v.write_marker(&RuntimeFiles::default()).unwrap();
        };
        build(&a, "w_dtype_BFLOAT16_layout_TILE.tensorbin");
        assert!(matches!(a.state(), CacheState::Warm { .. }));
        assert_eq!(b.state(), CacheState::Cold, "arm B was never built");
        build(&b, "w_dtype_BFLOAT8_B_layout_TILE.tensorbin");
        assert!(
            a.dir
                .join("w_dtype_BFLOAT16_layout_TILE.tensorbin")
                .exists(),
            "A's files kept"
        );
        assert!(matches!(a.state(), CacheState::Warm { files: 2, .. }));
        assert!(matches!(b.state(), CacheState::Warm { files: 2, .. }));
        assert_eq!(built_arms(&a.dir), ["BFP8=0", "BFP8=1"]);
        // A warm start of either generates nothing: the guard passes.
        assert!(a.guard(&RuntimeFiles::default()).unwrap().passed());

        // An engine whose names do not carry the dtype: C's build rewrites
        // A's and B's file, so they are forgotten.
        let c = arm("2");
        c.prepare_cold().unwrap();
        fs::write(
            c.dir.join("w_dtype_BFLOAT16_layout_TILE.tensorbin"),
            b"other tensor",
        )
        .unwrap();
        c.write_marker(&RuntimeFiles::default()).unwrap();
        assert_eq!(built_arms(&c.dir), ["BFP8=2"]);
        assert_eq!(a.state(), CacheState::Cold);
    }

    #[test]
    fn marker_makes_a_variant_warm_and_a_changed_file_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let v = Variant::for_model(dir.path(), "m", &model(dir.path(), &[], &[]), &[]);
        assert_eq!(v.state(), CacheState::Cold);
        v.prepare_cold().unwrap();
        fs::create_dir_all(v.dir.join("rank0")).unwrap();
        fs::write(
            v.dir.join("rank0/w_dtype_BFLOAT8_B_layout_TILE.tensorbin"),
            b"abcd",
        )
        .unwrap();
        assert_eq!(v.state(), CacheState::Cold, "no marker yet");
        v.write_marker(&RuntimeFiles::default()).unwrap();
        assert_eq!(v.state(), CacheState::Warm { files: 1, bytes: 4 });
        fs::write(
            v.dir.join("rank0/w_dtype_BFLOAT8_B_layout_TILE.tensorbin"),
            b"ab",
        )
        .unwrap();
        assert!(
            matches!(v.state(), CacheState::Incomplete { reason } if reason.contains("has 2 bytes"))
        );
    }

    #[test]
    fn guard_deletes_and_names_files_a_warm_start_generated() {
        let dir = tempfile::tempdir().unwrap();
        let v = Variant::for_model(dir.path(), "m", &model(dir.path(), &[], &[]), &[]);
        v.prepare_cold().unwrap();
        fs::write(v.dir.join("a.tensorbin"), b"1").unwrap();
        v.write_marker(&RuntimeFiles::default()).unwrap();
        assert!(v.guard(&RuntimeFiles::default()).unwrap().passed());
        fs::write(v.dir.join("b.tensorbin"), b"placeholder").unwrap();
        assert_eq!(
            v.guard(&RuntimeFiles::default()).unwrap().generated,
            vec!["b.tensorbin".to_string()]
        );
        assert!(!v.dir.join("b.tensorbin").exists());
        assert!(v.dir.join("a.tensorbin").exists());
        assert_eq!(
            v.state(),
            CacheState::Cold,
            "invalidated: the next start is cold"
        );
    }

    #[test]
    fn an_engines_runtime_files_are_not_weights_but_a_new_weights_file_still_fails_the_guard() {
        let dir = tempfile::tempdir().unwrap();
        let runtime =
            RuntimeFiles::new(vec!["weights/*empty_*cache_paged_attention*".into()]).unwrap();
        let v = Variant::for_model(dir.path(), "m", &model(dir.path(), &[], &[]), &[]);
        v.prepare_cold().unwrap();
        fs::create_dir_all(v.dir.join("weights/P150")).unwrap();
        fs::write(v.dir.join("weights/P150/layers.0.wq.tensorbin"), b"1").unwrap();
        let kv32 = "weights/P150/empty_kcache_paged_attention1024_1_8_64_128.tensorbin";
        fs::write(v.dir.join(kv32), b"kv").unwrap();
        let marker = v.write_marker(&runtime).unwrap();
        assert_eq!(
            marker.files.keys().collect::<Vec<_>>(),
            vec!["weights/P150/layers.0.wq.tensorbin"],
            "the cold start's KV buffers are not part of the variant"
        );
        // Deleting them leaves the variant warm.
        fs::remove_file(v.dir.join(kv32)).unwrap();
        assert!(matches!(v.state(), CacheState::Warm { files: 1, .. }));
        // A warm start with another scheduler shape writes new ones: fine.
        let kv64 = "weights/P150/empty_vcache_paged_attention2048_1_8_64_128.tensorbin";
        fs::write(v.dir.join(kv64), b"kv").unwrap();
        assert!(v.guard(&runtime).unwrap().passed());
        assert!(v.dir.join(kv64).exists(), "kept for the engine");
        // A weights file is still a placeholder the engine generated.
        fs::write(v.dir.join("weights/P150/layers.1.wq.tensorbin"), b"0").unwrap();
        assert_eq!(
            v.guard(&runtime).unwrap().generated,
            vec!["weights/P150/layers.1.wq.tensorbin".to_string()]
        );
        assert_eq!(v.state(), CacheState::Cold, "invalidated");
        v.write_marker(&runtime).unwrap();
        // So is a link, whatever its name.
        std::os::unix::fs::symlink(
            dir.path(),
            v.dir.join("weights/empty_kcache_paged_attention_link"),
        )
        .unwrap();
        assert_eq!(
            v.guard(&runtime).unwrap().generated,
            vec!["weights/empty_kcache_paged_attention_link".to_string()]
        );
    }

    /// ttnn rebuilds a file it fails to load in place under the same name
    /// (tmp + rename: a new inode), so no new file appears; the guard sees
    /// the listed file change, and a same-size overwrite too.
    #[test]
    fn a_warm_start_that_rewrites_a_cached_file_is_refused_and_the_variant_goes_cold() {
        let dir = tempfile::tempdir().unwrap();
        let v = Variant::for_model(dir.path(), "m", &model(dir.path(), &[], &[]), &[]);
        v.prepare_cold().unwrap();
        let name =
            "P150/tensor_cache_bf16/layers.0.attention_norm_dtype_BFLOAT16_layout_TILE.tensorbin";
        fs::create_dir_all(v.dir.join("P150/tensor_cache_bf16")).unwrap();
        fs::write(v.dir.join(name), b"real weights").unwrap();
        v.write_marker(&RuntimeFiles::default()).unwrap();
        assert!(matches!(v.state(), CacheState::Warm { files: 1, .. }));

        // Rebuilt from a placeholder of the same size, as ttnn does.
        let tmp = v.dir.join(format!("{name}.tmp.1.0"));
        fs::write(&tmp, b"NaN NaN NaN!").unwrap();
        fs::rename(&tmp, v.dir.join(name)).unwrap();
        let report = v.guard(&RuntimeFiles::default()).unwrap();
        assert!(report.generated.is_empty());
        assert_eq!(report.changed.len(), 1, "{report:?}");
        assert!(
            report.changed[0].starts_with(name) && report.changed[0].contains("was replaced"),
            "{report:?}"
        );
        assert!(report
            .describe()
            .contains("cached files changed during the warm start"));
        assert_eq!(v.state(), CacheState::Cold, "the next start builds it cold");
        assert!(v.dir.join(name).exists(), "the files stay until that build");

        // Before a start, a changed file makes the variant incomplete.
        v.write_marker(&RuntimeFiles::default()).unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(v.dir.join(name))
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"NaN"))
            .unwrap();
        assert!(
            matches!(v.state(), CacheState::Incomplete { reason } if reason.contains("written after the build")),
        );
    }

    #[test]
    fn the_engine_the_cards_and_the_mesh_are_in_the_key() {
        use crate::worker::identity::Identity;
        let dir = tempfile::tempdir().unwrap();
        let m = model(dir.path(), &[], &[]);
        let base = Variant::for_model(dir.path(), "m", &m, &[]);
        let engine = |ttnn: &str| {
            Identity::Answered(
                [("python ttnn".to_string(), ttnn.to_string())]
                    .into_iter()
                    .collect(),
            )
        };
        let cards = ["p150a".to_string()];
        let a = base
            .clone()
            .on_engine(dir.path(), &engine("0.81.1"), &cards, "(1,1)");
        let same = base
            .clone()
            .on_engine(dir.path(), &engine("0.81.1"), &cards, "(1,1)");
        let upgraded = base
            .clone()
            .on_engine(dir.path(), &engine("0.82.0"), &cards, "(1,1)");
        let other_card = base.clone().on_engine(
            dir.path(),
            &engine("0.81.1"),
            &["n300".to_string()],
            "(1,1)",
        );
        let other_mesh = base
            .clone()
            .on_engine(dir.path(), &engine("0.81.1"), &cards, "(1,2)");
        assert_eq!(a.key, same.key);
        assert_eq!(a.dir, dir.path().join("m").join(&a.key));
        for other in [&base, &upgraded, &other_card, &other_mesh] {
            assert_ne!(a.key, other.key);
        }
        assert_eq!(a.inputs["engine python ttnn"], "0.81.1");
        assert_eq!(a.inputs["cards"], "p150a");
        let silent = base.on_engine(
            dir.path(),
            &Identity::Unanswered("no line".into()),
            &cards,
            "(1,1)",
        );
        assert_eq!(silent.inputs["engine"], "(no identity step answer)");
    }

    #[test]
    fn ttnn_rebuild_lines_name_their_file_and_the_engines_kv_buffers_are_excused() {
        let dir = Path::new("/var/cache/tt/m/0123456789abcdef");
        let kv = "2026-12-05 01:17:46.603 | DEBUG    | core:from_torch_and_dump:905 - Generating cache for /var/cache/tt/m/0123456789abcdef/weights/P150/empty_kcache_paged_attention(2056, 8, 64, 64)_dtype_BFLOAT8_B_layout_TILE.tensorbin of shape Shape([1, 1, 64, 64]), dtype BFLOAT8_B, layout TILE";
        let weights = "2026-12-05 01:17:54.157 | WARNING  | core:as_tensor:935 - Failed to load cache for /var/cache/tt/m/0123456789abcdef/weights/P150/tensor_cache_bfp8/layers.0.attention.wqkv_dtype_BFLOAT8_B_layout_TILE.tensorbin: TT_FATAL @ /project/ttnn/core/tensor/serialization.cpp:99";
        assert!(is_rebuild_line(kv) && is_rebuild_line(weights));
        assert!(!is_rebuild_line(
            "DEBUG | core:as_tensor:933 - Loaded cache for /x of shape Shape([64, 64])"
        ));
        assert_eq!(
            rebuild_line_path(weights),
            Some("/var/cache/tt/m/0123456789abcdef/weights/P150/tensor_cache_bfp8/layers.0.attention.wqkv_dtype_BFLOAT8_B_layout_TILE.tensorbin")
        );
        let runtime =
            RuntimeFiles::new(vec!["weights/*empty_*cache_paged_attention*".into()]).unwrap();
        assert!(runtime.excuses(kv, dir));
        assert!(!runtime.excuses(weights, dir));
        assert!(
            !runtime.excuses(kv, Path::new("/elsewhere")),
            "another variant's file"
        );
    }

    #[test]
    fn a_runtime_file_pattern_that_matches_everything_is_refused() {
        for p in ["*", "**", "*/*", ""] {
            let e = RuntimeFiles::new(vec!["ok_kv*".into(), p.into()]).unwrap_err();
            assert!(
                e.contains("guard off") && e.contains(&format!("{p:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn links_in_a_variant_are_removed_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        fs::write(&precious, b"keep").unwrap();
        let v = Variant::for_model(dir.path(), "m", &model(dir.path(), &[], &[]), &[]);
        v.prepare_cold().unwrap();
        fs::write(v.dir.join("a.tensorbin"), b"1").unwrap();
        // A link where the marker's temp file goes: replaced, not followed.
        let tmp_name = format!(".{MARKER}.tmp.{}.0", std::process::id());
        std::os::unix::fs::symlink(&precious, v.dir.join(&tmp_name)).unwrap();
        v.write_marker(&RuntimeFiles::default()).unwrap();
        assert_eq!(fs::read(&precious).unwrap(), b"keep");
        fs::remove_file(v.dir.join(&tmp_name)).unwrap();
        // A link a warm start left behind is unexpected: removed, target kept.
        std::os::unix::fs::symlink(&precious, v.dir.join("b.tensorbin")).unwrap();
        assert_eq!(
            v.guard(&RuntimeFiles::default()).unwrap().generated,
            vec!["b.tensorbin".to_string()]
        );
        assert!(fs::symlink_metadata(v.dir.join("b.tensorbin")).is_err());
        assert_eq!(fs::read(&precious).unwrap(), b"keep");
        // A link at the variant's own path is removed by a cold start.
        let v2 = Variant::for_model(dir.path(), "m2", &model(dir.path(), &[], &[]), &[]);
        fs::create_dir_all(v2.dir.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(dir.path(), &v2.dir).unwrap();
        v2.prepare_cold().unwrap();
        assert!(fs::symlink_metadata(&v2.dir).unwrap().is_dir());
        assert_eq!(fs::read(&precious).unwrap(), b"keep");
    }
}
