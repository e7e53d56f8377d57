//! The banner rule, shared by the workers that print and relay banners and
//! the daemon that checks them.
//!
//! The field's lesson: flags were set, the server came up, and the feature
//! was silently off (a file not mounted, a patch lost in a rebase). So each
//! feature prints `<FLAG> engaged` from its own code path the first time it
//! runs, and the daemon calls a worker ready only when every truthy flag it
//! covers showed its banner.

/// The line a feature prints when it runs.
pub fn line(flag: &str) -> String {
    format!("{flag} engaged")
}

/// The flag named by a `<FLAG> engaged` line, if the line is one: the line
/// ends in ` engaged` (trailing white space and a carriage return aside),
/// and the flag is the run of letters, digits and `_` before it, so a log
/// prefix (`[rank 0] `, `INFO: `) may stand in front.
pub fn flag_in_line(line: &str) -> Option<&str> {
    let before = line.trim_end().strip_suffix(" engaged")?;
    let flag = before
        .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()?;
    (!flag.is_empty()).then_some(flag)
}

/// Truthy flag values, as engines commonly read them: `1`, `true`, `yes`,
/// `on`, in any case, surrounding space ignored. Anything else is off.
pub fn is_truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_banners_in_log_lines() {
        assert_eq!(
            flag_in_line("QWEN36_SDPA_STREAMING engaged"),
            Some("QWEN36_SDPA_STREAMING")
        );
        assert_eq!(
            flag_in_line("[rank 0] TTW_KV_F16 engaged\n"),
            Some("TTW_KV_F16")
        );
        assert_eq!(flag_in_line("2026-01-01 INFO: X engaged"), Some("X"));
        assert_eq!(
            flag_in_line("(EngineCore_DP0 pid=7) INFO [x.py:1] TT_FLAG_2 engaged \r"),
            Some("TT_FLAG_2")
        );
        assert_eq!(flag_in_line("engaged"), None);
        assert_eq!(flag_in_line("TTW_KV_F16 engaged later"), None);
        assert_eq!(flag_in_line("TT_FLAG_3 engaged: not a banner"), None);
        assert_eq!(
            flag_in_line(&line("TTW_MLP_DOWN_Q8")),
            Some("TTW_MLP_DOWN_Q8")
        );
    }

    #[test]
    fn truthy_values() {
        for v in ["1", "true", "TRUE", " yes ", "On"] {
            assert!(is_truthy(v), "{v:?}");
        }
        for v in ["0", "false", "", "off", "2", "enabled"] {
            assert!(!is_truthy(v), "{v:?}");
        }
    }
}
