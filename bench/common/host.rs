//! The machine and the processes a benchmark runs on, for its records.

use serde_json::{json, Value};
use tt_card_lock::procs;

/// CPU model, cores and load averages now (the machines are shared: a
/// record says how busy the host was).
pub fn record() -> Value {
    json!({
        "cpu": procs::cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "loadavg": procs::loadavg(),
    })
}

/// The `--port` of the first process under `worker` whose command line
/// `is_engine` accepts: the engine a tt-worker-openai started.
pub fn engine_port(worker: u32, is_engine: impl Fn(&[String]) -> bool) -> Option<u16> {
    procs::tree(worker).into_iter().skip(1).find_map(|pid| {
        let args = procs::cmdline(pid);
        if !is_engine(&args) {
            return None;
        }
        let i = args.iter().position(|a| a == "--port")?;
        args.get(i + 1)?.parse().ok()
    })
}

/// The GGUF a driver serves: the one given, else `$TT_SMOLLM2_GGUF` (what
/// `scripts/fetch-smollm2.sh` prints), else the tiny test model written
/// into `work`. With its file name, for the records.
pub fn model(
    given: Option<&std::path::Path>,
    work: &std::path::Path,
) -> (std::path::PathBuf, String) {
    let model = given
        .map(std::path::Path::to_path_buf)
        .or_else(|| std::env::var_os("TT_SMOLLM2_GGUF").map(std::path::PathBuf::from))
        .unwrap_or_else(|| tt_serving_tests::tiny_model(work));
    let name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (model, name)
}
