//! Opening files without following links: a hostile local user may plant a
//! symbolic or hard link where we create or write a file, to make us write
//! through it. Every file we write in place is opened `O_NOFOLLOW` and
//! checked to be a plain file with one link.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

fn not_plain(path: &Path, what: &str) -> io::Error {
    io::Error::other(format!(
        "{} is {what}; the daemon only writes plain files it can trust there. Remove it (it was not made by tt-servingd)",
        path.display()
    ))
}

/// Map ELOOP from `O_NOFOLLOW` to an error that says what was found.
fn no_follow_error(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        not_plain(path, "a symbolic link")
    } else {
        e
    }
}

/// Check that an open file is a regular file with exactly one link, so
/// writing or truncating it changes only this path.
pub fn check_plain(path: &Path, file: &File) -> io::Result<()> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(not_plain(path, "not a regular file"));
    }
    if meta.nlink() != 1 {
        return Err(not_plain(
            path,
            &format!("a file with {} hard links", meta.nlink()),
        ));
    }
    Ok(())
}

/// Open (creating with `mode` if absent) a file to write in place, never
/// through a link, and only if it is a plain file with one link.
pub fn open_in_place(path: &Path, mode: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| no_follow_error(path, e))?;
    check_plain(path, &file)?;
    Ok(file)
}

/// Open an existing file read-only without following a link.
pub fn open_read(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| no_follow_error(path, e))
}

/// Read a whole file without following a link.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    open_read(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// Whether `path` is a regular file (a link there is not).
pub fn is_plain_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}
