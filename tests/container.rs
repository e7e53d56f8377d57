//! Container mode on a real container runtime: rootful podman from Debian
//! runs the slot's engine (the vLLM stand-in, on the host's Python bound
//! read-only) in an image built locally by `scripts/podman-image.sh` (no
//! registry exists here), started by `tt-worker-openai --engine vllm-tt
//! --container` with the recipe of docs/ENGINES.md. Checked against what
//! podman ran (`podman inspect`): our entrypoint, the slot's one device
//! node, `--ipc host`, the hugepages and cache binds and nothing else; the
//! container's processes in the slot's cgroup; `kill -9` of the daemon
//! leaves no container; a stop gives the engine its grace.
//!
//! Needs root, `podman`, `runc` and `busybox-static` (.ci/run installs
//! them); skipped without them, except in CI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tt_serving_tests::{
    bin, generate, is_root, standin, tiny_model, ttnn_importable, wait_until, Daemon,
    DaemonOptions, FakeHw,
};

/// The image, built (or found) by the script; None when this host cannot
/// run rootful podman (a panic in CI, where it must).
fn podman_image() -> Option<String> {
    let ci = std::env::var_os("CI").is_some();
    let missing = if !is_root() {
        Some("root")
    } else if Command::new("podman").arg("--version").output().is_err() {
        Some("podman")
    } else {
        None
    };
    if let Some(what) = missing {
        assert!(!ci, "CI must run the container tests: {what} is missing (.ci/run installs podman runc busybox-static)");
        eprintln!("SKIPPED: container mode needs {what}");
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/podman-image.sh");
    let out = Command::new(&script).output().expect("run podman-image.sh");
    assert!(
        out.status.success(),
        "podman-image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// podman's configuration for this host: runc (crun 1.8 refuses a hybrid
/// cgroup host: "cgroups in hybrid mode not supported"), cgroupfs and file
/// events (no systemd), and ulimits within this process's hard limits
/// (podman's default nofile of 1048576 fails without CAP_SYS_RESOURCE:
/// "setrlimit RLIMIT_NOFILE: Operation not permitted").
fn containers_conf(dir: &Path) -> PathBuf {
    // The hard limits, from /proc/self/limits ("Max open files  20000  20000  files").
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let hard = |name: &str| -> u64 {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(1024)
    };
    let nofile = hard("Max open files").min(1 << 20);
    let nproc = hard("Max processes").min(32768);
    let path = dir.join("containers.conf");
    std::fs::write(
        &path,
        format!(
            "[containers]\ndefault_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={nproc}:{nproc}\"]\n\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n"
        ),
    )
    .expect("write containers.conf");
    path
}

struct Recipe {
    name: String,
    table: String,
    hugepages: PathBuf,
    engines: PathBuf,
    cache: PathBuf,
    checkpoint_dir: PathBuf,
}

/// The model table of the ENGINES.md recipe, on card 1 of two.
fn recipe(hw: &FakeHw, image: &str, conf: &Path, checkpoint: &Path, cache: &Path) -> Recipe {
    let name = format!("tt-serving-test-{}", std::process::id());
    let hugepages = hw.root.dev_root().join("hugepages-1G");
    std::fs::create_dir_all(&hugepages).expect("hugepages dir");
    let engines = standin().parent().expect("engines dir").to_path_buf();
    let checkpoint_dir = checkpoint.parent().expect("checkpoint dir").to_path_buf();
    let table = format!(
        r#"
[models.m]
tp = 1
cards = ["{card}"]
checkpoint = "{checkpoint}"
worker = ["{worker}", "--engine", "vllm-tt", "--container", "{name}", "--container-runtime", "podman",
          "--stop-timeout-secs", "30", "--",
          "podman", "run", "--name", "{name}", "--rm", "--cgroups=split", "--network=host", "--ipc", "host",
          "{{devices}}",
          "--mount", "type=bind,src={hugepages},dst=/dev/hugepages-1G",
          "-v", "/usr:/usr:ro", "-v", "{engines}:{engines}:ro", "-v", "{ckpt_dir}:{ckpt_dir}:ro",
          "-v", "{cache}:{cache}",
          "-e", "TT_VISIBLE_DEVICES", "-e", "MESH_DEVICE", "-e", "HF_MODEL", "-e", "TT_CACHE_PATH",
          "-e", "TT_METAL_CACHE", "-e", "PYTHONPATH", "-e", "STANDIN_STOP_SECS",
          "--entrypoint", "/usr/bin/python3", "{image}",
          "{standin}", "serve", "{{checkpoint}}", "--host", "127.0.0.1", "--port", "{{port}}",
          "--max-model-len", "4096"]
drain_timeout_secs = 5
env = {{ CONTAINERS_CONF = "{conf}", PYTHONPATH = "{ttnn}", STANDIN_STOP_SECS = "12" }}
[models.m.restart]
max_attempts = 1
stop_timeout_secs = 45
"#,
        card = FakeHw::bdf(1),
        checkpoint = checkpoint.display(),
        worker = bin("tt-worker-openai").display(),
        hugepages = hugepages.display(),
        engines = engines.display(),
        ckpt_dir = checkpoint_dir.display(),
        cache = cache.display(),
        conf = conf.display(),
        ttnn = ttnn_importable().display(),
        standin = standin().display(),
    );
    Recipe {
        name,
        table,
        hugepages,
        engines,
        cache: cache.to_path_buf(),
        checkpoint_dir,
    }
}

/// `podman inspect NAME`, or None when there is no such container.
fn inspect(name: &str, conf: &Path) -> Option<serde_json::Value> {
    let out = Command::new("podman")
        .env("CONTAINERS_CONF", conf)
        .args(["inspect", "--type", "container", name])
        .output()
        .expect("podman inspect");
    if !out.status.success() {
        return None;
    }
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    all.get(0).cloned()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_slot_runs_its_engine_in_a_podman_container_with_only_its_card_and_leaves_none_behind() {
    let Some(image) = podman_image() else {
        return;
    };
    let hw = FakeHw::with_char_dev_nodes(2);
    let dir = tempfile::tempdir().expect("temp dir");
    let conf = containers_conf(dir.path());
    let checkpoint = tiny_model(dir.path());
    let config_dir = tempfile::tempdir().expect("config dir");
    // The daemon's cache_dir (Daemon::configure), bound at the same path.
    let cache = config_dir.path().join("cache");
    let r = recipe(&hw, &image, &conf, &checkpoint, &cache);
    let mut daemon = Daemon::configure(
        &hw,
        config_dir.path(),
        &DaemonOptions {
            extra: r.table.clone(),
            ..Default::default()
        },
    );
    daemon.spawn(&[]);
    daemon.wait_slot_ready_within("m", Duration::from_secs(120));

    // What podman ran is the recipe: our entrypoint over the image's, the
    // slot's one card (not card 0), host IPC and network, and exactly the
    // binds given.
    let c = inspect(&r.name, &conf).expect("the slot's container exists");
    let create = strings(&c["Config"]["CreateCommand"]);
    let devices: Vec<&String> = create
        .iter()
        .enumerate()
        .filter(|(i, _)| *i > 0 && create[i - 1] == "--device")
        .map(|(_, d)| d)
        .collect();
    let card1 = hw.root.dev_root().join("tenstorrent/1");
    assert_eq!(devices, vec![&card1.display().to_string()], "{create:?}");
    assert!(
        create.windows(2).any(|w| w[0] == "--ipc" && w[1] == "host"),
        "{create:?}"
    );
    assert_eq!(
        c["HostConfig"]["NetworkMode"], "host",
        "{:#}",
        c["HostConfig"]
    );
    assert!(
        c["Config"]["Entrypoint"]
            .to_string()
            .contains("/usr/bin/python3"),
        "{:#}",
        c["Config"]["Entrypoint"]
    );
    let mut mounts: Vec<(String, String)> = c["Mounts"]
        .as_array()
        .expect("Mounts")
        .iter()
        .map(|m| {
            (
                m["Source"].as_str().unwrap_or_default().to_string(),
                m["Destination"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    mounts.sort();
    let path = |p: &Path| p.display().to_string();
    let mut want = vec![
        (path(&r.hugepages), "/dev/hugepages-1G".to_string()),
        ("/usr".to_string(), "/usr".to_string()),
        (path(&r.engines), path(&r.engines)),
        (path(&r.checkpoint_dir), path(&r.checkpoint_dir)),
        (path(&r.cache), path(&r.cache)),
    ];
    want.sort();
    assert_eq!(mounts, want);

    // The image's id keys the cache variant: a new image builds cold.
    let id = Command::new("podman")
        .env("CONTAINERS_CONF", &conf)
        .args(["image", "inspect", "--format", "{{.Id}}", &image])
        .output()
        .expect("podman image inspect");
    let id = String::from_utf8_lossy(&id.stdout).trim().to_string();
    let listing: serde_json::Value =
        serde_json::from_slice(&daemon.ttctl(&["cache", "ls", "--json"]).stdout)
            .expect("cache ls --json");
    let inputs = &listing["variants"][0]["inputs"];
    assert_eq!(
        inputs["engine container image"],
        image.as_str(),
        "{inputs:#}"
    );
    assert_eq!(
        inputs["engine container image id"],
        id.as_str(),
        "{inputs:#}"
    );

    // It serves, and its processes are the slot's: in the slot's cgroup,
    // where the daemon's containment counts and ends them.
    let answer = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(generate(&daemon.inference_address(), "m", "Hello", 3))
        .expect("generation through the container");
    assert!(!answer.text.is_empty(), "{answer:?}");
    let pid = c["State"]["Pid"].as_u64().expect("the container's pid");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    assert!(
        cgroup
            .lines()
            .any(|l| l.starts_with("0::") && l.contains("slot-m")),
        "the container's engine is outside the slot's cgroup:\n{cgroup}"
    );

    // kill -9 of the daemon: its worker's last act removes the container.
    daemon.kill9();
    wait_until(
        "the container to be gone after kill -9 of the daemon",
        || inspect(&r.name, &conf).is_none().then_some(()),
    );
    wait_until("the container's engine to be gone", || {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });

    // Started again (the cards are reset first), then stopped: the engine
    // gets its grace (its teardown takes 12 s, beyond podman's default
    // stop timeout of 10 s) and exits cleanly; no container remains.
    daemon.spawn(&[]);
    daemon.wait_slot_ready_within("m", Duration::from_secs(120));
    assert!(inspect(&r.name, &conf).is_some());
    let began = Instant::now();
    assert_eq!(daemon.terminate(), Some(0));
    let took = began.elapsed();
    assert!(
        took >= Duration::from_secs(12),
        "the stop took {took:?}: the teardown was cut short"
    );
    assert!(
        daemon.log_text().contains("Teardown finished after 12 s"),
        "{}",
        daemon.log_text()
    );
    assert!(inspect(&r.name, &conf).is_none(), "a container remains");
}
