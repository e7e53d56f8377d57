//! What a fake tt-kmd of one version lays out and does, release by release.
//!
//! The daemon must prove resets with whatever the installed driver offers,
//! so the fake can be any of the versions that differ (sources: tt-kmd's
//! history; `docs/HARDWARE.md` lists each fact):
//!
//! | from  | change                                                        |
//! |-------|---------------------------------------------------------------|
//! | 2.4.1 | resets in place: node and class dir stay (not in hot-plug slots) |
//! | 2.5.0 | `/proc/driver/tenstorrent/N/pids`, one line per open descriptor |
//! | 2.6.0 | `/dev/tenstorrent/by-id/` links (udev rule shipped with it)    |
//! | 2.7.0 | `tt_heartbeat` and `tt_therm_trip_count` attributes            |
//! | 2.9.0 | attribute reads fail (ENODATA) during a reset; earlier they may return the old values |
//! | 2.10.0| `O_EXCL` opens (not mirrored: the fake's nodes are plain files) |

use serde::{Deserialize, Serialize};

/// The version a new root's driver reports unless told otherwise.
pub const DEFAULT_DRIVER_VERSION: &str = "2.10.0";

/// A fake driver of one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kmd {
    /// As written to `sys/module/tenstorrent/version`.
    pub version: String,
}

impl Default for Kmd {
    fn default() -> Self {
        Kmd {
            version: DEFAULT_DRIVER_VERSION.to_string(),
        }
    }
}

impl Kmd {
    /// A driver reporting `version` (`2.4.1`, `2.10.0`, ...).
    pub fn new(version: &str) -> Kmd {
        Kmd {
            version: version.to_string(),
        }
    }

    fn at_least(&self, want: [u32; 3]) -> bool {
        parse(&self.version) >= want
    }

    /// `tt_heartbeat` and `tt_therm_trip_count` exist (2.7.0).
    pub fn has_heartbeat(&self) -> bool {
        self.at_least([2, 7, 0])
    }

    /// `proc/driver/tenstorrent/N/pids` exists (2.5.0).
    pub fn has_pids_file(&self) -> bool {
        self.at_least([2, 5, 0])
    }

    /// `dev/tenstorrent/by-id/` exists (2.6.0).
    pub fn has_by_id(&self) -> bool {
        self.at_least([2, 6, 0])
    }

    /// A reset keeps the node and class dir (2.4.1), outside hot-plug slots.
    pub fn resets_in_place(&self) -> bool {
        self.at_least([2, 4, 1])
    }

    /// Attribute reads fail during a reset (2.9.0); before, they return
    /// the values from before it.
    pub fn reads_fail_during_reset(&self) -> bool {
        self.at_least([2, 9, 0])
    }
}

/// `major.minor.patch`, missing or odd parts as 0.
fn parse(version: &str) -> [u32; 3] {
    let mut out = [0; 3];
    for (slot, part) in out.iter_mut().zip(
        version
            .trim()
            .split(['-', '+'])
            .next()
            .unwrap_or("")
            .split('.'),
    ) {
        *slot = part.parse().unwrap_or(0);
    }
    out
}

/// The tt-smi a fake root's `bin/tt-smi` plays.
pub const DEFAULT_TT_SMI_VERSION: &str = "6.8.0";

/// Whether a tt-smi of `version` parses `-r` targets as 6.8 does (from
/// 4.2.0: logical ids, PCI addresses, `/dev/tenstorrent/N`) rather than
/// as older releases (integer indices or a JSON file, from
/// tt_tools_common's `parse_reset_input`).
pub fn tt_smi_takes_bdfs(version: &str) -> bool {
    parse(version) >= [4, 2, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_follow_the_releases() {
        let old = Kmd::new("2.4.1");
        assert!(old.resets_in_place() && !old.has_pids_file() && !old.has_heartbeat());
        assert!(!Kmd::new("2.4.0").resets_in_place());
        assert!(Kmd::new("2.5.0").has_pids_file());
        assert!(Kmd::new("2.6.0").has_by_id() && !Kmd::new("2.6.0").has_heartbeat());
        assert!(Kmd::new("2.7.0").has_heartbeat());
        assert!(!Kmd::new("2.8.0").reads_fail_during_reset());
        assert!(Kmd::new("2.10.0").reads_fail_during_reset());
        assert!(tt_smi_takes_bdfs("6.8.0") && tt_smi_takes_bdfs("4.2.0"));
        assert!(!tt_smi_takes_bdfs("4.1.2") && !tt_smi_takes_bdfs("3.0.39"));
    }
}
