//! Where every file of a fake root lives, and how cards appear and vanish.
//!
//! The paths mirror the real tenstorrent kernel driver (tt-kmd) on a
//! Blackhole host, so the daemon runs the same discovery code against a fake
//! root as against `/dev` + `/sys` + `/proc`:
//!
//! ```text
//! dev/tenstorrent/<i>                                    char device (a plain file here)
//! sys/devices/pci0000:00/<BDF>/                          the PCI function; survives resets
//! sys/devices/pci0000:00/<BDF>/hwmon/hwmon<k>/           telemetry, name = blackhole
//! sys/devices/pci0000:00/<BDF>/tenstorrent/tenstorrent!<i>/   class dir: tt_* attributes, device -> ../..
//! sys/bus/pci/devices/<BDF>           -> ../../../devices/pci0000:00/<BDF>
//! sys/class/tenstorrent/tenstorrent!<i> -> ../../devices/pci0000:00/<BDF>/tenstorrent/tenstorrent!<i>
//! sys/module/tenstorrent/version                         driver version
//! proc/driver/tenstorrent/<i>/pids                       pids holding the device, one a line per descriptor (2.5.0+)
//! dev/tenstorrent/by-id/blackhole-<ASIC id> -> ../<i>    udev's stable link (2.6.0+)
//! dev/shm/                                               mode 1777, as the host's /dev/shm
//! dev/shm/TT_UMD_LOCK.CHIP_IN_USE_<i>_PCIe               tt-umd's chip lock (made by `hold-chip`)
//! dev/hugepages-1G/                                      where tt-umd maps its hugepage files
//! ```
//!
//! What exists depends on the driver version the root plays ([`Kmd`]).
//!
//! Every value a reader may see is written to a temporary name and renamed
//! into place, and a returning card's class dir is built aside and renamed in
//! whole, so a concurrent reader sees either the old state or the new one,
//! never half a file.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{FakeHwError, Result};
use crate::kmd::Kmd;
use crate::state::CardInfo;

/// The PCI host bridge directory all fake cards hang under.
const PCI_HOST: &str = "pci0000:00";
/// Tenstorrent's PCI vendor id.
const PCI_VENDOR: &str = "0x1e52";
/// Blackhole's PCI device id.
const PCI_DEVICE_BLACKHOLE: &str = "0xb140";
/// Heartbeat a card starts at after a reset: low, so tests can see the restart.
pub(crate) const HEARTBEAT_AFTER_RESET: u64 = 1;
/// Firmware bundle version reported by every fake card.
pub(crate) const FW_BUNDLE_VER: &str = "19.11.0.0";
/// M3 (DM app) firmware version reported by every fake card.
pub(crate) const M3APP_FW_VER: &str = "5.18.0.0";
/// AI clock in MHz.
pub(crate) const AICLK_MHZ: u32 = 1350;
/// AXI clock in MHz.
pub(crate) const AXICLK_MHZ: u32 = 900;
/// ARC clock in MHz.
pub(crate) const ARCCLK_MHZ: u32 = 800;
/// The first hwmon number used; deliberately not 0 so code that assumes
/// `hwmon<card index>` fails against the fake as it would on a real host,
/// where other devices own the low hwmon numbers.
const FIRST_HWMON: usize = 3;

/// The PCI address given at creation to the card with index `index`:
/// bus `index + 1`, device 0, function 0.
pub fn bdf(index: usize) -> String {
    format!("0000:{:02x}:00.0", index + 1)
}

/// The hwmon number of the card created at `index`.
pub(crate) fn hwmon_number(index: usize) -> usize {
    FIRST_HWMON + index
}

/// All the paths of one fake root. Cheap to build; holds only the root.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The fake root, absolute.
    root: PathBuf,
}

impl Layout {
    pub(crate) fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn dev_root(&self) -> PathBuf {
        self.root.join("dev")
    }

    pub(crate) fn dev_dir(&self) -> PathBuf {
        self.dev_root().join("tenstorrent")
    }

    pub(crate) fn dev_node(&self, index: u32) -> PathBuf {
        self.dev_dir().join(index.to_string())
    }

    /// Present when device nodes are character devices (see
    /// [`crate::CreateOptions::char_dev_nodes`]).
    pub(crate) fn char_dev_nodes_marker(&self) -> PathBuf {
        self.state_dir().join("char-dev-nodes")
    }

    pub(crate) fn by_id_dir(&self) -> PathBuf {
        self.dev_dir().join("by-id")
    }

    /// tt-umd's lock of the chip at `/dev/tenstorrent/<index>`.
    pub(crate) fn chip_lock(&self, index: u32) -> PathBuf {
        self.shm_dir()
            .join(format!("TT_UMD_LOCK.CHIP_IN_USE_{index}_PCIe"))
    }

    pub(crate) fn shm_dir(&self) -> PathBuf {
        self.dev_root().join("shm")
    }

    pub(crate) fn hugepages_dir(&self) -> PathBuf {
        self.dev_root().join("hugepages-1G")
    }

    pub(crate) fn sys_root(&self) -> PathBuf {
        self.root.join("sys")
    }

    pub(crate) fn pci_dir(&self, bdf: &str) -> PathBuf {
        self.sys_root().join("devices").join(PCI_HOST).join(bdf)
    }

    pub(crate) fn bus_link(&self, bdf: &str) -> PathBuf {
        self.sys_root().join("bus/pci/devices").join(bdf)
    }

    fn class_parent(&self, bdf: &str) -> PathBuf {
        self.pci_dir(bdf).join("tenstorrent")
    }

    pub(crate) fn class_dir(&self, bdf: &str, index: u32) -> PathBuf {
        self.class_parent(bdf).join(class_name(index))
    }

    pub(crate) fn class_root(&self) -> PathBuf {
        self.sys_root().join("class/tenstorrent")
    }

    pub(crate) fn class_link(&self, index: u32) -> PathBuf {
        self.class_root().join(class_name(index))
    }

    pub(crate) fn module_dir(&self) -> PathBuf {
        self.sys_root().join("module/tenstorrent")
    }

    pub(crate) fn hwmon_dir(&self, bdf: &str, hwmon: usize) -> PathBuf {
        self.pci_dir(bdf)
            .join("hwmon")
            .join(format!("hwmon{hwmon}"))
    }

    pub(crate) fn proc_root(&self) -> PathBuf {
        self.root.join("proc")
    }

    pub(crate) fn proc_dir(&self, index: u32) -> PathBuf {
        self.proc_root()
            .join("driver/tenstorrent")
            .join(index.to_string())
    }

    pub(crate) fn pids_file(&self, index: u32) -> PathBuf {
        self.proc_dir(index).join("pids")
    }

    pub(crate) fn tt_smi(&self) -> PathBuf {
        self.root.join("bin/tt-smi")
    }

    pub(crate) fn state_dir(&self) -> PathBuf {
        self.root.join("fakehw")
    }

    pub(crate) fn cards_file(&self) -> PathBuf {
        self.state_dir().join("cards.json")
    }

    pub(crate) fn faults_file(&self) -> PathBuf {
        self.state_dir().join("faults.json")
    }

    pub(crate) fn pending_file(&self) -> PathBuf {
        self.state_dir().join("pending.json")
    }

    pub(crate) fn lock_file(&self) -> PathBuf {
        self.state_dir().join("lock")
    }

    pub(crate) fn smi_log(&self) -> PathBuf {
        self.state_dir().join("tt-smi.log")
    }

    /// Locked by the running firmware loop; holds its pid.
    pub(crate) fn firmware_lock(&self) -> PathBuf {
        self.state_dir().join("firmware.lock")
    }

    /// Why the last firmware loop stopped.
    pub(crate) fn firmware_stopped(&self) -> PathBuf {
        self.state_dir().join("firmware.stopped")
    }

    /// The output of a firmware started with `--detach`.
    pub(crate) fn firmware_log(&self) -> PathBuf {
        self.state_dir().join("firmware.log")
    }

    /// The top-level entries `create` makes; `--force` removes exactly these.
    pub(crate) fn top_level(&self) -> [PathBuf; 5] {
        [
            self.dev_root(),
            self.sys_root(),
            self.proc_root(),
            self.root.join("bin"),
            self.state_dir(),
        ]
    }
}

/// `tenstorrent!<i>`, the class device name tt-kmd registers.
pub(crate) fn class_name(index: u32) -> String {
    format!("tenstorrent!{index}")
}

/// Lays out the static part of a fresh root: directories, the driver
/// module, each card's PCI dir, bus link and hwmon, and the tt-smi script.
/// Cards themselves are made present by [`materialize_card`].
pub(crate) fn create_static(
    layout: &Layout,
    cards: &[CardInfo],
    fakehw_bin: &Path,
    kmd: &Kmd,
) -> Result<()> {
    for dir in [
        layout.dev_dir(),
        layout.class_root(),
        layout.sys_root().join("bus/pci/devices"),
        layout.module_dir(),
        layout.proc_root().join("driver/tenstorrent"),
        layout.root().join("bin"),
        layout.state_dir(),
        layout.hugepages_dir(),
    ] {
        create_dir_all(&dir)?;
    }
    // Shared by every user, each keeping to their own files (sticky).
    create_dir_all(&layout.shm_dir())?;
    fs::set_permissions(layout.shm_dir(), fs::Permissions::from_mode(0o1777))
        .map_err(|e| FakeHwError::io("setting the mode of", layout.shm_dir(), e))?;
    write_file(
        &layout.module_dir().join("version"),
        &format!("{}\n", kmd.version),
    )?;
    if kmd.has_by_id() {
        create_dir_all(&layout.by_id_dir())?;
    }
    for card in cards {
        plug_pci_function(layout, card)?;
    }
    write_tt_smi_script(layout, fakehw_bin)
}

/// Puts the card's PCI function on the bus: its PCI dir with the PCI
/// attributes, the bus link and hwmon (what stays during a reset).
pub(crate) fn plug_pci_function(layout: &Layout, card: &CardInfo) -> Result<()> {
    let pci = layout.pci_dir(&card.bdf);
    create_dir_all(&layout.class_parent(&card.bdf))?;
    for (name, value) in [
        ("vendor", PCI_VENDOR),
        ("device", PCI_DEVICE_BLACKHOLE),
        ("class", "0x120000"),
        ("max_link_speed", LINK_FULL.speed),
        ("max_link_width", LINK_FULL.width),
        ("numa_node", "0"),
    ] {
        write_file(&pci.join(name), &format!("{value}\n"))?;
    }
    write_link(layout, &card.bdf, LINK_FULL)?;
    let link = layout.bus_link(&card.bdf);
    let target = PathBuf::from("../../../devices")
        .join(PCI_HOST)
        .join(&card.bdf);
    remove_file_if_exists(&link)?;
    symlink(&target, &link).map_err(|e| FakeHwError::io("creating symlink", &link, e))?;
    write_hwmon(layout, card)
}

/// Takes the card off the bus: gone from sysfs entirely (as after a hot
/// removal or a dead link), so `lspci` and tt-smi no longer see it.
pub(crate) fn unplug_pci_function(
    layout: &Layout,
    card: &CardInfo,
    index: Option<u32>,
) -> Result<()> {
    if let Some(index) = index {
        vanish_card(layout, &card.bdf, index)?;
    }
    remove_file_if_exists(&layout.bus_link(&card.bdf))?;
    remove_dir_all_if_exists(&layout.pci_dir(&card.bdf))
}

/// A PCIe link's `current_link_speed` and `current_link_width`, as Linux
/// prints them (`drivers/pci/pci-sysfs.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkText {
    pub(crate) speed: &'static str,
    pub(crate) width: &'static str,
}

/// A Blackhole's own link: PCIe Gen5 x16.
pub(crate) const LINK_FULL: LinkText = LinkText {
    speed: "32.0 GT/s PCIe",
    width: "16",
};

/// A link that trained down (the `downtrained` fault): Gen3 x4.
pub(crate) const LINK_DOWNTRAINED: LinkText = LinkText {
    speed: "8.0 GT/s PCIe",
    width: "4",
};

/// A link in reset: config reads return all ones, which Linux prints as an
/// unknown speed and 63 lanes.
pub(crate) const LINK_DOWN: LinkText = LinkText {
    speed: "Unknown",
    width: "63",
};

pub(crate) fn write_link(layout: &Layout, bdf: &str, link: LinkText) -> Result<()> {
    let pci = layout.pci_dir(bdf);
    write_atomic(
        &pci.join("current_link_speed"),
        format!("{}\n", link.speed).as_bytes(),
    )?;
    write_atomic(
        &pci.join("current_link_width"),
        format!("{}\n", link.width).as_bytes(),
    )
}

/// Writes `bin/tt-smi`, a shell script that re-enters this binary's `smi`
/// command with the root filled in, so the daemon can be pointed at it
/// exactly as at the real tool.
pub(crate) fn write_tt_smi_script(layout: &Layout, fakehw_bin: &Path) -> Result<()> {
    let script = format!(
        "#!/bin/sh\n# Fake tt-smi written by `tt-fakehw create`; runs against one fake hardware root.\n\
         exec {bin} smi --root {root} \"$@\"\n",
        bin = sh_quote(&fakehw_bin.to_string_lossy()),
        root = sh_quote(&layout.root().to_string_lossy()),
    );
    let path = layout.tt_smi();
    write_atomic(&path, script.as_bytes())?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
        .map_err(|e| FakeHwError::io("making executable", &path, e))
}

/// Quotes `s` for a POSIX shell: single quotes, with embedded ones spliced.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Writes the hwmon directory of `card` (values and labels).
pub(crate) fn write_hwmon(layout: &Layout, card: &CardInfo) -> Result<()> {
    let dir = layout.hwmon_dir(&card.bdf, card.hwmon);
    create_dir_all(&dir)?;
    let offset = u64::from(card.created_index);
    let files = [
        ("name", "blackhole".to_string()),
        ("temp1_input", (45_000 + 500 * offset).to_string()),
        ("temp1_label", "asic_temp".to_string()),
        ("in0_input", (770 + 5 * offset).to_string()),
        ("in0_label", "vcore".to_string()),
        ("curr1_input", (58_000 + 250 * offset).to_string()),
        ("curr1_label", "current".to_string()),
        ("power1_input", (55_000_000 + 250_000 * offset).to_string()),
        ("power1_label", "power".to_string()),
        ("fan1_input", (2_300 + 10 * offset).to_string()),
        ("fan1_label", "fan_rpm".to_string()),
    ];
    for (name, value) in files {
        write_atomic(&dir.join(name), format!("{value}\n").as_bytes())?;
    }
    Ok(())
}

/// What a card's class dir says, besides what never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Readings {
    /// `tt_heartbeat`.
    pub(crate) heartbeat: u64,
    /// `tt_therm_trip_count`.
    pub(crate) therm_trips: u64,
}

/// Makes `card` present at `index`: class dir with its attributes (built
/// aside, renamed in whole), the class link, the proc entry, the by-id
/// link, and last the device node — so whoever sees the node can already
/// read sysfs. Which attributes and files exist follows `kmd`.
pub(crate) fn materialize_card(
    layout: &Layout,
    card: &CardInfo,
    index: u32,
    readings: Readings,
    kmd: &Kmd,
) -> Result<()> {
    let parent = layout.class_parent(&card.bdf);
    let building = parent.join(format!(".{}.building", class_name(index)));
    remove_dir_all_if_exists(&building)?;
    // Plain create_dir (not _all): if the root was removed under us we must
    // fail rather than resurrect half a tree inside a deleted temp dir.
    fs::create_dir(&building).map_err(|e| FakeHwError::io("creating", &building, e))?;
    for (name, value) in class_attributes(card, readings, kmd) {
        write_file(&building.join(name), &format!("{value}\n"))?;
    }
    let device_link = building.join("device");
    symlink("../..", &device_link)
        .map_err(|e| FakeHwError::io("creating symlink", &device_link, e))?;
    let class_dir = layout.class_dir(&card.bdf, index);
    remove_dir_all_if_exists(&class_dir)?;
    fs::rename(&building, &class_dir)
        .map_err(|e| FakeHwError::io("renaming into", &class_dir, e))?;

    let class_target = PathBuf::from("../../devices")
        .join(PCI_HOST)
        .join(&card.bdf)
        .join("tenstorrent")
        .join(class_name(index));
    symlink_atomic(&class_target, &layout.class_link(index))?;

    write_hwmon(layout, card)?;

    if kmd.has_pids_file() {
        let proc_dir = layout.proc_dir(index);
        match fs::create_dir(&proc_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(FakeHwError::io("creating", &proc_dir, e)),
        }
        write_atomic(&layout.pids_file(index), b"")?;
    }
    if kmd.has_by_id() {
        symlink_atomic(Path::new(&format!("../{index}")), &by_id_link(layout, card))?;
    }

    if layout.char_dev_nodes_marker().exists() {
        return char_node_atomic(&layout.dev_node(index));
    }
    write_atomic(&layout.dev_node(index), b"")
}

/// A character device node with /dev/null's numbers (1, 3), made under a
/// temporary name and renamed into place: what a container runtime's
/// `--device` needs, where a regular file is refused ("not a device
/// node"). Needs root (CAP_MKNOD).
fn char_node_atomic(path: &Path) -> Result<()> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let tmp = tmp_sibling(path);
    mknod(
        &tmp,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 3),
    )
    .map_err(|e| FakeHwError::io("making device node", &tmp, e.into()))?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        FakeHwError::io("renaming into", path, e)
    })
}

fn by_id_link(layout: &Layout, card: &CardInfo) -> PathBuf {
    layout
        .by_id_dir()
        .join(format!("blackhole-{}", card.asic_id))
}

/// The class-dir attributes of `card`, in the order tt-kmd creates them
/// (`blackhole.c` bh_sysfs_attributes): serials and ASIC ids in upper-case
/// hex (`telemetry.c` prints `%08X%08X`), the heartbeat and thermal trip
/// count only from 2.7.0.
fn class_attributes(card: &CardInfo, readings: Readings, kmd: &Kmd) -> Vec<(&'static str, String)> {
    let mut attrs = vec![
        ("tt_aiclk", AICLK_MHZ.to_string()),
        ("tt_axiclk", AXICLK_MHZ.to_string()),
        ("tt_arcclk", ARCCLK_MHZ.to_string()),
        ("tt_serial", card.serial.to_ascii_uppercase()),
        ("tt_card_type", "p150a".to_string()),
        ("tt_fw_bundle_ver", FW_BUNDLE_VER.to_string()),
        ("tt_m3app_fw_ver", M3APP_FW_VER.to_string()),
        ("tt_asic_id", card.asic_id.to_ascii_uppercase()),
    ];
    if kmd.has_heartbeat() {
        attrs.push(("tt_heartbeat", readings.heartbeat.to_string()));
        attrs.push(("tt_therm_trip_count", readings.therm_trips.to_string()));
    }
    attrs
}

/// Starts an in-place reset of the card at `index` (tt-kmd 2.4.1+ outside
/// hot-plug slots): node and class dir stay, the link goes down, and from
/// 2.9.0 every attribute read fails until the card is back. A real read
/// fails with ENODATA; a plain file cannot, so each attribute becomes a
/// directory of the same name (reads fail with EISDIR): code must treat
/// any read error as "not back yet". Before 2.9.0 the files keep the
/// values from before the reset, and the heartbeat stops.
pub(crate) fn begin_in_place_reset(
    layout: &Layout,
    card: &CardInfo,
    index: u32,
    kmd: &Kmd,
) -> Result<()> {
    write_link(layout, &card.bdf, LINK_DOWN)?;
    if !kmd.reads_fail_during_reset() {
        return Ok(());
    }
    let class_dir = layout.class_dir(&card.bdf, index);
    for (name, _) in class_attributes(
        card,
        Readings {
            heartbeat: 0,
            therm_trips: 0,
        },
        kmd,
    ) {
        let path = class_dir.join(name);
        if path.is_dir() {
            // Still unreadable from an earlier reset that has not
            // completed: a second reset keeps the card in reset.
            continue;
        }
        remove_file_if_exists(&path)?;
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(FakeHwError::io("creating", &path, e)),
        }
    }
    Ok(())
}

/// Ends an in-place reset: the attributes read again (heartbeat restarted),
/// and the link is back at `link`.
pub(crate) fn finish_in_place_reset(
    layout: &Layout,
    card: &CardInfo,
    index: u32,
    readings: Readings,
    kmd: &Kmd,
    link: LinkText,
) -> Result<()> {
    let class_dir = layout.class_dir(&card.bdf, index);
    for (name, value) in class_attributes(card, readings, kmd) {
        let path = class_dir.join(name);
        if path.is_dir() {
            remove_dir_all_if_exists(&path)?;
        }
        write_atomic(&path, format!("{value}\n").as_bytes())?;
    }
    write_link(layout, &card.bdf, link)
}

/// Makes the card at `index` vanish the way a reset does: the device node
/// first (new opens fail), then the class link and class dir (sysfs reads
/// fail), then the proc entry. The PCI dir and hwmon stay, as the PCI
/// function itself stays on the bus during a link reset.
pub(crate) fn vanish_card(layout: &Layout, bdf: &str, index: u32) -> Result<()> {
    remove_file_if_exists(&layout.dev_node(index))?;
    if let Ok(entries) = fs::read_dir(layout.by_id_dir()) {
        for entry in entries.flatten() {
            let target = fs::read_link(entry.path()).ok();
            if target.as_deref() == Some(Path::new(&format!("../{index}"))) {
                remove_file_if_exists(&entry.path())?;
            }
        }
    }
    remove_file_if_exists(&layout.class_link(index))?;
    remove_dir_all_if_exists(&layout.class_dir(bdf, index))?;
    remove_dir_all_if_exists(&layout.proc_dir(index))
}

/// Reads a sysfs-style attribute: the file's text without the trailing newline.
pub(crate) fn read_attr(path: &Path) -> Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim_end_matches('\n').to_string())
        .map_err(|e| FakeHwError::io("reading", path, e))
}

fn create_dir_all(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| FakeHwError::io("creating", dir, e))
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).map_err(|e| FakeHwError::io("writing", path, e))
}

/// Distinguishes temporary names of concurrent writers within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary sibling of `path`: same directory (so rename is atomic),
/// hidden, and unique per process and call.
fn tmp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Writes `contents` to `path` so that readers see the old or the new
/// contents, never a mix: write a temporary sibling, then rename it over.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = tmp_sibling(path);
    if let Err(e) = fs::write(&tmp, contents) {
        let _ = fs::remove_file(&tmp);
        return Err(FakeHwError::io("writing", &tmp, e));
    }
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        FakeHwError::io("renaming into", path, e)
    })
}

/// Points the symlink `link` at `target`, replacing any old link atomically.
fn symlink_atomic(target: &Path, link: &Path) -> Result<()> {
    let tmp = tmp_sibling(link);
    symlink(target, &tmp).map_err(|e| FakeHwError::io("creating symlink", &tmp, e))?;
    fs::rename(&tmp, link).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        FakeHwError::io("renaming into", link, e)
    })
}

pub(crate) fn remove_file_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FakeHwError::io("removing", path, e)),
    }
}

pub(crate) fn remove_dir_all_if_exists(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FakeHwError::io("removing", path, e)),
    }
}

/// A card that is present right now: its class link resolves to a PCI dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PresentCard {
    /// Its `/dev/tenstorrent/N` index.
    pub(crate) index: u32,
    /// Its PCI address.
    pub(crate) bdf: String,
}

/// Lists the present cards, sorted by index, the way the daemon finds them:
/// each `sys/class/tenstorrent/tenstorrent!N` whose `device` link resolves
/// to a PCI dir names a card at index N with that dir's BDF. Entries that
/// vanish while we look (a reset in progress) are skipped.
pub(crate) fn present_cards(layout: &Layout) -> Result<Vec<PresentCard>> {
    let dir = layout.class_root();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) => return Err(FakeHwError::io("listing", &dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| FakeHwError::io("listing", &dir, e))?;
        let name = entry.file_name();
        let Some(index) = name
            .to_str()
            .and_then(|n| n.strip_prefix("tenstorrent!"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(bdf) = resolve_bdf(&entry.path().join("device")) {
            out.push(PresentCard { index, bdf });
        }
    }
    out.sort_by_key(|c| c.index);
    Ok(out)
}

/// The BDF a class dir's `device` link resolves to, if it resolves.
fn resolve_bdf(device_link: &Path) -> Option<String> {
    let pci = fs::canonicalize(device_link).ok()?;
    Some(pci.file_name()?.to_str()?.to_string())
}
