//! The tensor cache against the real runtime: the vLLM stand-in builds and
//! loads a tt_transformers-shaped cache with the real ttnn 0.81.1 from PyPI
//! (`TT_TTNN_PYTHON`, from `scripts/ttnn.sh`; mock cluster, no card), so
//! its files, its in-place rebuild of a file it cannot load and its log
//! lines are ttnn's own (docs/HARDWARE.md). Through the daemon, with
//! tt-worker-openai's `vllm-tt` preset in front.

use serde_json::Value;
use std::path::{Path, PathBuf};
use tt_serving_tests::{bin, real_ttnn, standin, wait_until, Daemon, DaemonOptions, FakeHw};

/// Slot `m` on card 0: the stand-in under `python` writing `layers`
/// layers through ttnn; `env` adds entries to the model's env table.
fn table(python: &Path, checkpoint: &Path, env: &str) -> String {
    format!(
        "\n[models.m]\ntp = 1\ncards = [\"{card}\"]\ncheckpoint = \"{checkpoint}\"\nworker = [\"{worker}\", \"--engine\", \"vllm-tt\", \"--stop-timeout-secs\", \"2\", \"--\", \"{python}\", \"{standin}\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"--max-model-len\", \"4096\", \"--max-num-seqs\", \"8\"]\ndrain_timeout_secs = 5\nenv = {{ STANDIN_TT_CACHE = \"2\", STANDIN_TT_CACHE_ENGINE = \"ttnn\"{env} }}\n[models.m.restart]\nmax_attempts = 1\nstop_timeout_secs = 5\n",
        card = FakeHw::bdf(0),
        checkpoint = checkpoint.display(),
        worker = bin("tt-worker-openai").display(),
        python = python.display(),
        standin = standin().display(),
    )
}

fn start(hw: &FakeHw, extra: String) -> Daemon {
    Daemon::start(
        hw,
        DaemonOptions {
            extra,
            ..Default::default()
        },
    )
}

/// Slot `m` once Ready or Failed.
fn settled(daemon: &Daemon) -> Value {
    wait_until("slot m to be ready or failed", || {
        let slot = daemon.slot("m");
        (slot["state"] == "ready" || slot["state"] == "failed").then_some(slot)
    })
}

fn ready(daemon: &Daemon, mode: &str) -> Value {
    let slot = settled(daemon);
    assert_eq!(slot["state"], "ready", "{slot:#}");
    assert_eq!(slot["cache_mode"], mode, "{slot:#}");
    slot
}

/// `ttctl cache ls --json`'s variants of model `m`.
fn variants(daemon: &Daemon) -> Vec<Value> {
    let out = daemon.ttctl(&["cache", "ls", "--json"]);
    let listing: Value = serde_json::from_slice(&out.stdout).expect("cache ls --json");
    listing["variants"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v["model"] == "m")
        .collect()
}

/// The worker lines of the daemon's log since `from` bytes.
fn log_since(daemon: &Daemon, from: usize) -> String {
    daemon
        .log_text()
        .get(from..)
        .unwrap_or_default()
        .to_string()
}

/// Layer 0's bfloat8_b weights file under the variant.
fn wqkv(variant_dir: &Path) -> PathBuf {
    variant_dir.join(
        "weights/P150/tensor_cache_bfp8/layers.0.attention.wqkv_dtype_BFLOAT8_B_layout_TILE.tensorbin",
    )
}

#[test]
fn a_real_ttnn_cache_builds_cold_loads_warm_and_any_rebuild_of_a_cached_file_is_refused() {
    let Some(python) = real_ttnn() else { return };
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model");
    std::fs::write(&ckpt, "weights").unwrap();
    let plain = table(&python, &ckpt, "");

    // Cold: ttnn generates every file; the marker certifies them.
    let mut daemon = start(&hw, plain.clone());
    let slot = ready(&daemon, "cold");
    let key = slot["cache_variant"].as_str().unwrap().to_string();
    let variant_dir = daemon.dir.join("cache/m").join(&key);
    let log = daemon.log_text();
    assert!(log.contains("Generating cache for"), "ttnn's own line");
    assert!(wqkv(&variant_dir).is_file());

    // Warm: ttnn loads every file and writes none.
    let mark = daemon.log_text().len();
    daemon.restart_with(&hw, plain.clone());
    ready(&daemon, "warm");
    let log = log_since(&daemon, mark);
    assert!(log.contains("Loaded cache for"), "ttnn's own line");
    assert!(
        log.contains("standin tt-cache tensor_cache_bfp8/layers.0.attention.wqkv finite"),
        "{log}"
    );

    // The cached file's header damaged during a warm start (same size):
    // ttnn says it failed to load it and rebuilds it in place from the
    // placeholder. Refused, quoting ttnn, and the variant goes cold.
    for damage in ["header", "truncate"] {
        let mark = daemon.log_text().len();
        daemon.restart_with(
            &hw,
            table(
                &python,
                &ckpt,
                &format!(", STANDIN_TT_CACHE_DAMAGE = \"{damage}\""),
            ),
        );
        let slot = settled(&daemon);
        let reason = slot["reason"].as_str().unwrap_or_default();
        assert_eq!(slot["state"], "failed", "{damage}: {slot:#}");
        assert!(
            reason.contains("warm start refused")
                && reason.contains("Failed to load cache for")
                && reason.contains("layers.0.attention.wqkv"),
            "{damage}: ttnn's line quoted: {reason}"
        );
        assert!(
            reason.contains("cached files changed during the warm start")
                && reason.contains("was replaced"),
            "{damage}: the guard saw the file rebuilt: {reason}"
        );
        assert!(reason.contains("invalidated"), "{reason}");
        assert!(
            log_since(&daemon, mark)
                .contains("standin tt-cache tensor_cache_bfp8/layers.0.attention.wqkv nan"),
            "{damage}: the trap was real: ttnn rebuilt the file from NaNs"
        );
        let listed = variants(&daemon);
        let v = listed.iter().find(|v| v["key"] == key.as_str()).unwrap();
        assert_eq!(v["state"], "cold", "{damage}: never warm again: {v:#}");

        // The next start builds it cold, from real weights, and serves.
        let mark = daemon.log_text().len();
        daemon.restart_with(&hw, plain.clone());
        let slot = ready(&daemon, "cold");
        assert_eq!(
            slot["cache_variant"],
            key.as_str(),
            "the same variant, rebuilt"
        );
        assert!(log_since(&daemon, mark)
            .contains("standin tt-cache tensor_cache_bfp8/layers.0.attention.wqkv finite"));
    }

    // Truncated while the daemon was down: the stamps differ before the
    // start, so it is cold and says which file.
    daemon.terminate();
    let path = wqkv(&variant_dir);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let mark = daemon.log_text().len();
    daemon.spawn(&[]);
    ready(&daemon, "cold");
    let log = log_since(&daemon, mark);
    assert!(
        log.contains("layers.0.attention.wqkv_dtype_BFLOAT8_B_layout_TILE.tensorbin has")
            && log.contains("bytes, the marker says"),
        "why it is cold, naming the file: {log}"
    );

    // Same size, rewritten while the daemon was down: cold too.
    daemon.terminate();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let mark = daemon.log_text().len();
    daemon.spawn(&[]);
    ready(&daemon, "cold");
    assert!(log_since(&daemon, mark).contains("written after the build"));
}

/// A marker-only distribution of `ttnn` at `version`, found before the
/// real one on PYTHONPATH: the engine's Python then reports that version
/// (importlib.metadata takes the first on sys.path) while `import ttnn`
/// still loads the real package.
fn shadow_ttnn_version(dir: &Path, version: &str) -> PathBuf {
    let site = dir.join(format!("shadow-{version}"));
    let info = site.join(format!("ttnn-{version}.dist-info"));
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(
        info.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: ttnn\nVersion: {version}\n"),
    )
    .unwrap();
    site
}

#[test]
fn an_engine_upgrade_is_a_new_variant_built_cold_once_then_warm() {
    let Some(python) = real_ttnn() else { return };
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model");
    std::fs::write(&ckpt, "weights").unwrap();

    let mut daemon = start(&hw, table(&python, &ckpt, ""));
    let old = ready(&daemon, "cold")["cache_variant"]
        .as_str()
        .unwrap()
        .to_string();
    let listed = variants(&daemon);
    let inputs = &listed.iter().find(|v| v["key"] == old.as_str()).unwrap()["inputs"];
    assert_eq!(inputs["engine python ttnn"], "0.81.1", "{inputs:#}");
    assert_eq!(inputs["engine python tt-umd"], "0.9.14", "{inputs:#}");
    assert_eq!(inputs["engine engine"], "vllm-tt", "{inputs:#}");
    assert_eq!(inputs["cards"], "p150a", "{inputs:#}");
    assert_eq!(inputs["mesh"], "(1,1)", "{inputs:#}");

    // The same tt-metal/ttnn under another version string: the cache it
    // would meet was made by another engine.
    let shadow = shadow_ttnn_version(dir.path(), "0.82.0");
    let upgraded = table(
        &python,
        &ckpt,
        &format!(", PYTHONPATH = \"{}\"", shadow.display()),
    );
    daemon.restart_with(&hw, upgraded.clone());
    let new = ready(&daemon, "cold")["cache_variant"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new, old);
    daemon.restart_with(&hw, upgraded);
    assert_eq!(ready(&daemon, "warm")["cache_variant"], new.as_str());
    let listed = variants(&daemon);
    let inputs = &listed.iter().find(|v| v["key"] == new.as_str()).unwrap()["inputs"];
    assert_eq!(inputs["engine python ttnn"], "0.82.0", "{inputs:#}");
    // Going back finds the old engine's variant warm.
    daemon.restart_with(&hw, table(&python, &ckpt, ""));
    assert_eq!(ready(&daemon, "warm")["cache_variant"], old.as_str());
}

#[test]
fn ttctl_cache_verify_checks_the_content_and_a_changed_byte_makes_the_variant_cold() {
    let Some(python) = real_ttnn() else { return };
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("model");
    std::fs::write(&ckpt, "weights").unwrap();
    let daemon = start(&hw, table(&python, &ckpt, ""));
    let key = ready(&daemon, "cold")["cache_variant"]
        .as_str()
        .unwrap()
        .to_string();
    daemon.wait_log("cache content hashes recorded");
    let out = daemon.ttctl(&["cache", "verify", "m"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("files,") && text.contains("MiB hashed"),
        "progress: {text}"
    );
    assert!(text.contains(&format!("variant {key}: verified")), "{text}");

    // One data byte flipped under the running slot (a stray writer): ttnn
    // would load it without a word; the hashes name it now, and the
    // variant is cold from then on.
    let path = wqkv(&daemon.dir.join("cache/m").join(&key));
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let out = daemon.ttctl(&["cache", "verify", "m"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{text}{err}");
    assert!(
        text.contains(&format!("variant {key}: FAILED"))
            && text.contains("layers.0.attention.wqkv")
            && text.contains("has SHA-256"),
        "{text}"
    );
    let listed = variants(&daemon);
    assert_eq!(
        listed.iter().find(|v| v["key"] == key.as_str()).unwrap()["state"],
        "cold"
    );
}
