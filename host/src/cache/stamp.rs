//! What proves a cache file untouched since the cold build that made it.
//!
//! ttnn writes its cache in place under the final name and rebuilds a file
//! it fails to load in place from whatever tensor the caller passed (on a
//! warm start, a placeholder), with no checksum (docs/HARDWARE.md, "ttnn
//! 0.81.1"). So a size check cannot see a damaged file rebuilt to the same
//! size, nor a same-size overwrite. Every write moves a file's change time
//! (ctime), which no user call can set back; a replacement gets a new inode.
//! The marker keeps, per file: size, mtime and ctime to the nanosecond, and
//! the inode. Reading a file (a warm load) changes none of them.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// A file's identity as the marker records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stamp {
    /// Bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, nanoseconds since the epoch: moved by every
    /// write, rename or chmod, and by nothing a process can set.
    pub ctime_ns: i64,
    /// Inode number: a file replaced by another has a new one.
    pub ino: u64,
}

impl Stamp {
    /// The stamp of a file's metadata (read without following a link).
    pub fn of(meta: &Metadata) -> Stamp {
        // i64 nanoseconds last until 2262.
        let ns = |secs: i64, nsec: i64| secs.saturating_mul(1_000_000_000).saturating_add(nsec);
        Stamp {
            size: meta.len(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
        }
    }

    /// How `now` differs from this recorded stamp, in words; None when it
    /// is the same file, untouched.
    pub fn differs(&self, now: &Stamp) -> Option<String> {
        if now.size != self.size {
            return Some(format!(
                "has {} bytes, the marker says {}",
                now.size, self.size
            ));
        }
        if now.ino != self.ino {
            return Some(format!(
                "was replaced (inode {}, the marker says {})",
                now.ino, self.ino
            ));
        }
        if now.mtime_ns != self.mtime_ns || now.ctime_ns != self.ctime_ns {
            return Some(format!(
                "was written after the build (modified {}, changed {}; the marker says {} and {})",
                show_ns(now.mtime_ns),
                show_ns(now.ctime_ns),
                show_ns(self.mtime_ns),
                show_ns(self.ctime_ns)
            ));
        }
        None
    }
}

/// One file in the marker: its stamp, or (markers written before stamps)
/// its size alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Entry {
    /// Size, mtime, ctime and inode.
    Stamped(Stamp),
    /// Size only (an older marker): only a size change can be seen.
    Size(u64),
}

impl Entry {
    /// The recorded size.
    pub fn size(&self) -> u64 {
        match self {
            Entry::Stamped(s) => s.size,
            Entry::Size(size) => *size,
        }
    }

    /// How the file as it is now differs from this entry; None when it
    /// matches.
    pub fn differs(&self, now: &Stamp) -> Option<String> {
        match self {
            Entry::Stamped(recorded) => recorded.differs(now),
            Entry::Size(size) if *size != now.size => {
                Some(format!("has {} bytes, the marker says {size}", now.size))
            }
            Entry::Size(_) => None,
        }
    }
}

/// Nanoseconds since the epoch as `seconds.nanoseconds`.
fn show_ns(ns: i64) -> String {
    format!(
        "{}.{:09}",
        ns.div_euclid(1_000_000_000),
        ns.rem_euclid(1_000_000_000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;

    fn stamp(path: &std::path::Path) -> Stamp {
        Stamp::of(&fs::symlink_metadata(path).unwrap())
    }

    #[test]
    fn reading_keeps_the_stamp_and_every_kind_of_write_changes_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w_dtype_BFLOAT16_layout_TILE.tensorbin");
        fs::write(&file, b"0123456789abcdef").unwrap();
        let built = stamp(&file);
        assert_eq!(fs::read(&file).unwrap().len(), 16);
        assert_eq!(built.differs(&stamp(&file)), None, "a warm load reads only");

        // Same size, same bytes, written again in place (ttnn's rebuild).
        fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .write_all(b"0123456789abcdef")
            .unwrap();
        let why = built.differs(&stamp(&file)).expect("a rewrite is seen");
        assert!(why.contains("written after the build"), "{why}");

        // Truncated.
        let rewritten = stamp(&file);
        fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(8)
            .unwrap();
        let why = rewritten.differs(&stamp(&file)).unwrap();
        assert!(why.contains("has 8 bytes, the marker says 16"), "{why}");

        // Replaced by another file of the same size.
        let before = stamp(&file);
        let other = dir.path().join("other");
        fs::write(&other, b"01234567").unwrap();
        fs::rename(&other, &file).unwrap();
        let why = before.differs(&stamp(&file)).unwrap();
        assert!(why.contains("was replaced"), "{why}");
    }

    #[test]
    fn an_older_markers_size_entries_still_load_and_check_the_size() {
        let text = r#"{"a": 4, "b": {"size": 2, "mtime_ns": 1, "ctime_ns": 2, "ino": 3}}"#;
        let files: std::collections::BTreeMap<String, Entry> = serde_json::from_str(text).unwrap();
        assert_eq!(files["a"], Entry::Size(4));
        assert_eq!(files["b"].size(), 2);
        let now = Stamp {
            size: 4,
            mtime_ns: 9,
            ctime_ns: 9,
            ino: 9,
        };
        assert_eq!(files["a"].differs(&now), None);
        assert!(files["b"].differs(&now).is_some());
    }
}
