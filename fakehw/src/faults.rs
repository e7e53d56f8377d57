//! The faults a fake card can be told to have.
//!
//! Each one reproduces a failure seen on real Blackhole hosts (see
//! DESIGN.md section 2): `tt-smi -r` exits 0 and the card never comes back,
//! the card comes back under another `/dev/tenstorrent/N`, a reset that takes
//! seconds, a heartbeat that stops, and a re-init error. Faults are keyed by
//! BDF because that is the one identity a card keeps across resets, and they
//! persist across resets until cleared.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One fault to switch on for a card. Several may be on at once (for
/// example `slow` and `new-index`); [`crate::FakeRoot::clear_fault`] turns all off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `tt-smi -r` exits 0 but the card never comes back. Clearing the fault
    /// lets a pending reset complete on the next firmware tick.
    NeverReturns,
    /// The card comes back under the lowest free index other than its old
    /// one. Renumbering happens only in hot-plug slots, so this implies
    /// [`Fault::HotPlug`].
    NewIndex,
    /// The reset takes `delay_ms` instead of the root's default delay.
    Slow {
        /// How long after `tt-smi -r` the card is back.
        delay_ms: u64,
    },
    /// The firmware stops incrementing `tt_heartbeat` (the card looks hung).
    FrozenHeartbeat,
    /// `tt-smi -r` naming this card fails before any reset: tt-umd raises
    /// and tt-smi dies with a Python traceback, exit 1, every card untouched.
    SmiExit1,
    /// The card sits in a hot-plug slot: a reset takes it off the bus (node
    /// and class dir gone) instead of resetting it in place, as tt-kmd does
    /// there even from 2.4.1.
    HotPlug,
    /// The reset ioctl to this card fails: tt-umd logs `Sending reset ioctl
    /// to device N failed: ...`, the card is not reset, tt-smi exits 0.
    IoctlFails,
    /// After a reset the card's PCIe link comes back at 8.0 GT/s x4
    /// instead of its 32.0 GT/s x16.
    Downtrained,
    /// The card trips its thermal limit during a reset:
    /// `tt_therm_trip_count` is one higher when it comes back.
    ThermTrip,
    /// tt-smi's re-initialisation after a reset (skipped with
    /// `--no_reinit`) fails on this card, whichever cards were reset: it
    /// re-discovers every card on the host.
    ReinitFails,
    /// `tt-smi -r` naming this card never returns, as if stuck in the
    /// reset ioctl: no card is touched, it ignores SIGTERM, SIGINT and
    /// SIGHUP, and only SIGKILL ends it (a process really stuck in the
    /// kernel does not even die to that until the ioctl returns). It also
    /// forks a child that hangs the same way, so that a test sees a whole
    /// process group go. Seen for real: `tt-smi -r` on a Galaxy appears
    /// stuck (tt-umd issue 2439), a reset hung 15 minutes and then returned
    /// non-zero (tt-smi issue 85), and one left the host unresponsive until
    /// a hard reboot (tt-smi issue 185).
    SmiHangs,
}

impl Fault {
    /// The delay of a `slow` reset when none is given.
    pub const DEFAULT_SLOW_DELAY_MS: u64 = 3_000;

    /// The fault's name on the command line (`never-returns`, `slow`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Fault::NeverReturns => "never-returns",
            Fault::NewIndex => "new-index",
            Fault::Slow { .. } => "slow",
            Fault::FrozenHeartbeat => "frozen-heartbeat",
            Fault::SmiExit1 => "smi-exit-1",
            Fault::HotPlug => "hot-plug",
            Fault::IoctlFails => "ioctl-fails",
            Fault::Downtrained => "downtrained",
            Fault::ThermTrip => "therm-trip",
            Fault::ReinitFails => "reinit-fails",
            Fault::SmiHangs => "smi-hangs",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Slow { delay_ms } => write!(f, "slow ({delay_ms} ms)"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    /// Parses a CLI fault name; `slow` gets [`Fault::DEFAULT_SLOW_DELAY_MS`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "never-returns" => Ok(Fault::NeverReturns),
            "new-index" => Ok(Fault::NewIndex),
            "slow" => Ok(Fault::Slow {
                delay_ms: Fault::DEFAULT_SLOW_DELAY_MS,
            }),
            "frozen-heartbeat" => Ok(Fault::FrozenHeartbeat),
            "smi-exit-1" => Ok(Fault::SmiExit1),
            "hot-plug" => Ok(Fault::HotPlug),
            "ioctl-fails" => Ok(Fault::IoctlFails),
            "downtrained" => Ok(Fault::Downtrained),
            "therm-trip" => Ok(Fault::ThermTrip),
            "reinit-fails" => Ok(Fault::ReinitFails),
            "smi-hangs" => Ok(Fault::SmiHangs),
            other => Err(format!(
                "unknown fault {other:?}; expected never-returns, new-index, slow, \
                 frozen-heartbeat, smi-exit-1, hot-plug, ioctl-fails, downtrained, \
                 therm-trip, reinit-fails or smi-hangs"
            )),
        }
    }
}

/// The faults switched on for one card, as stored in `fakehw/faults.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CardFaults {
    /// [`Fault::NeverReturns`] is on.
    pub never_returns: bool,
    /// [`Fault::NewIndex`] is on.
    pub new_index: bool,
    /// [`Fault::Slow`] is on with this delay.
    pub slow_delay_ms: Option<u64>,
    /// [`Fault::FrozenHeartbeat`] is on.
    pub frozen_heartbeat: bool,
    /// [`Fault::SmiExit1`] is on.
    pub smi_exit_1: bool,
    /// [`Fault::HotPlug`] is on.
    pub hot_plug: bool,
    /// [`Fault::IoctlFails`] is on.
    pub ioctl_fails: bool,
    /// [`Fault::Downtrained`] is on.
    pub downtrained: bool,
    /// [`Fault::ThermTrip`] is on.
    pub therm_trip: bool,
    /// [`Fault::ReinitFails`] is on.
    pub reinit_fails: bool,
    /// [`Fault::SmiHangs`] is on.
    pub smi_hangs: bool,
}

impl CardFaults {
    /// Switches `fault` on (a second `slow` replaces the delay).
    pub fn apply(&mut self, fault: Fault) {
        match fault {
            Fault::NeverReturns => self.never_returns = true,
            Fault::NewIndex => self.new_index = true,
            Fault::Slow { delay_ms } => self.slow_delay_ms = Some(delay_ms),
            Fault::FrozenHeartbeat => self.frozen_heartbeat = true,
            Fault::SmiExit1 => self.smi_exit_1 = true,
            Fault::HotPlug => self.hot_plug = true,
            Fault::IoctlFails => self.ioctl_fails = true,
            Fault::Downtrained => self.downtrained = true,
            Fault::ThermTrip => self.therm_trip = true,
            Fault::ReinitFails => self.reinit_fails = true,
            Fault::SmiHangs => self.smi_hangs = true,
        }
    }

    /// True when no fault is on.
    pub fn is_clear(&self) -> bool {
        *self == CardFaults::default()
    }

    /// The faults that are on, in a fixed order.
    pub fn active(&self) -> Vec<Fault> {
        let mut out = Vec::new();
        if self.never_returns {
            out.push(Fault::NeverReturns);
        }
        if self.new_index {
            out.push(Fault::NewIndex);
        }
        if let Some(delay_ms) = self.slow_delay_ms {
            out.push(Fault::Slow { delay_ms });
        }
        if self.frozen_heartbeat {
            out.push(Fault::FrozenHeartbeat);
        }
        if self.smi_exit_1 {
            out.push(Fault::SmiExit1);
        }
        for (on, fault) in [
            (self.hot_plug, Fault::HotPlug),
            (self.ioctl_fails, Fault::IoctlFails),
            (self.downtrained, Fault::Downtrained),
            (self.therm_trip, Fault::ThermTrip),
            (self.reinit_fails, Fault::ReinitFails),
            (self.smi_hangs, Fault::SmiHangs),
        ] {
            if on {
                out.push(fault);
            }
        }
        out
    }

    /// A reset takes the card off the bus (hot-plug slot), where it may
    /// come back under another index, instead of resetting it in place.
    pub fn leaves_the_bus(&self) -> bool {
        self.hot_plug || self.new_index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in [
            "never-returns",
            "new-index",
            "slow",
            "frozen-heartbeat",
            "smi-exit-1",
            "hot-plug",
            "ioctl-fails",
            "downtrained",
            "therm-trip",
            "reinit-fails",
            "smi-hangs",
        ] {
            let fault: Fault = name.parse().unwrap();
            assert_eq!(fault.name(), name);
        }
        assert!("bogus".parse::<Fault>().is_err());
    }

    #[test]
    fn apply_and_list() {
        let mut f = CardFaults::default();
        assert!(f.is_clear());
        f.apply(Fault::Slow { delay_ms: 10 });
        f.apply(Fault::NewIndex);
        assert_eq!(
            f.active(),
            vec![Fault::NewIndex, Fault::Slow { delay_ms: 10 }]
        );
        assert!(!f.is_clear());
    }
}
