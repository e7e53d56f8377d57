//! Reading secret files (bearer tokens, the TLS key). A secret every local
//! user can read is no secret, so such a file stops the daemon at startup
//! with the command that fixes it, rather than being served with.

use anyhow::{bail, Context};
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Read the secret file at `path` (named by config key `key` in errors).
/// Refused when "other" users may read or write it. The mode is checked on
/// the opened file, so a file swapped in between cannot slip past.
pub fn read(path: &Path, key: &str) -> anyhow::Result<Vec<u8>> {
    // Non-blocking: a FIFO at the path must not hang startup; the type
    // check below refuses it.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| {
            format!(
                "cannot open {} ({key}); check the path and that the daemon's user may read it",
                path.display()
            )
        })?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat {} ({key})", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{} ({key}) is not a regular file; point {key} at the file itself",
            path.display()
        );
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o007 != 0 {
        bail!(
            "{path} ({key}) has mode {mode:04o}, so every local user can {what} it; restrict it with `chmod o-rwx {path}` (e.g. mode 0640, owned by root and the daemon's group) and start again",
            path = path.display(),
            what = if mode & 0o002 != 0 { "change" } else { "read" },
        );
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {} ({key})", path.display()))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, mode: u32) -> std::path::PathBuf {
        let path = dir.join(format!("secret-{mode:o}"));
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn private_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o640, 0o440, 0o400] {
            let path = write(dir.path(), mode);
            assert_eq!(read(&path, "inference.tokens_file").unwrap(), b"s3cret\n");
        }
    }

    #[test]
    fn world_readable_file_is_refused_naming_file_key_and_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), 0o644);
        let text = read(&path, "inference.tokens_file")
            .unwrap_err()
            .to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("inference.tokens_file"), "{text}");
        assert!(text.contains("mode 0644"), "{text}");
        assert!(text.contains("every local user can read it"), "{text}");
        assert!(text.contains("chmod o-rwx"), "{text}");
    }

    #[test]
    fn world_writable_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), 0o662);
        let text = read(&path, "inference.tls_key").unwrap_err().to_string();
        assert!(text.contains("every local user can change it"), "{text}");
    }

    #[test]
    fn missing_file_and_directory_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let text = read(&dir.path().join("nope"), "inference.tokens_file")
            .unwrap_err()
            .to_string();
        assert!(text.contains("cannot open"), "{text}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let text = read(dir.path(), "inference.tokens_file")
            .unwrap_err()
            .to_string();
        assert!(text.contains("not a regular file"), "{text}");
    }
}
