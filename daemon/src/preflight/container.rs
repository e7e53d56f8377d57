//! `check-config` for a worker that runs its engine in a container
//! (`tt-worker-openai ... -- podman run ...` or `docker run`): the bind
//! sources must exist (the runtime fails the start on a missing one, or,
//! with Docker's `-v`, creates an empty root-owned directory in its place),
//! the slot's cards go in as `{devices}` (one `--device` per card) never as
//! the whole `/dev/tenstorrent` or `--privileged` (either lets the
//! container open another slot's cards), and an image whose own entrypoint
//! cannot run the slot's engine is given `--entrypoint`.

use std::path::Path;

/// Images whose entrypoint is tt-inference-server's launcher
/// (`ENTRYPOINT ["/bin/bash", "-c", "source ... && exec python
/// run_vllm_api_server.py \"$@\"", "--"]`, tt-inference-server
/// `vllm-tt-metal/vllm.tt-metal.src.dev.Dockerfile:246` at 11ac526e): it
/// requires `--tt-device` (argparse exits 2 without it, `:46-51`) and runs
/// the model spec it looks up, not the command the worker gives.
const LAUNCHER_IMAGES: &[&str] = &["tt-inference-server/vllm-tt-metal"];

/// The container run in a worker command, if there is one: the arguments
/// after `--` when the engine program is podman or docker and its verb is
/// `run`.
fn container_run(worker: &[String]) -> Option<&[String]> {
    let dashes = worker.iter().position(|a| a == "--")?;
    let engine = &worker[dashes + 1..];
    let program = Path::new(engine.first()?).file_name()?.to_str()?;
    (matches!(program, "podman" | "docker") && engine.get(1).is_some_and(|v| v == "run"))
        .then(|| &engine[2..])
}

/// The problems of a container run in `worker` (messages for the model's
/// `worker` key).
pub fn problems(worker: &[String]) -> Vec<String> {
    let Some(run) = container_run(worker) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for source in bind_sources(run) {
        // Placeholders are filled at each start; named volumes are the
        // runtime's own.
        if source.contains('{') || !source.starts_with('/') {
            continue;
        }
        if std::fs::symlink_metadata(&source).is_err() {
            problems.push(format!(
                "the container binds {source}, which does not exist; create it or fix the bind (the runtime would fail the start, or Docker create an empty directory there)"
            ));
        }
    }
    for (i, a) in run.iter().enumerate() {
        let value = if a == "--device" {
            run.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix("--device=")
        };
        if let Some(device) = value {
            let host = device.split(':').next().unwrap_or_default();
            if host.trim_end_matches('/') == "/dev/tenstorrent" {
                problems.push(
                    "the container is given the whole /dev/tenstorrent: it could open every card, other slots' too; give `{devices}` (one --device per slot card, read at each start)".to_string(),
                );
            }
        }
        if a == "--privileged" || a == "--privileged=true" {
            problems.push(
                "the container runs --privileged: it sees every device on the host, other slots' cards too; give the slot's cards with `{devices}` instead".to_string(),
            );
        }
    }
    let entrypoint = run
        .iter()
        .any(|a| a == "--entrypoint" || a.starts_with("--entrypoint="));
    if !entrypoint {
        if let Some(image) = run
            .iter()
            .find(|a| LAUNCHER_IMAGES.iter().any(|l| a.contains(l)))
        {
            problems.push(format!(
                "image {image} starts tt-inference-server's launcher (run_vllm_api_server.py), which exits at argument parsing without --tt-device and serves its own model spec, not this command: give --entrypoint with the image's Python (/home/container_app_user/tt-metal/python_env/bin/python) and run `-m vllm.entrypoints.openai.api_server` (docs/ENGINES.md, \"From a container image\")"
            ));
        }
    }
    problems
}

/// The host paths of `-v SRC:DST[:OPTS]`, `--volume`, and `--mount
/// type=bind,src=SRC,...` (also `source=`).
fn bind_sources(run: &[String]) -> Vec<String> {
    let mut sources = Vec::new();
    for (i, a) in run.iter().enumerate() {
        let next = || run.get(i + 1).cloned();
        let volume = match a.as_str() {
            "-v" | "--volume" => next(),
            _ => a
                .strip_prefix("--volume=")
                .or_else(|| a.strip_prefix("-v="))
                .map(String::from),
        };
        if let Some(v) = volume {
            if let Some((source, _)) = v.split_once(':') {
                sources.push(source.to_string());
            }
            continue;
        }
        let mount = match a.as_str() {
            "--mount" => next(),
            _ => a.strip_prefix("--mount=").map(String::from),
        };
        if let Some(m) = mount {
            let fields: Vec<&str> = m.split(',').collect();
            let is_bind = fields.contains(&"type=bind");
            let source = fields
                .iter()
                .find_map(|f| f.strip_prefix("src=").or_else(|| f.strip_prefix("source=")));
            if let (true, Some(source)) = (is_bind, source) {
                sources.push(source.to_string());
            }
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_container_run_is_checked_for_binds_devices_and_the_launcher_entrypoint() {
        let dir = tempfile::tempdir().expect("dir");
        let present = dir.path().display().to_string();
        let worker = argv(&[
            "tt-worker-openai", "--engine", "vllm-tt", "--container", "c", "--",
            "podman", "run", "--name", "c", "--device", "/dev/tenstorrent",
            "-v", &format!("{present}:/x:ro"), "-v", "/no/such/dir:/y",
            "--mount", "type=bind,src=/no/hugepages,dst=/dev/hugepages-1G",
            "-v", "{cache_dir}:/c", "-v", "named:/n",
            "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.19.0",
            "--model", "{checkpoint}",
        ]);
        let found = problems(&worker);
        let has = |needle: &str| found.iter().any(|p| p.contains(needle));
        assert!(has("binds /no/such/dir"), "{found:?}");
        assert!(has("binds /no/hugepages"), "{found:?}");
        assert!(
            !has(&present) && !has("named") && !has("{cache_dir}"),
            "{found:?}"
        );
        assert!(has("whole /dev/tenstorrent"), "{found:?}");
        assert!(has("--tt-device") && has("--entrypoint"), "{found:?}");
        assert_eq!(found.len(), 4, "{found:?}");

        let fixed = argv(&[
            "w",
            "--",
            "docker",
            "run",
            "{devices}",
            "--entrypoint",
            "/p/python",
            "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src:1",
            "-m",
            "vllm",
        ]);
        assert!(problems(&fixed).is_empty());
        // Not a container: nothing to check here.
        assert!(problems(&argv(&["w", "--", "python", "-v", "/no:/x"])).is_empty());
    }
}
