//! Preflight: what `check-config` checks on the host, beyond the text: that the files,
//! programs, groups and cards a config names are there and usable, so a
//! config it accepts is one the daemon will start with (and whose slots can
//! start). Each check uses the rule the daemon itself applies (the secret
//! file reader, the env file parser, the group lookup, the worker command),
//! so `check-config` and startup cannot disagree.
//!
//! Checks run as the user who runs `check-config`; run it as the daemon's
//! user (root under the NixOS module) to see what the daemon will see.

mod container;
mod gguf;

use crate::config::{Config, DaemonConfig, ModelConfig, Problem};
use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use tt_worker_contract::subprocess::find_program;

/// What a check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The text alone: syntax, types, unknown keys, ranges, cross-field
    /// rules. Gives the same answer on every machine.
    Offline,
    /// Also this host: files, modes, groups, programs, the GGUF header and
    /// size, the daemon's directories, and the cards when the driver is
    /// loaded.
    Host,
}

/// Check config text as `scope` says, collecting every problem: the text's
/// first, then the host's.
pub fn check(text: &str, scope: Scope) -> crate::config::Checked {
    let mut checked = crate::config::check(text);
    if scope == Scope::Host {
        if let Some(config) = &checked.config {
            // A key already wrong in the text (a relative path, an empty
            // name) would only be reported again, less clearly.
            let offline: BTreeSet<String> =
                checked.problems.iter().map(|p| p.key.clone()).collect();
            let found = check_host(config, &checked.untyped);
            checked
                .problems
                .extend(found.into_iter().filter(|p| !offline.contains(&p.key)));
        }
    }
    checked
}

fn problem(key: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem {
        key: key.into(),
        message: message.into(),
    }
}

/// Every host problem of `config`. Sections in `untyped` (their text could
/// not be typed, so `config` holds defaults there) are not checked.
fn check_host(config: &Config, untyped: &BTreeSet<String>) -> Vec<Problem> {
    let read = |section: &str| !untyped.contains(section);
    let mut problems = Vec::new();
    if read("daemon") {
        check_control_socket(&config.daemon.control_socket, &mut problems);
        check_groups(&config.daemon, &mut problems);
        problems.extend(check_directories(config));
    }
    if read("hardware") {
        let tt_smi = config.hardware.tt_smi.to_string_lossy();
        match find_program(&tt_smi) {
            Err(why) => problems.push(problem(
                "hardware.tt_smi",
                format!("{why}; install tt-smi (on NixOS: hardware.tenstorrent.enable = true) or set hardware.tt_smi to its path"),
            )),
            Ok(_) => {
                if let Err(why) = crate::cards::driver::check_tt_smi(&config.hardware.tt_smi) {
                    problems.push(problem("hardware.tt_smi", why));
                }
            }
        }
        let hw = crate::cards::discovery::HardwareRoot::from(&config.hardware);
        if let crate::cards::driver::DriverStatus::Refused(why) =
            crate::cards::driver::driver_status(&hw)
        {
            problems.push(problem("hardware.sys_root", why));
        }
        // Without the driver no card can be found; the caller says so.
        if hw.driver_loaded() {
            problems.extend(crate::cards::check_cards_exist(config, &hw));
            problems.extend(crate::cards::check_requirements(config, &hw));
            problems.extend(crate::host_memory::check(config, &hw));
        }
    }
    if read("reset") {
        if let Some(program) = config.reset.probe_command.first() {
            if let Err(why) = find_program(program) {
                problems.push(problem(
                    "reset.probe_command",
                    format!("{why}; install the probe or fix reset.probe_command (an empty list runs no probe)"),
                ));
            }
        }
    }
    if read("inference") {
        check_inference(config, &mut problems);
    }
    for (name, model) in &config.models {
        check_model(name, model, &mut problems);
    }
    problems
}

/// The control socket's path must be free or hold a (stale) socket: the
/// daemon binds a new socket there and replaces nothing else.
fn check_control_socket(path: &Path, problems: &mut Vec<Problem>) {
    // Absent (or not visible to this user): the daemon creates it.
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    let shown = path.display();
    let kind = meta.file_type();
    let (what, remove) = if kind.is_socket() {
        return;
    } else if kind.is_symlink() {
        let target = std::fs::read_link(path)
            .map(|t| format!(" to {}", t.display()))
            .unwrap_or_default();
        (format!("a symbolic link{target}"), "rm")
    } else if kind.is_dir() {
        ("a directory".to_string(), "rmdir")
    } else if kind.is_file() {
        ("a regular file".to_string(), "rm")
    } else {
        ("a FIFO or device node".to_string(), "rm")
    };
    problems.push(problem(
        "daemon.control_socket",
        format!("`{shown}` exists and is {what}, not a socket; the daemon binds its control socket there: remove it (`{remove} {shown}`) or set daemon.control_socket to a free path"),
    ));
}

fn check_groups(d: &DaemonConfig, problems: &mut Vec<Problem>) {
    for (key, group) in [
        ("daemon.control_socket_group", &d.control_socket_group),
        ("daemon.control_admin_group", &d.control_admin_group),
    ] {
        if let Some(name) = group {
            if let Err(e) = crate::api::group_id(name, key) {
                problems.push(problem(key, format!("{e:#}")));
            }
        }
    }
}

/// The directories the daemon creates and writes (state, lock, cache and
/// socket dirs) must be writable only by trusted users, by the same rule
/// the daemon applies at startup (`hostfs`).
fn check_directories(config: &Config) -> Vec<Problem> {
    crate::hostfs::check_daemon_dirs(config)
        .into_iter()
        .map(|e| {
            problem(
                e.key.clone(),
                format!("{}: {}; {}", e.path.display(), e.problem, e.fix),
            )
        })
        .collect()
}

/// The tokens file and the TLS files, read as the daemon reads them at
/// startup.
fn check_inference(config: &Config, problems: &mut Vec<Problem>) {
    let i = &config.inference;
    if let Some(path) = &i.tokens_file {
        if let Err(e) = crate::api::tokens::Tokens::load(path) {
            problems.push(problem("inference.tokens_file", format!("{e:#}")));
        }
    }
    if let (Some(cert), Some(key)) = (&i.tls_cert, &i.tls_key) {
        // The key's rule first, so a problem is named at its own key; then
        // the pair as the daemon loads it.
        if let Err(e) = crate::secrets::read(key, "inference.tls_key") {
            problems.push(problem("inference.tls_key", format!("{e:#}")));
        } else if let Err(e) = crate::api::tls::load(cert, key) {
            problems.push(problem("inference.tls_cert", format!("{e:#}")));
        }
    }
}

fn check_model(name: &str, m: &ModelConfig, problems: &mut Vec<Problem>) {
    let key = |field: &str| format!("models.{name}.{field}");
    let command = crate::worker::command_for(m);
    let program = command.first().map(String::as_str).unwrap_or_default();
    if let Err(why) = find_program(program) {
        let fix = if m.worker.is_empty() {
            format!(
                "the default worker is tt-worker next to tt-servingd: install it there or set {}",
                key("worker")
            )
        } else {
            format!("install the worker or fix {}", key("worker"))
        };
        problems.push(problem(key("worker"), format!("{why}; {fix}")));
    }
    // tt-worker loads one GGUF file; other engines (vLLM and the like) take
    // a file or a directory in their own format, so only its existence is
    // theirs to share.
    for why in container::problems(&command) {
        problems.push(problem(key("worker"), why));
    }
    let gguf_engine = Path::new(program).file_name() == Some("tt-worker".as_ref());
    check_checkpoint(&key("checkpoint"), &m.checkpoint, gguf_engine, problems);
    if let Some(path) = &m.env_file {
        if let Err(e) = crate::worker::env_file::load(path, &key("env_file")) {
            problems.push(problem(key("env_file"), e));
        }
    }
    // Read as the start reads them (`readiness.accuracy`), so a task file
    // that would fail a start fails the check instead.
    for (task, gate) in &m.accuracy {
        if let Some(file) = gate.file.as_ref().filter(|f| f.is_absolute()) {
            if let Err(e) = tt_serving_proto::accuracy::read_task(file) {
                problems.push(problem(key(&format!("accuracy.{task}.file")), e));
            }
        }
    }
}

fn check_checkpoint(key: &str, path: &Path, gguf_engine: bool, problems: &mut Vec<Problem>) {
    let shown = path.display();
    let found = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            problems.push(problem(
                key,
                format!("`{shown}` does not exist; put the model's checkpoint there or fix {key}"),
            ));
            return;
        }
        Err(e) => {
            problems.push(problem(
                key,
                format!("cannot read `{shown}` ({e}); check the path and that the daemon's user may read it"),
            ));
            return;
        }
    };
    if !gguf_engine {
        return;
    }
    let result = if found.is_dir() {
        Err(format!(
            "`{shown}` is a directory; tt-worker loads one GGUF file: point {key} at the model's .gguf file"
        ))
    } else {
        gguf::check(path, key)
    };
    if let Err(message) = result {
        problems.push(problem(key, message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_MODEL: &str =
        "[models.qwen]\ntp = 1\ncards = [\"0000:01:00.0\"]\ncheckpoint = \"/m/q.gguf\"\n";

    #[test]
    fn host_checks_skip_what_the_text_already_got_wrong() {
        // A section that could not be typed holds defaults: checking the host
        // for them (tt-smi on PATH, /sys) would report what the file never said.
        let checked = check(
            "[hardware]\nsys_root = 5\ntt_smi = \"/nonexistent/tt-smi\"\n",
            Scope::Host,
        );
        let keys: Vec<&str> = checked.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["hardware.sys_root"], "{:?}", checked.problems);
        // A key wrong in the text is reported once, by the text's rule.
        let checked = check(&ONE_MODEL.replace("/m/q.gguf", "q.gguf"), Scope::Host);
        let at_checkpoint: Vec<&Problem> = checked
            .problems
            .iter()
            .filter(|p| p.key == "models.qwen.checkpoint")
            .collect();
        assert_eq!(at_checkpoint.len(), 1, "{:?}", checked.problems);
        assert!(at_checkpoint[0].message.contains("relative path"));
    }

    #[test]
    fn a_task_file_is_read_as_the_start_reads_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let good = dir.path().join("good.jsonl");
        std::fs::write(&good, "{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n").unwrap();
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, "{\"prompt\": \"2+2=\"}\n").unwrap();
        let missing = dir.path().join("missing.jsonl");
        let text = format!(
            "{ONE_MODEL}[models.qwen.accuracy.good]\npass_mark = \"1/1\"\nfile = \"{}\"\n\
             [models.qwen.accuracy.bad]\npass_mark = \"1/1\"\nfile = \"{}\"\n\
             [models.qwen.accuracy.missing]\npass_mark = \"1/1\"\nfile = \"{}\"\n",
            good.display(),
            bad.display(),
            missing.display()
        );
        let checked = check(&text, Scope::Host);
        let at = |task: &str| {
            checked
                .problems
                .iter()
                .find(|p| p.key == format!("models.qwen.accuracy.{task}.file"))
                .map(|p| p.message.clone())
        };
        assert_eq!(at("good"), None, "{:?}", checked.problems);
        assert!(
            at("bad").is_some_and(|m| m.contains("line 1: no \"answer\"")),
            "{:?}",
            checked.problems
        );
        assert!(
            at("missing").is_some_and(|m| m.contains("cannot read the task file")),
            "{:?}",
            checked.problems
        );
    }
}
