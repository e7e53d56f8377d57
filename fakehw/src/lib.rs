//! A fake Tenstorrent Blackhole hardware root, for tests and the demo mode.
//!
//! The daemon reads cards from `dev_root`, `sys_root` and `proc_root` and
//! resets them with the `tt-smi` named in its config. Point those at a
//! directory laid out by this crate and the daemon's real code runs without
//! cards: the files mirror what the tenstorrent kernel driver (tt-kmd)
//! exposes, the fake `tt-smi` mirrors tt-smi 6.8's command line, output and
//! exit codes, and a fake firmware loop makes heartbeats advance and reset
//! cards come back — late, under another index, or never, as real ones do.
//!
//! # Layout
//!
//! - [`FakeRoot`] (this file) — the handle tests hold: create or open a root,
//!   inject faults, register foreign pids, read what a card shows, step the
//!   firmware.
//! - `layout` — where every file lives (`dev/tenstorrent/N`, the PCI and
//!   class dirs, hwmon, `proc/driver/tenstorrent/N/pids`), and how a card
//!   appears and vanishes atomically.
//! - `state` — the fake's own bookkeeping under `R/fakehw/` (inventory,
//!   faults, pending resets, the `tt-smi` log) and the lock every writer takes.
//! - `faults` — [`Fault`] and [`CardFaults`], the failures a card can be told to have.
//! - `firmware` — one firmware step ([`FakeRoot::tick`]) and the loop the
//!   `tt-fakehw firmware` command runs.
//! - `running` — whether a firmware loop runs on a root (it holds a lock)
//!   and why the last one stopped, so a root without one says so.
//! - `smi` — the fake `tt-smi` ([`run_smi`]): argparse-compatible parsing,
//!   `-r`, `-ls`, `-s`.
//! - `snapshot` — the `tt-smi -s` JSON, in the real tool's shape.
//! - `chip_lock` — tt-umd's chip lock ([`ChipLock`]), a real robust
//!   pthread mutex in tt-umd's file layout, as `hold-chip` takes it.
//! - `error` — [`FakeHwError`].
//!
//! The binary `tt-fakehw` wraps all of this: `create`, `firmware`, `smi`,
//! `fault`, `pid`, `status`.
//!
//! # Fidelity notes
//!
//! - During a real reset (tt-kmd 2.9.0+), reads of the class attributes
//!   fail with ENODATA; here each attribute becomes a directory, so they
//!   fail with EISDIR (a card that leaves the bus loses its class dir:
//!   ENOENT). All are "the card is not readable"; code must treat any read
//!   error as such.
//! - The device node is a regular file, not a character device.
//! - The card's PCI dir and hwmon stay during a reset (the PCI function
//!   stays on the bus during a link reset); `sys/bus/pci/devices/<BDF>`
//!   therefore always resolves.

#![warn(missing_docs)]

mod chip_lock;
mod error;
mod faults;
mod firmware;
mod kmd;
mod layout;
mod running;
mod smi;
mod snapshot;
mod state;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use chip_lock::ChipLock;
pub use error::{FakeHwError, Result};
pub use faults::{CardFaults, Fault};
pub use firmware::{run_firmware, FirmwareThread, ReturnedCard, TickReport};
pub use kmd::{Kmd, DEFAULT_DRIVER_VERSION, DEFAULT_TT_SMI_VERSION};
pub use running::FirmwareState;
pub use smi::{run_smi, run_smi_to_end, SmiEnd, SmiHang, HUNG_EXIT_CODE, TT_SMI_VERSION};
pub use state::{CardInfo, PendingReset, SmiInvocation, DEFAULT_RESET_DELAY_MS};

use layout::Layout;
use state::{Inventory, StateLock};

/// The most cards a root can have: BDF buses run from 01 to ff.
pub const MAX_CARDS: usize = 255;

/// How to lay out a new root; see [`FakeRoot::create_with`].
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Number of P150a cards, at indices `0..cards` and BDFs [`FakeRoot::bdf`].
    pub cards: usize,
    /// The `tt-fakehw` binary `bin/tt-smi` re-enters.
    pub fakehw_bin: PathBuf,
    /// How long a reset takes for cards without the `slow` fault.
    pub reset_delay_ms: u64,
    /// Replace an existing root's files instead of refusing a non-empty directory.
    pub force: bool,
    /// The tt-kmd version the root plays (what exists and how a reset
    /// looks follow it: see [`Kmd`]).
    pub driver_version: String,
    /// The tt-smi release `bin/tt-smi` plays (`-v` prints it; before 4.2.0
    /// `-r` takes only integer indices or a JSON file).
    pub tt_smi_version: String,
    /// Make each card's device node a character device (/dev/null's
    /// numbers) instead of an empty file, so that a container runtime
    /// takes it as `--device` (root only).
    pub char_dev_nodes: bool,
}

impl CreateOptions {
    /// Options with the default reset delay, driver and tt-smi, and no `force`.
    pub fn new(cards: usize, fakehw_bin: &Path) -> Self {
        CreateOptions {
            cards,
            fakehw_bin: fakehw_bin.to_path_buf(),
            reset_delay_ms: DEFAULT_RESET_DELAY_MS,
            force: false,
            driver_version: DEFAULT_DRIVER_VERSION.to_string(),
            tt_smi_version: DEFAULT_TT_SMI_VERSION.to_string(),
            char_dev_nodes: false,
        }
    }
}

/// Everything a test may want to know about one card at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardStatus {
    /// What never changes about the card (BDF, serial, ...).
    pub info: CardInfo,
    /// Its index now; `None` while it is gone.
    pub index: Option<u32>,
    /// Its heartbeat now; `None` while it is gone.
    pub heartbeat: Option<u64>,
    /// The faults switched on for it.
    pub faults: CardFaults,
    /// The reset in progress on it, if any.
    pub pending: Option<PendingReset>,
}

/// What an in-process run of the fake `tt-smi` printed and returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiOutput {
    /// Exit code.
    pub code: i32,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

/// A fake hardware root on disk. Holds only its path: all state lives in
/// the files, so several handles, the `tt-fakehw` processes and the daemon
/// all see the same thing.
#[derive(Debug, Clone)]
pub struct FakeRoot {
    /// Paths of the root (absolute).
    layout: Layout,
}

impl FakeRoot {
    /// Lays out a root with `cards` cards at `root` (which must be missing or
    /// empty), whose `bin/tt-smi` runs `fakehw_bin`.
    pub fn create(root: &Path, cards: usize, fakehw_bin: &Path) -> Result<FakeRoot> {
        FakeRoot::create_with(root, &CreateOptions::new(cards, fakehw_bin))
    }

    /// Lays out a root as `opts` says.
    pub fn create_with(root: &Path, opts: &CreateOptions) -> Result<FakeRoot> {
        if opts.cards > MAX_CARDS {
            return Err(FakeHwError::Invalid(format!(
                "{} cards asked for; a fake root holds at most {MAX_CARDS}",
                opts.cards
            )));
        }
        let is_nonempty = |dir: &Path| {
            fs::read_dir(dir)
                .map(|mut entries| entries.next().is_some())
                .unwrap_or(false)
        };
        if is_nonempty(root) {
            if !opts.force {
                return Err(FakeHwError::RootNotEmpty(root.to_path_buf()));
            }
            // Remove only what `create` makes, never unrelated files a
            // mistyped --root might point at.
            for path in Layout::new(root).top_level() {
                layout::remove_dir_all_if_exists(&path)?;
            }
        }
        fs::create_dir_all(root).map_err(|e| FakeHwError::io("creating", root, e))?;
        let root = fs::canonicalize(root).map_err(|e| FakeHwError::io("resolving", root, e))?;
        let fakehw_bin = absolute(&opts.fakehw_bin)?;
        let layout = Layout::new(&root);

        let cards: Vec<CardInfo> = (0..opts.cards)
            .map(|i| CardInfo {
                bdf: layout::bdf(i),
                serial: format!("{:08X}{:08X}", 0x403, 0x1924_062a + i as u64),
                asic_id: format!("{:016X}", 0x0b1a_c4e0_0000_1000 + 0x101 * i as u64),
                hwmon: layout::hwmon_number(i),
                created_index: i as u32,
            })
            .collect();
        for (what, version) in [
            ("driver", &opts.driver_version),
            ("tt-smi", &opts.tt_smi_version),
        ] {
            let v = version.trim();
            if v.is_empty()
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
            {
                return Err(FakeHwError::Invalid(format!(
                    "{what} version {version:?} is not a version such as 2.10.0"
                )));
            }
        }
        let inventory = Inventory {
            format: state::FORMAT_VERSION,
            reset_delay_ms: opts.reset_delay_ms,
            cards,
            kmd: Kmd::new(opts.driver_version.trim()),
            tt_smi_version: opts.tt_smi_version.trim().to_string(),
        };
        layout::create_static(&layout, &inventory.cards, &fakehw_bin, &inventory.kmd)?;
        if opts.char_dev_nodes {
            layout::write_atomic(&layout.char_dev_nodes_marker(), b"")?;
        }
        for card in &inventory.cards {
            let readings = layout::Readings {
                heartbeat: 1_000 + 100 * u64::from(card.created_index),
                therm_trips: 0,
            };
            layout::materialize_card(&layout, card, card.created_index, readings, &inventory.kmd)?;
        }
        state::save_faults(&layout, &Default::default())?;
        state::save_pending(&layout, &[])?;
        // Written last: its presence is what marks the root as complete.
        state::save_inventory(&layout, &inventory)?;
        Ok(FakeRoot { layout })
    }

    /// Opens a root made earlier by [`FakeRoot::create`] (or `tt-fakehw create`).
    pub fn open(root: &Path) -> Result<FakeRoot> {
        let root = fs::canonicalize(root).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FakeHwError::NotAFakeRoot(root.to_path_buf()),
            _ => FakeHwError::io("resolving", root, e),
        })?;
        let layout = Layout::new(&root);
        state::load_inventory(&layout)?;
        Ok(FakeRoot { layout })
    }

    /// The root directory (absolute).
    pub fn root(&self) -> &Path {
        self.layout.root()
    }

    /// What to configure as the daemon's `dev_root` (holds `tenstorrent/N`).
    pub fn dev_root(&self) -> PathBuf {
        self.layout.dev_root()
    }

    /// What to configure as the daemon's `sys_root` (holds `class`, `bus`, `module`, `devices`).
    pub fn sys_root(&self) -> PathBuf {
        self.layout.sys_root()
    }

    /// What to configure as the daemon's `proc_root` (holds `driver/tenstorrent/N/pids`).
    pub fn proc_root(&self) -> PathBuf {
        self.layout.proc_root()
    }

    /// The fake `tt-smi` executable.
    pub fn tt_smi(&self) -> PathBuf {
        self.layout.tt_smi()
    }

    /// The fake's own state directory (`R/fakehw`).
    pub fn state_dir(&self) -> PathBuf {
        self.layout.state_dir()
    }

    /// The `dev_root`, `sys_root`, `proc_root` and `tt_smi` lines of a daemon
    /// config pointing at this root, as TOML.
    pub fn config_toml(&self) -> String {
        [
            ("dev_root", self.dev_root()),
            ("sys_root", self.sys_root()),
            ("proc_root", self.proc_root()),
            ("tt_smi", self.tt_smi()),
        ]
        .iter()
        .map(|(k, v)| format!("{k} = {}\n", toml_string(&v.to_string_lossy())))
        .collect()
    }

    /// The BDF given at creation to the card created at `index`.
    pub fn bdf(index: usize) -> String {
        layout::bdf(index)
    }

    /// The BDFs of all cards of this root, in creation order, present or not.
    pub fn card_bdfs(&self) -> Result<Vec<String>> {
        Ok(state::load_inventory(&self.layout)?
            .cards
            .into_iter()
            .map(|c| c.bdf)
            .collect())
    }

    /// Everything about every card, in creation order.
    pub fn cards(&self) -> Result<Vec<CardStatus>> {
        let inventory = state::load_inventory(&self.layout)?;
        let faults = state::load_faults(&self.layout)?;
        let pending = state::load_pending(&self.layout)?;
        Ok(inventory
            .cards
            .into_iter()
            .map(|info| CardStatus {
                index: self.index_of(&info.bdf),
                heartbeat: self.heartbeat(&info.bdf),
                faults: faults.get(&info.bdf).cloned().unwrap_or_default(),
                pending: pending.iter().find(|p| p.bdf == info.bdf).cloned(),
                info,
            })
            .collect())
    }

    /// Turns a card as a user names it — a present index or a BDF (full or
    /// `bb:dd.f`) — into its BDF.
    pub fn resolve_card(&self, spec: &str) -> Result<String> {
        let inventory = state::load_inventory(&self.layout)?;
        let spec = spec.trim();
        if let Ok(index) = spec.parse::<u32>() {
            return layout::present_cards(&self.layout)?
                .into_iter()
                .find(|c| c.index == index)
                .map(|c| c.bdf)
                .ok_or_else(|| {
                    FakeHwError::Invalid(format!(
                        "no card has index {index} right now (a card that is mid-reset or \
                         never came back has no index); name the card by its BDF instead, \
                         `tt-fakehw status` lists them"
                    ))
                });
        }
        let bdf = if spec.len() == 7 {
            format!("0000:{spec}")
        } else {
            spec.to_string()
        }
        .to_ascii_lowercase();
        inventory
            .card(&bdf)
            .map(|c| c.bdf.clone())
            .ok_or_else(|| FakeHwError::UnknownCard(spec.to_string()))
    }

    /// Switches `fault` on for the card `bdf` (other faults stay on).
    pub fn set_fault(&self, bdf: &str, fault: Fault) -> Result<()> {
        let _lock = StateLock::acquire(&self.layout)?;
        self.known_card(bdf)?;
        let mut table = state::load_faults(&self.layout)?;
        table.entry(bdf.to_string()).or_default().apply(fault);
        state::save_faults(&self.layout, &table)
    }

    /// Switches every fault of the card `bdf` off. A card held back by
    /// `never-returns` then comes back on the next firmware step.
    pub fn clear_fault(&self, bdf: &str) -> Result<()> {
        let _lock = StateLock::acquire(&self.layout)?;
        self.known_card(bdf)?;
        let mut table = state::load_faults(&self.layout)?;
        table.remove(bdf);
        state::save_faults(&self.layout, &table)
    }

    /// The faults switched on for the card `bdf`.
    pub fn faults(&self, bdf: &str) -> Result<CardFaults> {
        self.known_card(bdf)?;
        Ok(state::load_faults(&self.layout)?
            .remove(bdf)
            .unwrap_or_default())
    }

    /// Replaces the pids the driver lists as holding `/dev/tenstorrent/<index>`
    /// (`proc/driver/tenstorrent/<index>/pids`). The card must be present.
    pub fn set_pids(&self, index: u32, pids: &[u32]) -> Result<()> {
        self.update_pids(index, |list| *list = pids.to_vec())
    }

    /// Adds one line for `pid` to the driver's list of `/dev/tenstorrent/<index>`:
    /// one open descriptor (tt-kmd prints a line per descriptor, so a
    /// process that opened the node twice appears twice).
    pub fn add_pid(&self, index: u32, pid: u32) -> Result<()> {
        self.update_pids(index, |list| list.push(pid))
    }

    /// Drops every line of `pid` (its descriptors closed).
    pub fn remove_pid(&self, index: u32, pid: u32) -> Result<()> {
        self.update_pids(index, |list| list.retain(|p| *p != pid))
    }

    /// Reads, changes and writes a card's pid list under the root's lock,
    /// so concurrent `add_pid`s do not lose each other's pids.
    fn update_pids(&self, index: u32, change: impl FnOnce(&mut Vec<u32>)) -> Result<()> {
        let _lock = StateLock::acquire(&self.layout)?;
        let mut pids = self.pids(index)?;
        change(&mut pids);
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        layout::write_atomic(&self.layout.pids_file(index), text.as_bytes())
    }

    /// The pids listed as holding `/dev/tenstorrent/<index>`.
    pub fn pids(&self, index: u32) -> Result<Vec<u32>> {
        let path = self.layout.pids_file(index);
        let text = fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                FakeHwError::CardGone(format!("/dev/tenstorrent/{index}"))
            }
            _ => FakeHwError::io("reading", &path, e),
        })?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Loads (`true`) or unloads (`false`) the fake driver module: without
    /// `sys/module/tenstorrent`, `tt-smi` exits 1 as on a host without tt-kmd.
    pub fn set_driver_loaded(&self, loaded: bool) -> Result<()> {
        let dir = self.layout.module_dir();
        if loaded {
            fs::create_dir_all(&dir).map_err(|e| FakeHwError::io("creating", &dir, e))?;
            let kmd = state::load_inventory(&self.layout)?.kmd;
            layout::write_atomic(
                &dir.join("version"),
                format!("{}\n", kmd.version).as_bytes(),
            )
        } else {
            layout::remove_dir_all_if_exists(&dir)
        }
    }

    /// The card's `tt_heartbeat` now; `None` while the card is gone.
    pub fn heartbeat(&self, bdf: &str) -> Option<u64> {
        let index = self.index_of(bdf)?;
        layout::read_attr(&self.layout.class_dir(bdf, index).join("tt_heartbeat"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The card's `/dev/tenstorrent/N` index now; `None` while it is gone.
    pub fn index_of(&self, bdf: &str) -> Option<u32> {
        layout::present_cards(&self.layout)
            .ok()?
            .into_iter()
            .find(|c| c.bdf == bdf)
            .map(|c| c.index)
    }

    /// Resets started by `tt-smi -r` that the firmware has not completed.
    pub fn pending_resets(&self) -> Result<Vec<PendingReset>> {
        state::load_pending(&self.layout)
    }

    /// Every run of the fake `tt-smi` so far, oldest first.
    pub fn tt_smi_log(&self) -> Result<Vec<SmiInvocation>> {
        state::read_smi_log(&self.layout)
    }

    /// One firmware step at the current time: see [`FakeRoot::tick_at`].
    pub fn tick(&self) -> Result<TickReport> {
        self.tick_at(state::now_unix_ms())
    }

    /// One firmware step as if the time were `now_unix_ms` (ms since the
    /// epoch): every present card's heartbeat advances unless frozen, and
    /// every reset due by then completes. Lets tests step past a reset
    /// delay without sleeping.
    pub fn tick_at(&self, now_unix_ms: u64) -> Result<TickReport> {
        firmware::tick_at(&self.layout, now_unix_ms)
    }

    /// Runs the firmware loop on a background thread every `interval`
    /// until the returned handle is dropped or stopped.
    pub fn spawn_firmware_thread(&self, interval: Duration) -> FirmwareThread {
        FirmwareThread::spawn(self.root(), interval)
    }

    /// Whether a firmware loop runs on this root (any process), and why the
    /// last one stopped.
    pub fn firmware_state(&self) -> FirmwareState {
        FirmwareState::of(&self.layout)
    }

    /// Where `tt-fakehw firmware --detach` writes the firmware's output.
    pub fn firmware_log(&self) -> PathBuf {
        self.layout.firmware_log()
    }

    /// Runs the fake `tt-smi` in this process (no `bin/tt-smi`, no fork)
    /// and captures what it printed. Logged like any other run.
    pub fn run_smi(&self, args: &[&str]) -> SmiOutput {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = run_smi(self.root(), &args, &mut out, &mut err);
        SmiOutput {
            code,
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
        }
    }

    /// The driver this root plays.
    pub fn kmd(&self) -> Result<Kmd> {
        Ok(state::load_inventory(&self.layout)?.kmd)
    }

    /// Takes the card `bdf` off the bus, as a hot removal or a dead link
    /// does: node, class dir, PCI dir and bus link are gone, tt-smi no
    /// longer sees it, and it stays gone (a pending reset of it is dropped)
    /// until [`FakeRoot::plug`].
    pub fn unplug(&self, bdf: &str) -> Result<()> {
        let _lock = StateLock::acquire(&self.layout)?;
        let inventory = state::load_inventory(&self.layout)?;
        let card = inventory
            .card(bdf)
            .ok_or_else(|| FakeHwError::UnknownCard(bdf.to_string()))?;
        let index = self.index_of(bdf).or_else(|| {
            state::load_pending(&self.layout)
                .ok()?
                .into_iter()
                .find(|p| p.bdf == bdf && p.in_place)
                .map(|p| p.old_index)
        });
        layout::unplug_pci_function(&self.layout, card, index)?;
        let mut pending = state::load_pending(&self.layout)?;
        pending.retain(|p| p.bdf != bdf);
        state::save_pending(&self.layout, &pending)
    }

    /// Puts an unplugged card back on the bus at the lowest free index,
    /// freshly booted. Returns that index.
    pub fn plug(&self, bdf: &str) -> Result<u32> {
        let _lock = StateLock::acquire(&self.layout)?;
        let inventory = state::load_inventory(&self.layout)?;
        let card = inventory
            .card(bdf)
            .ok_or_else(|| FakeHwError::UnknownCard(bdf.to_string()))?;
        if let Some(index) = self.index_of(bdf) {
            return Ok(index);
        }
        let used: Vec<u32> = layout::present_cards(&self.layout)?
            .iter()
            .map(|c| c.index)
            .chain(
                state::load_pending(&self.layout)?
                    .iter()
                    .map(|p| p.old_index),
            )
            .collect();
        let index = (0..).find(|i| !used.contains(i)).unwrap_or(0);
        layout::plug_pci_function(&self.layout, card)?;
        let readings = layout::Readings {
            heartbeat: layout::HEARTBEAT_AFTER_RESET,
            therm_trips: 0,
        };
        layout::materialize_card(&self.layout, card, index, readings, &inventory.kmd)?;
        Ok(index)
    }

    /// Where tt-umd keeps the chip lock of `/dev/tenstorrent/<index>`
    /// under this root (`dev/shm/TT_UMD_LOCK.CHIP_IN_USE_<index>_PCIe`).
    pub fn chip_lock(&self, index: u32) -> PathBuf {
        self.layout.chip_lock(index)
    }

    /// The root's `dev/shm` (mode 1777, as the host's): tt-umd's locks and
    /// Open MPI's segments.
    pub fn shm_dir(&self) -> PathBuf {
        self.layout.shm_dir()
    }

    /// The root's `dev/hugepages-1G`, where tt-umd maps its 1 GiB
    /// hugepage files (`device_<index>_...`).
    pub fn hugepages_dir(&self) -> PathBuf {
        self.layout.hugepages_dir()
    }

    fn known_card(&self, bdf: &str) -> Result<()> {
        let inventory = state::load_inventory(&self.layout)?;
        match inventory.card(bdf) {
            Some(_) => Ok(()),
            None => Err(FakeHwError::UnknownCard(bdf.to_string())),
        }
    }
}

/// Finds a built `tt-fakehw` binary for callers outside this package
/// (which have no `CARGO_BIN_EXE_tt-fakehw`): `$TT_FAKEHW_BIN` if set,
/// else `tt-fakehw` next to the running executable or one directory up
/// (a test binary runs from `target/<profile>/deps/`). The binary must
/// have been built, e.g. with `cargo build -p tt-fakehw`.
pub fn locate_fakehw_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TT_FAKEHW_BIN") {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("tt-fakehw"))
        .find(|candidate| candidate.is_file())
}

/// `path` made absolute (resolved if it exists) without requiring it to exist.
fn absolute(path: &Path) -> Result<PathBuf> {
    if let Ok(p) = fs::canonicalize(path) {
        return Ok(p);
    }
    std::path::absolute(path).map_err(|e| FakeHwError::io("resolving", path, e))
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdfs_follow_the_bus_number() {
        assert_eq!(FakeRoot::bdf(0), "0000:01:00.0");
        assert_eq!(FakeRoot::bdf(9), "0000:0a:00.0");
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }
}
