//! `tt-servingd check-config` as an operator (or `nixos-rebuild`) meets it:
//! the real binary run on real files, programs, groups and a fake hardware
//! root. A config it accepts without `--offline` is one the daemon starts
//! with; every problem, of the file or of the host, comes in one list.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use tt_serving_tests::{bin, output_text, tiny_model, Daemon, DaemonOptions, FakeHw};

/// Runs check-config on `config`; returns the exit code and all output.
fn check_config(config: &Path, offline: bool, path_env: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(bin("tt-servingd"));
    cmd.arg("check-config");
    if offline {
        cmd.arg("--offline");
    }
    if let Some(path) = path_env {
        cmd.env("PATH", path);
    }
    let out = cmd
        .arg(config)
        .output()
        .expect("run tt-servingd check-config");
    (out.status.code(), output_text(&out))
}

/// A config for a fake hardware root with one card, its daemon paths in a
/// temp dir, and `extra` appended (model tables, sections).
struct Setup {
    _hw: FakeHw,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Setup {
    fn new(daemon_extra: &str, extra: &str) -> Setup {
        let hw = FakeHw::new(1);
        let dir = tempfile::tempdir().expect("temp dir");
        let opts = DaemonOptions {
            daemon_extra: daemon_extra.to_string(),
            extra: extra.to_string(),
            ..Default::default()
        };
        let config = Daemon::configure(&hw, dir.path(), &opts).config.clone();
        Setup {
            _hw: hw,
            dir,
            config,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Full check: exit code 2 and every `needles` line in the output.
    fn assert_problems(&self, needles: &[&str]) -> String {
        let (code, text) = check_config(&self.config, false, None);
        assert_eq!(code, Some(2), "{text}");
        for needle in needles {
            assert!(text.contains(needle), "no `{needle}` in:\n{text}");
        }
        text
    }
}

/// A model table on the fake card, with the worker command given or the
/// default (tt-worker next to tt-servingd).
fn model(name: &str, checkpoint: &Path, worker: Option<&str>, extra: &str) -> String {
    let worker = worker.map_or(String::new(), |w| format!("worker = [\"{w}\"]\n"));
    format!(
        "\n[models.{name}]\ntp = 1\ncards = [\"{card}\"]\ncheckpoint = \"{checkpoint}\"\n{worker}{extra}\n",
        card = FakeHw::bdf(0),
        checkpoint = checkpoint.display(),
    )
}

fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The name of this process's primary group, which exists by definition.
fn own_group() -> String {
    nix::unistd::Group::from_gid(nix::unistd::getgid())
        .ok()
        .flatten()
        .expect("the primary group has a name")
        .name
}

#[test]
fn a_config_whose_host_has_everything_passes_the_full_check() {
    let files = tempfile::tempdir().unwrap();
    let checkpoint = tiny_model(files.path());
    let tokens = files.path().join("tokens");
    write_mode(&tokens, "# clients\ns3cret-token\n", 0o640);
    let env_file = files.path().join("m.env");
    write_mode(&env_file, "API_KEY=abc\n", 0o600);
    let group = own_group();
    let setup = Setup::new(
        &format!("control_socket_group = \"{group}\"\ncontrol_admin_group = \"{group}\"\n"),
        &format!(
            "[inference]\ntokens_file = \"{}\"\n{}",
            tokens.display(),
            model(
                "m",
                &checkpoint,
                None,
                &format!("env_file = \"{}\"", env_file.display())
            )
        ),
    );
    let (code, text) = check_config(&setup.config, false, None);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("valid (1 model(s), 1 slot(s))"), "{text}");
}

#[test]
fn a_missing_checkpoint_is_named_with_the_fix() {
    let setup = Setup::new("", &model("m", Path::new("/nonexistent/m.gguf"), None, ""));
    setup.assert_problems(&[
        "models.m.checkpoint: `/nonexistent/m.gguf` does not exist; put the model's checkpoint there or fix models.m.checkpoint",
    ]);
}

#[test]
fn a_checkpoint_that_is_not_gguf_or_is_cut_short_is_refused_both_in_one_list() {
    let files = tempfile::tempdir().unwrap();
    let whole = tiny_model(files.path());
    let bytes = std::fs::read(&whole).unwrap();
    // An interrupted copy: the header is whole, half the tensor data is not.
    let cut = files.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let text_file = files.path().join("notes.txt");
    std::fs::write(&text_file, "these are not weights\n").unwrap();
    let setup = Setup::new(
        "",
        &format!(
            "{}{}",
            model("cut", &cut, None, ""),
            // Model names order the list; this one needs another card.
            model("text", &text_file, None, "").replace(&FakeHw::bdf(0), "0000:07:00.0"),
        ),
    );
    let text = setup.assert_problems(&[
        &format!(
            "models.cut.checkpoint: `{}` is truncated: its GGUF header says the tensor data ends at byte",
            cut.display()
        ),
        &format!("but the file has {} bytes; copy or download it again", bytes.len() / 2),
        &format!(
            "models.text.checkpoint: `{}` is not a GGUF file (it starts with bytes 74 68 65 73, not `GGUF`)",
            text_file.display()
        ),
        // The unknown card is a problem of the same run.
        "models.text.cards[0]: unknown card 0000:07:00.0",
    ]);
    assert!(text.starts_with("3 problem(s) in "), "{text}");
}

#[test]
fn another_engine_only_needs_its_checkpoint_to_exist() {
    // vLLM-style engines take a directory; only tt-worker reads GGUF.
    let files = tempfile::tempdir().unwrap();
    let engine = files.path().join("my-engine");
    write_mode(&engine, "#!/bin/sh\nexit 0\n", 0o755);
    let weights = files.path().join("weights");
    std::fs::create_dir(&weights).unwrap();
    let setup = Setup::new(
        "",
        &model("m", &weights, Some(&engine.display().to_string()), ""),
    );
    let (code, text) = check_config(&setup.config, false, None);
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn a_missing_or_non_executable_worker_is_refused() {
    let files = tempfile::tempdir().unwrap();
    let checkpoint = tiny_model(files.path());
    let plain = files.path().join("worker.sh");
    write_mode(&plain, "#!/bin/sh\n", 0o644);
    let setup = Setup::new(
        "",
        &format!(
            "{}{}{}",
            model("gone", &checkpoint, Some("/opt/nowhere/tt-worker"), ""),
            model("plain", &checkpoint, Some(&plain.display().to_string()), "")
                .replace(&FakeHw::bdf(0), "0000:07:00.0"),
            model("named", &checkpoint, Some("no-such-engine-on-path"), "")
                .replace(&FakeHw::bdf(0), "0000:08:00.0"),
        ),
    );
    setup.assert_problems(&[
        "models.gone.worker: `/opt/nowhere/tt-worker` does not exist; install the worker or fix models.gone.worker",
        &format!(
            "models.plain.worker: `{}` is not executable (mode 0644; `chmod +x {}`",
            plain.display(),
            plain.display()
        ),
        "models.named.worker: `no-such-engine-on-path` is not on PATH (",
    ]);
}

#[test]
fn a_world_readable_or_missing_tokens_file_is_refused() {
    let setup = Setup::new("", "");
    let tokens = setup.path("tokens");
    write_mode(&tokens, "s3cret-token\n", 0o644);
    let config = std::fs::read_to_string(&setup.config).unwrap();
    std::fs::write(
        &setup.config,
        format!(
            "{config}\n[inference]\ntokens_file = \"{}\"\n",
            tokens.display()
        ),
    )
    .unwrap();
    let text = setup.assert_problems(&[&format!(
        "inference.tokens_file: {} (inference.tokens_file) has mode 0644, so every local user can read it; restrict it with `chmod o-rwx {}`",
        tokens.display(),
        tokens.display()
    )]);
    assert!(
        !text.contains("s3cret-token"),
        "a token was printed: {text}"
    );
    std::fs::remove_file(&tokens).unwrap();
    setup.assert_problems(&[&format!(
        "inference.tokens_file: cannot open {} (inference.tokens_file)",
        tokens.display()
    )]);
}

#[test]
fn groups_that_do_not_exist_are_named() {
    let setup = Setup::new(
        "control_socket_group = \"tt-no-such-group\"\ncontrol_admin_group = \"tt-no-such-admins\"\n",
        "",
    );
    setup.assert_problems(&[
        "daemon.control_socket_group: group `tt-no-such-group` (daemon.control_socket_group) does not exist; create it (groupadd tt-no-such-group) or change the config",
        "daemon.control_admin_group: group `tt-no-such-admins` (daemon.control_admin_group) does not exist",
    ]);
}

#[test]
fn a_regular_file_or_a_directory_at_the_control_socket_is_refused() {
    let setup = Setup::new("", "");
    let socket = setup.path("control.sock");
    std::fs::write(&socket, "").unwrap();
    setup.assert_problems(&[&format!(
        "daemon.control_socket: `{}` exists and is a regular file, not a socket; the daemon binds its control socket there: remove it (`rm {}`) or set daemon.control_socket to a free path",
        socket.display(),
        socket.display()
    )]);
    std::fs::remove_file(&socket).unwrap();
    std::fs::create_dir(&socket).unwrap();
    setup.assert_problems(&[&format!(
        "daemon.control_socket: `{}` exists and is a directory, not a socket; the daemon binds its control socket there: remove it (`rmdir {}`)",
        socket.display(),
        socket.display()
    )]);
    // A stale socket is what a stopped daemon leaves; the daemon replaces it.
    std::fs::remove_dir(&socket).unwrap();
    let _stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let (code, text) = check_config(&setup.config, false, None);
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn every_unknown_key_of_a_table_is_named_with_the_host_problems() {
    let setup = Setup::new(
        "socket = \"/run/x.sock\"\nlog_fromat = \"json\"\n",
        &model(
            "m",
            Path::new("/nonexistent/m.gguf"),
            None,
            "max_inflight = 4\n",
        ),
    );
    let text = setup.assert_problems(&[
        "daemon.socket: unknown field `socket`",
        "daemon.log_fromat: unknown field `log_fromat`",
        "models.m.max_inflight: unknown field `max_inflight`",
        "models.m.checkpoint: `/nonexistent/m.gguf` does not exist",
    ]);
    assert!(text.starts_with("4 problem(s) in "), "{text}");
}

#[test]
fn offline_checks_the_file_alone() {
    let setup = Setup::new(
        "control_admin_group = \"tt-no-such-admins\"\n",
        &model("m", Path::new("/nonexistent/m.gguf"), None, ""),
    );
    setup.assert_problems(&["daemon.control_admin_group:", "models.m.checkpoint:"]);
    let (code, text) = check_config(&setup.config, true, None);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("the file alone, not this host"), "{text}");
}

/// The example passes `--offline` anywhere, and the full check on a host
/// prepared as its header comment says. The host is simulated under a temp
/// dir R: every absolute path in the example's strings, `"/x"`, becomes
/// `"R/x"` (so `/dev`, `/sys`, `/proc` become a fake hardware root laid out
/// at R with the two cards the example names, `/var/lib/...` the checkpoint's
/// place, `/run/...` the socket's), and `PATH` starts with R/bin, where the
/// fake root keeps its `tt-smi`.
#[test]
fn the_example_passes_offline_and_on_a_host_prepared_as_its_comments_say() {
    let out = Command::new(bin("tt-servingd"))
        .arg("print-example-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let example = String::from_utf8(out.stdout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let as_is = dir.path().join("as-is.toml");
    std::fs::write(&as_is, &example).unwrap();
    let (code, text) = check_config(&as_is, true, None);
    assert_eq!(code, Some(0), "{text}");

    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let mapped_text = example.replace("\"/", &format!("\"{}/", host.display()));
    for line in mapped_text.lines() {
        let setting = line.split('#').next().unwrap_or_default();
        assert!(
            !setting.contains("\"/") || setting.contains(&host.display().to_string()),
            "an absolute path was not mapped: {line}"
        );
    }
    let mapped = dir.path().join("mapped.toml");
    std::fs::write(&mapped, &mapped_text).unwrap();
    let fake = tt_fakehw::FakeRoot::create(&host, 2, &bin("tt-fakehw")).unwrap();
    // Every host has /run (the control socket's directory is made in it).
    std::fs::create_dir_all(host.join("run")).unwrap();
    let path_env = format!(
        "{}:{}",
        fake.tt_smi().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // Not prepared yet: the checkpoint is missing, and the check says so.
    let (code, text) = check_config(&mapped, false, Some(&path_env));
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("models.smollm2.checkpoint: `"), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(text.starts_with("1 problem(s) in "), "{text}");

    let checkpoint = host.join("var/lib/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
    std::fs::rename(tiny_model(dir.path()), &checkpoint).unwrap();
    let (code, text) = check_config(&mapped, false, Some(&path_env));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("valid (1 model(s), 1 slot(s))"), "{text}");
}

/// A model spec's firmware and driver minimums (tt-inference-server's
/// `system_requirements`): the fake card runs firmware 19.11.0 on tt-kmd
/// 2.10.0, so a spec asking 19.2.0 / 2.5.0 passes and one asking 20.0 /
/// 3.0 is refused naming the card, the version found and the minimum.
#[test]
fn a_host_below_the_models_firmware_or_driver_minimum_is_refused_by_name() {
    let files = tempfile::tempdir().unwrap();
    let checkpoint = tiny_model(files.path());
    let ok = Setup::new(
        "",
        &model(
            "m",
            &checkpoint,
            None,
            "[models.m.requires]\nfirmware = \"19.2.0\"\nkmd = \"2.5.0\"",
        ),
    );
    let (code, text) = check_config(&ok.config, false, None);
    assert_eq!(code, Some(0), "{text}");
    let short = Setup::new(
        "",
        &model(
            "m",
            &checkpoint,
            None,
            "[models.m.requires]\nfirmware = \"20.0\"\nkmd = \"3.0.0\"",
        ),
    );
    short.assert_problems(&[
        "models.m.requires.firmware",
        &format!(
            "card {} runs firmware bundle 19.11.0, below the 20.0.0",
            FakeHw::bdf(0)
        ),
        "models.m.requires.kmd",
        "the tenstorrent driver is 2.10.0, below the tt-kmd 3.0.0",
    ]);
}

/// Hugepages: the host's 1 GiB reservation against what the models' slots
/// need together (hugepages_per_card for each card, 4 by default).
#[test]
fn slots_that_need_more_hugepages_than_the_host_reserved_are_refused_naming_both() {
    let files = tempfile::tempdir().unwrap();
    let checkpoint = tiny_model(files.path());
    let setup = Setup::new("", &model("m", &checkpoint, None, ""));
    let pages = setup
        ._hw
        .root
        .sys_root()
        .join("kernel/mm/hugepages/hugepages-1048576kB");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(pages.join("nr_hugepages"), "2\n").unwrap();
    setup.assert_problems(&[
        "models.m.hugepages_per_card",
        "the models need 4 1 GiB hugepages together (m 4;",
        "the host has 2 reserved",
    ]);
    std::fs::write(pages.join("nr_hugepages"), "4\n").unwrap();
    let (code, text) = check_config(&setup.config, false, None);
    assert_eq!(code, Some(0), "{text}");
}

/// RAM: hugepages come out of the host's RAM, and what they leave must
/// hold the engines' own processes: a reservation that leaves less than
/// `host.ram_floor_mib` is refused naming the numbers (the field's host:
/// 15 GB, 10 of them in hugepages).
#[test]
fn hugepages_that_leave_less_ram_than_the_floor_are_refused_naming_the_numbers() {
    let files = tempfile::tempdir().unwrap();
    let checkpoint = tiny_model(files.path());
    let table = model("m", &checkpoint, None, "");
    let setup = Setup::new("", &format!("{table}\n[host]\nram_floor_mib = 6144\n"));
    let pages = setup
        ._hw
        .root
        .sys_root()
        .join("kernel/mm/hugepages/hugepages-1048576kB");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(pages.join("nr_hugepages"), "4\n").unwrap();
    std::fs::write(
        setup._hw.root.proc_root().join("meminfo"),
        "MemTotal:        8388608 kB\nMemFree:  1000 kB\nMemAvailable:    3000000 kB\n",
    )
    .unwrap();
    let text = setup.assert_problems(&[
        "host.ram_floor_mib",
        "the host has 8192 MiB of RAM and 4 GiB of it go to 1 GiB hugepages (the slots need 4, the host reserved 4): 4096 MiB are left",
        "below host.ram_floor_mib (6144 MiB)",
    ]);
    assert!(
        !text.contains("hugepages_per_card:"),
        "the pages suffice: {text}"
    );
    // The default floor (4 GiB) holds.
    let lower = Setup::new("", &table);
    std::fs::create_dir_all(
        lower
            ._hw
            .root
            .sys_root()
            .join("kernel/mm/hugepages/hugepages-1048576kB"),
    )
    .unwrap();
    std::fs::write(
        lower
            ._hw
            .root
            .sys_root()
            .join("kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"),
        "4\n",
    )
    .unwrap();
    std::fs::write(
        lower._hw.root.proc_root().join("meminfo"),
        "MemTotal:        8388608 kB\nMemAvailable:    3000000 kB\n",
    )
    .unwrap();
    let (code, text) = check_config(&lower.config, false, None);
    assert_eq!(code, Some(0), "{text}");
}

/// A control socket whose directory does not exist, nor its parent, is a
/// mistyped path: `check-config` refuses it naming the fix, and the daemon
/// does not create the tree (it refuses to start with the same words). One
/// missing level (systemd's RuntimeDirectory) is the daemon's to create.
#[test]
fn a_control_socket_in_a_missing_tree_is_refused_not_created() {
    let files = tempfile::tempdir().unwrap();
    let checkpoint = tiny_model(files.path());
    let setup = Setup::new("", &model("m", &checkpoint, None, ""));
    let text = std::fs::read_to_string(&setup.config).unwrap();
    let socket = text
        .lines()
        .find_map(|l| l.strip_prefix("control_socket = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let typo = setup.dir.path().join("runn/tt-serving/control.sock");
    std::fs::write(&setup.config, text.replace(&socket, typo.to_str().unwrap())).unwrap();
    setup.assert_problems(&[
        "daemon.control_socket",
        "does not exist, nor does",
        "the daemon would create that whole tree",
        "mkdir -p",
    ]);
    let run = Command::new(bin("tt-servingd"))
        .args(["run", "--config"])
        .arg(&setup.config)
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("the daemon would create that whole tree"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        !setup.dir.path().join("runn").exists(),
        "nothing was created"
    );
    // One level down from a directory that exists is fine.
    let one = setup.dir.path().join("run-tt/control.sock");
    std::fs::write(&setup.config, text.replace(&socket, one.to_str().unwrap())).unwrap();
    let (code, out) = check_config(&setup.config, false, None);
    assert_eq!(code, Some(0), "{out}");
}
