//! Finding cards the way the kernel driver exposes them.
//!
//! `sys_root/class/tenstorrent/tenstorrent!N` is the class dir of
//! `/dev/tenstorrent/N`; its `device` link resolves to the PCI dir whose name
//! is the card's BDF. The index N can change across a reset while the BDF
//! does not, so every lookup starts from the BDF and resolves N at use time.

use crate::config::HardwareConfig;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use tt_card_lock::{procs, umd};

/// Where the driver's files are: the three roots from the config.
#[derive(Debug, Clone)]
pub struct HardwareRoot {
    /// Holds `tenstorrent/N`.
    pub dev_root: PathBuf,
    /// Holds `class/tenstorrent`, `bus/pci/devices`, `module/tenstorrent`.
    pub sys_root: PathBuf,
    /// Holds `driver/tenstorrent/N/pids`.
    pub proc_root: PathBuf,
}

impl HardwareRoot {
    /// `cards` when the roots are the host's own (`/sys`, `/dev`, `/proc`),
    /// otherwise `simulated: ...` naming them: cards found there are not
    /// the host's (a fake root), and nothing measured on them may be
    /// reported as a card's.
    pub fn kind(&self) -> String {
        if self.sys_root == Path::new("/sys")
            && self.dev_root == Path::new("/dev")
            && self.proc_root == Path::new("/proc")
        {
            "cards".into()
        } else {
            format!(
                "simulated: sys_root {}, dev_root {} (not the host's /sys and /dev)",
                self.sys_root.display(),
                self.dev_root.display()
            )
        }
    }
}

impl From<&HardwareConfig> for HardwareRoot {
    fn from(h: &HardwareConfig) -> Self {
        HardwareRoot {
            dev_root: h.dev_root.clone(),
            sys_root: h.sys_root.clone(),
            proc_root: h.proc_root.clone(),
        }
    }
}

/// What one read of a card's sysfs and hwmon files says.
#[derive(Debug, Clone, PartialEq)]
pub struct CardInfo {
    /// Current `/dev/tenstorrent/N` index.
    pub index: u32,
    /// PCI address, the stable identity.
    pub bdf: String,
    /// Whether `dev_root/tenstorrent/N` exists.
    pub dev_node: bool,
    /// `tt_card_type`, e.g. `p150a`.
    pub card_type: String,
    /// `tt_serial`.
    pub serial: String,
    /// `tt_fw_bundle_ver`.
    pub fw_bundle_version: String,
    /// `tt_m3app_fw_ver`.
    pub m3app_fw_version: String,
    /// `tt_aiclk` in MHz.
    pub aiclk_mhz: Option<u32>,
    /// `tt_heartbeat`; None when unreadable (the card is resetting).
    pub heartbeat: Option<u64>,
    /// hwmon readings.
    pub telemetry: Telemetry,
}

/// hwmon readings, converted to everyday units. None when unreadable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Telemetry {
    /// `temp1_input` in degrees Celsius.
    pub temperature_c: Option<f64>,
    /// `power1_input` in watts.
    pub power_w: Option<f64>,
    /// `in0_input` in volts.
    pub voltage_v: Option<f64>,
    /// `curr1_input` in amperes.
    pub current_a: Option<f64>,
    /// `fan1_input` in RPM.
    pub fan_rpm: Option<u32>,
}

/// A process that has a card's device open, per the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardProcess {
    /// Process id.
    pub pid: u32,
    /// `comm` of the process, when readable.
    pub command: String,
    /// It holds the card's tt-umd chip lock now (the lock's word names
    /// it): it runs on the chip (an engine), so the card has a second
    /// user. False for a process that only has the device open (a
    /// monitoring tool) and for one that took the chip and released it
    /// (tt-umd keeps the lock mapped for the process's life).
    pub holds_chip: bool,
    /// How the holder was told, when the lock's word alone could not say
    /// (a holder in another pid namespace); empty otherwise.
    pub note: String,
}

impl HardwareRoot {
    fn class_root(&self) -> PathBuf {
        self.sys_root.join("class/tenstorrent")
    }

    /// Path of the device node for index `n`.
    pub fn dev_node(&self, index: u32) -> PathBuf {
        self.dev_root.join(format!("tenstorrent/{index}"))
    }

    /// Kernel driver version, from `sys_root/module/tenstorrent/version`.
    pub fn driver_version(&self) -> Option<String> {
        read_trimmed(&self.sys_root.join("module/tenstorrent/version")).ok()
    }

    /// Whether the tenstorrent driver is loaded at all.
    pub fn driver_loaded(&self) -> bool {
        self.sys_root.join("module/tenstorrent").is_dir()
    }

    /// Every card whose class dir resolves to a PCI device, sorted by BDF.
    /// Cards in the middle of a reset (class dir gone or unreadable) are
    /// absent; callers that expect them report them as resetting or missing.
    pub fn discover(&self) -> io::Result<Vec<CardInfo>> {
        let mut cards = Vec::new();
        let entries = match fs::read_dir(self.class_root()) {
            Ok(e) => e,
            // No class dir: driver not loaded or no cards. Not an error for
            // discovery; status shows the driver as missing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(cards),
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(index) = name
                .to_str()
                .and_then(|n| n.strip_prefix("tenstorrent!"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(card) = self.read_card(index) {
                cards.push(card);
            }
        }
        cards.sort_by(|a, b| a.bdf.cmp(&b.bdf));
        Ok(cards)
    }

    /// The card with this BDF as it is now, if present.
    pub fn find(&self, bdf: &str) -> Option<CardInfo> {
        self.discover().ok()?.into_iter().find(|c| c.bdf == bdf)
    }

    /// Current index of the card with this BDF.
    pub fn index_of(&self, bdf: &str) -> Option<u32> {
        self.find(bdf).map(|c| c.index)
    }

    /// TT_VISIBLE_DEVICES in the `index` form: the `/dev/tenstorrent`
    /// numbers of `bdfs`, in their order, comma-separated. Refused unless
    /// every card on the host has its node and the numbers follow PCI
    /// order from 0: tt-umd up to 0.9.2 opens `/dev/tenstorrent/<N>`, 0.9.3
    /// and newer opens the N-th card in PCI order (`pci_device.cpp`
    /// enumerate_devices, tt-umd 0.9.3), and only then are they the same.
    pub fn device_indices(&self, bdfs: &[String]) -> Result<String, String> {
        let cards = self
            .discover()
            .map_err(|e| format!("cannot list the cards: {e}"))?;
        for (position, card) in cards.iter().enumerate() {
            if !card.dev_node || card.index as usize != position {
                return Err(format!(
                    "visible_devices = \"index\" needs the host's cards numbered in PCI order from 0, but {} is /dev/tenstorrent/{}{} at position {position} in PCI order: tt-umd 0.9.2 and older would open /dev/tenstorrent/{position} and 0.9.3 and newer {} for the number {position}. Use visible_devices = \"bdf\" (tt-umd 0.9.2 or newer), or reload the driver so the numbering follows PCI order",
                    card.bdf,
                    card.index,
                    if card.dev_node { "" } else { " (no device node)" },
                    card.bdf,
                ));
            }
        }
        let mut out = Vec::with_capacity(bdfs.len());
        for bdf in bdfs {
            match cards.iter().find(|c| &c.bdf == bdf) {
                Some(card) => out.push(card.index.to_string()),
                None => return Err(format!("card {bdf} is not present")),
            }
        }
        Ok(out.join(","))
    }

    fn read_card(&self, index: u32) -> Option<CardInfo> {
        let class_dir = self.class_root().join(format!("tenstorrent!{index}"));
        let pci_dir = fs::canonicalize(class_dir.join("device")).ok()?;
        let bdf = pci_dir.file_name()?.to_str()?.to_string();
        let attr = |name: &str| read_trimmed(&class_dir.join(name)).ok();
        Some(CardInfo {
            index,
            dev_node: self.dev_node(index).exists(),
            card_type: attr("tt_card_type").unwrap_or_default(),
            serial: attr("tt_serial").unwrap_or_default(),
            fw_bundle_version: attr("tt_fw_bundle_ver").unwrap_or_default(),
            m3app_fw_version: attr("tt_m3app_fw_ver").unwrap_or_default(),
            aiclk_mhz: attr("tt_aiclk").and_then(|v| v.parse().ok()),
            heartbeat: attr("tt_heartbeat").and_then(|v| v.parse().ok()),
            telemetry: self.telemetry(&bdf),
            bdf,
        })
    }

    /// Read the card's sysfs attributes that every tt-kmd has and that
    /// answer only while the firmware does: `tt_card_type` and `tt_serial`
    /// (the heartbeat is read apart: drivers before 2.7.0 have none). During
    /// a reset these reads fail (ENODATA from tt-kmd 2.9.0), so an error
    /// here means "not back yet".
    pub fn read_attributes(&self, index: u32) -> io::Result<(String, String)> {
        let class_dir = self.class_root().join(format!("tenstorrent!{index}"));
        let card_type = read_trimmed(&class_dir.join("tt_card_type"))?;
        let serial = read_trimmed(&class_dir.join("tt_serial"))?;
        Ok((card_type, serial))
    }

    /// A decimal counter of the class dir (`tt_heartbeat`,
    /// `tt_therm_trip_count`); None when absent or unreadable.
    pub fn read_counter(&self, index: u32, name: &str) -> Option<u64> {
        let class_dir = self.class_root().join(format!("tenstorrent!{index}"));
        read_trimmed(&class_dir.join(name)).ok()?.parse().ok()
    }

    /// hwmon readings from `sys_root/bus/pci/devices/<BDF>/hwmon/hwmon*/`
    /// whose `name` is `blackhole`.
    pub fn telemetry(&self, bdf: &str) -> Telemetry {
        let hwmon_root = self
            .sys_root
            .join("bus/pci/devices")
            .join(bdf)
            .join("hwmon");
        let Ok(entries) = fs::read_dir(&hwmon_root) else {
            return Telemetry::default();
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            if read_trimmed(&dir.join("name")).ok().as_deref() != Some("blackhole") {
                continue;
            }
            let num = |file: &str| {
                read_trimmed(&dir.join(file))
                    .ok()
                    .and_then(|v| v.parse::<f64>().ok())
            };
            return Telemetry {
                temperature_c: num("temp1_input").map(|v| v / 1000.0),
                power_w: num("power1_input").map(|v| v / 1_000_000.0),
                voltage_v: num("in0_input").map(|v| v / 1000.0),
                current_a: num("curr1_input").map(|v| v / 1000.0),
                fan_rpm: num("fan1_input").map(|v| v as u32),
            };
        }
        Telemetry::default()
    }

    /// Processes the driver lists as having `/dev/tenstorrent/<index>` open,
    /// once each (tt-kmd prints one line per open descriptor, so a process
    /// with two opens appears twice), each told apart as holding the chip
    /// or only watching it, then any holder of the chip lock the driver
    /// does not list (a driver before 2.5.0 lists nobody).
    pub fn processes(&self, index: u32) -> Vec<CardProcess> {
        let path = self
            .proc_root
            .join(format!("driver/tenstorrent/{index}/pids"));
        let text = fs::read_to_string(path).unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        let openers: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .filter(|pid| seen.insert(*pid))
            .collect();
        let holders = umd::holders(&self.chip_lock_path(index), &openers);
        let process = |pid: u32| {
            let holds_chip = holders.pids.contains(&pid);
            CardProcess {
                pid,
                command: procs::stat(pid).map(|p| p.comm).unwrap_or_default(),
                holds_chip,
                note: holders
                    .note
                    .clone()
                    .filter(|_| holds_chip)
                    .unwrap_or_default(),
            }
        };
        let unlisted: Vec<u32> = holders
            .pids
            .iter()
            .copied()
            .filter(|pid| !seen.contains(pid))
            .collect();
        openers.into_iter().chain(unlisted).map(process).collect()
    }

    /// tt-umd's per-chip lock for `/dev/tenstorrent/<index>`: a robust
    /// mutex in `<dev_root>/shm/TT_UMD_LOCK.CHIP_IN_USE_<index>_PCIe`
    /// (tt-umd `lock_manager.cpp`, `robust_mutex.cpp`), mapped by every
    /// process that opened the chip as an engine does (`LocalChip`) for
    /// its whole life, and held while it uses it ([`umd`] reads who). A
    /// monitoring tool (a tt-smi display, an exporter) opens the device
    /// without it.
    pub fn chip_lock_path(&self, index: u32) -> PathBuf {
        self.dev_root
            .join(format!("shm/TT_UMD_LOCK.CHIP_IN_USE_{index}_PCIe"))
    }
}

fn read_trimmed(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_string())
}
