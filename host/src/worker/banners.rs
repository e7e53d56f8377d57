//! Fail-closed banner checks (the rule's line format and truthy values are
//! tt-worker-contract's `banner`).
//!
//! The field lesson: flags were set, the server came up, and the feature was
//! off (a file not mounted, a patch lost in a rebase). Each engine feature
//! prints `<FLAG> engaged` when it actually runs; a slot is only called ready
//! if every covered flag set to a truthy value showed its banner, and, in
//! `both` mode, no covered flag set to a falsy value did (A/B control arms).

use crate::config::{BannerConfig, BannerMode};
use std::collections::{BTreeMap, BTreeSet};

// The line format and the truthy rule are the contract's, shared with the
// workers that print and relay banners.
use tt_worker_contract::banner::is_truthy;

/// Whether `name` matches `pattern`, where `*` matches any run of
/// characters (`/` included) and everything else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// Whether the rule covers this flag.
pub fn covers(rule: &BannerConfig, flag: &str) -> bool {
    rule.patterns.is_empty() || rule.patterns.iter().any(|p| glob_match(p, flag))
}

/// The settings the rule checks, with the values the worker got: every
/// `flags` entry the rule covers, and, when the rule names patterns, every
/// variable of the worker's environment they match, wherever it was set
/// (`env`, `cold_env`, `warm_env` or the secret `env_file`): a flag moved
/// out of `flags` is checked exactly as before. Without patterns the rule
/// means "every flag", so only `flags` counts (an env table holds much
/// that is not a feature flag). The daemon's own contract variables are
/// never flags.
pub fn covered_settings(
    rule: &BannerConfig,
    flags: &BTreeMap<String, String>,
    worker_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut covered: BTreeMap<String, String> = flags
        .iter()
        .filter(|(f, _)| covers(rule, f))
        .map(|(f, v)| (f.clone(), worker_env.get(f).unwrap_or(v).clone()))
        .collect();
    if !rule.patterns.is_empty() {
        covered.extend(
            worker_env
                .iter()
                .filter(|(name, _)| !crate::config::RESERVED_ENV.contains(&name.as_str()))
                .filter(|(name, _)| covers(rule, name))
                .map(|(n, v)| (n.clone(), v.clone())),
        );
    }
    covered
}

/// Check the banner rule. Returns every violation, each naming the flag and
/// what was wrong; empty means the rule holds.
pub fn check(
    rule: &BannerConfig,
    flags: &BTreeMap<String, String>,
    engaged: &BTreeSet<String>,
) -> Vec<String> {
    if rule.mode == BannerMode::Off {
        return Vec::new();
    }
    let mut problems = Vec::new();
    for (flag, value) in flags.iter().filter(|(f, _)| covers(rule, f)) {
        let shown = engaged.contains(flag);
        if is_truthy(value) && !shown {
            problems.push(format!(
                "{flag}={value} but the worker never printed `{flag} engaged`: the feature did not run"
            ));
        }
        if rule.mode == BannerMode::Both && !is_truthy(value) && shown {
            problems.push(format!(
                "{flag}={value} (off) but the worker printed `{flag} engaged`: the control arm is contaminated"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_set_through_an_env_table_is_covered_when_the_rule_names_it() {
        let env = flags(&[
            ("QWEN_FAST", "1"),
            ("QWEN_SLOW", "0"),
            ("OMP_NUM_THREADS", "1"),
            ("TT_VISIBLE_DEVICES", "1"),
            ("FLAGGED", "1"),
        ]);
        let from_flags = flags(&[("FLAGGED", "1")]);
        let patterned = covered_settings(
            &rule(&["QWEN*", "TT_*"], BannerMode::Both),
            &from_flags,
            &env,
        );
        assert_eq!(
            patterned.keys().collect::<Vec<_>>(),
            ["QWEN_FAST", "QWEN_SLOW"],
            "env entries matching the patterns, never the contract's variables"
        );
        let problems = check(
            &rule(&["QWEN*"], BannerMode::Truthy),
            &patterned,
            &BTreeSet::new(),
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("QWEN_FAST=1"), "{problems:?}");
        // Without patterns only the flags table counts.
        let every = covered_settings(&rule(&[], BannerMode::Truthy), &from_flags, &env);
        assert_eq!(every.keys().collect::<Vec<_>>(), ["FLAGGED"]);
    }

    fn rule(patterns: &[&str], mode: BannerMode) -> BannerConfig {
        BannerConfig {
            patterns: patterns.iter().map(|s| s.to_string()).collect(),
            mode,
        }
    }

    fn flags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn truthy_flag_without_banner_fails_closed() {
        let problems = check(
            &rule(&["QWEN*"], BannerMode::Truthy),
            &flags(&[("QWEN_A", "1"), ("QWEN_B", "1"), ("OTHER", "1")]),
            &set(&["QWEN_A"]),
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("QWEN_B=1"));
    }

    #[test]
    fn both_mode_rejects_a_banner_from_a_falsy_flag() {
        let r = rule(&[], BannerMode::Both);
        let f = flags(&[("A", "0"), ("B", "1")]);
        assert!(check(&r, &f, &set(&["B"])).is_empty());
        let problems = check(&r, &f, &set(&["A", "B"]));
        assert!(problems[0].contains("control arm"), "{problems:?}");
        // Truthy mode does not care about falsy flags.
        assert!(check(&rule(&[], BannerMode::Truthy), &f, &set(&["A", "B"])).is_empty());
    }

    #[test]
    fn off_mode_checks_nothing() {
        assert!(check(
            &rule(&[], BannerMode::Off),
            &flags(&[("A", "1")]),
            &set(&[])
        )
        .is_empty());
    }

    #[test]
    fn glob_patterns() {
        assert!(glob_match("QWEN*", "QWEN36_X"));
        assert!(glob_match("*_STREAMING", "QWEN36_SDPA_STREAMING"));
        assert!(glob_match("Q*SDPA*", "QWEN36_SDPA_STREAMING"));
        assert!(!glob_match("QWEN*", "TTW_KV"));
        assert!(glob_match("EXACT", "EXACT"));
        assert!(!glob_match("A*A", "A"));
    }
}
