//! What the installed kernel driver (tt-kmd) and `tt-smi` can do, read from
//! their versions, and therefore which proofs a reset can rest on.
//!
//! The daemon was first written against one belief about the driver (every
//! card has `tt_heartbeat`); on a driver older than 2.7 that belief
//! quarantined every card after its first reset, since the attribute does
//! not exist there. Each fact below carries its source in tt-kmd, tt-umd or
//! tt-smi (`docs/HARDWARE.md` lists them with the version they hold from),
//! and the reset proof asks these methods instead of assuming.

use super::discovery::HardwareRoot;
use std::fmt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tt_worker_contract::subprocess::{self, Keep, RunError};

/// A dotted version (`2.10.0`, `6.8.0`, `2.10.0.1`), compared part by
/// part; a suffix such as `-rc1` or `+build` is ignored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(Vec<u32>);

impl Version {
    /// Parse the leading dotted numbers of `text`; None when it starts with
    /// no number.
    pub fn parse(text: &str) -> Option<Version> {
        let core = text.trim().trim_start_matches('v');
        let core = core.split(['-', '+', ' ']).next().unwrap_or_default();
        let mut parts = Vec::new();
        for part in core.split('.') {
            let digits: String = part.chars().take_while(|c| c.is_ascii_digit()).collect();
            if digits.is_empty() {
                break;
            }
            parts.push(digits.parse().ok()?);
            if digits.len() != part.len() {
                break;
            }
        }
        if parts.is_empty() {
            return None;
        }
        // 2.7 and 2.7.0 are one version.
        while parts.len() > 1 && parts.last() == Some(&0) {
            parts.pop();
        }
        Some(Version(parts))
    }

    fn of(parts: &[u32]) -> Version {
        Version::parse(
            &parts
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("."),
        )
        .unwrap_or(Version(parts.to_vec()))
    }

    /// Whether this is `other` or newer.
    pub fn not_below(&self, other: &Version) -> bool {
        self >= other
    }

    fn at_least(&self, parts: &[u32]) -> bool {
        *self >= Version::of(parts)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.0.iter().map(u32::to_string).collect();
        while parts.len() < 3 {
            parts.push("0".into());
        }
        f.write_str(&parts.join("."))
    }
}

/// The oldest tt-kmd the daemon runs on: tt-umd refuses to open a card
/// below it (tt-umd `device/api/umd/device/utils/kmd_versions.hpp`,
/// `KMD_MINIMUM_VERSION = 2.0.0`), so no engine could use the cards.
pub const DRIVER_MINIMUM: [u32; 3] = [2, 0, 0];

/// The oldest tt-smi whose `-r` takes full PCI addresses, the only target
/// form the daemon uses (tt-smi 4.2.0 `tt_smi_reset.py` `PCI_BDF_FULL_RE`;
/// up to 4.1.2 `-r` takes integer indices or a JSON file, from
/// tt_tools_common's `parse_reset_input`, and exits 1 on a PCI address).
/// `--no_reinit` is older than that (3.0.x has it).
pub const TT_SMI_MINIMUM: [u32; 3] = [4, 2, 0];

/// What a loaded tt-kmd of one version exposes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// From `/sys/module/tenstorrent/version`.
    pub version: Version,
}

impl Driver {
    /// A driver of this version.
    pub fn new(version: Version) -> Driver {
        Driver { version }
    }

    /// `tt_heartbeat` in the class dir (tt-kmd 2.7.0, commit c5bc972:
    /// `blackhole.c` bh_sysfs_attributes).
    pub fn has_heartbeat(&self) -> bool {
        self.version.at_least(&[2, 7, 0])
    }

    /// `tt_therm_trip_count` in the class dir (tt-kmd 2.7.0, same commit).
    pub fn has_therm_trip_count(&self) -> bool {
        self.version.at_least(&[2, 7, 0])
    }

    /// `/proc/driver/tenstorrent/N/pids`, one line per open descriptor
    /// (tt-kmd 2.5.0, `enumerate.c` pids_proc_show).
    pub fn has_pids_file(&self) -> bool {
        self.version.at_least(&[2, 5, 0])
    }

    /// A reset keeps the device node and class dir (tt-kmd 2.4.1; the
    /// arch-agnostic reset ioctl tt-umd uses from that version,
    /// `kmd_versions.hpp` KMD_ARCH_AGNOSTIC_RESET). Cards in hot-plug slots
    /// still leave and may come back under another index.
    pub fn resets_in_place(&self) -> bool {
        self.version.at_least(&[2, 4, 1])
    }

    /// Attribute reads fail (ENODATA) while a reset runs (tt-kmd 2.9.0,
    /// `telemetry.c` tt_telemetry_read32); before that they can return the
    /// values from before the reset, so a readable attribute proves less.
    pub fn reads_fail_during_reset(&self) -> bool {
        self.version.at_least(&[2, 9, 0])
    }

    /// The proofs of a reset this driver allows, for the operator.
    pub fn proofs(&self) -> String {
        let mut proofs = vec!["device node and class dir back", "sysfs readable"];
        if self.has_heartbeat() {
            proofs.push("heartbeat advancing");
        }
        proofs.push("PCIe link back at its speed and width");
        if self.has_therm_trip_count() {
            proofs.push("thermal trip count unchanged");
        }
        proofs.join(", ")
    }

    /// What is missing from the proof on this driver, and what to do; None
    /// when nothing is.
    pub fn weaker_proof(&self) -> Option<String> {
        if self.has_heartbeat() {
            return None;
        }
        let stale = if self.reads_fail_during_reset() {
            ""
        } else {
            ", and attribute reads during a reset may return the values from before it (reads fail during a reset from 2.9.0)"
        };
        Some(format!(
            "tenstorrent driver {} has no tt_heartbeat (from 2.7.0): no sysfs signal shows the firmware running after a reset{stale}; \
             resets are proven by {} only. Set reset.probe_command (for example a mesh open) for a proof that the card computes, or upgrade tt-kmd to 2.7.0 or later",
            self.version,
            self.proofs()
        ))
    }
}

/// Why the driver on this host is refused, or what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverStatus {
    /// No `module/tenstorrent` under the sys root.
    NotLoaded,
    /// A version the daemon can prove resets on.
    Supported(Driver),
    /// Refused: the reason names the version and the minimum.
    Refused(String),
}

/// Read and judge the driver under this hardware root.
pub fn driver_status(hw: &HardwareRoot) -> DriverStatus {
    if !hw.driver_loaded() {
        return DriverStatus::NotLoaded;
    }
    let path = hw.sys_root.join("module/tenstorrent/version");
    let Some(text) = hw.driver_version() else {
        return DriverStatus::Refused(format!(
            "the tenstorrent driver is loaded but {} cannot be read, so the daemon cannot tell which reset proofs it supports; reinstall tt-kmd {} or later",
            path.display(),
            Version::of(&DRIVER_MINIMUM)
        ));
    };
    let Some(version) = Version::parse(&text) else {
        return DriverStatus::Refused(format!(
            "{} says {:?}, which is not a version; reinstall tt-kmd {} or later",
            path.display(),
            crate::echo::echo(&text),
            Version::of(&DRIVER_MINIMUM)
        ));
    };
    if !version.at_least(&DRIVER_MINIMUM) {
        return DriverStatus::Refused(format!(
            "tenstorrent driver {version} is older than {}, the oldest tt-umd opens cards with (kmd_versions.hpp KMD_MINIMUM_VERSION); upgrade tt-kmd",
            Version::of(&DRIVER_MINIMUM)
        ));
    }
    DriverStatus::Supported(Driver::new(version))
}

/// The driver to prove a reset with: the one loaded now, or, when its
/// version cannot be read, the least capable one (so no attribute that may
/// not exist is required).
pub fn driver_for_proof(hw: &HardwareRoot) -> Driver {
    match driver_status(hw) {
        DriverStatus::Supported(d) => d,
        _ => Driver::new(Version::of(&DRIVER_MINIMUM)),
    }
}

/// What of `tt-smi -v`'s output is read (a version line, or a traceback's
/// first lines).
const VERSION_OUTPUT: usize = 16 * 1024;

/// How long `tt-smi -v` may take (it imports Python modules; cold caches on
/// a busy host take seconds).
const VERSION_TIMEOUT: Duration = Duration::from_secs(60);

/// Run `tt-smi -v` and judge its version: Ok with the version when the
/// daemon's reset targets (full PCI addresses with `--no_reinit`) are ones
/// it takes, else a reason naming the version and the minimum.
pub fn check_tt_smi(tt_smi: &Path) -> Result<Version, String> {
    let shown = tt_smi.display();
    let mut cmd = Command::new(tt_smi);
    cmd.arg("-v");
    let done = match subprocess::run_blocking(cmd, VERSION_TIMEOUT, Keep::First(VERSION_OUTPUT)) {
        Ok(done) => done,
        Err(e @ RunError::Spawn(_)) => {
            return Err(format!(
                "cannot run {shown} -v: {e}; install tt-smi or set hardware.tt_smi to its path"
            ))
        }
        Err(RunError::TimedOut { .. }) => {
            return Err(format!(
                "{shown} -v did not answer within {} s",
                VERSION_TIMEOUT.as_secs()
            ))
        }
        Err(e) => return Err(format!("{shown} -v: {e}")),
    };
    let text = done.stdout.text() + &done.stderr.text();
    judge_tt_smi_version(&shown.to_string(), done.status.success(), &text)
}

/// The verdict on what `tt-smi -v` printed (argparse's version action
/// prints the package version alone, e.g. `6.8.0`).
pub fn judge_tt_smi_version(shown: &str, exited_ok: bool, output: &str) -> Result<Version, String> {
    let line = output
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    let version = match (exited_ok, Version::parse(line)) {
        (true, Some(v)) => v,
        _ => {
            return Err(format!(
                "{shown} -v printed {:?} instead of a version, so the daemon cannot tell whether its -r takes PCI addresses (tt-smi {} or later); check hardware.tt_smi",
                crate::echo::echo(line),
                Version::of(&TT_SMI_MINIMUM)
            ))
        }
    };
    if !version.at_least(&TT_SMI_MINIMUM) {
        return Err(format!(
            "tt-smi {version} ({shown}) is older than {}: its -r takes only integer indices or a JSON file, and the daemon names cards by PCI address (an index can name another card after a reset). Upgrade tt-smi to {} or later",
            Version::of(&TT_SMI_MINIMUM),
            Version::of(&TT_SMI_MINIMUM)
        ));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_part_and_ignore_suffixes() {
        let v = |s| Version::parse(s).unwrap();
        assert!(v("2.10.0") > v("2.9.0"));
        assert_eq!(v("2.7"), v("2.7.0"));
        assert_eq!(v("2.4.1-rc1"), v("2.4.1"));
        assert!(v("2.10.0.1") > v("2.10.0"));
        assert_eq!(v("2.10.0").to_string(), "2.10.0");
        assert_eq!(Version::parse("garbage"), None);
        assert_eq!(Version::parse(""), None);
    }

    #[test]
    fn driver_features_follow_the_tt_kmd_releases() {
        let d = |s| Driver::new(Version::parse(s).unwrap());
        assert!(!d("2.4.1").has_heartbeat());
        assert!(d("2.4.1").resets_in_place());
        assert!(!d("2.4.0").resets_in_place());
        assert!(!d("2.4.1").has_pids_file());
        assert!(d("2.5.0").has_pids_file());
        assert!(d("2.7.0").has_heartbeat() && d("2.7.0").has_therm_trip_count());
        assert!(!d("2.8.0").reads_fail_during_reset());
        assert!(d("2.9.0").reads_fail_during_reset());
        assert!(d("2.7.0").weaker_proof().is_none());
        let weak = d("2.6.0").weaker_proof().unwrap();
        assert!(
            weak.contains("2.6.0") && weak.contains("probe_command"),
            "{weak}"
        );
    }

    #[test]
    fn old_or_unreadable_tt_smi_is_refused_by_name() {
        assert_eq!(
            judge_tt_smi_version("tt-smi", true, "6.8.0\n"),
            Ok(Version::parse("6.8.0").unwrap())
        );
        let old = judge_tt_smi_version("tt-smi", true, "4.1.2\n").unwrap_err();
        assert!(old.contains("4.1.2") && old.contains("4.2.0"), "{old}");
        let odd = judge_tt_smi_version("tt-smi", false, "Traceback ...").unwrap_err();
        assert!(odd.contains("Traceback"), "{odd}");
    }
}
