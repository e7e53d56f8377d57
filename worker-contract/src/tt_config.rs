//! The settings vllm-tt-plugin reads under `--additional-config
//! '{"tt": ...}'` (a model's `[models.X.tt]` table): checked by the daemon's
//! `check-config` and again by tt-worker-openai's `vllm-tt` preset, so a
//! misspelt key or a value the plugin would assert on is refused before any
//! card is touched. Sources: vllm-tt-plugin at e3fc849 (file:line per key).

use serde_json::{Map, Value};

/// The keys the plugin reads under `additional_config["tt"]`, with the
/// values it accepts (`None`: any value of the type it reads). It ignores
/// any other key silently (vllm-tt-plugin `config.py:14-32` has no
/// allow-list), so a misspelt key would change nothing: refused here.
pub const TT_KEYS: &[(&str, Option<&[&str]>)] = &[
    // worker.py:196-203
    ("trace_mode", Some(&["all", "decode_only", "none"])),
    // worker.py:205-213 (a boolean)
    ("enable_model_warmup", None),
    // worker.py:671-678 (bytes)
    ("trace_region_size", None),
    // worker.py:680-684
    ("worker_l1_size", None),
    ("l1_small_size", None),
    // worker.py:581-595
    ("dispatch_core_axis", Some(&["row", "col"])),
    // worker.py:598-623: ttnn.FabricConfig's members (ttnn 0.81.1)
    (
        "fabric_config",
        Some(&[
            "DISABLED",
            "FABRIC_1D",
            "FABRIC_1D_RING",
            "FABRIC_1D_NEIGHBOR_EXCHANGE",
            "FABRIC_2D",
            "FABRIC_2D_TORUS_XY",
            "FABRIC_2D_TORUS_X",
            "FABRIC_2D_TORUS_Y",
            "CUSTOM",
        ]),
    ),
    // worker.py:626-640
    (
        "fabric_reliability_mode",
        Some(&["STRICT_INIT", "RELAXED_INIT"]),
    ),
    // platform.py:980-988
    ("sample_on_device_mode", Some(&["all", "decode_only"])),
    // loader.py:27-33
    ("optimizations", Some(&["performance", "accuracy"])),
    // platform.py:939-946
    ("register_test_models", None),
];

/// The keys that change the weights tt_transformers writes to its tensor
/// cache (`optimizations` picks each layer's precision: bfp8 or bf16), so
/// a new value is a new cache variant.
pub const TT_CACHE_KEYS: &[&str] = &["optimizations"];

/// Check a `tt` table against [`TT_KEYS`]: `Err` names the key and what it
/// takes. Shared with the daemon's `check-config`.
pub fn check_tt_table(table: &Map<String, Value>) -> Result<(), String> {
    for (key, value) in table {
        let Some((_, allowed)) = TT_KEYS.iter().find(|(k, _)| k == key) else {
            let known: Vec<&str> = TT_KEYS.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "`{key}` is not a key vllm-tt-plugin reads (it would be ignored silently); use one of {}",
                known.join(", ")
            ));
        };
        let ok = match (allowed, value) {
            (Some(words), Value::String(s)) => words.contains(&s.as_str()),
            (Some(_), _) => false,
            (None, Value::Bool(_)) => {
                matches!(key.as_str(), "enable_model_warmup" | "register_test_models")
            }
            (None, Value::Number(n)) => {
                !matches!(key.as_str(), "enable_model_warmup" | "register_test_models")
                    && n.as_u64().is_some()
            }
            (None, _) => false,
        };
        if !ok {
            let takes = match allowed {
                Some(words) => format!("one of {}", words.join(", ")),
                None if matches!(key.as_str(), "enable_model_warmup" | "register_test_models") => {
                    "true or false".into()
                }
                None => "a whole number".into(),
            };
            return Err(format!(
                "`{key}` = {value} is not accepted by vllm-tt-plugin; it takes {takes}"
            ));
        }
    }
    Ok(())
}
