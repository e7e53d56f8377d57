//! The real tt-smi 6.8.0 (PyPI, `TT_SMI_REAL`, installed by
//! `scripts/tt-smi.sh`) against every reset command the daemon can build,
//! and against the fake tt-smi on the same argument forms.
//!
//! tt-smi runs without a card here: in a private mount namespace whose
//! `/sys/module` holds a made-up `tenstorrent/version` (tt-smi checks for
//! a driver before it parses `-r`) and whose `/dev/tenstorrent`, if the
//! host has one, is an empty tmpfs, so tt-umd finds no card to touch on
//! any host. What it prints is how it understood its targets
//! (`Resetting PCI BDFs: [...]`, `Resetting all PCI devices: [...]`, or the
//! parse error), which is what the daemon must get right.

use std::path::PathBuf;
use std::process::{Command, Output};
use tt_serving_tests::{is_root, FakeHw};
use tt_servingd::cards::discovery::HardwareRoot;
use tt_servingd::cards::reset::{strip_ansi, ResetTargets};

/// The real tt-smi, or None (SKIPPED; CI must have it).
fn real_tt_smi() -> Option<PathBuf> {
    let path = std::env::var_os("TT_SMI_REAL").filter(|s| !s.is_empty());
    let usable = is_root() && Command::new("unshare").arg("--help").output().is_ok();
    match path {
        Some(p) if usable => Some(PathBuf::from(p)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI must set TT_SMI_REAL (scripts/tt-smi.sh) and run as root (unshare -m)")
        }
        _ => {
            eprintln!("SKIPPED: run as root with TT_SMI_REAL=$(scripts/tt-smi.sh) and unshare (util-linux)");
            None
        }
    }
}

/// Run the real tt-smi with `args` where it sees a driver (`driver`: a
/// version, or None for no driver at all) and no card.
fn run_real(tt_smi: &PathBuf, driver: Option<&str>, args: &[String]) -> Output {
    let setup = match driver {
        Some(v) => format!(
            "mount -t tmpfs tmpfs /sys/module && mkdir /sys/module/tenstorrent && echo {v} > /sys/module/tenstorrent/version || exit 99; "
        ),
        None => "mount -t tmpfs tmpfs /sys/module || exit 99; ".to_string(),
    };
    let script = format!(
        "{setup}if [ -e /dev/tenstorrent ]; then mount -t tmpfs tmpfs /dev/tenstorrent || exit 99; fi; exec \"$0\" \"$@\""
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(tt_smi)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run unshare");
    assert_ne!(
        out.status.code(),
        Some(99),
        "the namespace setup failed: {out:?}"
    );
    out
}

/// stdout without colour codes, as trimmed non-empty lines.
fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| strip_ansi(l).trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Exit code, or 128 + the signal it died of.
fn status(out: &Output) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    out.status
        .code()
        .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_reset_the_daemon_builds_is_one_real_tt_smi_takes_as_exactly_those_cards() {
    let Some(tt_smi) = real_tt_smi() else {
        return;
    };
    let hw = FakeHw::new(3);
    let root = HardwareRoot {
        dev_root: hw.root.dev_root(),
        sys_root: hw.root.sys_root(),
        proc_root: hw.root.proc_root(),
    };
    let (a, b, c) = (FakeHw::bdf(0), FakeHw::bdf(1), FakeHw::bdf(2));
    // One card, a TP=2 pair in either order, three at once.
    for cards in [
        vec![a.clone()],
        vec![b.clone(), a.clone()],
        vec![a.clone(), b.clone()],
        vec![a.clone(), b.clone(), c.clone()],
    ] {
        let targets = ResetTargets::check(&root, &cards).expect("present cards are targets");
        let args = targets.tt_smi_args().to_vec();
        let real = run_real(&tt_smi, Some("2.10.0"), &args);
        let said = lines(&real);
        let listed: Vec<String> = cards.iter().map(|b| format!("'{b}'")).collect();
        assert_eq!(status(&real), 0, "{args:?}: {said:?}");
        assert_eq!(
            said,
            vec![format!("Resetting PCI BDFs: [{}]", listed.join(", "))],
            "{args:?}: tt-smi must take exactly these cards, as PCI addresses, and skip re-initialisation"
        );
        // The fake says the same to the same command.
        let fake = Command::new(hw.root.tt_smi()).args(&args).output().unwrap();
        assert_eq!(status(&fake), 0);
        assert_eq!(lines(&fake), said, "{args:?}");
    }
    // What could widen a call is never built: no card, an absent card, a
    // short or upper-case address, a device path.
    let absent = "0000:09:00.0".to_string();
    for cards in [
        vec![],
        vec![a.clone(), absent.clone()],
        vec![absent],
        vec!["01:00.0".to_string()],
        vec!["0000:0A:00.0".to_string()],
        vec!["/dev/tenstorrent/0".to_string()],
    ] {
        assert!(
            ResetTargets::check(&root, &cards).is_err(),
            "{cards:?} must not reach tt-smi"
        );
    }
    // And why: those forms, handed to the real tool, reset every card or fail.
    let real = run_real(
        &tt_smi,
        Some("2.10.0"),
        &strings(&["-r", "/dev/tenstorrent/0,0000:02:00.0"]),
    );
    assert_eq!(status(&real), 1, "{:?}", lines(&real));
    let real = run_real(&tt_smi, Some("2.10.0"), &strings(&["-r", "01:00.0"]));
    assert_eq!(status(&real), 1, "{:?}", lines(&real));
}

#[test]
fn the_fake_tt_smi_answers_every_argument_form_as_the_real_one() {
    let Some(tt_smi) = real_tt_smi() else {
        return;
    };
    // No card on either side: the real one has none here.
    let hw = FakeHw::new(0);
    let forms: &[&[&str]] = &[
        &["-r", "0000:01:00.0"],
        &["-r", "0000:01:00.0,0000:02:00.0"],
        &["-r", "0000:01:00.0", "0000:02:00.0"],
        &["--no_reinit", "-r", "0000:01:00.0"],
        &["-r", "0000:0A:00.0"],
        &["-r", "01:00.0"],
        &["-r", "/dev/tenstorrent/0,0000:02:00.0"],
        &["-r", "0,1"],
        &["-r", "/dev/tenstorrent/3"],
        &["-r", "/dev/tenstorrent/x"],
        &["-r"],
        &["-r", "all"],
        &["-r", "0000:01:00.0,all"],
        &["-r", "card0"],
        &["-r", "-1"],
        &["-v"],
    ];
    for form in forms {
        let args = strings(form);
        let real = run_real(&tt_smi, Some("2.10.0"), &args);
        let fake = Command::new(hw.root.tt_smi()).args(&args).output().unwrap();
        assert_eq!(
            status(&fake),
            status(&real),
            "{args:?}: real said {:?}",
            lines(&real)
        );
        assert_eq!(lines(&fake), lines(&real), "{args:?}");
    }
    // An argument error: exit 2 and argparse's message on both.
    let args = strings(&["-r", "0", "--bogus"]);
    let real = run_real(&tt_smi, Some("2.10.0"), &args);
    let fake = Command::new(hw.root.tt_smi()).args(&args).output().unwrap();
    assert_eq!((status(&real), status(&fake)), (2, 2));
    let error = "tt-smi: error: unrecognized arguments: --bogus";
    for out in [&real, &fake] {
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(error),
            "{out:?}"
        );
    }
    // No driver: exit 1 before the targets are read, on both.
    hw.root.set_driver_loaded(false).unwrap();
    let args = strings(&["-r", "0000:01:00.0"]);
    let real = run_real(&tt_smi, None, &args);
    let fake = Command::new(hw.root.tt_smi()).args(&args).output().unwrap();
    assert_eq!(status(&real), 1);
    assert_eq!(status(&fake), 1);
    assert_eq!(lines(&fake), lines(&real));
}
