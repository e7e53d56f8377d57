//! llama.cpp's `llama-server` as its users run it for chat: a child of the
//! driver on a free port, killed when the guard drops (also while a panic
//! unwinds) and by the kernel if the driver itself dies.

use crate::client::{get, HttpClient};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running llama-server; dropping it kills and reaps the process.
pub struct LlamaServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The flags it was started with, after `-m MODEL` (the port as `PORT`:
    /// a free one, different every run).
    pub flags: Vec<String>,
    /// What `llama-server --version` printed, first line.
    pub version: Option<String>,
    /// Where its output goes (for the panic message when it does not come up).
    log: std::path::PathBuf,
}

impl LlamaServer {
    /// Start `binary` on `model` with `threads` compute threads (and the
    /// `extra` flags after the usual ones) and wait until `/health` says it
    /// has loaded.
    ///
    /// The flags: `-np 8` slots (one per conversation), `-c 8192` (1024
    /// tokens per slot, above the longest turn's prompt plus answer),
    /// prompt caching left at its default (on: each slot keeps the KV of
    /// its last prompt, and a request goes to the slot whose prompt it
    /// shares most with). `--cache-reuse` stays at its default (0, off):
    /// it reuses chunks of a cached prompt after a shift (KV shifting), for
    /// prompts edited in the middle; a growing chat history only appends,
    /// which the plain prompt cache already reuses.
    pub async fn start(
        client: &HttpClient,
        binary: &Path,
        model: &Path,
        threads: u32,
        extra: &[String],
        log: &Path,
    ) -> LlamaServer {
        let port = free_port();
        let threads = threads.to_string();
        let flags: Vec<String> = [
            "--host",
            "127.0.0.1",
            "--port",
            "PORT",
            "-np",
            "8",
            "-c",
            "8192",
            "-t",
            &threads,
            "--metrics",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().cloned())
        .collect();
        let args = flags.iter().map(|f| {
            if f == "PORT" {
                port.to_string()
            } else {
                f.clone()
            }
        });
        let out = std::fs::File::create(log).expect("llama-server log file");
        let mut command = Command::new(binary);
        command
            .arg("-m")
            .arg(model)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out);
        // SAFETY: between fork and exec only prctl, which is
        // async-signal-safe. The driver spawns from its main thread, which
        // lives as long as the driver (PR_SET_PDEATHSIG follows the thread).
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut server = LlamaServer {
            child,
            base: format!("http://127.0.0.1:{port}"),
            flags,
            version: version(binary),
            log: log.to_path_buf(),
        };
        server.wait_healthy(client).await;
        server
    }

    async fn wait_healthy(&mut self, client: &HttpClient) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "llama-server exited with {status}; its output:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if let Some((200, _)) = get(client, &format!("{}/health", self.base)).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "llama-server did not load in 120 s; its output is in {}",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now (the kernel's choice; the short race
/// until llama-server binds it is harmless on a bench machine).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

/// `llama-server --version`'s version line (it prints to stderr).
fn version(binary: &Path) -> Option<String> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("version: "))
        .map(|l| l.trim().to_string())
}
