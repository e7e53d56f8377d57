//! Content hashes of a variant's files: recorded once after its cold build
//! (one more read of files the build took minutes to write: a small part
//! of its wall time), checked on demand by
//! `ttctl cache verify`. A stamp ([`super::stamp`]) sees every write through
//! the file system; a hash also sees what bypasses it (a disk that flips a
//! bit, a restore from a backup that kept the times). A variant whose files
//! do not match is invalidated: never used warm again.

use super::stamp::Stamp;
use super::{read_marker, Marker};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The digests file inside a variant dir.
pub const DIGESTS: &str = ".tt-serving-digests.json";

/// Read size per call while hashing.
const CHUNK: usize = 1 << 20;

/// The digests file's contents.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Digests {
    /// The marker these belong to (its `created_unix_ms`): a later build
    /// of the same variant does not inherit them.
    pub marker_created_unix_ms: u64,
    /// Relative path -> SHA-256, hex.
    pub files: BTreeMap<String, String>,
}

/// Where a long hash run is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Files finished.
    pub files_done: usize,
    /// Files in all.
    pub files_total: usize,
    /// Bytes hashed.
    pub bytes_done: u64,
    /// Bytes in all.
    pub bytes_total: u64,
}

/// What a verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every listed file has its recorded content.
    Verified {
        /// Files checked.
        files: usize,
        /// Bytes hashed.
        bytes: u64,
    },
    /// Files whose content differs from the record, each with how; the
    /// variant has been invalidated.
    Mismatch(Vec<String>),
    /// Nothing to check against, and why (no complete variant, no
    /// digests recorded for this build).
    Unverifiable(String),
}

/// Hash every file the marker lists and write the digests beside it.
/// A file that changes while it is hashed fails the record (the guard or
/// the next start will see the change); nothing partial is written.
pub fn record(dir: &Path) -> io::Result<Digests> {
    let marker = read_marker(dir)?;
    let files = hash_all(dir, &marker, &mut |_| {})?
        .into_iter()
        .map(|(name, hashed)| {
            hashed
                .map(|h| (name.clone(), h))
                .map_err(|why| io::Error::other(format!("{name} {why}")))
        })
        .collect::<io::Result<BTreeMap<_, _>>>()?;
    let digests = Digests {
        marker_created_unix_ms: marker.created_unix_ms,
        files,
    };
    let text = serde_json::to_vec_pretty(&digests).map_err(io::Error::other)?;
    super::atomic_write(&dir.join(DIGESTS), &text)?;
    Ok(digests)
}

/// Check every file the marker lists against the recorded digests,
/// reporting progress after each chunk; a mismatch invalidates the
/// variant.
pub fn verify(dir: &Path, progress: &mut dyn FnMut(&Progress)) -> io::Result<Verdict> {
    let marker = match read_marker(dir) {
        Ok(marker) => marker,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Verdict::Unverifiable(
                "the variant is not complete (no marker): it is never used warm; the next start builds it cold".into(),
            ))
        }
        Err(e) => return Err(e),
    };
    let digests: Digests = match super::hostfs::read(&dir.join(DIGESTS)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Verdict::Unverifiable(
                "no content hashes are recorded for this build (they are computed at the end of a cold build; a variant built by an older tt-serving, or whose hashing failed, has none: `ttctl cache build MODEL` rebuilds it with them)".into(),
            ))
        }
        Err(e) => return Err(e),
    };
    if digests.marker_created_unix_ms != marker.created_unix_ms {
        return Ok(Verdict::Unverifiable(
            "the recorded hashes belong to an earlier build of this variant; they are recomputed after the next cold build".into(),
        ));
    }
    let mut bad = Vec::new();
    let mut bytes = 0;
    for (name, hashed) in hash_all(dir, &marker, progress)? {
        let recorded = digests.files.get(&name);
        match (hashed, recorded) {
            (Ok(hash), Some(recorded)) if hash == *recorded => {
                bytes += marker.files.get(&name).map_or(0, |e| e.size())
            }
            (Ok(hash), Some(recorded)) => bad.push(format!(
                "{name} has SHA-256 {hash}, the build recorded {recorded}"
            )),
            (Ok(_), None) => bad.push(format!("{name} has no recorded hash")),
            (Err(why), _) => bad.push(format!("{name} {why}")),
        }
    }
    if bad.is_empty() {
        return Ok(Verdict::Verified {
            files: marker.files.len(),
            bytes,
        });
    }
    super::invalidate(
        dir,
        &format!("content verification failed: {}", bad.join("; ")),
    )?;
    Ok(Verdict::Mismatch(bad))
}

/// SHA-256 of each file the marker lists, or why it could not be taken
/// (missing, not a plain file, changed while read).
type Hashed = Vec<(String, Result<String, String>)>;

fn hash_all(
    dir: &Path,
    marker: &Marker,
    progress: &mut dyn FnMut(&Progress),
) -> io::Result<Hashed> {
    let mut at = Progress {
        files_total: marker.files.len(),
        bytes_total: marker.files.values().map(|e| e.size()).sum(),
        ..Progress::default()
    };
    progress(&at);
    let mut out = Vec::with_capacity(marker.files.len());
    let mut buf = vec![0u8; CHUNK];
    for name in marker.files.keys() {
        out.push((
            name.clone(),
            hash_file(&dir.join(name), &mut buf, &mut at, progress),
        ));
        at.files_done += 1;
        progress(&at);
    }
    Ok(out)
}

fn hash_file(
    path: &Path,
    buf: &mut [u8],
    at: &mut Progress,
    progress: &mut dyn FnMut(&Progress),
) -> Result<String, String> {
    // Never through a link: a planted one would make us hash (and vouch
    // for) another file.
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => "is missing".to_string(),
            _ => format!("cannot be read ({e})"),
        })?;
    let before = file
        .metadata()
        .map_err(|e| format!("cannot be read ({e})"))?;
    if !before.is_file() {
        return Err("is not a regular file".into());
    }
    let mut hash = Sha256::new();
    let mut since_report = 0usize;
    loop {
        let n = match file.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot be read ({e})")),
        };
        hash.update(&buf[..n]);
        at.bytes_done += n as u64;
        since_report += n;
        if since_report >= 64 * CHUNK {
            since_report = 0;
            progress(at);
        }
    }
    let after = file
        .metadata()
        .map_err(|e| format!("cannot be read ({e})"))?;
    if let Some(why) = Stamp::of(&before).differs(&Stamp::of(&after)) {
        return Err(format!("changed while it was hashed: it {why}"));
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::super::{state_of, CacheState, Marker, MARKER};
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    fn built(dir: &Path) {
        fs::write(
            dir.join("a_dtype_BFLOAT16_layout_TILE.tensorbin"),
            vec![7u8; 3 << 20],
        )
        .unwrap();
        fs::write(dir.join("b.tensorbin"), b"bias").unwrap();
        let mut files = BTreeMap::new();
        for name in ["a_dtype_BFLOAT16_layout_TILE.tensorbin", "b.tensorbin"] {
            let meta = fs::symlink_metadata(dir.join(name)).unwrap();
            files.insert(
                name.to_string(),
                super::super::stamp::Entry::Stamped(Stamp::of(&meta)),
            );
        }
        let marker = Marker {
            files,
            created_unix_ms: 42,
            arms: Vec::new(),
        };
        fs::write(dir.join(MARKER), serde_json::to_vec(&marker).unwrap()).unwrap();
    }

    #[test]
    fn a_recorded_build_verifies_with_progress_and_a_flipped_byte_invalidates_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            verify(dir.path(), &mut |_| {}).unwrap(),
            Verdict::Unverifiable(why) if why.contains("no marker")
        ));
        built(dir.path());
        assert!(matches!(
            verify(dir.path(), &mut |_| {}).unwrap(),
            Verdict::Unverifiable(why) if why.contains("no content hashes")
        ));
        let digests = record(dir.path()).unwrap();
        assert_eq!(digests.files.len(), 2);
        // sha256sum of the four bytes "bias".
        assert_eq!(
            digests.files["b.tensorbin"],
            "fa4824e83746480e1029c47ad659fdc3854195c0fa76c9209807cef32e29243e"
        );
        let mut seen = Vec::new();
        let verdict = verify(dir.path(), &mut |p| seen.push(p.clone())).unwrap();
        assert_eq!(
            verdict,
            Verdict::Verified {
                files: 2,
                bytes: (3 << 20) + 4
            }
        );
        let last = seen.last().unwrap();
        assert_eq!((last.files_done, last.files_total), (2, 2));
        assert_eq!(last.bytes_done, last.bytes_total);
        assert!(seen.len() >= 3, "progress before, and after each file");

        // One byte flipped inside a file of unchanged size.
        let path = dir.path().join("a_dtype_BFLOAT16_layout_TILE.tensorbin");
        let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&[8]).unwrap();
        drop(f);
        let verdict = verify(dir.path(), &mut |_| {}).unwrap();
        let Verdict::Mismatch(bad) = verdict else {
            panic!("{verdict:?}")
        };
        assert!(
            bad[0].starts_with("a_dtype_BFLOAT16_layout_TILE.tensorbin has SHA-256"),
            "{bad:?}"
        );
        assert_eq!(
            state_of(dir.path()),
            CacheState::Cold,
            "never used warm again"
        );
        assert!(!dir.path().join(DIGESTS).exists());
    }

    #[test]
    fn hashes_of_an_earlier_build_do_not_vouch_for_a_later_one() {
        let dir = tempfile::tempdir().unwrap();
        built(dir.path());
        record(dir.path()).unwrap();
        let mut marker = read_marker(dir.path()).unwrap();
        marker.created_unix_ms += 1;
        fs::write(
            dir.path().join(MARKER),
            serde_json::to_vec(&marker).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            verify(dir.path(), &mut |_| {}).unwrap(),
            Verdict::Unverifiable(why) if why.contains("earlier build")
        ));
    }

    #[test]
    fn a_link_where_a_file_was_is_not_hashed() {
        let dir = tempfile::tempdir().unwrap();
        built(dir.path());
        record(dir.path()).unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"bias").unwrap();
        fs::remove_file(dir.path().join("b.tensorbin")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("b.tensorbin")).unwrap();
        let Verdict::Mismatch(bad) = verify(dir.path(), &mut |_| {}).unwrap() else {
            panic!()
        };
        assert!(
            bad.iter()
                .any(|b| b.starts_with("b.tensorbin cannot be read")),
            "{bad:?}"
        );
    }
}
