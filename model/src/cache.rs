//! The tensor cache: one file per tensor per rank, in the layout the ranks
//! compute with.
//!
//! A file is named by tensor, TP degree, rank, dtype and layout
//! (`blk.0.ffn_down.weight_tp2_rank1_dtype_Q8_0_layout_COLSHARD.tensorbin`),
//! the field's convention: the dtype is part of the name, so two variants of
//! one tensor never collide. Files are written under a temporary name, synced
//! and renamed, so a crash mid-build leaves no file that looks complete.
//!
//! A warm start maps the files and checks each one's size and header against
//! what the shard plan expects. A missing or wrong-sized file is an error that
//! names it: the field's worst cache incident was a warm start that filled a
//! missing file with placeholders and served a model of NaNs, so this module
//! never invents data.
//!
//! File format: a 64-byte header (magic `TTWTENS1`, GGML dtype id as u32,
//! number of dims as u32, four u64 dims, data length as u64, an interleave
//! byte (1: interleaved by 8 rows, see `kernels::pack_q4_1_x8` and
//! `kernels::pack_q8_0_x8`), zero
//! padding) followed by the tensor data in GGML block layout (or that
//! interleaved one). The fixed header
//! keeps the data 64-byte aligned in the mapping.

use crate::weights::ShardSpec;
use candle_core::quantized::GgmlDType;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"TTWTENS1";
/// Size of the header before the tensor data.
pub const HEADER_LEN: usize = 64;
const MAX_DIMS: usize = 4;

pub use tt_serving_proto::CacheMode;

/// Why a cache file could not be written or used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A warm start found a planned file absent.
    #[error("warm start: cache file {0} is missing; the cache is incomplete, rebuild it with a cold start (--cache-mode cold)")]
    Missing(PathBuf),
    /// A warm start found a file of the wrong size.
    #[error("warm start: cache file {file} has {actual} bytes, expected {expected}; the cache is damaged or from another build, rebuild it with a cold start")]
    WrongSize {
        /// The file.
        file: PathBuf,
        /// Bytes the plan expects.
        expected: u64,
        /// Bytes on disk.
        actual: u64,
    },
    /// A file's header disagrees with the plan.
    #[error("cache file {file}: {problem}; rebuild the cache with a cold start")]
    BadHeader {
        /// The file.
        file: PathBuf,
        /// What disagrees.
        problem: String,
    },
    /// A filesystem operation failed.
    #[error("cache file {file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Stable upper-case name of a dtype, as used in file names.
pub fn dtype_name(dtype: GgmlDType) -> &'static str {
    match dtype {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// The dtype a [`dtype_name`] names.
pub fn dtype_from_name(name: &str) -> Option<GgmlDType> {
    [
        GgmlDType::F32,
        GgmlDType::F16,
        GgmlDType::BF16,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q8_1,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::Q8K,
    ]
    .into_iter()
    .find(|d| dtype_name(*d) == name)
}

/// The GGML numeric id of a dtype (stable across ggml versions).
fn dtype_id(dtype: GgmlDType) -> u32 {
    match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

/// Byte length of a tensor of `shape` stored as `dtype`.
pub fn data_len(dtype: GgmlDType, shape: &[usize]) -> usize {
    shape.iter().product::<usize>() / dtype.block_size() * dtype.type_size()
}

fn header(spec: &ShardSpec) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&dtype_id(spec.dtype).to_le_bytes());
    h[12..16].copy_from_slice(&(spec.shape.len() as u32).to_le_bytes());
    for (i, d) in spec.shape.iter().enumerate().take(MAX_DIMS) {
        let at = 16 + 8 * i;
        h[at..at + 8].copy_from_slice(&(*d as u64).to_le_bytes());
    }
    let len = data_len(spec.dtype, &spec.shape) as u64;
    h[48..56].copy_from_slice(&len.to_le_bytes());
    h[56] = u8::from(spec.interleaved);
    h
}

/// Writes `data` as the file of `spec` in `dir`: temp name, fsync, rename.
/// Returns the file name (relative to `dir`). On failure the temp file is
/// removed, so a full disk is not left fuller by a half-written tensor.
pub fn write(dir: &Path, spec: &ShardSpec, data: &[u8]) -> Result<String, CacheError> {
    write_file(dir, spec, data, false)
}

/// TEST ONLY (`TTW_FAULT_CACHE_WRITE_ERROR`): like [`write`], but the disk
/// fills up half way through the data and the write fails with ENOSPC, the
/// way it fails on a full cache filesystem.
pub fn write_no_space(dir: &Path, spec: &ShardSpec, data: &[u8]) -> Result<String, CacheError> {
    write_file(dir, spec, data, true)
}

fn write_file(
    dir: &Path,
    spec: &ShardSpec,
    data: &[u8],
    no_space: bool,
) -> Result<String, CacheError> {
    let name = spec.file_name();
    let path = dir.join(&name);
    let expected = data_len(spec.dtype, &spec.shape);
    if data.len() != expected {
        return Err(CacheError::BadHeader {
            file: path,
            problem: format!(
                "internal: shard has {} bytes, plan expects {expected}",
                data.len()
            ),
        });
    }
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = create_temp(&tmp)?;
        f.write_all(&header(spec))?;
        if no_space {
            f.write_all(&data[..data.len() / 2])?;
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        f.write_all(data)?;
        // The daemon certifies the file set with a marker after we exit; a
        // certified file must be on disk, not only in the page cache.
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(CacheError::Io { file: path, source });
    }
    Ok(name)
}

/// Create a temp file afresh, never through a link planted at its name: a
/// leftover from a crashed build is removed (unlink removes a link, not its
/// target), then `O_EXCL|O_NOFOLLOW` refuses anything that appeared since.
fn create_temp(tmp: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)
}

/// The cached checkpoint header (config, tokenizer, tensor directory),
/// written by a cold start so a warm start never parses the checkpoint.
pub const META_FILE: &str = "checkpoint-header.json";

/// Writes the cached checkpoint header: temp name, fsync, rename.
pub fn write_meta(dir: &Path, json: &[u8]) -> Result<String, CacheError> {
    let path = dir.join(META_FILE);
    let tmp = dir.join(format!(".{META_FILE}.tmp.{}", std::process::id()));
    let io = |source| CacheError::Io {
        file: path.clone(),
        source,
    };
    let mut f = create_temp(&tmp).map_err(io)?;
    f.write_all(json).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(META_FILE.to_string())
}

/// Reads the cached checkpoint header; a missing file is
/// [`CacheError::Missing`] naming it.
pub fn read_meta(dir: &Path) -> Result<(PathBuf, Vec<u8>), CacheError> {
    let path = dir.join(META_FILE);
    match std::fs::read(&path) {
        Ok(b) => Ok((path, b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CacheError::Missing(path)),
        Err(source) => Err(CacheError::Io { file: path, source }),
    }
}

/// Makes the renames of a cold build durable.
pub fn sync_dir(dir: &Path) -> Result<(), CacheError> {
    let io = |source| CacheError::Io {
        file: dir.to_path_buf(),
        source,
    };
    File::open(dir).map_err(io)?.sync_all().map_err(io)
}

/// A mapped cache file; [`Mapped::data`] is the tensor data.
pub struct Mapped {
    map: memmap2::Mmap,
}

impl Mapped {
    /// The tensor data, 64-byte aligned.
    pub fn data(&self) -> &[u8] {
        &self.map[HEADER_LEN..]
    }
}

/// Maps the file of `spec` in `dir` after checking its size and header.
pub fn map(dir: &Path, spec: &ShardSpec) -> Result<Mapped, CacheError> {
    let path = dir.join(spec.file_name());
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CacheError::Missing(path));
        }
        Err(source) => return Err(CacheError::Io { file: path, source }),
    };
    let actual = file
        .metadata()
        .map_err(|source| CacheError::Io {
            file: path.clone(),
            source,
        })?
        .len();
    let expected = (HEADER_LEN + data_len(spec.dtype, &spec.shape)) as u64;
    if actual != expected {
        return Err(CacheError::WrongSize {
            file: path,
            expected,
            actual,
        });
    }
    // SAFETY: the cache directory belongs to this worker's variant; the
    // daemon serialises builds of a variant, so nobody truncates the file
    // while it is mapped; a rebuild renames a new file over it, which leaves
    // this mapping intact. The mapping lives as long as the worker's
    // weights: the Q4_1 kernels read it in place.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| CacheError::Io {
        file: path.clone(),
        source,
    })?;
    if map[..HEADER_LEN] != header(spec) {
        return Err(CacheError::BadHeader {
            file: path,
            problem: format!(
                "header does not describe a {}{} tensor of shape {:?}",
                dtype_name(spec.dtype),
                if spec.interleaved {
                    " (interleaved by 8 rows)"
                } else {
                    ""
                },
                spec.shape
            ),
        });
    }
    Ok(Mapped { map })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Layout;

    fn spec() -> ShardSpec {
        ShardSpec {
            tensor: "blk.0.attn_norm.weight".into(),
            tp: 1,
            rank: 0,
            layout: Layout::Replicated,
            dtype: GgmlDType::F32,
            shape: vec![16],
            parts: Vec::new(),
            interleaved: false,
        }
    }

    #[test]
    fn a_full_disk_fails_the_write_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![0u8; 64];
        let err = write_no_space(dir.path(), &spec(), &data).unwrap_err();
        match err {
            CacheError::Io { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC))
            }
            other => panic!("{other}"),
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let name = write(dir.path(), &spec(), &data).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![name]);
    }
}
