//! The fake's own state under `R/fakehw/`, and the lock that serialises
//! every change to a root.
//!
//! Files (all JSON, all replaced atomically):
//!
//! - `cards.json` — the inventory written once by `create`: format version,
//!   default reset delay, and per card its BDF, serial, ASIC id, hwmon number
//!   and the index it was created at. Which cards are *present*, and at which
//!   index, is not stored: the sysfs tree itself is the truth, read the way
//!   the daemon reads it.
//! - `faults.json` — `{ "<BDF>": CardFaults }` for cards with a fault on.
//! - `pending.json` — `[PendingReset]`, resets `tt-smi -r` started and the
//!   firmware has not completed yet.
//! - `tt-smi.log` — one [`SmiInvocation`] JSON object per line.
//! - `lock` — `flock`ed by every writer (`tt-smi`, the firmware loop, the
//!   library), so a reset never interleaves with a heartbeat tick.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{FakeHwError, Result};
use crate::faults::CardFaults;
use crate::layout::{write_atomic, Layout};

/// Version of the `cards.json` format; bumped on incompatible changes.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// The reset delay used when a root is created without one.
pub const DEFAULT_RESET_DELAY_MS: u64 = 300;

/// What never changes about one fake card (an entry of `cards.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardInfo {
    /// PCI address, the card's identity across resets.
    pub bdf: String,
    /// `tt_serial`: 16 hex digits, also the board id in `tt-smi -s`.
    pub serial: String,
    /// `tt_asic_id`: 16 hex digits.
    pub asic_id: String,
    /// The `k` of `hwmon/hwmon<k>`.
    pub hwmon: usize,
    /// The `/dev/tenstorrent/N` index the card had at creation.
    pub created_index: u32,
}

/// The contents of `cards.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Inventory {
    /// [`FORMAT_VERSION`] at creation.
    pub(crate) format: u32,
    /// How long a reset takes for a card without the `slow` fault.
    pub(crate) reset_delay_ms: u64,
    /// One entry per card, in creation order.
    pub(crate) cards: Vec<CardInfo>,
    /// The driver the root plays.
    #[serde(default)]
    pub(crate) kmd: crate::kmd::Kmd,
    /// The tt-smi release `bin/tt-smi` plays.
    #[serde(default = "default_tt_smi_version")]
    pub(crate) tt_smi_version: String,
}

fn default_tt_smi_version() -> String {
    crate::kmd::DEFAULT_TT_SMI_VERSION.to_string()
}

impl Inventory {
    pub(crate) fn card(&self, bdf: &str) -> Option<&CardInfo> {
        self.cards.iter().find(|c| c.bdf == bdf)
    }
}

/// A reset `tt-smi -r` started and the firmware will complete
/// (an entry of `pending.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReset {
    /// The card being reset.
    pub bdf: String,
    /// The index it had before the reset.
    pub old_index: u32,
    /// Wall-clock time (ms since the Unix epoch) from which the firmware
    /// brings the card back.
    pub due_unix_ms: u64,
    /// Reset in place: the node and class dir stayed (tt-kmd 2.4.1+
    /// outside hot-plug slots); else the card left the bus.
    #[serde(default)]
    pub in_place: bool,
    /// `tt_therm_trip_count` before the reset (the attribute may be
    /// unreadable during it).
    #[serde(default)]
    pub therm_trips: u64,
}

/// One line of `tt-smi.log`: a run of the fake `tt-smi`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmiInvocation {
    /// When it ran, ms since the Unix epoch.
    pub unix_ms: u64,
    /// Its arguments (without the program name and the fake's `--root`).
    pub args: Vec<String>,
    /// What it exited with.
    pub exit_code: i32,
    /// The cards this run actually reset (their BDFs), whatever its
    /// arguments named: what a test checks to see that a reset never
    /// touched another card.
    #[serde(default)]
    pub reset_bdfs: Vec<String>,
    /// The run hung (the `smi-hangs` fault). Such a run never ends by
    /// itself, so it is logged when it begins to hang, with `exit_code`
    /// 137: what the SIGKILL that ends it gives.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hung: bool,
    /// The processes of a hung run (tt-smi, then the child it forked), for
    /// a test to check that they are gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
}

/// Faults by BDF, as stored in `faults.json`.
pub(crate) type FaultTable = BTreeMap<String, CardFaults>;

/// Holds the root's `flock` until dropped.
pub(crate) struct StateLock {
    /// The locked file; the lock is released when it is closed.
    _file: Flock<File>,
}

impl StateLock {
    /// Blocks until this process holds the exclusive lock of the root.
    pub(crate) fn acquire(layout: &Layout) -> Result<StateLock> {
        let path = layout.lock_file();
        if !layout.cards_file().is_file() {
            return Err(FakeHwError::NotAFakeRoot(layout.root().to_path_buf()));
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| FakeHwError::io("opening lock", &path, e))?;
        let file = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| FakeHwError::io("locking", &path, io::Error::from(errno)))?;
        Ok(StateLock { _file: file })
    }
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = fs::read(path).map_err(|e| FakeHwError::io("reading", path, e))?;
    serde_json::from_slice(&text).map_err(|source| FakeHwError::CorruptState {
        path: path.to_path_buf(),
        source,
    })
}

/// Like [`read_json`], but a missing file is the default value.
fn read_json_or_default<T: DeserializeOwned + Default>(path: &Path) -> Result<T> {
    match read_json(path) {
        Err(e) if e.is_not_found() => Ok(T::default()),
        other => other,
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut text =
        serde_json::to_vec_pretty(value).map_err(|source| FakeHwError::CorruptState {
            path: path.to_path_buf(),
            source,
        })?;
    text.push(b'\n');
    write_atomic(path, &text)
}

pub(crate) fn load_inventory(layout: &Layout) -> Result<Inventory> {
    match read_json::<Inventory>(&layout.cards_file()) {
        Err(e) if e.is_not_found() => Err(FakeHwError::NotAFakeRoot(layout.root().to_path_buf())),
        Ok(inv) if inv.format != FORMAT_VERSION => Err(FakeHwError::Invalid(format!(
            "{} has format {} but this tt-fakehw understands {}; recreate the root",
            layout.cards_file().display(),
            inv.format,
            FORMAT_VERSION
        ))),
        other => other,
    }
}

pub(crate) fn save_inventory(layout: &Layout, inv: &Inventory) -> Result<()> {
    write_json(&layout.cards_file(), inv)
}

pub(crate) fn load_faults(layout: &Layout) -> Result<FaultTable> {
    read_json_or_default(&layout.faults_file())
}

pub(crate) fn save_faults(layout: &Layout, faults: &FaultTable) -> Result<()> {
    write_json(&layout.faults_file(), faults)
}

pub(crate) fn load_pending(layout: &Layout) -> Result<Vec<PendingReset>> {
    read_json_or_default(&layout.pending_file())
}

pub(crate) fn save_pending(layout: &Layout, pending: &[PendingReset]) -> Result<()> {
    write_json(&layout.pending_file(), &pending)
}

/// Appends one invocation to `tt-smi.log` with a single `write`, so
/// concurrent runs cannot interleave within a line.
pub(crate) fn append_smi_log(layout: &Layout, entry: &SmiInvocation) -> Result<()> {
    let path = layout.smi_log();
    let mut line = serde_json::to_vec(entry).map_err(|source| FakeHwError::CorruptState {
        path: path.clone(),
        source,
    })?;
    line.push(b'\n');
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| FakeHwError::io("opening", &path, e))?;
    file.write_all(&line)
        .map_err(|e| FakeHwError::io("appending to", &path, e))
}

pub(crate) fn read_smi_log(layout: &Layout) -> Result<Vec<SmiInvocation>> {
    let path = layout.smi_log();
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FakeHwError::io("reading", &path, e)),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|source| FakeHwError::CorruptState {
                path: path.clone(),
                source,
            })
        })
        .collect()
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
