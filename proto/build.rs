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
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
