//! The identity step ([`crate::names::IDENTIFY`]): before a start, the
//! daemon runs the worker's command with `TT_WORKER_IDENTIFY=1` and keys
//! the tensor cache by what it answers. A worker answers before it
//! validates the rest of its contract (no socket is given) and exits.

use crate::names;
use std::collections::BTreeMap;
use std::path::Path;

/// Whether this run is the identity step.
pub fn requested() -> bool {
    std::env::var(names::IDENTIFY).is_ok_and(|v| v == "1")
}

/// The worker program's own part of an identity: its name, version and
/// build (the executable's size and modification time, which change with
/// every build installed).
pub fn worker_identity(program: &str, version: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("worker".to_string(), format!("{program} {version}"));
    if let Ok(exe) = std::env::current_exe() {
        out.insert("worker build".to_string(), file_build(&exe));
    }
    out
}

/// A file's size and modification time, as `size=N mtime=S.NS`.
pub fn file_build(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "size={} mtime={}.{:09}",
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(e) => format!("unreadable ({e})"),
    }
}

/// The identity line: [`names::IDENTITY_PREFIX`] and the JSON object.
pub fn line(identity: &BTreeMap<String, String>) -> String {
    let json = serde_json::to_string(identity).unwrap_or_else(|_| "{}".to_string());
    format!("{}{json}", names::IDENTITY_PREFIX)
}

/// Read an identity line back (the daemon's side).
pub fn parse(line: &str) -> Option<BTreeMap<String, String>> {
    serde_json::from_str(line.strip_prefix(names::IDENTITY_PREFIX)?.trim()).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_identity_line_reads_back_and_other_lines_do_not() {
        let id = super::worker_identity("tt-worker", "1.2.3");
        assert_eq!(id["worker"], "tt-worker 1.2.3");
        assert!(id["worker build"].starts_with("size="));
        assert_eq!(super::parse(&super::line(&id)), Some(id));
        assert_eq!(super::parse("INFO loading"), None);
        assert_eq!(super::parse("TT_WORKER_IDENTITY not json"), None);
    }
}
