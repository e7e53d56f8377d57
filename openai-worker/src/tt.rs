//! The `vllm-tt` preset: upstream vLLM with Tenstorrent's `vllm-tt-plugin`,
//! as tt-inference-server runs it, with what the plugin refuses refused
//! here first, by name. Each rule cites the plugin (vllm-tt-plugin at
//! e3fc849) or tt-inference-server (11ac526e); docs/ENGINES.md has the
//! table.
//!
//! - The command line: no `--tensor-parallel-size` above 1 (the mesh
//!   comes from MESH_DEVICE), no `--override-tt-config` (gone with the
//!   fork), `--additional-config '{"tt": ...}'` composed from the model's
//!   `[models.X.tt]` table, `--block-size 64` and `--max-num-batched-tokens`
//!   = `--max-model-len` unless given.
//! - The environment: `VLLM_PLUGINS`, when set, must name both of the
//!   plugin's entry points; the launcher's `VLLM_RPC_TIMEOUT` and
//!   `TORCHDYNAMO_DISABLE` unless set; `HF_MODEL` a directory named after
//!   the model (tt_transformers keys its settings by the basename).
//! - Which request parameters push a batch to host sampling.

use crate::cli::UsageError;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use tt_worker_contract::names;
pub use tt_worker_contract::tt_config::{check_tt_table, TT_CACHE_KEYS, TT_KEYS};

/// The plugin's two entry points (vllm-tt-plugin `pyproject.toml:31-35`):
/// the platform (`vllm.platform_plugins`) and its model classes
/// (`vllm.general_plugins`). vLLM loads only the names a set `VLLM_PLUGINS`
/// lists (vLLM 0.25.1 `vllm/plugins/__init__.py:56`): without `tt` it runs
/// on another platform, without `tt_model_registry` the TT architectures
/// are missing ("No TT model architecture is registered").
pub const ENTRY_POINTS: [&str; 2] = ["tt", "tt_model_registry"];

/// The launcher's environment defaults (tt-inference-server
/// `workflows/model_spec.py:547-552`, 11ac526e): vLLM's RPC timeout long
/// enough for a first-use compile, and torch's dynamo off.
pub const ENV_DEFAULTS: [(&str, &str); 2] =
    [("VLLM_RPC_TIMEOUT", "900000"), ("TORCHDYNAMO_DISABLE", "1")];

/// The request parameters that move a batch to host sampling when the
/// engine samples on the device: logprobs (device sampling with logprobs
/// needs 8 or 32 devices), min_tokens (a logits processor), and grammars
/// (`response_format`, and `tools` with a required or named choice) —
/// vllm-tt-plugin `model_runner.py:1767-1813`
/// `check_perform_device_sampling`.
pub const HOST_SAMPLING_PARAMETERS: &[&str] = {
    use tt_serving_proto::parameters as p;
    &[p::MIN_TOKENS, p::LOGPROBS, p::RESPONSE_FORMAT, p::TOOLS]
};

/// What the preset adds to the engine's start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preset {
    /// The engine's command line, completed.
    pub argv: Vec<String>,
    /// The `tt` settings the engine gets (from the table, or the command
    /// line's own `--additional-config`).
    pub tt: Map<String, Value>,
    /// Environment defaults to add (only those the worker's environment
    /// does not set).
    pub env: Vec<(String, String)>,
}

impl Preset {
    /// The request parameters that push a batch to host sampling: none
    /// when the engine samples on the host anyway (no
    /// `sample_on_device_mode`: every request is sampled on the host).
    pub fn host_sampling_parameters(&self) -> Vec<&'static str> {
        if self.tt.contains_key("sample_on_device_mode") {
            HOST_SAMPLING_PARAMETERS.to_vec()
        } else {
            Vec::new()
        }
    }
}

/// The `--additional-config` spellings vLLM's argument parser takes.
const ADDITIONAL_CONFIG: [&str; 2] = ["--additional-config", "--additional_config"];

/// Complete a vLLM-TT command line. `table` is the model's `[models.X.tt]`
/// table as JSON (TT_WORKER_TT_CONFIG), `env` reads the worker's own
/// environment.
pub fn preset(
    mut argv: Vec<String>,
    tp: u32,
    table: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Preset, UsageError> {
    let usage = |m: String| UsageError(format!("--engine vllm-tt: {m}"));
    if let Some(v) = option_value(&argv, &["--tensor-parallel-size", "-tp"]) {
        let size = v.replace("{tp}", &tp.to_string());
        if size != "1" {
            // platform.py:902-905 (an assertion at start).
            return Err(usage(format!(
                "the engine command sets --tensor-parallel-size {v} (= {size}); vllm-tt-plugin refuses it above 1 (\"TT backend does not support distributed execution\"): the mesh comes from MESH_DEVICE, which the daemon sets. Remove the option"
            )));
        }
    }
    for refused in ["--override-tt-config", "--override_tt_config"] {
        if argv
            .iter()
            .any(|a| a == refused || a.starts_with(&format!("{refused}=")))
        {
            return Err(usage(format!(
                "the engine command has {refused}, which upstream vLLM with vllm-tt-plugin does not know (it was the tenstorrent/vllm fork's): put its keys in the model's [models.<name>.tt] table, which becomes --additional-config '{{\"tt\": ...}}'"
            )));
        }
    }
    if let Some(plugins) = env("VLLM_PLUGINS") {
        // vLLM splits on commas, without trimming (envs.py:1064-1068).
        let listed: Vec<&str> = plugins.split(',').collect();
        let missing: Vec<&str> = ENTRY_POINTS
            .iter()
            .copied()
            .filter(|p| !listed.contains(p))
            .collect();
        if !missing.is_empty() {
            return Err(usage(format!(
                "VLLM_PLUGINS={plugins:?} leaves out {}: vLLM loads only the plugins it lists, and vllm-tt-plugin needs both of its entry points ({}); set VLLM_PLUGINS={} or unset it",
                missing.join(" and "),
                ENTRY_POINTS.join(", "),
                ENTRY_POINTS.join(",")
            )));
        }
    }
    let given = option_value(&argv, &ADDITIONAL_CONFIG).map(String::from);
    let tt = match (table, given) {
        (Some(_), Some(_)) => {
            return Err(usage(
                "the model has a [models.<name>.tt] table and the engine command its own --additional-config: give the TT settings in one place (the table)".into(),
            ))
        }
        (Some(table), None) => {
            let tt = parse_tt(table, names::TT_CONFIG)?;
            let mut config = Map::new();
            config.insert("tt".into(), Value::Object(tt.clone()));
            argv.push(ADDITIONAL_CONFIG[0].into());
            argv.push(Value::Object(config).to_string());
            tt
        }
        (None, Some(given)) => {
            let config: Value = serde_json::from_str(&given).map_err(|e| {
                usage(format!(
                    "--additional-config is not JSON ({e}); vLLM would refuse it"
                ))
            })?;
            match config.get("tt") {
                None => Map::new(),
                Some(tt) => parse_tt(&tt.to_string(), "--additional-config's \"tt\"")?,
            }
        }
        (None, None) => Map::new(),
    };
    if option_value(&argv, &["--block-size"]).is_none() {
        argv.extend(["--block-size".to_string(), "64".to_string()]);
    }
    if option_value(&argv, &["--max-num-batched-tokens"]).is_none() {
        if let Some(len) = option_value(&argv, &["--max-model-len"]).map(String::from) {
            argv.extend(["--max-num-batched-tokens".to_string(), len]);
        }
    }
    let env = ENV_DEFAULTS
        .iter()
        .filter(|(name, _)| env(name).is_none())
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    Ok(Preset { argv, tt, env })
}

fn parse_tt(json: &str, origin: &str) -> Result<Map<String, Value>, UsageError> {
    let tt = match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(tt)) => tt,
        // config.py:14-32: "additional_config['tt'] must be a JSON object".
        Ok(_) => {
            return Err(UsageError(format!(
                "--engine vllm-tt: {origin} must be a JSON object (vllm-tt-plugin: \"additional_config['tt'] must be a JSON object\")"
            )))
        }
        Err(e) => {
            return Err(UsageError(format!(
                "--engine vllm-tt: {origin} is not JSON: {e}"
            )))
        }
    };
    check_tt_table(&tt).map_err(|e| UsageError(format!("--engine vllm-tt: {origin}: {e}")))?;
    Ok(tt)
}

/// The value of an engine option given as `--name V` or `--name=V`.
pub fn option_value<'a>(argv: &'a [String], names: &[&str]) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, a)| {
        names.iter().find_map(|n| {
            if a == n {
                argv.get(i + 1).map(String::as_str)
            } else {
                a.strip_prefix(n).and_then(|r| r.strip_prefix('='))
            }
        })
    })
}

/// The model's name as tt_transformers reads it from `HF_MODEL`: the last
/// path component (`HF_MODEL.strip("/").split("/")[-1]`, tt-metal
/// `models/tt_transformers/tt/model_config.py` at 0039cbf), which keys its
/// model-specific settings (prefill chunk sizes per device, warm-up caps).
/// A Hugging Face cache's snapshot (`.../models--ORG--NAME/snapshots/HASH`)
/// would make it the hash and lose them: its name is then NAME.
pub fn model_name(checkpoint: &str) -> Option<String> {
    let path = Path::new(checkpoint.trim_end_matches('/'));
    let parent = path.parent()?;
    if parent.file_name()? == "snapshots" {
        let repo = parent.parent()?.file_name()?.to_str()?;
        let name = repo.strip_prefix("models--")?.rsplit("--").next()?;
        return (!name.is_empty()).then(|| name.to_string());
    }
    None
}

/// Where the worker puts the link named after the model when the
/// checkpoint is a snapshot: beside the cache variant (in the model's
/// cache directory, which a container recipe mounts at the same path), as
/// tt-inference-server keeps its `model_file_symlinks_map` under its cache
/// root (`run_vllm_api_server.py:403-418`).
pub fn hf_model_link(cache_dir: &Path, name: &str) -> Option<PathBuf> {
    let parent = cache_dir.parent()?;
    let variant = cache_dir.file_name()?;
    let mut dir = std::ffi::OsString::from("hf-model-");
    dir.push(variant);
    Some(parent.join(dir).join(name))
}

/// Make `link` a symbolic link to `target`, replacing only a link of ours:
/// the directory is created (never followed if it is a link), and the link
/// is written under a temporary name and renamed over the old one.
pub fn place_link(link: &Path, target: &Path) -> Result<(), String> {
    let dir = link
        .parent()
        .ok_or_else(|| format!("{} has no directory", link.display()))?;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(format!(
                "{} is not a directory (a link or a file is there); remove it",
                dir.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    }
    if std::fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    if let Ok(m) = std::fs::symlink_metadata(link) {
        if !m.file_type().is_symlink() {
            return Err(format!(
                "{} is there and is not a link; remove it so HF_MODEL can name the model",
                link.display()
            ));
        }
    }
    let temporary = dir.join(format!(".link.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    std::os::unix::fs::symlink(target, &temporary)
        .and_then(|()| std::fs::rename(&temporary, link))
        .map_err(|e| {
            format!(
                "cannot link {} to {}: {e}",
                link.display(),
                target.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_table_becomes_additional_config_and_the_fork_option_is_refused() {
        let p = preset(
            argv(&["vllm", "--max-model-len", "4096"]),
            1,
            Some(r#"{"sample_on_device_mode": "decode_only", "trace_region_size": 56000000}"#),
            no_env,
        )
        .expect("accepted");
        let at = p
            .argv
            .iter()
            .position(|a| a == "--additional-config")
            .expect("added");
        let config: Value = serde_json::from_str(&p.argv[at + 1]).expect("json");
        assert_eq!(config["tt"]["trace_region_size"], 56000000);
        assert_eq!(
            option_value(&p.argv, &["--max-num-batched-tokens"]),
            Some("4096")
        );
        assert_eq!(option_value(&p.argv, &["--block-size"]), Some("64"));
        assert!(p.host_sampling_parameters().contains(&"logprobs"));

        let e = preset(
            argv(&["vllm", "--override-tt-config", "{}"]),
            1,
            None,
            no_env,
        )
        .expect_err("refused");
        assert!(
            e.0.contains("--override-tt-config") && e.0.contains("[models.<name>.tt]"),
            "{}",
            e.0
        );
        let e = preset(
            argv(&["vllm", "--additional-config", r#"{"tt": {}}"#]),
            1,
            Some("{}"),
            no_env,
        )
        .expect_err("two places");
        assert!(e.0.contains("one place"), "{}", e.0);
    }

    #[test]
    fn unknown_or_wrong_tt_keys_are_refused_by_name() {
        for (table, names) in [
            (r#"{"trace_regoin_size": 1}"#, "trace_regoin_size"),
            (r#"{"trace_mode": "sometimes"}"#, "all, decode_only, none"),
            (r#"{"enable_model_warmup": 1}"#, "true or false"),
            (r#"{"trace_region_size": "big"}"#, "whole number"),
            (r#"["trace_mode"]"#, "JSON object"),
        ] {
            let e = preset(argv(&["vllm"]), 1, Some(table), no_env).expect_err(table);
            assert!(e.0.contains(names), "{table}: {}", e.0);
        }
        // Given on the command line: read and checked the same way.
        let p = preset(
            argv(&[
                "vllm",
                "--additional_config",
                r#"{"tt": {"trace_mode": "none"}}"#,
            ]),
            1,
            None,
            no_env,
        )
        .expect("accepted");
        assert_eq!(p.tt["trace_mode"], "none");
        assert!(
            p.host_sampling_parameters().is_empty(),
            "host sampling for all"
        );
    }

    #[test]
    fn vllm_plugins_must_name_both_entry_points() {
        let only = |v: &'static str| move |n: &str| (n == "VLLM_PLUGINS").then(|| v.to_string());
        let e = preset(argv(&["vllm"]), 1, None, only("tt")).expect_err("refused");
        assert!(
            e.0.contains("tt_model_registry") && e.0.contains("VLLM_PLUGINS=tt,tt_model_registry"),
            "{}",
            e.0
        );
        // vLLM does not trim: a space is part of the name.
        assert!(preset(argv(&["vllm"]), 1, None, only("tt, tt_model_registry")).is_err());
        let p = preset(argv(&["vllm"]), 1, None, only("tt_model_registry,tt")).expect("both");
        assert_eq!(p.env.len(), 2, "the launcher's defaults");
        let set = |n: &str| (n == "VLLM_RPC_TIMEOUT").then(|| "5".to_string());
        let p = preset(argv(&["vllm"]), 1, None, set).expect("ok");
        assert_eq!(
            p.env,
            vec![("TORCHDYNAMO_DISABLE".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn a_snapshot_is_named_after_its_repository() {
        assert_eq!(
            model_name("/hf/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/0e9e39f/"),
            Some("Llama-3.1-8B-Instruct".into())
        );
        assert_eq!(model_name("/srv/models/Llama-3.1-8B-Instruct"), None);
        assert_eq!(
            model_name("/x/snapshots/abc"),
            None,
            "not a cache repository"
        );
        let link = hf_model_link(Path::new("/c/m/variant-1"), "Llama").expect("link");
        assert_eq!(link, Path::new("/c/m/hf-model-variant-1/Llama"));
    }

    #[test]
    fn the_link_is_placed_and_replaced_but_never_over_a_file() {
        let dir = std::env::temp_dir().join(format!("tt-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("dir");
        let link = dir.join("links").join("Model");
        place_link(&link, Path::new("/snap/a")).expect("placed");
        assert_eq!(
            std::fs::read_link(&link).expect("link"),
            Path::new("/snap/a")
        );
        place_link(&link, Path::new("/snap/b")).expect("replaced");
        assert_eq!(
            std::fs::read_link(&link).expect("link"),
            Path::new("/snap/b")
        );
        std::fs::remove_file(&link).expect("rm");
        std::fs::write(&link, "x").expect("file");
        assert!(
            place_link(&link, Path::new("/snap/a")).is_err(),
            "a file is left alone"
        );
        assert_eq!(std::fs::read(&link).expect("file"), b"x");
        // A directory planted as a link to somewhere else is not followed:
        // nothing is written where it points.
        let elsewhere = dir.join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("dir");
        let planted = dir.join("planted");
        std::os::unix::fs::symlink(&elsewhere, &planted).expect("link");
        let e = place_link(&planted.join("Model"), Path::new("/snap/a")).expect_err("refused");
        assert!(e.contains("not a directory"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).expect("read").count(), 0);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
