//! Compiles the .proto files with protox (a pure-Rust protobuf compiler), so a
//! machine with only the Rust toolchain can build the workspace: no `protoc`.

use prost::Message;
use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "tt/serving/v1/generation.proto",
    "tt/serving/v1/inference.proto",
    "tt/serving/v1/control.proto",
    "tt/serving/v1/engine.proto",
];

/// The messages `ttctl` prints as JSON (`status --json`, `reload --json`,
/// the variants of `cache ls --json`). They derive `serde::Serialize`, so the
/// JSON is the message itself rather than a hand-kept copy of it; `src/json.rs`
/// says how each one reads.
const JSON_MESSAGES: &[&str] = &[
    "StatusResponse",
    "DaemonInfo",
    "Card",
    "Telemetry",
    "LockHolder",
    "CardProcess",
    "Slot",
    "SlotKvMemory",
    "ReloadReport",
    "ReloadStep",
    "CacheVariant",
    "AuditRecord",
    "KeyUsage",
];

/// Where the JSON is not the field as prost holds it (`src/json.rs` explains
/// each rule): enums as words, sub-messages that were always printed as
/// objects, and the fields the JSON was fixed without.
const JSON_FIELDS: &[(&str, &str)] = &[
    ("StatusResponse.daemon", OR_DEFAULT),
    ("StatusResponse.queues", SKIP),
    ("StatusResponse.accuracy", SKIP),
    ("DaemonInfo.lock_dir", SKIP),
    ("Card.telemetry", OR_DEFAULT),
    (
        "Card.state",
        r#"#[serde(serialize_with = "crate::json::word::<CardState, _>")]"#,
    ),
    (
        "Slot.state",
        r#"#[serde(serialize_with = "crate::json::word::<SlotState, _>")]"#,
    ),
    ("Slot.starts", SKIP),
    (
        "ReloadReport.outcome",
        r#"#[serde(serialize_with = "crate::json::word::<ReloadOutcome, _>")]"#,
    ),
];
const OR_DEFAULT: &str = r#"#[serde(serialize_with = "crate::json::or_default")]"#;
const SKIP: &str = "#[serde(skip)]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Server reflection needs the encoded descriptors at run time.
    std::fs::write(
        out_dir.join("tt_serving_descriptor.bin"),
        fds.encode_to_vec(),
    )?;
    let mut config = tonic_prost_build::configure()
        // Sorted, so a variant's inputs list (and print) the same way every
        // time.
        .btree_map(".tt.serving.v1.CacheVariant.inputs")
        .btree_map(".tt.serving.v1.Slot.flags")
        .btree_map(".tt.serving.v1.AuditRecord.args");
    for message in JSON_MESSAGES {
        config = config.message_attribute(
            format!(".tt.serving.v1.{message}"),
            "#[derive(::serde::Serialize)]",
        );
    }
    for (field, attribute) in JSON_FIELDS {
        config = config.field_attribute(format!(".tt.serving.v1.{field}"), attribute);
    }
    config.compile_fds(fds)?;
    Ok(())
}
