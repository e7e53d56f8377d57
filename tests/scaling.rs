//! Many hosts: two daemons on two fake hardware roots behind a real nginx
//! (the Debian package), configured as docs/SCALING.md shows. Requests
//! spread over both (OpenAI HTTP and gRPC); one daemon stopped mid-run:
//! every request either completes or fails visibly to its client, and the
//! survivor takes the load.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tt_serving_tests::chaos_support as chaos;
use tt_serving_tests::{model_table, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw};

/// nginx, or None (skipped loudly; CI installs it and requires it).
fn nginx() -> Option<PathBuf> {
    for path in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(path).exists() {
            return Some(path.into());
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("CI must provide nginx: .ci/run installs the Debian package");
    }
    eprintln!("SKIPPED: nginx is not installed (apt-get install nginx)");
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running nginx; stopped on drop.
struct Nginx {
    child: Child,
    http: u16,
    grpc: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    /// nginx in front of the daemons' OpenAI and gRPC ports, with the
    /// upstream and retry settings of docs/SCALING.md.
    fn start(binary: &Path, daemons: &[&Daemon]) -> Nginx {
        let dir = tempfile::tempdir().expect("temp dir");
        let (http, grpc) = (free_port(), free_port());
        let servers = |address: &dyn Fn(&Daemon) -> String| -> String {
            daemons
                .iter()
                .map(|d| {
                    format!(
                        "        server {} max_fails=1 fail_timeout=5s;\n",
                        address(d)
                    )
                })
                .collect()
        };
        let openai = servers(&|d| {
            d.status()["daemon"]["openai_address"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        let grpc_servers = servers(&|d| d.inference_address());
        let user = if tt_serving_tests::is_root() {
            "user root root;"
        } else {
            ""
        };
        let d = dir.path().display();
        let conf = format!(
            r#"{user}
daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream tt_openai {{
{openai}        keepalive 16;
    }}
    upstream tt_grpc {{
{grpc_servers}    }}
    server {{
        listen 127.0.0.1:{http};
        location / {{
            proxy_pass http://tt_openai;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc} http2;
        location / {{
            grpc_pass grpc://tt_grpc;
            grpc_read_timeout 600s;
            grpc_next_upstream error timeout non_idempotent;
        }}
    }}
}}
"#
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("startup.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let mut nginx = Nginx {
            child,
            http,
            grpc,
            _dir: dir,
        };
        wait_until("nginx to answer /health", || {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                let log = ["startup.log", "error.log"]
                    .map(|f| std::fs::read_to_string(nginx._dir.path().join(f)).unwrap_or_default())
                    .join("");
                panic!("nginx exited ({status}): {log}");
            }
            (curl_status(&format!("http://127.0.0.1:{}/health", nginx.http)) == 200).then_some(())
        });
        nginx
    }
}

fn curl_status(url: &str) -> u16 {
    Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            url,
        ])
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// How one streamed request ended, as its client saw it.
#[derive(Debug, Clone)]
enum Seen {
    /// 200, a finish chunk, usage, then `[DONE]`.
    Complete { tokens: u64 },
    /// An error status, an error event, a stream cut without `[DONE]`, or a
    /// transport error: the client knows it did not get its answer.
    Failed(String),
}

/// One streamed completion through nginx, read to its end.
fn stream_once(port: u16) -> Seen {
    let out = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "60", "-w", "\n%{http_code}"])
        .args(["-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"model":"m","prompt":"hello","max_tokens":120,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}"#)
        .arg(format!("http://127.0.0.1:{port}/v1/completions"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        return Seen::Failed(format!(
            "curl: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    if code.trim() != "200" {
        return Seen::Failed(format!("status {code}: {body}"));
    }
    let events: Vec<&str> = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    if events.last() != Some(&"[DONE]") {
        return Seen::Failed(format!("stream ended without [DONE]: {body}"));
    }
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    let deltas = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count() as u64;
    let finished = chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"].is_string());
    let tokens = chunks
        .last()
        .and_then(|c| c["usage"]["completion_tokens"].as_u64())
        .unwrap_or(0);
    // A stream that says it is done carries its whole answer: the finish,
    // the usage, and as many text chunks as tokens it reports (the tiny
    // model's tokens each decode to text).
    assert!(
        finished && tokens > 0,
        "a [DONE] stream without its finish or usage: {body}"
    );
    assert!(
        deltas <= tokens,
        "{deltas} text chunks for {tokens} tokens: {body}"
    );
    Seen::Complete { tokens }
}

fn daemon(hw: &FakeHw, model: &Path) -> Daemon {
    Daemon::start(
        hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n{}",
                model_table("m", 1, &[0], model, "")
            ),
            ..Default::default()
        },
    )
}

fn served(d: &Daemon) -> f64 {
    chaos::scrape(d).sum(
        "tt_serving_requests_total",
        &[("model", "m"), ("outcome", "ok")],
    )
}

#[test]
fn two_daemons_behind_nginx_share_the_load_and_one_stopping_loses_nothing_silently() {
    let Some(binary) = nginx() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let (hw_a, hw_b) = (FakeHw::new(1), FakeHw::new(1));
    let mut a = daemon(&hw_a, &model);
    let b = daemon(&hw_b, &model);
    a.wait_slot_state("m", "ready");
    b.wait_slot_state("m", "ready");
    let lb = Nginx::start(&binary, &[&a, &b]);

    // Spread: round robin puts requests of both protocols on both hosts.
    for _ in 0..6 {
        assert!(matches!(stream_once(lb.http), Seen::Complete { .. }));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    for _ in 0..6 {
        let answer = rt
            .block_on(tt_serving_tests::generate(
                &format!("127.0.0.1:{}", lb.grpc),
                "m",
                "hello",
                4,
            ))
            .expect("gRPC through nginx");
        assert_eq!(answer.last.usage.map(|u| u.completion_tokens), Some(4));
    }
    let (before_a, before_b) = (served(&a), served(&b));
    assert!(
        before_a >= 3.0 && before_b >= 3.0,
        "both hosts served: {before_a} and {before_b} of 12"
    );

    // Four clients stream in a loop; one host stops under them.
    let stop = Arc::new(AtomicBool::new(false));
    let records: Arc<Mutex<Vec<(Instant, Instant, Seen)>>> = Arc::default();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, records, port) = (stop.clone(), records.clone(), lb.http);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let seen = stream_once(port);
                    records
                        .lock()
                        .unwrap()
                        .push((started, Instant::now(), seen));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let code = a.terminate();
    assert_eq!(code, Some(0), "the stopped daemon exits cleanly");
    let stopped = Instant::now();
    let survivor_before = served(&b);
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }

    let records = records.lock().unwrap().clone();
    let failed: Vec<&str> = records
        .iter()
        .filter_map(|(_, _, s)| match s {
            Seen::Failed(why) => Some(why.as_str()),
            Seen::Complete { .. } => None,
        })
        .collect();
    let tokens: u64 = records
        .iter()
        .map(|(_, _, s)| match s {
            Seen::Complete { tokens } => *tokens,
            Seen::Failed(_) => 0,
        })
        .sum();
    let complete = records.len() - failed.len();
    eprintln!(
        "{} requests while one host stopped: {complete} complete ({tokens} tokens), {} failed visibly: {failed:?}",
        records.len(),
        failed.len()
    );
    // At most the requests in flight on the stopped host can fail, and
    // each of those failed in the client's sight (checked in stream_once).
    assert!(failed.len() <= 4, "{failed:?}");
    // Everything started after the stop completed, on the survivor.
    let after: Vec<&(Instant, Instant, Seen)> =
        records.iter().filter(|(s, _, _)| *s > stopped).collect();
    assert!(after.len() >= 4, "requests after the stop: {}", after.len());
    assert!(
        after
            .iter()
            .all(|(_, _, s)| matches!(s, Seen::Complete { .. })),
        "{after:?}"
    );
    let survivor_gain = served(&b) - survivor_before;
    assert!(
        survivor_gain >= after.len() as f64,
        "the survivor served the requests after the stop: {survivor_gain} of {}",
        after.len()
    );
}
