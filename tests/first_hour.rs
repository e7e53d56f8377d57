//! The first hour of a new user (issue 46, "What a new user meets"):
//! `tt-servingd demo` and every command it prints, run as printed against
//! the real binaries, with the fake cards the demo lays out itself.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use tt_fakehw::{FakeRoot, Fault, FirmwareState};
use tt_serving_tests::{bin, output_text, tiny_model, wait_until, FakeHw};

/// A `tt-servingd demo` process on its own directory, with the tiny test
/// model; its stderr (the banner, then the daemon's log) goes to a file.
struct Demo {
    child: Option<Child>,
    dir: PathBuf,
    log: PathBuf,
}

impl Demo {
    /// Starts a demo on `dir` with `extra` flags and waits until its
    /// control socket answers.
    fn start(dir: &Path, model: &Path, extra: &[&str]) -> Demo {
        let log = dir.with_extension("log");
        let child = demo_command(dir, model, extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the demo's log"))
            .spawn()
            .expect("start tt-servingd demo");
        let mut demo = Demo {
            child: Some(child),
            dir: dir.to_path_buf(),
            log,
        };
        wait_until("the demo's control socket to answer", || {
            demo.assert_alive();
            let status = demo.status()?;
            (status["daemon"]["pid"].as_u64() == Some(demo.pid().into())).then_some(())
        });
        demo
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("demo running").id()
    }

    fn assert_alive(&mut self) {
        if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
            panic!("the demo exited with {status}:\n{}", self.log_text());
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    fn ttctl(&self, args: &[&str]) -> Output {
        Command::new(bin("ttctl"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ttctl")
    }

    /// `ttctl status --json`, or None while the daemon does not answer.
    fn status(&self) -> Option<Value> {
        serde_json::from_slice(&self.ttctl(&["status", "--json"]).stdout).ok()
    }

    fn card(&self, bdf: &str) -> Value {
        self.status()
            .and_then(|s| {
                s["cards"]
                    .as_array()?
                    .iter()
                    .find(|c| c["bdf"] == bdf)
                    .cloned()
            })
            .unwrap_or(Value::Null)
    }

    fn wait_slot(&self, state: &str) -> Value {
        wait_until(&format!("the demo's slot to be {state}"), || {
            let status = self.status()?;
            (status["slots"][0]["state"] == state).then_some(status)
        })
    }

    /// The commands the banner prints under `header`, up to the next
    /// `demo:` line, as printed (comments included: a shell drops them).
    fn printed_commands(&self, header: &str) -> Vec<String> {
        let log = self.log_text();
        let after = log
            .split_once(header)
            .unwrap_or_else(|| panic!("the demo prints {header:?}:\n{log}"))
            .1;
        after
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .map(|l| l.trim().to_string())
            .collect()
    }

    fn fake_root(&self) -> FakeRoot {
        FakeRoot::open(&self.dir.join("hw")).expect("the demo's fake root")
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            for _ in 0..200 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn demo_command(dir: &Path, model: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin("tt-servingd"));
    cmd.args(["demo", "--listen", "127.0.0.1:0", "--openai-listen", ""])
        .arg("--dir")
        .arg(dir)
        .arg("--model")
        .arg(model)
        .args(extra)
        .stdin(Stdio::null());
    cmd
}

/// Runs one line the demo printed, as a user pasting it into a shell.
fn run_printed(line: &str) -> Output {
    Command::new("sh")
        .args(["-c", line])
        .stdin(Stdio::null())
        .output()
        .expect("run sh")
}

#[test]
fn the_demos_printed_failure_step_quarantines_card_1_only_and_its_repair_serves_again() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let demo = Demo::start(&tmp.path().join("demo"), &model, &[]);
    demo.wait_slot("ready");
    let (card0, card1) = (FakeHw::bdf(0), FakeHw::bdf(1));

    let failure = demo.printed_commands("demo: a card whose reset lies, in this order:");
    assert!(failure.len() >= 2, "{failure:?}");
    assert!(failure[0].contains("fault") && failure[0].contains("never-returns"));
    for line in &failure {
        let out = run_printed(line);
        // The last one is the reset that is not proven: it fails, saying so.
        assert!(
            out.status.success() || line.contains("card reset 1"),
            "{line}: {}",
            output_text(&out)
        );
    }
    let quarantined = wait_until("card 1 to be quarantined", || {
        let card = demo.card(&card1);
        (card["state"] == "quarantined").then_some(card)
    });
    let reason = quarantined["state_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("did not come back"), "{quarantined:#}");
    let status = demo.status().expect("the daemon answers");
    for card in status["cards"].as_array().unwrap() {
        let text = card.to_string();
        assert!(!text.contains("\\u001b"), "no raw colour codes: {card:#}");
        assert!(!text.contains('\x1b'), "no raw colour codes: {card:#}");
    }
    assert_eq!(demo.card(&card0)["state"], "ready", "{status:#}");
    // The firmware still runs for both cards: card 0's heartbeat advances.
    let fake = demo.fake_root();
    assert!(
        matches!(fake.firmware_state(), FirmwareState::Running { .. }),
        "{}",
        fake.firmware_state().describe(fake.root())
    );
    let beat = fake.heartbeat(&card0).expect("card 0 readable");
    wait_until("card 0's heartbeat to advance", || {
        (fake.heartbeat(&card0)? > beat).then_some(())
    });

    // The printed repair brings card 1 back and the slot serves again.
    let repair = demo.printed_commands("demo: and the repair:");
    assert_eq!(repair.len(), 1, "{repair:?}");
    let out = run_printed(&repair[0]);
    assert!(out.status.success(), "{}: {}", repair[0], output_text(&out));
    demo.wait_slot("ready");
    assert_eq!(demo.card(&card1)["state"], "ready");
}

#[test]
fn a_reset_of_both_cards_while_one_is_still_in_reset_leaves_no_card_half_reset() {
    let hw = FakeHw::new(2);
    let (card0, card1) = (FakeHw::bdf(0), FakeHw::bdf(1));
    hw.root.set_fault(&card1, Fault::NeverReturns).unwrap();
    let tt_smi = |targets: &str| {
        Command::new(hw.root.tt_smi())
            .args(["--no_reinit", "-r", targets])
            .output()
            .expect("run the fake tt-smi")
    };
    let out = tt_smi(&card1);
    assert!(out.status.success(), "{}", output_text(&out));
    // What a TP=2 slot's reset does next: both cards in one call.
    let out = tt_smi(&format!("{card0},{card1}"));
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains('\x1b'), "{text:?}");
    let log = hw.root.tt_smi_log().unwrap();
    assert_eq!(
        log.last().unwrap().reset_bdfs,
        [card0.clone(), card1.clone()]
    );
    // Card 0 comes back and beats on; card 1 stays in its reset; the
    // firmware never stops over a half-reset card.
    let beat = wait_until("card 0 to come back", || hw.root.heartbeat(&card0));
    wait_until("card 0's heartbeat to advance", || {
        (hw.root.heartbeat(&card0)? > beat).then_some(())
    });
    assert!(
        matches!(hw.root.firmware_state(), FirmwareState::Running { .. }),
        "{}",
        hw.root.firmware_state().describe(hw.root.root())
    );
    assert_eq!(hw.root.heartbeat(&card1), None);
}

/// The files a second demo must leave alone: (path, inode, mtime, bytes).
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, i64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    ["config.toml", "hw/fakehw/cards.json", "hw/bin/tt-smi"]
        .iter()
        .map(|name| {
            let path = dir.join(name);
            let meta = std::fs::metadata(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            (
                path,
                meta.ino(),
                meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
                bytes,
            )
        })
        .collect()
}

#[test]
fn a_second_demo_on_a_directory_in_use_is_refused_before_it_touches_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let dir = tmp.path().join("demo");
    let first = Demo::start(&dir, &model, &[]);
    let FirmwareState::Running { pid: firmware } = first.fake_root().firmware_state() else {
        panic!("the first demo's firmware runs");
    };
    let before = snapshot(&dir);

    let out = demo_command(&dir, &model, &[])
        .output()
        .expect("run a second demo");
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "a demo already runs on {} (pid {}",
            dir.canonicalize().unwrap().display(),
            first.pid()
        )),
        "{text}"
    );
    assert!(text.contains("control.sock"), "{text}");
    assert!(!text.contains("demo: try"), "no banner: {text}");

    assert_eq!(
        snapshot(&dir),
        before,
        "the first demo's files are untouched"
    );
    assert_eq!(
        first.fake_root().firmware_state(),
        FirmwareState::Running { pid: firmware }
    );
    let status = first.status().expect("the first demo still answers");
    assert_eq!(status["daemon"]["pid"].as_u64(), Some(first.pid().into()));
    first.wait_slot("ready");
}

#[test]
fn the_demos_metrics_address_can_be_set_and_help_says_how() {
    let help = Command::new(bin("tt-servingd"))
        .args(["demo", "--help"])
        .output()
        .unwrap();
    let help = output_text(&help);
    assert!(help.contains("--metrics-listen"), "{help}");

    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    // A bad address is refused before anything is written.
    let bad = tmp.path().join("bad");
    let out = demo_command(&bad, &model, &["--metrics-listen", "9464"])
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("--metrics-listen \"9464\""), "{text}");
    assert!(!bad.exists(), "nothing written for a refused flag");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let demo = Demo::start(
        &tmp.path().join("demo"),
        &model,
        &["--metrics-listen", &address],
    );
    let status = demo.status().unwrap();
    assert_eq!(status["daemon"]["metrics_address"], address.as_str());
    let banner = demo.log_text();
    assert!(
        banner.contains(&format!("curl -s http://{address}/metrics")),
        "{banner}"
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(format!("http://{address}/metrics"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("tt_serving_card_temperature"),
        "{}",
        output_text(&out)
    );
}

/// The card rows of `ttctl status` that show a stalled heartbeat.
fn stalled_rows(demo: &Demo) -> Vec<String> {
    let out = demo.ttctl(&["status"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("0000:0") && l.split_whitespace().any(|w| w == "stalled"))
        .map(str::to_string)
        .collect()
}

/// Polls `ttctl status` until `settled` holds and then each card's
/// heartbeat has been read by the daemon at `reads` new values (one read a
/// tick), failing on any card row showing `stalled` meanwhile.
fn never_stalled(demo: &Demo, what: &str, reads: usize, mut settled: impl FnMut(&Value) -> bool) {
    let mut seen: Vec<std::collections::BTreeSet<u64>> = vec![Default::default(); 2];
    wait_until(what, || {
        let rows = stalled_rows(demo);
        assert!(
            rows.is_empty(),
            "{what}: a healthy card shown stalled: {rows:?}"
        );
        let status = demo.status()?;
        if !settled(&status) {
            return None;
        }
        for (i, bdf) in [FakeHw::bdf(0), FakeHw::bdf(1)].iter().enumerate() {
            let card = status["cards"]
                .as_array()?
                .iter()
                .find(|c| c["bdf"] == *bdf)?;
            seen[i].insert(card["heartbeat"].as_u64()?);
        }
        seen.iter().all(|s| s.len() >= reads).then_some(())
    });
}

#[test]
fn heartbeats_are_not_called_stalled_at_start_or_after_a_reset() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    // The demo as a user runs it: the default tick (1 s), a reset at start
    // and one before the slot starts, each followed by the proof.
    let demo = Demo::start(&tmp.path().join("demo"), &model, &[]);
    let serving = |s: &Value| {
        s["slots"][0]["state"] == "ready"
            && s["cards"]
                .as_array()
                .is_some_and(|cards| cards.iter().all(|c| c["state"] == "ready"))
    };
    never_stalled(&demo, "three reads once the demo serves", 3, serving);

    // A restart resets both cards again.
    let mut restart = Command::new(bin("ttctl"))
        .arg("--socket")
        .arg(demo.socket())
        .args(["slot", "restart", "smollm2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let resets = demo.fake_root().tt_smi_log().unwrap().len();
    never_stalled(&demo, "three reads after the restart's reset", 3, |s| {
        serving(s)
            && demo.fake_root().tt_smi_log().unwrap().len() > resets
            && restart.try_wait().ok().flatten().is_some()
    });
    assert!(restart.wait().unwrap().success());

    // A heartbeat that really stops is still called stalled.
    demo.fake_root()
        .set_fault(&FakeHw::bdf(1), Fault::FrozenHeartbeat)
        .unwrap();
    let rows = wait_until("a frozen heartbeat to show stalled", || {
        let rows = stalled_rows(&demo);
        (!rows.is_empty()).then_some(rows)
    });
    assert!(rows.iter().all(|r| r.contains(&FakeHw::bdf(1))), "{rows:?}");
}
