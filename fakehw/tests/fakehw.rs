//! Behaviour of the fake hardware root, through the library and the real
//! `tt-fakehw` binary (and its `bin/tt-smi` script), the way the daemon and
//! the integration tests will use them.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tt_fakehw::{CreateOptions, FakeRoot, Fault, FirmwareState};

const BIN: &str = env!("CARGO_BIN_EXE_tt-fakehw");

/// How long any polled condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);

struct Fixture {
    /// Keeps the temp dir alive for the test.
    _dir: tempfile::TempDir,
    fake: FakeRoot,
}

fn fixture(cards: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeRoot::create(&dir.path().join("root"), cards, Path::new(BIN)).unwrap();
    Fixture { _dir: dir, fake }
}

/// A root playing tt-kmd `driver` and tt-smi `tt_smi`.
fn fixture_with(cards: usize, driver: &str, tt_smi: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = CreateOptions::new(cards, Path::new(BIN));
    opts.driver_version = driver.into();
    opts.tt_smi_version = tt_smi.into();
    let fake = FakeRoot::create_with(&dir.path().join("root"), &opts).unwrap();
    Fixture { _dir: dir, fake }
}

/// tt-smi's output without its colour codes.
fn plain(o: &Output) -> String {
    let text = stdout(o);
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The cards the last `tt-smi` run reset, from the fake's log.
fn last_reset(fake: &FakeRoot) -> Vec<String> {
    fake.tt_smi_log()
        .unwrap()
        .last()
        .map(|e| e.reset_bdfs.clone())
        .unwrap_or_default()
}

/// Runs `bin/tt-smi` of the root as the daemon would: a real process.
fn tt_smi(fake: &FakeRoot, args: &[&str]) -> Output {
    Command::new(fake.tt_smi()).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Polls `cond` until it holds or [`DEADLINE`] passes.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn class_dir(fake: &FakeRoot, index: u32) -> PathBuf {
    fake.sys_root()
        .join("class/tenstorrent")
        .join(format!("tenstorrent!{index}"))
}

fn due_of(fake: &FakeRoot, bdf: &str) -> u64 {
    fake.pending_resets()
        .unwrap()
        .into_iter()
        .find(|p| p.bdf == bdf)
        .unwrap_or_else(|| panic!("no pending reset for {bdf}"))
        .due_unix_ms
}

#[test]
fn layout_mirrors_the_kernel_driver() {
    let f = fixture(2);
    let fake = &f.fake;
    let mut serials = Vec::new();
    for i in 0..2u32 {
        let bdf = FakeRoot::bdf(i as usize);
        assert!(fake.dev_root().join(format!("tenstorrent/{i}")).is_file());

        // The class link's `device` resolves to the PCI dir named by the BDF,
        // and the bus link resolves to the same dir.
        let class = class_dir(fake, i);
        let pci = fs::canonicalize(class.join("device")).unwrap();
        assert!(pci.ends_with(&bdf), "{} should end in {bdf}", pci.display());
        assert!(pci.ends_with(format!("devices/pci0000:00/{bdf}")));
        let bus = fs::canonicalize(fake.sys_root().join("bus/pci/devices").join(&bdf)).unwrap();
        assert_eq!(bus, pci);
        assert!(fs::symlink_metadata(&class)
            .unwrap()
            .file_type()
            .is_symlink());

        let attr = |name: &str| fs::read_to_string(class.join(name)).unwrap();
        assert_eq!(attr("tt_card_type"), "p150a\n");
        let serial = attr("tt_serial");
        assert!(serial.ends_with('\n'));
        let serial = serial.trim_end().to_string();
        assert_eq!(serial.len(), 16);
        assert!(serial.chars().all(|c| c.is_ascii_hexdigit()));
        serials.push(serial);
        assert_eq!(attr("tt_aiclk"), "1350\n");
        assert_eq!(attr("tt_axiclk"), "900\n");
        assert_eq!(attr("tt_arcclk"), "800\n");
        for ver in ["tt_fw_bundle_ver", "tt_m3app_fw_ver"] {
            let v = attr(ver);
            assert_eq!(v.trim_end().split('.').count(), 4, "{ver} = {v:?}");
            assert!(v.trim_end().split('.').all(|p| p.parse::<u32>().is_ok()));
        }
        assert!(!attr("tt_asic_id").trim().is_empty());
        assert!(attr("tt_heartbeat").trim().parse::<u64>().is_ok());
        assert_eq!(attr("tt_therm_trip_count"), "0\n");

        // hwmon under the PCI dir, reachable through the bus link.
        let hwmons: Vec<PathBuf> = fs::read_dir(bus.join("hwmon"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(hwmons.len(), 1);
        let hw = &hwmons[0];
        assert!(hw
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("hwmon"));
        let read = |name: &str| fs::read_to_string(hw.join(name)).unwrap();
        assert_eq!(read("name"), "blackhole\n");
        let temp: u64 = read("temp1_input").trim().parse().unwrap();
        assert!((30_000..90_000).contains(&temp), "millidegrees: {temp}");
        let vcore: u64 = read("in0_input").trim().parse().unwrap();
        assert!((600..1_000).contains(&vcore), "mV: {vcore}");
        let power: u64 = read("power1_input").trim().parse().unwrap();
        assert!((1_000_000..300_000_000).contains(&power), "uW: {power}");
        for (input, label) in [
            ("temp1", "asic_temp"),
            ("in0", "vcore"),
            ("curr1", "current"),
            ("power1", "power"),
            ("fan1", "fan_rpm"),
        ] {
            assert!(read(&format!("{input}_input"))
                .trim()
                .parse::<u64>()
                .is_ok());
            assert_eq!(read(&format!("{input}_label")), format!("{label}\n"));
        }

        let pids = fake
            .proc_root()
            .join(format!("driver/tenstorrent/{i}/pids"));
        assert_eq!(fs::read_to_string(pids).unwrap(), "");
        assert_eq!(fake.index_of(&bdf), Some(i));
    }
    assert_ne!(serials[0], serials[1]);

    // hwmon numbers differ between cards.
    let hw = |i: usize| {
        fs::read_dir(
            fake.sys_root()
                .join("bus/pci/devices")
                .join(FakeRoot::bdf(i))
                .join("hwmon"),
        )
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
    };
    assert_ne!(hw(0), hw(1));

    assert_eq!(
        fs::read_to_string(fake.sys_root().join("module/tenstorrent/version")).unwrap(),
        "2.10.0\n"
    );
    // udev's stable link (tt-kmd 2.6.0+) names the ASIC id.
    let asic = fs::read_to_string(class_dir(fake, 0).join("tt_asic_id")).unwrap();
    let link = fake
        .dev_root()
        .join(format!("tenstorrent/by-id/blackhole-{}", asic.trim_end()));
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("../0"));
    let script = fs::metadata(fake.tt_smi()).unwrap();
    assert!(script.permissions().mode() & 0o111 != 0);
    assert!(fs::read_to_string(fake.tt_smi())
        .unwrap()
        .starts_with("#!/bin/sh\n"));
}

#[test]
fn cards_are_identical_between_two_roots() {
    let a = fixture(2);
    let b = fixture(2);
    let cards = |f: &Fixture| {
        f.fake
            .cards()
            .unwrap()
            .into_iter()
            .map(|c| c.info)
            .collect::<Vec<_>>()
    };
    assert_eq!(cards(&a), cards(&b));
}

#[test]
fn heartbeat_advances_with_tick_and_not_when_frozen() {
    let f = fixture(2);
    let fake = &f.fake;
    let (a, b) = (FakeRoot::bdf(0), FakeRoot::bdf(1));
    let (a0, b0) = (fake.heartbeat(&a).unwrap(), fake.heartbeat(&b).unwrap());
    fake.tick().unwrap();
    fake.tick().unwrap();
    assert_eq!(fake.heartbeat(&a), Some(a0 + 2));
    assert_eq!(fake.heartbeat(&b), Some(b0 + 2));

    fake.set_fault(&b, Fault::FrozenHeartbeat).unwrap();
    fake.tick().unwrap();
    assert_eq!(fake.heartbeat(&a), Some(a0 + 3));
    assert_eq!(fake.heartbeat(&b), Some(b0 + 2));

    fake.clear_fault(&b).unwrap();
    fake.tick().unwrap();
    assert_eq!(fake.heartbeat(&b), Some(b0 + 3));
}

#[test]
fn reset_returns_before_the_card_is_back_and_the_firmware_brings_it_back() {
    let f = fixture(2);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    for _ in 0..5 {
        fake.tick().unwrap();
    }
    let before = fake.heartbeat(&bdf).unwrap();

    let out = tt_smi(fake, &["-r", "/dev/tenstorrent/0"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = plain(&out);
    assert!(
        text.contains("Resetting /dev/tenstorrent IDs: [0]"),
        "{text}"
    );
    assert!(
        text.contains("Re-initializing boards after reset...."),
        "{text}"
    );
    assert_eq!(last_reset(fake), vec![bdf.clone()]);

    // tt-kmd 2.10 resets in place: node and class dir stay, every
    // attribute read fails, the link is down.
    assert!(fake.dev_root().join("tenstorrent/0").exists());
    assert!(class_dir(fake, 0).exists());
    assert!(fs::read_to_string(class_dir(fake, 0).join("tt_serial")).is_err());
    assert!(fs::read_to_string(class_dir(fake, 0).join("tt_heartbeat")).is_err());
    let pci = fake.sys_root().join("bus/pci/devices").join(&bdf);
    assert_eq!(
        fs::read_to_string(pci.join("current_link_speed")).unwrap(),
        "Unknown\n"
    );
    assert_eq!(fake.index_of(&bdf), Some(0));
    assert_eq!(fake.heartbeat(&bdf), None);
    // The other card is untouched.
    assert_eq!(fake.index_of(&FakeRoot::bdf(1)), Some(1));
    assert!(fake.heartbeat(&FakeRoot::bdf(1)).is_some());

    let due = due_of(fake, &bdf);
    let report = fake.tick_at(due - 1).unwrap();
    assert!(report.returned.is_empty());
    assert_eq!(fake.heartbeat(&bdf), None);

    let report = fake.tick_at(due).unwrap();
    assert_eq!(report.returned.len(), 1);
    assert_eq!(fake.index_of(&bdf), Some(0));
    let after = fake.heartbeat(&bdf).unwrap();
    assert!(
        after < before,
        "heartbeat restarts low: {after} vs {before}"
    );
    assert_eq!(
        fs::read_to_string(pci.join("current_link_speed")).unwrap(),
        "32.0 GT/s PCIe\n"
    );
    assert!(fake.pending_resets().unwrap().is_empty());
}

#[test]
fn a_hot_plug_card_leaves_the_bus_during_its_reset() {
    let f = fixture(2);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    fake.set_fault(&bdf, Fault::HotPlug).unwrap();
    assert_eq!(tt_smi(fake, &["-r", &bdf]).status.code(), Some(0));
    assert!(!fake.dev_root().join("tenstorrent/0").exists());
    assert!(!class_dir(fake, 0).exists());
    assert_eq!(fake.index_of(&bdf), None);
    // The PCI function itself stays.
    assert!(fake.sys_root().join("bus/pci/devices").join(&bdf).exists());
    fake.tick_at(due_of(fake, &bdf)).unwrap();
    assert_eq!(fake.index_of(&bdf), Some(0));
}

#[test]
fn an_old_driver_resets_in_place_with_stale_reads_and_no_heartbeat() {
    let f = fixture_with(1, "2.4.1", "6.8.0");
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    let class = class_dir(fake, 0);
    // tt-kmd 2.4.1: no heartbeat, no thermal trip count, no pids file.
    assert!(!class.join("tt_heartbeat").exists());
    assert!(!class.join("tt_therm_trip_count").exists());
    assert!(!fake.proc_root().join("driver/tenstorrent/0/pids").exists());
    assert!(!fake.dev_root().join("tenstorrent/by-id").exists());
    let serial = fs::read_to_string(class.join("tt_serial")).unwrap();
    assert_eq!(tt_smi(fake, &["-r", &bdf]).status.code(), Some(0));
    // In place, and reads answer with what the card said before.
    assert_eq!(fs::read_to_string(class.join("tt_serial")).unwrap(), serial);
    assert!(!fake.pending_resets().unwrap().is_empty());
    fake.tick_at(u64::MAX).unwrap();
    assert!(fake.pending_resets().unwrap().is_empty());
}

#[test]
fn reset_targets_follow_tt_smi_6_8() {
    let f = fixture(3);
    let fake = &f.fake;
    let (a, b, c) = (FakeRoot::bdf(0), FakeRoot::bdf(1), FakeRoot::bdf(2));
    let settle = || {
        fake.tick_at(u64::MAX).unwrap();
    };

    // Full BDFs: exactly those.
    let out = tt_smi(fake, &["--no_reinit", "-r", &format!("{a},{c}")]);
    assert_eq!(out.status.code(), Some(0), "{}", plain(&out));
    assert!(plain(&out).contains(&format!("Resetting PCI BDFs: ['{a}', '{c}']")));
    assert!(!plain(&out).contains("Re-initializing"));
    assert_eq!(last_reset(fake), vec![a.clone(), c.clone()]);
    settle();

    // An absent BDF is dropped, and none left means every card.
    let out = tt_smi(fake, &["-r", "0000:09:00.0"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(last_reset(fake), vec![a.clone(), b.clone(), c.clone()]);
    settle();
    // So does an upper-case one: tt-umd compares with sysfs exactly.
    fake.set_fault(&a, Fault::HotPlug).unwrap();
    let out = tt_smi(fake, &["-r", "0000:0A:00.0"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(last_reset(fake).len(), 3);
    settle();
    fake.clear_fault(&a).unwrap();

    // Bare integers are UMD logical ids: positions in PCI order, the
    // out-of-range ones skipped, none left meaning every card.
    assert_eq!(tt_smi(fake, &["-r", "1"]).status.code(), Some(0));
    assert_eq!(last_reset(fake), vec![b.clone()]);
    settle();
    assert_eq!(tt_smi(fake, &["-r", "7"]).status.code(), Some(0));
    assert_eq!(last_reset(fake).len(), 3);
    settle();

    // An absent /dev path is skipped silently and widens nothing.
    let out = tt_smi(fake, &["-r", "/dev/tenstorrent/4"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(last_reset(fake).is_empty());

    // `all`, or no target: every card.
    assert_eq!(tt_smi(fake, &["-r", "all"]).status.code(), Some(0));
    assert_eq!(last_reset(fake).len(), 3);
    settle();
    assert_eq!(tt_smi(fake, &["-r"]).status.code(), Some(0));
    assert_eq!(last_reset(fake).len(), 3);
    settle();
}

#[test]
fn mixed_short_and_bad_targets_exit_1_and_touch_nothing() {
    let f = fixture(2);
    let fake = &f.fake;
    for (target, said) in [
        (
            "/dev/tenstorrent/0,0000:02:00.0",
            "Mixed device target kinds are not allowed",
        ),
        ("01:00.0", "Invalid device target: '01:00.0'"),
        ("card0", "Invalid device target: 'card0'"),
        ("0,all", "Use 'all' as the only argument"),
        ("/dev/tenstorrent/x", "Invalid path: /dev/tenstorrent/x"),
    ] {
        let out = tt_smi(fake, &["-r", target]);
        assert_eq!(out.status.code(), Some(1), "target {target}");
        assert!(plain(&out).contains(said), "{target}: {}", plain(&out));
        assert!(last_reset(fake).is_empty());
    }
    assert!(fake.pending_resets().unwrap().is_empty());
}

#[test]
fn a_negative_logical_id_crashes_tt_smi() {
    use std::os::unix::process::ExitStatusExt;
    let f = fixture(1);
    let out = tt_smi(&f.fake, &["-r", "-1"]);
    assert_eq!(out.status.signal(), Some(11), "{:?}", out.status);
    assert!(f.fake.pending_resets().unwrap().is_empty());
}

#[test]
fn failed_ioctls_and_lost_cards_still_exit_0_with_their_lines() {
    let f = fixture(2);
    let fake = &f.fake;
    let (a, b) = (FakeRoot::bdf(0), FakeRoot::bdf(1));
    fake.set_fault(&a, Fault::IoctlFails).unwrap();
    let out = tt_smi(fake, &["-r", &format!("{a},{b}")]);
    assert_eq!(out.status.code(), Some(0), "the real tool exits 0 too");
    assert!(plain(&out).contains("Sending reset ioctl to device 0 failed"));
    assert_eq!(last_reset(fake), vec![b.clone()]);
    fake.tick_at(u64::MAX).unwrap();

    fake.clear_fault(&a).unwrap();
    fake.set_fault(&a, Fault::HotPlug).unwrap();
    fake.set_fault(&a, Fault::NeverReturns).unwrap();
    let out = tt_smi(fake, &["-r", &a]);
    assert_eq!(out.status.code(), Some(0));
    assert!(plain(&out).contains("Reset failed."), "{}", plain(&out));
}

#[test]
fn re_initialisation_fails_on_any_card_of_the_host_unless_skipped() {
    let f = fixture(2);
    let fake = &f.fake;
    let (a, b) = (FakeRoot::bdf(0), FakeRoot::bdf(1));
    // Card b's re-discovery fails; only card a is reset.
    fake.set_fault(&b, Fault::ReinitFails).unwrap();
    let out = tt_smi(fake, &["-r", &a]);
    assert_eq!(out.status.code(), Some(1));
    assert!(plain(&out).contains("Error when re-initializing chips!"));
    assert_eq!(last_reset(fake), vec![a.clone()]);
    fake.tick_at(u64::MAX).unwrap();
    let out = tt_smi(fake, &["--no_reinit", "-r", &a]);
    assert_eq!(out.status.code(), Some(0), "{}", plain(&out));
}

#[test]
fn an_old_tt_smi_takes_only_indices() {
    let f = fixture_with(2, "2.10.0", "4.1.2");
    let fake = &f.fake;
    let out = tt_smi(fake, &["-v"]);
    assert_eq!(stdout(&out).trim(), "4.1.2");
    let out = tt_smi(fake, &["-r", &FakeRoot::bdf(0)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(plain(&out)
        .contains("Invalid input! Provide list of comma separated numbers or a json file"));
    // A /dev path is opened as a JSON reset config.
    let out = tt_smi(fake, &["-r", "/dev/tenstorrent/0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(plain(&out).contains("Please check the format of the json file."));
    assert!(last_reset(fake).is_empty());
    assert_eq!(tt_smi(fake, &["-r", "1"]).status.code(), Some(0));
    assert_eq!(last_reset(fake), vec![FakeRoot::bdf(1)]);
}

#[test]
fn downtrain_and_thermal_trip_show_after_the_reset() {
    let f = fixture(1);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    fake.set_fault(&bdf, Fault::Downtrained).unwrap();
    fake.set_fault(&bdf, Fault::ThermTrip).unwrap();
    assert_eq!(tt_smi(fake, &["-r", &bdf]).status.code(), Some(0));
    fake.tick_at(u64::MAX).unwrap();
    let pci = fake.sys_root().join("bus/pci/devices").join(&bdf);
    assert_eq!(
        fs::read_to_string(pci.join("current_link_speed")).unwrap(),
        "8.0 GT/s PCIe\n"
    );
    assert_eq!(
        fs::read_to_string(pci.join("current_link_width")).unwrap(),
        "4\n"
    );
    assert_eq!(
        fs::read_to_string(pci.join("max_link_width")).unwrap(),
        "16\n"
    );
    assert_eq!(
        fs::read_to_string(class_dir(fake, 0).join("tt_therm_trip_count")).unwrap(),
        "1\n"
    );
}

#[test]
fn an_unplugged_card_is_gone_until_plugged() {
    let f = fixture(2);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    fake.unplug(&bdf).unwrap();
    assert_eq!(fake.index_of(&bdf), None);
    assert!(!fake.sys_root().join("bus/pci/devices").join(&bdf).exists());
    assert!(!fake.dev_root().join("tenstorrent/0").exists());
    // tt-smi no longer sees it: its address is dropped, and with none left
    // the call resets the one card that is there.
    assert_eq!(tt_smi(fake, &["-r", &bdf]).status.code(), Some(0));
    assert_eq!(last_reset(fake), vec![FakeRoot::bdf(1)]);
    fake.tick_at(u64::MAX).unwrap();
    assert_eq!(fake.plug(&bdf).unwrap(), 0);
    assert_eq!(fake.index_of(&bdf), Some(0));
}

#[test]
fn new_index_fault_brings_the_card_back_under_another_index() {
    let f = fixture(2);
    let fake = &f.fake;
    let (a, b) = (FakeRoot::bdf(0), FakeRoot::bdf(1));
    fake.set_fault(&a, Fault::NewIndex).unwrap();

    let out = tt_smi(fake, &["-r", "/dev/tenstorrent/0"]);
    assert_eq!(out.status.code(), Some(0));
    fake.tick_at(due_of(fake, &a)).unwrap();
    // Index 0 is the old one and 1 is taken: the lowest other free index is 2.
    assert_eq!(fake.index_of(&a), Some(2));
    assert!(fake.dev_root().join("tenstorrent/2").is_file());
    assert!(!fake.dev_root().join("tenstorrent/0").exists());
    assert_eq!(
        fs::canonicalize(class_dir(fake, 2).join("device"))
            .unwrap()
            .file_name()
            .unwrap(),
        a.as_str()
    );

    // Resetting both: the moving card must not take the index the other
    // card is coming back to.
    let out = tt_smi(fake, &["-r", "all"]);
    assert_eq!(out.status.code(), Some(0));
    fake.tick_at(u64::MAX).unwrap();
    let (ia, ib) = (fake.index_of(&a).unwrap(), fake.index_of(&b).unwrap());
    assert_eq!(ib, 1);
    assert_ne!(ia, 2);
    assert_ne!(ia, ib);
}

#[test]
fn never_returns_fault_lies_with_exit_0_until_cleared() {
    let f = fixture(1);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    fake.set_fault(&bdf, Fault::NeverReturns).unwrap();

    let out = tt_smi(fake, &["-r", "0"]);
    assert_eq!(out.status.code(), Some(0), "the real tool lies too");
    for _ in 0..3 {
        fake.tick_at(u64::MAX).unwrap();
    }
    // In place: the node stays, but the card never reads again.
    assert!(fake.dev_root().join("tenstorrent/0").exists());
    assert_eq!(fake.heartbeat(&bdf), None);

    fake.clear_fault(&bdf).unwrap();
    fake.tick_at(u64::MAX).unwrap();
    assert!(fake.heartbeat(&bdf).is_some());
}

#[test]
fn slow_fault_delays_the_return() {
    let f = fixture(1);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    fake.set_fault(&bdf, Fault::Slow { delay_ms: 60_000 })
        .unwrap();
    let started = tt_fakehw_now_ms();
    assert_eq!(tt_smi(fake, &["-r", "0"]).status.code(), Some(0));
    let due = due_of(fake, &bdf);
    assert!(due >= started + 60_000, "due {due}, started {started}");
    fake.tick().unwrap();
    assert_eq!(fake.heartbeat(&bdf), None);
    fake.tick_at(due).unwrap();
    assert!(fake.heartbeat(&bdf).is_some());
}

fn tt_fakehw_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn smi_exit_1_fault_fails_the_reset_and_leaves_the_card() {
    let f = fixture(1);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    fake.set_fault(&bdf, Fault::SmiExit1).unwrap();
    let out = tt_smi(fake, &["-r", "/dev/tenstorrent/0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("Traceback"), "{}", stdout(&out));
    assert!(fake.heartbeat(&bdf).is_some());
    assert!(fake.pending_resets().unwrap().is_empty());
}

/// Whether `pid` runs (a zombie has ended: an orphan's zombie waits for an
/// init that may never reap it).
fn running(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(!matches!(state, 'Z' | 'X'))
        })
        .unwrap_or(false)
}

#[test]
fn smi_hangs_fault_hangs_the_reset_until_sigkill_reaches_its_group() {
    use std::os::unix::process::CommandExt;
    let f = fixture(2);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(1);
    fake.set_fault(&bdf, Fault::SmiHangs).unwrap();
    assert!(fake.faults(&bdf).unwrap().smi_hangs);
    // A reset that does not name the card is not affected.
    assert_eq!(
        tt_smi(fake, &["-r", &FakeRoot::bdf(0)]).status.code(),
        Some(0)
    );

    let mut child = Command::new(fake.tt_smi())
        .args(["--no_reinit", "-r", &bdf])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut hung = None;
    wait_for("the hung run to be logged", || {
        hung = fake.tt_smi_log().unwrap().into_iter().find(|i| i.hung);
        hung.is_some()
    });
    let hung = hung.unwrap();
    assert_eq!(hung.exit_code, 137);
    assert!(hung.reset_bdfs.is_empty(), "{hung:?}");
    // tt-smi (the script execs the binary) and the child it forked.
    assert_eq!(hung.pids.len(), 2, "{hung:?}");
    assert_eq!(hung.pids[0], child.id());
    // Nothing was done to the card, and SIGTERM does not end the run.
    assert!(fake.pending_resets().unwrap().iter().all(|p| p.bdf != bdf));
    assert!(fake.heartbeat(&bdf).is_some());
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(child.try_wait().unwrap(), None, "SIGTERM ended it");
    assert!(hung.pids.iter().all(|p| running(*p)), "{hung:?}");

    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(
        out.contains("Resetting PCI BDFs: ['0000:02:00.0']"),
        "{out}"
    );
    wait_for("the forked child to die too", || {
        hung.pids.iter().all(|p| !running(*p))
    });

    // In process a run cannot hang: it says so and returns what SIGKILL gives.
    let in_process = fake.run_smi(&["-r", &bdf]);
    assert_eq!(in_process.code, 137);
    assert!(in_process.stderr.contains("smi-hangs"), "{in_process:?}");
}

#[test]
fn bad_flag_exits_2_with_argparse_usage() {
    let f = fixture(1);
    let out = tt_smi(&f.fake, &["--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.starts_with("usage: tt-smi "), "{err}");
    assert!(err.contains("tt-smi: error: unrecognized arguments: --bogus"));

    let out = tt_smi(&f.fake, &["-s", "extra"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unrecognized arguments: extra"));
}

#[test]
fn help_and_version_exit_0() {
    let f = fixture(1);
    let out = tt_smi(&f.fake, &["-h"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("--snapshot_no_tty"));
    let out = tt_smi(&f.fake, &["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out).trim(), "6.8.0");
}

#[test]
fn missing_driver_exits_1() {
    let f = fixture(1);
    f.fake.set_driver_loaded(false).unwrap();
    for args in [&["-r", "0"][..], &["-s"], &["-ls"]] {
        let out = tt_smi(&f.fake, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stdout(&out).contains("No Tenstorrent driver detected"));
    }
    assert_eq!(f.fake.index_of(&FakeRoot::bdf(0)), Some(0));
    f.fake.set_driver_loaded(true).unwrap();
    assert_eq!(tt_smi(&f.fake, &["-ls"]).status.code(), Some(0));
}

/// The key structure of a JSON value: objects keep their keys in order,
/// arrays are represented by their first element.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Array(
            map.iter()
                .map(|(k, v)| Value::Array(vec![Value::String(k.clone()), shape(v)]))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.first().map(shape).into_iter().collect()),
        Value::String(_) => Value::String("string".into()),
        Value::Number(_) => Value::String("number".into()),
        Value::Bool(_) => Value::String("bool".into()),
        Value::Null => Value::Null,
    }
}

/// Every object key of a pretty-printed JSON text, in document order
/// (the workspace's serde_json sorts map keys, so order is read from the text).
fn key_sequence(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start().strip_prefix('"')?;
            let (key, _) = l.split_once("\":")?;
            Some(key.to_string())
        })
        .collect()
}

#[test]
fn snapshot_has_the_shape_of_the_real_tool() {
    let f = fixture(2);
    let fake = &f.fake;
    fake.set_pids(1, &[std::process::id()]).unwrap();
    let reference_text = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/tt-smi-6.8-snapshot-p150a.synthetic.json"),
    )
    .unwrap();
    let reference: Value = serde_json::from_str(&reference_text).unwrap();

    for flag in ["-s", "--snapshot", "--snapshot_no_tty"] {
        let out = tt_smi(fake, &[flag]);
        assert_eq!(out.status.code(), Some(0));
        let text = stdout(&out);
        let snap: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(shape(&snap), shape(&reference), "{flag}");

        let top: Vec<&str> = snap
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = vec![
            "device_info",
            "host_info",
            "host_sw_vers",
            "processes",
            "time",
        ];
        want.sort();
        assert_eq!(top, want);

        let devices = snap["device_info"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        let dev = &devices[1];
        assert_eq!(dev["board_info"]["bus_id"], "0000:02:00.0");
        assert_eq!(dev["board_info"]["board_type"], "p150a");
        let serial = fs::read_to_string(class_dir(fake, 1).join("tt_serial")).unwrap();
        // sysfs prints the serial in upper-case hex, tt-smi in lower-case.
        assert_eq!(serial.trim_end(), serial.trim_end().to_ascii_uppercase());
        assert_eq!(
            dev["board_info"]["board_id"],
            serial.trim_end().to_ascii_lowercase()
        );
        // Telemetry values are strings, padded like the real tool's.
        let power = dev["telemetry"]["power"].as_str().unwrap();
        assert_eq!(power.len(), 5, "{power:?}");
        assert!(power.trim().parse::<f64>().is_ok());
        assert_eq!(dev["firmwares"]["fw_bundle_version"], "19.11.0.0");
        assert_eq!(snap["processes"][0]["pid"], std::process::id());
        assert_eq!(snap["processes"][0]["device"], 1);
    }

    // A card off the bus for its reset (a hot-plug slot) is missing from
    // the snapshot.
    fake.set_fault(&FakeRoot::bdf(0), Fault::HotPlug).unwrap();
    assert_eq!(tt_smi(fake, &["-r", "0"]).status.code(), Some(0));
    let snap: Value = serde_json::from_slice(&tt_smi(fake, &["-s"]).stdout).unwrap();
    assert_eq!(snap["device_info"].as_array().unwrap().len(), 1);
}

#[test]
fn snapshot_keys_come_in_the_real_tools_order() {
    // One card with one process: the same key sequence as the reference.
    let f = fixture(1);
    f.fake.set_pids(0, &[std::process::id()]).unwrap();
    let reference = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/tt-smi-6.8-snapshot-p150a.synthetic.json"),
    )
    .unwrap();
    let out = tt_smi(&f.fake, &["--snapshot_no_tty"]);
    assert_eq!(key_sequence(&stdout(&out)), key_sequence(&reference));
    // Four-space indentation, like the real tool.
    assert!(stdout(&out).starts_with("{\n    \"time\": \""));
}

#[test]
fn list_shows_index_type_serial_and_bdf() {
    let f = fixture(2);
    let out = tt_smi(&f.fake, &["-ls"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.contains("0000:02:00.0"))
        .expect("a row for card 1");
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[0], "1");
    assert!(cols.contains(&"p150a"));
    assert!(cols.iter().any(|c| c.len() == 16));
}

#[test]
fn tt_smi_log_records_every_invocation() {
    let f = fixture(1);
    let fake = &f.fake;
    tt_smi(fake, &["-ls"]);
    tt_smi(fake, &["--bogus"]);
    tt_smi(fake, &["-r", "/dev/tenstorrent/0"]);
    let in_process = fake.run_smi(&["-v"]);
    assert_eq!(in_process.code, 0);
    let log = fake.tt_smi_log().unwrap();
    let got: Vec<(Vec<String>, i32)> = log.iter().map(|e| (e.args.clone(), e.exit_code)).collect();
    let want: Vec<(Vec<String>, i32)> = vec![
        (vec!["-ls".into()], 0),
        (vec!["--bogus".into()], 2),
        (vec!["-r".into(), "/dev/tenstorrent/0".into()], 0),
        (vec!["-v".into()], 0),
    ];
    assert_eq!(got, want);
    assert!(log.windows(2).all(|w| w[0].unix_ms <= w[1].unix_ms));
    assert!(log[0].unix_ms > 1_600_000_000_000);

    // The file itself is JSON lines with the documented keys.
    let raw = fs::read_to_string(fake.state_dir().join("tt-smi.log")).unwrap();
    let first: Value = serde_json::from_str(raw.lines().next().unwrap()).unwrap();
    for key in ["unix_ms", "args", "exit_code"] {
        assert!(first.get(key).is_some(), "{key} in {first}");
    }
}

#[test]
fn pids_are_written_where_the_driver_lists_them() {
    let f = fixture(2);
    let fake = &f.fake;
    let pids = fake.proc_root().join("driver/tenstorrent/1/pids");
    fake.set_pids(1, &[4242, 4343]).unwrap();
    assert_eq!(fs::read_to_string(&pids).unwrap(), "4242\n4343\n");

    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .arg("--root")
            .arg(fake.root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    };
    run(&["pid", "--card", "1", "--add", "99"]);
    assert_eq!(fs::read_to_string(&pids).unwrap(), "4242\n4343\n99\n");
    // One line per open descriptor: a second open lists the pid again.
    run(&["pid", "--card", "1", "--add", "99"]);
    assert_eq!(fs::read_to_string(&pids).unwrap(), "4242\n4343\n99\n99\n");
    run(&["pid", "--card", "1", "--clear"]);
    assert_eq!(fs::read_to_string(&pids).unwrap(), "");

    // A card off the bus has no proc entry; setting its pids fails clearly.
    fake.set_fault(&FakeRoot::bdf(1), Fault::HotPlug).unwrap();
    assert_eq!(tt_smi(fake, &["-r", "1"]).status.code(), Some(0));
    let err = fake.set_pids(1, &[1]).unwrap_err().to_string();
    assert!(err.contains("/dev/tenstorrent/1"), "{err}");
}

#[test]
fn fault_command_sets_and_clears_faults() {
    let f = fixture(2);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(1);
    let fault = |args: &[&str]| {
        Command::new(BIN)
            .arg("fault")
            .arg("--root")
            .arg(fake.root())
            .args(args)
            .output()
            .unwrap()
    };
    assert!(fault(&["--card", "1", "slow", "--delay-ms", "1234"])
        .status
        .success());
    assert!(fault(&["--card", &bdf, "new-index"]).status.success());
    assert!(fault(&["--card", "02:00.0", "smi-exit-1"]).status.success());
    assert!(fault(&["--card", "1", "smi-hangs"]).status.success());
    let faults = fake.faults(&bdf).unwrap();
    assert_eq!(faults.slow_delay_ms, Some(1234));
    assert!(faults.new_index && faults.smi_exit_1 && faults.smi_hangs);
    assert!(fake.faults(&FakeRoot::bdf(0)).unwrap().is_clear());

    assert!(fault(&["--card", "1", "clear"]).status.success());
    assert!(fake.faults(&bdf).unwrap().is_clear());

    let out = fault(&["--card", "0000:33:00.0", "slow"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("0000:33:00.0"));
    let out = fault(&["--card", "1", "melt"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn create_command_prints_config_and_refuses_a_nonempty_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let create = |extra: &[&str]| {
        Command::new(BIN)
            .arg("create")
            .arg("--root")
            .arg(&root)
            .args(["--cards", "2"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = create(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let root = fs::canonicalize(&root).unwrap();
    for (key, path) in [
        ("dev_root", root.join("dev")),
        ("sys_root", root.join("sys")),
        ("proc_root", root.join("proc")),
        ("tt_smi", root.join("bin/tt-smi")),
    ] {
        assert!(
            text.contains(&format!("{key} = \"{}\"", path.display())),
            "{key} in {text}"
        );
    }

    let out = create(&[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));

    let fake = FakeRoot::open(&root).unwrap();
    fake.tick().unwrap();
    let out = create(&["--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fake.heartbeat(&FakeRoot::bdf(0)), Some(1000));

    // The script created by the CLI works.
    assert_eq!(tt_smi(&fake, &["-ls"]).status.code(), Some(0));
}

#[test]
fn open_refuses_a_directory_that_is_not_a_fake_root() {
    let dir = tempfile::tempdir().unwrap();
    let err = FakeRoot::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tt-fakehw create"), "{err}");
    let out = Command::new(BIN)
        .args(["smi", "--root"])
        .arg(dir.path())
        .arg("-ls")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn readers_never_see_a_half_written_heartbeat() {
    let f = fixture(1);
    let fake = f.fake.clone();
    let path = class_dir(&fake, 0).join("tt_heartbeat");
    let reader = std::thread::spawn(move || {
        let mut reads = 0;
        let start = Instant::now();
        while reads < 2_000 && start.elapsed() < DEADLINE {
            let text = fs::read_to_string(&path).unwrap();
            assert!(
                text.ends_with('\n') && text.trim().parse::<u64>().is_ok(),
                "{text:?}"
            );
            reads += 1;
        }
    });
    for _ in 0..300 {
        fake.tick().unwrap();
    }
    reader.join().unwrap();
}

#[test]
fn firmware_thread_runs_in_real_time() {
    let f = fixture(1);
    let fake = &f.fake;
    let bdf = FakeRoot::bdf(0);
    let firmware = fake.spawn_firmware_thread(Duration::from_millis(5));
    let h0 = fake.heartbeat(&bdf).unwrap();
    wait_for("the heartbeat to advance", || {
        fake.heartbeat(&bdf).is_some_and(|h| h > h0 + 2)
    });
    assert_eq!(fake.run_smi(&["-r", "0"]).code, 0);
    wait_for("the card to come back", || fake.index_of(&bdf) == Some(0));
    firmware.stop().unwrap();
}

/// Whether `pid` has exited (gone, or a zombie nobody reaped yet).
fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

#[test]
fn firmware_process_brings_reset_cards_back_and_exits_when_the_root_goes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = FakeRoot::create_with(
        &root,
        &CreateOptions {
            reset_delay_ms: 50,
            ..CreateOptions::new(2, Path::new(BIN))
        },
    )
    .unwrap();
    let mut firmware = Command::new(BIN)
        .args(["firmware", "--interval-ms", "10", "--root"])
        .arg(fake.root())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let bdf = FakeRoot::bdf(1);
    let h0 = fake.heartbeat(&bdf).unwrap();
    wait_for("the heartbeat to advance", || {
        fake.heartbeat(&bdf).is_some_and(|h| h > h0)
    });

    let out = tt_smi(&fake, &["-r", "/dev/tenstorrent/1"]);
    assert_eq!(out.status.code(), Some(0));
    wait_for("card 1 to come back", || fake.index_of(&bdf) == Some(1));
    wait_for("its heartbeat to advance again", || {
        fake.heartbeat(&bdf).is_some_and(|h| h > 2)
    });

    fs::remove_dir_all(fake.root().join("fakehw")).unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = firmware.try_wait().unwrap() {
            assert!(status.success(), "firmware exited with {status}");
            break;
        }
        if start.elapsed() > DEADLINE {
            let _ = firmware.kill();
            panic!("firmware did not exit after its root was removed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn firmware_process_exits_when_its_parent_dies() {
    let f = fixture(1);
    // A shell starts the firmware in the background, prints its pid, and
    // exits when we close its stdin.
    let mut parent = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" firmware --interval-ms 10 --root \"$1\" </dev/null >/dev/null & echo $!; read _")
        .arg(BIN)
        .arg(f.fake.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    {
        use std::io::BufRead;
        let stdout = parent.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
    }
    let pid: u32 = line.trim().parse().unwrap();
    let bdf = FakeRoot::bdf(0);
    let h0 = f.fake.heartbeat(&bdf).unwrap();
    wait_for("the firmware to run", || {
        f.fake.heartbeat(&bdf).is_some_and(|h| h > h0)
    });
    assert!(!process_gone(pid));

    drop(parent.stdin.take());
    parent.wait().unwrap();
    wait_for("the firmware to exit after its parent", || {
        process_gone(pid)
    });
}

#[test]
fn the_binary_can_be_located_from_a_test_binary() {
    let found = tt_fakehw::locate_fakehw_bin().expect("tt-fakehw next to target/*/deps");
    assert_eq!(
        fs::canonicalize(found).unwrap(),
        fs::canonicalize(BIN).unwrap()
    );
}

#[test]
fn a_firmware_that_stopped_with_its_shell_says_so_where_resets_are_run() {
    let f = fixture(1);
    let root = f.fake.root();
    // A shell starts the firmware in the background, waits for us, exits.
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" firmware --interval-ms 10 --root \"$1\" </dev/null >/dev/null 2>&1 & read _")
        .arg(BIN)
        .arg(root)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the firmware to run", || {
        matches!(f.fake.firmware_state(), FirmwareState::Running { .. })
    });
    drop(shell.stdin.take());
    shell.wait().unwrap();
    wait_for("the firmware to record why it stopped", || {
        matches!(
            f.fake.firmware_state(),
            FirmwareState::Stopped { last: Some(_) }
        )
    });

    // The reset is still accepted, as tt-smi would, but says why it will
    // not complete and how to fix that.
    let out = tt_smi(&f.fake, &["-r", "/dev/tenstorrent/0"]);
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("firmware: NOT running (the last one stopped"),
        "{err}"
    );
    assert!(err.contains("its parent process (pid "), "{err}");
    assert!(err.contains("--detach"), "{err}");
    let status = Command::new(BIN)
        .args(["status", "--root"])
        .arg(root)
        .output()
        .unwrap();
    assert!(
        stdout(&status).contains("firmware: NOT running"),
        "{}",
        stdout(&status)
    );
}

#[test]
fn a_detached_firmware_outlives_its_shell_until_the_root_goes() {
    let f = fixture(1);
    let root = f.fake.root();
    let out = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" firmware --detach --interval-ms 10 --root \"$1\"")
        .arg(BIN)
        .arg(root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let pid: u32 = stdout(&out)
        .split("as pid ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", stdout(&out)));
    // The shell is gone; the firmware still runs and resets complete.
    assert_eq!(f.fake.firmware_state(), FirmwareState::Running { pid });
    let bdf = FakeRoot::bdf(0);
    let h0 = f.fake.heartbeat(&bdf).unwrap();
    wait_for("the heartbeat to advance", || {
        f.fake.heartbeat(&bdf).is_some_and(|h| h > h0)
    });
    let out = tt_smi(&f.fake, &["-r", "/dev/tenstorrent/0"]);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    wait_for("the card to come back", || f.fake.index_of(&bdf) == Some(0));
    // A second one is not started.
    let again = Command::new(BIN)
        .args(["firmware", "--detach", "--root"])
        .arg(root)
        .output()
        .unwrap();
    assert!(
        stdout(&again).contains(&format!("already runs on {} (pid {pid})", root.display())),
        "{}",
        stdout(&again)
    );

    fs::remove_dir_all(root.join("fakehw")).unwrap();
    wait_for("the detached firmware to exit", || process_gone(pid));
}

/// A `tt-fakehw hold-chip` or `watch` on card 0 with `extra` arguments,
/// and a reader of its stdout lines.
fn card_user(
    fake: &FakeRoot,
    cmd: &str,
    extra: &[&str],
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args([cmd, "--card", "0", "--root"])
        .arg(fake.root())
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// The lock file's mutex word, tt-umd's record of the holder (pid, tid)
/// and its marker.
fn umd_lock(path: &Path) -> (u32, (u32, u32), u64) {
    let b = fs::read(path).unwrap();
    assert_eq!(b.len(), 56, "tt-umd's size");
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let marker = u64::from_le_bytes(b[40..48].try_into().unwrap());
    (u32_at(0), (u32_at(52), u32_at(48)), marker)
}

#[test]
fn hold_chip_maps_the_umd_lock_and_watch_does_not() {
    let f = fixture(1);
    let fake = &f.fake;
    assert_eq!(
        fs::metadata(fake.shm_dir()).unwrap().permissions().mode() & 0o7777,
        0o1777
    );
    assert!(fake.hugepages_dir().is_dir());
    let (mut holder, mut out) = card_user(fake, "hold-chip", &[]);
    let said = out.next().unwrap().unwrap();
    assert!(said.contains("holds the chip"), "{said}");
    let (mut watcher, mut seen) = card_user(fake, "watch", &[]);
    let said = seen.next().unwrap().unwrap();
    assert!(said.contains("watches"), "{said}");
    let lock = fake.chip_lock(0);
    assert!(lock.ends_with("dev/shm/TT_UMD_LOCK.CHIP_IN_USE_0_PCIe"));
    let maps = |pid: u32| fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps(holder.id()).contains(lock.to_str().unwrap()));
    assert!(!maps(watcher.id()).contains("TT_UMD_LOCK"));
    // tt-umd's file: mode 0666, the marker, the mutex word naming the
    // holding thread (its main thread: the pid) and tt-umd's record, and
    // the kind of a robust process-shared mutex.
    assert_eq!(
        fs::metadata(&lock).unwrap().permissions().mode() & 0o777,
        0o666
    );
    let first = holder.id();
    assert_eq!(
        umd_lock(&lock),
        (first, (first, first), 0x5454_554d_444d_5458)
    );
    assert_eq!(&fs::read(&lock).unwrap()[16..20], &[0x90, 0, 0, 0]);
    // The holder has two descriptors open, the watcher one.
    let pids = fake.pids(0).unwrap();
    assert_eq!(pids.iter().filter(|p| **p == first).count(), 2);
    assert_eq!(pids.iter().filter(|p| **p == watcher.id()).count(), 1);

    // A second holder waits for the first, as tt-umd does.
    let (mut second, mut second_out) = card_user(fake, "hold-chip", &[]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!fake.pids(0).unwrap().contains(&second.id()));
    assert_eq!(umd_lock(&lock).0 & 0x3fff_ffff, first);
    for child in [&mut holder, &mut watcher] {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        child.wait().unwrap();
    }
    assert!(second_out
        .next()
        .unwrap()
        .unwrap()
        .contains("holds the chip"));
    // glibc keeps the waiters bit after a contended take.
    assert_eq!(umd_lock(&lock).0 & 0x3fff_ffff, second.id());
    assert_eq!(fake.pids(0).unwrap(), vec![second.id(); 2]);
    // Killed holding it: the kernel marks the owner dead and clears the
    // TID; tt-umd's record still names the dead holder.
    second.kill().unwrap();
    second.wait().unwrap();
    let (word, record, _) = umd_lock(&lock);
    assert_eq!(
        (word & 0x7fff_ffff, record),
        (0x4000_0000, (second.id(), second.id()))
    );
    let _ = fake.remove_pid(0, second.id());

    // The next taker recovers it silently, and one that releases keeps it
    // mapped and its device open.
    let (mut third, mut third_out) = card_user(fake, "hold-chip", &["--release-after-ms", "0"]);
    assert!(third_out
        .next()
        .unwrap()
        .unwrap()
        .contains("holds the chip"));
    assert!(third_out
        .next()
        .unwrap()
        .unwrap()
        .contains("released the chip"));
    assert_eq!(umd_lock(&lock), (0, (0, 0), 0x5454_554d_444d_5458));
    assert!(maps(third.id()).contains(lock.to_str().unwrap()));
    assert_eq!(fake.pids(0).unwrap(), vec![third.id(); 2]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(third.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    third.wait().unwrap();
    assert_eq!(fake.pids(0).unwrap(), Vec::<u32>::new());
    assert_eq!(umd_lock(&lock).0, 0);
}
