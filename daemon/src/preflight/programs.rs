//! Finding the programs a config names (workers, tt-smi, the reset probe)
//! the way the daemon will start them: a name with a `/` is a path, any
//! other name is looked up in `PATH` (the daemon passes its own `PATH` on to
//! the programs it starts, so this process's `PATH` is the one that counts).

use nix::unistd::{access, AccessFlags};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The file `program` runs, or why it cannot be run, as a clause the caller
/// completes with the fix (e.g. "`/opt/w` does not exist").
pub(super) fn find(program: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        return runnable(Path::new(program)).map(|()| PathBuf::from(program));
    }
    let Some(path) = std::env::var_os("PATH") else {
        return Err(format!(
            "`{program}` is a bare name but PATH is not set, so it cannot be found"
        ));
    };
    // Like execvp: the first runnable match wins; remember why the others
    // were skipped in case none is.
    let mut skipped = None;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        if !candidate.exists() {
            continue;
        }
        match runnable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(why) => skipped = skipped.or(Some(why)),
        }
    }
    Err(match skipped {
        Some(why) => why,
        None => format!(
            "`{program}` is not on PATH ({})",
            std::env::join_paths(std::env::split_paths(&path))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
    })
}

/// Whether the file at `path` can be executed by this user.
fn runnable(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("`{shown}` does not exist"))
        }
        Err(e) => return Err(format!("`{shown}` cannot be read ({e})")),
    };
    if !meta.is_file() {
        return Err(format!("`{shown}` is a directory, not a program"));
    }
    if access(path, AccessFlags::X_OK).is_err() {
        return Err(format!(
            "`{shown}` is not executable (mode {:04o}; `chmod +x {shown}` if it is the right program)",
            meta.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_for_existence_type_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let e = find(&missing.display().to_string()).unwrap_err();
        assert!(e.ends_with("does not exist"), "{e}");
        let e = find(&dir.path().display().to_string()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let script = dir.path().join("worker");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = find(&script.display().to_string()).unwrap_err();
        assert!(e.contains("not executable (mode 0644; `chmod +x"), "{e}");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find(&script.display().to_string()).unwrap(), script);
    }

    #[test]
    fn bare_names_are_looked_up_in_path() {
        assert!(find("sh").is_ok(), "sh is on every PATH");
        let e = find("no-such-program-tt-serving").unwrap_err();
        assert!(e.contains("is not on PATH ("), "{e}");
    }
}
