//! A model's `env_file`: secrets for its workers' environment, kept out of
//! the config file (and so out of the Nix store, reload plans and status).
//!
//! The format is systemd's `EnvironmentFile=` subset that people write by
//! hand: `KEY=VALUE` lines, `#` or `;` comments, blank lines, an optional
//! `export ` prefix, and a value optionally wrapped in one pair of single or
//! double quotes (no escapes, no variable expansion). Errors name the file,
//! the line and the key, never a value.

use crate::config::validate::{is_env_name, RESERVED_ENV};
use std::collections::BTreeMap;
use std::path::Path;

/// Reads and parses `path` (config key `key` in errors): refused when every
/// local user may read or change it (see [`crate::secrets::read`]).
pub fn load(path: &Path, key: &str) -> Result<BTreeMap<String, String>, String> {
    let bytes = crate::secrets::read(path, key).map_err(|e| format!("{e:#}"))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        format!(
            "{} ({key}) is not UTF-8 text; write it as KEY=VALUE lines",
            path.display()
        )
    })?;
    parse(&text).map_err(|e| format!("{} ({key}): {e}", path.display()))
}

/// Parses the `KEY=VALUE` lines of an env file.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut vars = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!(
                "line {n} is not KEY=VALUE (nor a comment starting with #)"
            ));
        };
        let name = name.trim();
        if !is_env_name(name) {
            return Err(format!(
                "line {n}: `{name}` is not a valid environment variable name (letters, digits, '_'; not starting with a digit)"
            ));
        }
        if RESERVED_ENV.contains(&name) {
            return Err(format!(
                "line {n}: `{name}` is set by the daemon for every worker; remove it from the file"
            ));
        }
        let value = value.trim();
        let value = [b'"', b'\'']
            .iter()
            .find_map(|&q| {
                let b = value.as_bytes();
                (b.len() >= 2 && b[0] == q && b[b.len() - 1] == q)
                    .then(|| &value[1..value.len() - 1])
            })
            .unwrap_or(value);
        vars.insert(name.to_string(), value.to_string());
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn lines_comments_export_and_quotes() {
        let vars = parse(
            "# the API key\n\nAPI_KEY=abc=def\n; old style comment\nexport REGION = \"eu west\"\nEMPTY=\nSINGLE='x y'\nODD=\"unclosed\n",
        )
        .unwrap();
        let want: BTreeMap<String, String> = [
            ("API_KEY", "abc=def"),
            ("REGION", "eu west"),
            ("EMPTY", ""),
            ("SINGLE", "x y"),
            ("ODD", "\"unclosed"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(vars, want);
    }

    #[test]
    fn errors_name_the_line_and_key_never_the_value() {
        let e = parse("A=1\nhunter2\n").unwrap_err();
        assert_eq!(e, "line 2 is not KEY=VALUE (nor a comment starting with #)");
        assert!(!e.contains("hunter2"));
        let e = parse("1BAD=secretvalue\n").unwrap_err();
        assert!(e.starts_with("line 1: `1BAD` is not a valid"), "{e}");
        assert!(!e.contains("secretvalue"), "{e}");
        let e = parse("TT_VISIBLE_DEVICES=0000:09:00.0\n").unwrap_err();
        assert!(e.contains("set by the daemon"), "{e}");
    }

    #[test]
    fn a_file_every_user_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.env");
        std::fs::write(&path, "TOKEN=s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&path, "models.m.env_file").unwrap_err();
        assert!(e.contains("chmod o-rwx"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(load(&path, "models.m.env_file").unwrap()["TOKEN"], "s3cret");
        let e = load(&dir.path().join("missing.env"), "models.m.env_file").unwrap_err();
        assert!(e.contains("cannot open"), "{e}");
    }
}
