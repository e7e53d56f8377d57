//! Test-only fault modes, for the daemon's recovery tests.
//!
//! TEST ONLY. Nothing here is active unless `TTW_TEST_FAULTS=1` is set; the
//! individual fault variables are ignored (with a warning) without it, so a
//! stray variable in production cannot crash a worker.
//!
//! | variable                       | effect                                              |
//! |--------------------------------|-----------------------------------------------------|
//! | `TTW_FAULT_EXIT_AT_START=CODE` | exit with CODE before binding the socket            |
//! | `TTW_FAULT_SLOW_LOAD_MS=MS`    | spread MS of extra sleep over the load steps        |
//! | `TTW_FAULT_CRASH_AFTER_TOKENS=N` | abort (SIGABRT) once N tokens were generated      |
//! | `TTW_FAULT_HANG_AFTER_TOKENS=N`  | stop decoding forever once N tokens were generated; RPCs still answer |
//! | `TTW_FAULT_PREFILL_STALL_MS=MS`  | every step that prefills sleeps MS first: a long prefill that shows no progress, as an engine that prefills in one opaque call |
//! | `TTW_FAULT_SKIP_BANNER=FLAG`   | the feature of FLAG runs but its banner is withheld |
//! | `TTW_FAULT_EXTRA_BANNER=FLAG`  | print `FLAG engaged` on the first step though FLAG's feature is not running |
//! | `TTW_FAULT_WARM_EXTRA_FILE=1`  | a warm start writes a stray file into the cache dir |
//! | `TTW_FAULT_CACHE_WRITE_ERROR=N` | the Nth cache file of a cold build fails half-written with ENOSPC (a full cache disk) |
//! | `TTW_FAULT_HOLD_FILE=PATH`     | while PATH exists, the load does not go on and the engine takes no step: admitted requests stay in the batch, commands and a drain's deadline are still handled; removing the file releases it (tests hold a request by this, not by racing a clock) |
//! | `TTW_FAULT_EARLY_EXIT=1`       | the decoder runs only its first three quarters of layers: a quarter less work per step and wrong answers, with its banner (`TTW_FAULT_EARLY_EXIT engaged`), the harmful arm of accuracy gates' tests |
//! | `TTW_FAULT_LEAK_MIB_PER_SEC=N` | once loaded, hold N MiB more of resident memory every second, for good: a steady leak (the field: 10 GB over six days) |
//! | `TTW_FAULT_WITHHOLD_PARAMETERS=a,b` | Info leaves these optional GenerateRequest parameters out of `supported_parameters` and Generate refuses them, as an engine without them would |

use std::collections::HashMap;
use std::path::PathBuf;

/// The switch that enables every other fault variable.
pub const SWITCH: &str = "TTW_TEST_FAULTS";

/// The harmful "optimisation" flag: its banner names it.
pub const EARLY_EXIT: &str = "TTW_FAULT_EARLY_EXIT";

/// File name the warm-start fault writes into the cache dir.
pub const STRAY_FILE: &str = "stray_placeholder_tp0_rank0_dtype_F32_layout_REPLICATED.tensorbin";

/// The active faults (all off by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Exit code at start.
    pub exit_at_start: Option<i32>,
    /// Extra load time in milliseconds.
    pub slow_load_ms: u64,
    /// Abort after this many generated tokens (all sequences together).
    pub crash_after_tokens: Option<u64>,
    /// Hang after this many generated tokens.
    pub hang_after_tokens: Option<u64>,
    /// Sleep before each step that prefills, in milliseconds.
    pub prefill_stall_ms: Option<u64>,
    /// Banner withheld.
    pub skip_banner: Option<String>,
    /// Banner printed without its feature.
    pub extra_banner: Option<String>,
    /// Warm start writes a stray cache file.
    pub warm_extra_file: bool,
    /// The Nth cache file write (1-based) of a cold build fails with ENOSPC.
    pub cache_write_error: Option<u64>,
    /// Optional parameters the worker behaves as if it lacked.
    pub withhold_parameters: Vec<String>,
    /// While this file exists, loading and stepping wait.
    pub hold_file: Option<PathBuf>,
    /// Run only the first three quarters of the layers.
    pub early_exit: bool,
    /// MiB of resident memory taken and kept every second once loaded.
    pub leak_mib_per_sec: Option<u64>,
}

/// Why the fault variables could not be read.
#[derive(Debug, thiserror::Error)]
#[error("test fault variable {var}={value} is not a valid number")]
pub struct FaultError {
    var: String,
    value: String,
}

impl Faults {
    /// Reads the faults from `env` (the process environment in production).
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, FaultError> {
        let set: Vec<&String> = env.keys().filter(|k| k.starts_with("TTW_FAULT_")).collect();
        if env.get(SWITCH).map(String::as_str) != Some("1") {
            if !set.is_empty() {
                tracing::warn!(
                    "ignoring test fault variables {set:?}: they need {SWITCH}=1 (test-only)"
                );
            }
            return Ok(Self::default());
        }
        let num = |var: &str| -> Result<Option<u64>, FaultError> {
            env.get(var)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| FaultError {
                        var: var.into(),
                        value: v.clone(),
                    })
                })
                .transpose()
        };
        let exit_at_start = num("TTW_FAULT_EXIT_AT_START")?.map(|c| c as i32);
        let text = |var: &str| env.get(var).filter(|v| !v.is_empty()).cloned();
        Ok(Self {
            exit_at_start,
            slow_load_ms: num("TTW_FAULT_SLOW_LOAD_MS")?.unwrap_or(0),
            crash_after_tokens: num("TTW_FAULT_CRASH_AFTER_TOKENS")?,
            hang_after_tokens: num("TTW_FAULT_HANG_AFTER_TOKENS")?,
            prefill_stall_ms: num("TTW_FAULT_PREFILL_STALL_MS")?,
            skip_banner: text("TTW_FAULT_SKIP_BANNER"),
            extra_banner: text("TTW_FAULT_EXTRA_BANNER"),
            warm_extra_file: env.get("TTW_FAULT_WARM_EXTRA_FILE").map(String::as_str) == Some("1"),
            cache_write_error: num("TTW_FAULT_CACHE_WRITE_ERROR")?,
            withhold_parameters: env
                .get("TTW_FAULT_WITHHOLD_PARAMETERS")
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|p| !p.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            hold_file: text("TTW_FAULT_HOLD_FILE").map(PathBuf::from),
            leak_mib_per_sec: num("TTW_FAULT_LEAK_MIB_PER_SEC")?,
            early_exit: env
                .get(EARLY_EXIT)
                .is_some_and(|v| tt_worker_contract::banner::is_truthy(v)),
        })
    }

    /// `TTW_FAULT_LEAK_MIB_PER_SEC`: a thread that takes the memory in
    /// tenths of a second, writes every page (so it is resident) and never
    /// gives it back.
    pub fn start_leak(&self) {
        let Some(mib) = self.leak_mib_per_sec.filter(|m| *m > 0) else {
            return;
        };
        tracing::warn!(
            "test fault TTW_FAULT_LEAK_MIB_PER_SEC: holding {mib} MiB more every second"
        );
        let piece = (mib * 1024 * 1024 / 10) as usize;
        let spawned = std::thread::Builder::new()
            .name("ttw-leak".into())
            .spawn(move || {
                let mut held: Vec<Vec<u8>> = Vec::new();
                loop {
                    held.push(vec![1u8; piece]);
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            });
        if let Err(e) = spawned {
            tracing::error!("test fault TTW_FAULT_LEAK_MIB_PER_SEC: no thread: {e}");
        }
    }

    /// Whether the hold file is there (the test has not released us yet).
    pub fn held(&self) -> bool {
        self.hold_file.as_ref().is_some_and(|p| p.exists())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn faults_need_the_explicit_switch() {
        let f = Faults::from_env(&env(&[("TTW_FAULT_CRASH_AFTER_TOKENS", "3")])).unwrap();
        assert_eq!(f, Faults::default());
        let f = Faults::from_env(&env(&[
            ("TTW_TEST_FAULTS", "1"),
            ("TTW_FAULT_CRASH_AFTER_TOKENS", "3"),
            ("TTW_FAULT_SKIP_BANNER", "TTW_KV_F16"),
        ]))
        .unwrap();
        assert_eq!(f.crash_after_tokens, Some(3));
        assert!(!f.early_exit);
        let early = |pairs: &[(&str, &str)]| Faults::from_env(&env(pairs)).unwrap().early_exit;
        assert!(early(&[("TTW_TEST_FAULTS", "1"), (EARLY_EXIT, "1")]));
        assert!(!early(&[(EARLY_EXIT, "1")]), "ignored without the switch");
        assert_eq!(f.skip_banner.as_deref(), Some("TTW_KV_F16"));
        let f = Faults::from_env(&env(&[
            ("TTW_TEST_FAULTS", "1"),
            ("TTW_FAULT_CACHE_WRITE_ERROR", "2"),
        ]))
        .unwrap();
        assert_eq!(f.cache_write_error, Some(2));
        let f = Faults::from_env(&env(&[
            ("TTW_TEST_FAULTS", "1"),
            ("TTW_FAULT_WITHHOLD_PARAMETERS", "logprobs, ignore_eos"),
        ]))
        .unwrap();
        assert_eq!(f.withhold_parameters, vec!["logprobs", "ignore_eos"]);
    }

    #[test]
    fn malformed_numbers_are_errors() {
        let e = Faults::from_env(&env(&[
            ("TTW_TEST_FAULTS", "1"),
            ("TTW_FAULT_HANG_AFTER_TOKENS", "x"),
        ]));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("TTW_FAULT_HANG_AFTER_TOKENS"));
    }
}
