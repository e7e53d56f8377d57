//! `tt-smi -s`: the JSON snapshot, in the exact shape tt-smi 6.8 prints
//! (see `shared/reference/tt-smi-6.8-snapshot-p150a.synthetic.json`).
//!
//! Keys keep the real tool's order and telemetry values are the real
//! tool's padded strings (`" 45.0"`), so parsers written against the fake
//! also parse the real output. Everything per card is read from the fake
//! sysfs tree, the same files the daemon reads, so the two never disagree.

use std::fs;
use std::path::{Path, PathBuf};

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use crate::error::{FakeHwError, Result};
use crate::layout::{present_cards, read_attr, Layout, PresentCard};
use crate::smi::TT_SMI_VERSION;

/// A JSON value whose objects keep their key order (serde_json's own map
/// sorts keys unless a workspace-wide feature is switched on, which would
/// change every other crate's output too).
#[derive(Debug, Clone)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
    Arr(Vec<Node>),
    Obj(Vec<(&'static str, Node)>),
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::Str(v) => s.serialize_str(v),
            Node::Arr(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Obj(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

fn s(v: impl Into<String>) -> Node {
    Node::Str(v.into())
}

fn hex(v: u64) -> Node {
    Node::Str(format!("{v:#x}"))
}

/// Builds the snapshot of the present cards and renders it the way the
/// real tool does (4-space indented JSON).
pub(crate) fn snapshot_json(layout: &Layout) -> Result<String> {
    let present = present_cards(layout)?;
    let mut devices = Vec::new();
    let mut processes = Vec::new();
    for card in &present {
        // A card can vanish between listing and reading (a reset from
        // another shell); the real tool would not see it either.
        match device_info(layout, card) {
            Ok(d) => devices.push(d),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
        processes.extend(card_processes(layout, card.index));
    }
    let doc = Node::Obj(vec![
        ("time", s(timestamp_now())),
        ("host_info", host_info(layout)),
        (
            "host_sw_vers",
            Node::Obj(vec![
                ("tt_smi", s(TT_SMI_VERSION)),
                ("pyluwen", s("0.10.0")),
                ("tt_umd", s("0.9.12")),
            ]),
        ),
        ("device_info", Node::Arr(devices)),
        ("processes", Node::Arr(processes)),
    ]);
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    doc.serialize(&mut ser)
        .map_err(|source| FakeHwError::CorruptState {
            path: layout.root().to_path_buf(),
            source,
        })?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The card's values as read from sysfs.
struct Readings {
    serial: String,
    card_type: String,
    aiclk: u64,
    axiclk: u64,
    arcclk: u64,
    fw_bundle: String,
    m3app: String,
    heartbeat: u64,
    therm_trips: u64,
    temp_milli_c: u64,
    vcore_mv: u64,
    current_ma: u64,
    power_uw: u64,
    fan_rpm: u64,
}

fn read_u64(path: &Path) -> Result<u64> {
    read_attr(path)?
        .trim()
        .parse()
        .map_err(|_| FakeHwError::Invalid(format!("{} does not hold an integer", path.display())))
}

/// The `hwmon<k>` dir of a card whose `name` is `blackhole`.
fn find_hwmon(layout: &Layout, bdf: &str) -> Result<PathBuf> {
    let dir = layout.pci_dir(bdf).join("hwmon");
    let entries = fs::read_dir(&dir).map_err(|e| FakeHwError::io("listing", &dir, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if read_attr(&path.join("name")).is_ok_and(|n| n == "blackhole") {
            return Ok(path);
        }
    }
    Err(FakeHwError::io(
        "finding a blackhole hwmon in",
        &dir,
        std::io::Error::from(std::io::ErrorKind::NotFound),
    ))
}

fn read_card(layout: &Layout, card: &PresentCard) -> Result<Readings> {
    let class = layout.class_dir(&card.bdf, card.index);
    let hwmon = find_hwmon(layout, &card.bdf)?;
    Ok(Readings {
        serial: read_attr(&class.join("tt_serial"))?,
        card_type: read_attr(&class.join("tt_card_type"))?,
        aiclk: read_u64(&class.join("tt_aiclk"))?,
        axiclk: read_u64(&class.join("tt_axiclk"))?,
        arcclk: read_u64(&class.join("tt_arcclk"))?,
        fw_bundle: read_attr(&class.join("tt_fw_bundle_ver"))?,
        m3app: read_attr(&class.join("tt_m3app_fw_ver"))?,
        heartbeat: read_u64(&class.join("tt_heartbeat"))?,
        therm_trips: read_u64(&class.join("tt_therm_trip_count"))?,
        temp_milli_c: read_u64(&hwmon.join("temp1_input"))?,
        vcore_mv: read_u64(&hwmon.join("in0_input"))?,
        current_ma: read_u64(&hwmon.join("curr1_input"))?,
        power_uw: read_u64(&hwmon.join("power1_input"))?,
        fan_rpm: read_u64(&hwmon.join("fan1_input"))?,
    })
}

/// `a.b.c.d` packed one byte each, as the firmware reports versions.
fn packed_version(v: &str) -> u64 {
    v.split('.')
        .take(4)
        .map(|p| p.parse::<u64>().unwrap_or(0) & 0xff)
        .chain(std::iter::repeat(0))
        .take(4)
        .fold(0, |acc, b| (acc << 8) | b)
}

fn device_info(layout: &Layout, card: &PresentCard) -> Result<Node> {
    let r = read_card(layout, card)?;
    let board_id = u64::from_str_radix(&r.serial, 16).unwrap_or(0);
    let power_w = r.power_uw as f64 / 1e6;
    let board_power_w = power_w + 50.0;
    let current_a = r.current_ma as f64 / 1e3;
    let temp_c = r.temp_milli_c as f64 / 1e3;
    let null = || Node::Null;
    let smbus = Node::Obj(vec![
        ("BOARD_ID_HIGH", hex(board_id >> 32)),
        ("BOARD_ID_LOW", hex(board_id & 0xffff_ffff)),
        ("ASIC_ID", hex(0)),
        ("HARVESTING_STATE", null()),
        ("UPDATE_TELEM_SPEED", null()),
        ("VCORE", hex(r.vcore_mv)),
        ("TDP", hex(power_w.round() as u64)),
        ("TDC", hex(current_a.round() as u64)),
        ("VDD_LIMITS", s("0x3b602bc")),
        ("THM_LIMIT_SHUTDOWN", s("0x6e")),
        // 16.16 fixed point degrees C.
        ("ASIC_TEMPERATURE", hex(r.temp_milli_c * 65_536 / 1_000)),
        ("VREG_TEMPERATURE", s("0x28")),
        ("BOARD_TEMPERATURE", s("0x23")),
        ("AICLK", hex(r.aiclk)),
        ("AXICLK", hex(r.axiclk)),
        ("ARCCLK", hex(r.arcclk)),
        ("L2CPUCLK0", null()),
        ("L2CPUCLK1", null()),
        ("L2CPUCLK2", null()),
        ("L2CPUCLK3", null()),
        ("ETH_LIVE_STATUS", null()),
        ("DDR_STATUS", s("0x55555555")),
        ("DDR_SPEED", s("0x3e80")),
        ("ETH_FW_VERSION", s("0x10700")),
        ("GDDR_FW_VERSION", s("0x2000f")),
        ("DM_APP_FW_VERSION", hex(packed_version(&r.m3app))),
        ("DM_BL_FW_VERSION", s("0x70000")),
        ("FLASH_BUNDLE_VERSION", hex(packed_version(&r.fw_bundle))),
        ("CM_FW_VERSION", hex(packed_version(&r.fw_bundle))),
        ("L2CPU_FW_VERSION", null()),
        ("FAN_SPEED", null()),
        ("TIMER_HEARTBEAT", hex(r.heartbeat)),
        ("TELEMETRY_ENUM_COUNT", null()),
        ("ENABLED_TENSIX_COL", null()),
        ("ENABLED_ETH", null()),
        ("ENABLED_GDDR", s("0xff")),
        ("ENABLED_L2CPU", null()),
        ("PCIE_USAGE", null()),
        ("NOC_TRANSLATION", null()),
        ("FAN_RPM", hex(r.fan_rpm)),
        ("GDDR_0_1_TEMP", s("0x2a2b2c2d")),
        ("GDDR_2_3_TEMP", s("0x2a2b2c2d")),
        ("GDDR_4_5_TEMP", s("0x2a2b2c2d")),
        ("GDDR_6_7_TEMP", s("0x2a2b2c2d")),
        ("GDDR_0_1_CORR_ERRS", s("0x0")),
        ("GDDR_2_3_CORR_ERRS", s("0x0")),
        ("GDDR_4_5_CORR_ERRS", s("0x0")),
        ("GDDR_6_7_CORR_ERRS", s("0x0")),
        ("GDDR_UNCORR_ERRS", s("0x0")),
        ("MAX_GDDR_TEMP", s("0x2d")),
        ("ASIC_LOCATION", null()),
        ("BOARD_POWER_LIMIT", s("0x12c")),
        ("TDC_LIMIT_MAX", s("0xc8")),
        ("THM_LIMIT_THROTTLE", s("0x5a")),
        ("TT_FLASH_VERSION", s("0x3040000")),
        ("THERM_TRIP_COUNT", hex(r.therm_trips)),
        ("ASIC_ID_HIGH", null()),
        ("ASIC_ID_LOW", null()),
        ("AICLK_LIMIT_MAX", hex(r.aiclk)),
        ("TDP_LIMIT_MAX", s("0x12c")),
        ("AICLK_ARB_MIN", null()),
        ("AICLK_ARB_MAX", null()),
        ("ENABLED_MIN_ARB", null()),
        ("ENABLED_MAX_ARB", null()),
        ("NUMBER_OF_TAGS", null()),
        ("INPUT_POWER", hex(board_power_w.round() as u64)),
    ]);
    let board_info = Node::Obj(vec![
        ("bus_id", s(&card.bdf)),
        ("board_type", s(&r.card_type)),
        // tt-smi prints the board id in lower-case hex; sysfs upper-case.
        ("board_id", s(r.serial.to_ascii_lowercase())),
        ("coords", s("N/A")),
        ("dram_status", Node::Bool(true)),
        ("dram_speed", s("16G")),
        ("pcie_speed", Node::Int(5)),
        ("pcie_width", s("16")),
    ]);
    let telemetry = Node::Obj(vec![
        ("voltage", s(format!("{:.2}", r.vcore_mv as f64 / 1e3))),
        ("current", s(format!("{current_a:5.1}"))),
        ("power", s(format!("{power_w:5.1}"))),
        ("board_power", s(format!("{board_power_w:5.1}"))),
        ("aiclk", s(r.aiclk.to_string())),
        ("asic_temperature", s(format!("{temp_c:.1}"))),
        ("fan_speed", s(r.fan_rpm.to_string())),
        ("heartbeat", s(r.heartbeat.to_string())),
    ]);
    let channels = (0..8)
        .map(|ch: i64| {
            let (top, bottom) = if ch % 2 == 0 { (44, 45) } else { (42, 43) };
            Node::Obj(vec![
                ("channel", Node::Int(ch)),
                ("harvested", Node::Bool(false)),
                ("enabled", Node::Bool(true)),
                ("training", s("pass")),
                ("bist", s("pass")),
                ("temp_top", s(top.to_string())),
                ("temp_bottom", s(bottom.to_string())),
                ("corr_rd", s("0")),
                ("corr_wr", s("0")),
                ("uncorr_rd", s("0")),
                ("uncorr_wr", s("0")),
            ])
        })
        .collect();
    let gddr = Node::Obj(vec![
        ("speed", s("16G")),
        ("max_temp", s("45")),
        ("enabled_mask", s("0xff")),
        ("channels", Node::Arr(channels)),
    ]);
    let firmwares = Node::Obj(vec![
        ("fw_bundle_version", s(&r.fw_bundle)),
        ("tt_flash_version", s("3.4.0.0")),
        ("cm_fw", s(&r.fw_bundle)),
        ("cm_fw_date", s("2021-03-11")),
        ("eth_fw", s("1.7.0")),
        ("dm_bl_fw", s("0.7.0.0")),
        ("dm_app_fw", s(&r.m3app)),
        ("gddr_fw", s("2.15")),
    ]);
    let limits = Node::Obj(vec![
        ("vdd_min", s("0.70")),
        ("vdd_max", s("0.95")),
        ("tdp_limit", s("300")),
        ("tdc_limit", s("200")),
        ("asic_fmax", s(r.aiclk.to_string())),
        ("therm_trip_l1_limit", s("90")),
        ("thm_limit", s("110")),
        ("bus_peak_limit", Node::Int(0)),
        ("fan_rpm_limit", Node::Int(0)),
        ("board_power_limit", s("300")),
    ]);
    Ok(Node::Obj(vec![
        ("smbus_telem", smbus),
        ("board_info", board_info),
        ("telemetry", telemetry),
        ("gddr_telemetry", gddr),
        ("firmwares", firmwares),
        ("limits", limits),
    ]))
}

/// The `processes` entries for the pids registered on a card.
fn card_processes(layout: &Layout, index: u32) -> Vec<Node> {
    let Ok(text) = fs::read_to_string(layout.pids_file(index)) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.trim().parse::<i64>().ok())
        .map(|pid| {
            // The pids are real processes of this host when a test registers
            // its own children; describe them from the real /proc if we can.
            let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
                .ok()
                .map(|raw| {
                    raw.split(|b| *b == 0)
                        .filter(|p| !p.is_empty())
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| "N/A".to_string());
            Node::Obj(vec![
                ("pid", Node::Int(pid)),
                ("user", s(process_user(pid))),
                ("device", Node::Int(i64::from(index))),
                ("cmdline", s(cmdline)),
            ])
        })
        .collect()
}

/// The login name owning `/proc/<pid>`, or `N/A`.
fn process_user(pid: i64) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = fs::metadata(format!("/proc/{pid}")) else {
        return "N/A".to_string();
    };
    let uid = meta.uid();
    fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let id: u32 = fields.nth(1)?.parse().ok()?;
                (id == uid).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| uid.to_string())
}

fn host_info(layout: &Layout) -> Node {
    let read = |p: &str| {
        fs::read_to_string(p)
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "N/A".to_string())
    };
    let distro = fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .unwrap_or_else(|| "N/A".to_string());
    let memory = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.2} GB", kb / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| "N/A".to_string());
    let driver = read_attr(&layout.module_dir().join("version"))
        .map(|v| format!("TT-KMD {v}"))
        .unwrap_or_else(|_| "N/A".to_string());
    Node::Obj(vec![
        ("OS", s("Linux")),
        ("Distro", s(distro)),
        ("Kernel", s(read("/proc/sys/kernel/osrelease"))),
        ("Hostname", s(read("/proc/sys/kernel/hostname"))),
        ("Platform", s(std::env::consts::ARCH)),
        ("Python", s("N/A")),
        ("Memory", s(memory)),
        ("Driver", s(driver)),
    ])
}

/// Now as `YYYY-MM-DDTHH:MM:SS.ffffff` (UTC; the real tool prints local
/// time without a zone, and nothing parses the zone).
fn timestamp_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format_timestamp(now.as_secs(), now.subsec_micros())
}

fn format_timestamp(secs: u64, micros: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Gregorian date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_format_like_python_isoformat() {
        assert_eq!(format_timestamp(0, 0), "1970-01-01T00:00:00.000000");
        // 2026-10-01T12:00:00 UTC
        assert_eq!(
            format_timestamp(1_790_856_000, 123_456),
            "2026-10-01T12:00:00.123456"
        );
        assert_eq!(
            format_timestamp(951_782_400, 0),
            "2000-02-29T00:00:00.000000"
        );
    }

    #[test]
    fn versions_pack_like_the_firmware() {
        assert_eq!(packed_version("19.11.0.0"), 0x130b_0000);
        assert_eq!(packed_version("5.18.0.0"), 0x0512_0000);
    }
}
