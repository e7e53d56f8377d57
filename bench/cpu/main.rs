//! CPU time per relayed token: what the daemon and `tt-worker-openai`
//! spend of the host's CPUs for every token they carry from an engine to a
//! client, beside the floor (the same stream relayed by nginx with
//! `proxy_buffering off`), in one run.
//!
//! Arms, interleaved round by round (the order rotates, so drift hits each
//! arm alike): the engine's own port (`direct`), nginx in front of the
//! engine's port (`nginx`, when nginx is installed), the daemon's OpenAI
//! door (`openai`) and its gRPC port (`grpc`), both through the slot's
//! `tt-worker-openai`. Every process's CPU time (the scheduler's own
//! count, `/proc/<pid>/task/*/schedstat`; utime+stime are recorded beside
//! it) is read before and after each round, so each arm also shows what
//! the processes it does not use spend meanwhile (the idle cost).
//!
//! Engines: the zero-cost engine (`fast`, this binary's `fast-engine`: the
//! relay's own ceiling), llama.cpp's `llama-server`, or the real vLLM.
//! Appends one JSON line per (streams, arm) to `--out`.

mod engine;
mod hold;

use clap::Parser;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tt_bench::http::{Connection, HttpClient};
use tt_bench::{grpc, host, http};
use tt_card_lock::procs;
use tt_serving_tests::{tiny_model, Daemon, DaemonOptions, FakeHw};

#[derive(Parser)]
#[command(about = "CPU per relayed token: the daemon and its adapter beside nginx, one run")]
struct Args {
    /// The engine behind the slot.
    #[arg(long, value_enum, default_value_t = EngineKind::Fast)]
    engine: EngineKind,
    /// llama-server's binary (`scripts/llama-server.sh` prints it), for
    /// `--engine llama-server`.
    #[arg(long, required_if_eq("engine", "llama-server"))]
    llama_server: Option<PathBuf>,
    /// llama-server's compute threads.
    #[arg(long, default_value_t = 2)]
    llama_threads: u32,
    /// The GGUF llama-server serves (default: $TT_SMOLLM2_GGUF).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The Python of a venv with vLLM (`scripts/vllm.sh`), for `--engine vllm`.
    #[arg(long, required_if_eq("engine", "vllm"))]
    vllm: Option<PathBuf>,
    /// The Hugging Face directory vLLM serves (`scripts/vllm.sh --model-dir`).
    #[arg(long, required_if_eq("engine", "vllm"))]
    vllm_model: Option<PathBuf>,
    /// Concurrent streams per round, one setting after another.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    streams: Vec<usize>,
    /// Tokens per request.
    #[arg(long, default_value_t = 256)]
    tokens: u32,
    /// Rounds per arm at each streams setting.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Fewest tokens one round carries: each stream makes requests one
    /// after another until the round has them (the clock-tick resolution of
    /// `/proc/<pid>/stat` needs a few thousand tokens per arm).
    #[arg(long, default_value_t = 4096)]
    round_tokens: u64,
    /// Seconds of nothing before the rounds, to measure each process's
    /// idle CPU (health probes, timers), recorded beside the arms.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// The zero-cost engine's pause between tokens, in microseconds (0: as
    /// fast as the reader takes them, so several tokens may share a read).
    #[arg(long, default_value_t = 1000)]
    token_us: u64,
    /// nginx's binary for the floor arm (default: `nginx` on PATH, else
    /// /usr/sbin/nginx; the arm is left out when there is none).
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// Leave out these arms (comma separated: direct, nginx, openai, grpc).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
    /// Instead of the CPU rounds: hold this many streams open at once, on
    /// the engine's own port and through the OpenAI door, `--rounds`
    /// rounds each, alternating (see `hold.rs`). Pace the zero-cost engine
    /// with `--token-us` so the host keeps up (50000 for 1000 streams on
    /// two cores).
    #[arg(long, default_value_t = 0)]
    hold: usize,
    /// The slot's `max_in_flight` (default: the most streams asked for,
    /// so nothing queues); below `--hold`, the rest wait in the model's
    /// queue.
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// The model's `max_queue` (default: the daemon's, 64): with
    /// `--max-in-flight` below `--hold`, streams past both are refused.
    #[arg(long)]
    max_queue: Option<usize>,
    /// The daemon's `daemon.runtime_threads` (0: its default, one per CPU).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1024))]
    daemon_threads: u64,
    /// The daemon's `daemon.relay_threads` (its default 1; 0: inference
    /// shares the other runtime, as before there was a relay runtime).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=1024))]
    relay_threads: u64,
    /// The tt-worker-openai binary the slot runs (default: the one built
    /// beside this driver): a baseline build, to compare side by side with
    /// runs of the default. Recorded as `worker_binary`.
    #[arg(long)]
    worker: Option<PathBuf>,
    /// The tt-servingd binary to run (default: the one built beside this
    /// driver): a baseline build, to compare side by side. Recorded as
    /// `daemon_binary`.
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// Turn the daemon's traces on, exporting to this OTLP/gRPC collector
    /// (`[tracing] otlp_endpoint`, e.g. a receiver from
    /// tests/clients/otlp_receiver.py). Recorded as `otlp_endpoint`.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Free text recorded as `label` in every record ("before", "after").
    #[arg(long)]
    label: Option<String>,
    /// JSON-lines file to append results to.
    #[arg(long, default_value = "bench/cpu/results.jsonl")]
    out: PathBuf,
}

impl Args {
    /// The worker binary the slot runs.
    fn worker(&self) -> PathBuf {
        self.worker
            .clone()
            .unwrap_or_else(|| tt_serving_tests::bin("tt-worker-openai"))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Debug)]
enum EngineKind {
    Fast,
    LlamaServer,
    Vllm,
}

/// `bench-cpu fast-engine ...`: the zero-cost engine, as a slot's engine
/// command runs it.
#[derive(Parser)]
struct FastArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long)]
    port: u16,
    #[arg(long, default_value = "m")]
    served_model_name: String,
    #[arg(long, default_value_t = 1000)]
    token_us: u64,
    /// Taken as vLLM takes it (tt-worker-openai passes it to a vLLM engine
    /// while traces are on); the zero-cost engine makes no spans.
    #[arg(long)]
    otlp_traces_endpoint: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    Direct,
    Nginx,
    OpenAi,
    Grpc,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Direct => "direct",
            Arm::Nginx => "nginx",
            Arm::OpenAi => "openai",
            Arm::Grpc => "grpc",
        }
    }
}

/// The processes whose CPU is read: (role, pids).
struct Watched {
    roles: Vec<(&'static str, Vec<u32>)>,
}

/// Both clocks of every watched role, at one moment.
struct Snapshot {
    ns: Vec<u64>,
    ticks: Vec<u64>,
}

impl Watched {
    fn snapshot(&self) -> Snapshot {
        let sum = |f: fn(u32) -> u64| {
            self.roles
                .iter()
                .map(|(_, pids)| pids.iter().map(|p| f(*p)).sum())
                .collect()
        };
        Snapshot {
            ns: sum(procs::cpu_ns),
            ticks: sum(procs::cpu_ticks),
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// nginx, stopped when dropped (a panicking run too): SIGTERM is its fast
/// shutdown, which takes its worker with it.
struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn find_nginx(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("nginx"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/sbin/nginx")).filter(|p| p.is_file()))
}

/// nginx as a streaming reverse proxy in front of the engine: one worker,
/// no buffering (each upstream chunk goes out at once), a new upstream
/// connection per request as tt-worker-openai makes one (llama-server's
/// HTTP library closes kept-alive connections after 5 requests or 5 s, and
/// nginx answers 502 rather than send a POST again).
fn start_nginx(binary: &Path, dir: &Path, engine_port: u16) -> (Nginx, u16) {
    let port = free_port();
    let d = dir.display();
    std::fs::create_dir_all(dir.join("logs")).expect("nginx dir");
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  upstream engine {{ server 127.0.0.1:{engine_port}; }}\n  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://engine;\n      proxy_http_version 1.1;\n      proxy_buffering off;\n      proxy_read_timeout 600s;\n    }}\n  }}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).expect("nginx.conf");
    // Its output to the error log, not our pipes: an nginx left running
    // must not hold a caller's pipe open.
    let child = Command::new(binary)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let child = Nginx(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, port)
}

/// One streamed `/v1/completions` on a pooled connection; the tokens its
/// usage reports (read the cheap way: the client shares the cores).
async fn http_once(client: &HttpClient, base: &str, prompt: &str, tokens: u32) -> u32 {
    let body = json!({
        "model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
    });
    let url = format!("{base}/v1/completions");
    http::completion_tokens_only(http::post(client, &url, &body, Connection::Pooled).await).await
}

async fn grpc_once(channel: tonic::transport::Channel, prompt: String, tokens: u32) -> u32 {
    grpc::generate(channel, grpc::prompt_request(&prompt, tokens, true))
        .await
        .completion_tokens
}

/// What one arm cost at one streams setting, summed over its rounds.
#[derive(Default, Clone)]
struct Tally {
    tokens: u64,
    requests: u64,
    wall: Duration,
    ns: Vec<u64>,
    ticks: Vec<u64>,
}

fn slot_table(args: &Args, work: &Path) -> String {
    let worker = args.worker();
    let cards = format!("cards = [\"{}\"]", FakeHw::bdf(0));
    let in_flight = args
        .streams
        .iter()
        .copied()
        .max()
        .unwrap_or(8)
        .max(args.hold);
    let in_flight = args.max_in_flight.unwrap_or(in_flight);
    let queue = args
        .max_queue
        .map(|q| format!("max_queue = {q}\n"))
        .unwrap_or_default();
    let head = format!("[limits]\nmax_streams_per_connection = 4096\n\n[models.m]\ntp = 1\n{cards}\nmax_in_flight = {in_flight}\n{queue}");
    match args.engine {
        EngineKind::Fast => {
            let me = std::env::current_exe().expect("own path");
            format!(
                "{head}checkpoint = \"{}\"\nworker = [\"{}\", \"--engine\", \"vllm\", \"--\", \"{}\", \"fast-engine\", \"--port\", \"{{port}}\", \"--token-us\", \"{}\"]\n",
                tiny_model(work).display(),
                worker.display(),
                me.display(),
                args.token_us
            )
        }
        EngineKind::LlamaServer => {
            let server = args
                .llama_server
                .as_ref()
                .expect("--engine llama-server needs --llama-server PATH");
            let model = args
                .model
                .clone()
                .or_else(|| std::env::var_os("TT_SMOLLM2_GGUF").map(PathBuf::from))
                .expect("--engine llama-server needs --model or $TT_SMOLLM2_GGUF");
            format!(
                "{head}checkpoint = \"{}\"\nworker = [\"{}\", \"--engine\", \"llama-server\", \"--\", \"{}\", \"-m\", \"{{checkpoint}}\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--metrics\", \"-np\", \"{in_flight}\", \"-c\", \"{}\", \"-t\", \"{}\"]\n",
                model.display(),
                worker.display(),
                server.display(),
                in_flight as u32 * (args.tokens + 64),
                args.llama_threads
            )
        }
        EngineKind::Vllm => {
            let (python, dir) = match (&args.vllm, &args.vllm_model) {
                (Some(p), Some(d)) => (p, d),
                _ => panic!("--engine vllm needs --vllm PYTHON and --vllm-model DIR"),
            };
            format!(
                "{head}checkpoint = \"{}\"\nworker = [\"{}\", \"--engine\", \"vllm\", \"--\", \"{}\", \"-m\", \"vllm.entrypoints.openai.api_server\", \"--model\", \"{{checkpoint}}\", \"--served-model-name\", \"m\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--enforce-eager\", \"--max-model-len\", \"2048\", \"--max-num-seqs\", \"{in_flight}\", \"--disable-uvicorn-access-log\"]\nenv = {{ HF_HUB_OFFLINE = \"1\", TRANSFORMERS_OFFLINE = \"1\", VLLM_CPU_KVCACHE_SPACE = \"1\" }}\n[models.m.readiness]\ndeadline_secs = 600\n",
                dir.display(),
                worker.display(),
                python.display(),
            )
        }
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("fast-engine") {
        let a = FastArgs::parse_from(std::env::args().skip(1));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let served = rt.block_on(engine::serve(engine::Options {
            host: a.host,
            port: a.port,
            model: a.served_model_name,
            token_us: a.token_us,
        }));
        if let Err(e) = served {
            eprintln!("fast engine: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args = Args::parse();
    if args.engine == EngineKind::LlamaServer
        && args.model.is_none()
        && std::env::var_os("TT_SMOLLM2_GGUF").is_none()
    {
        eprintln!("bench-cpu: --engine llama-server needs a GGUF: give --model PATH or set TT_SMOLLM2_GGUF (scripts/fetch-smollm2.sh prints it)");
        std::process::exit(2);
    }
    for (option, binary, what) in [
        ("--worker", &args.worker, "tt-worker-openai"),
        ("--daemon", &args.daemon, "tt-servingd"),
    ] {
        let Some(binary) = binary else { continue };
        let runnable = std::fs::metadata(binary).is_ok_and(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        });
        if !runnable {
            eprintln!(
                "bench-cpu: {option} {} is not an executable file; give a {what} binary (cargo build --release -p {what})",
                binary.display()
            );
            std::process::exit(2);
        }
    }
    let tick_us = 1e6 / procs::ticks_per_second() as f64;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let work = tempfile::tempdir().expect("temp dir");
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            // Every stream comes from this host, one peer to the door: its
            // connection caps are raised above what the run holds.
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\nmax_connections = {cap}\nmax_connections_per_peer = {cap}\n{}{}",
                args.otlp_endpoint
                    .as_ref()
                    .map(|e| format!("\n[tracing]\notlp_endpoint = \"{e}\"\n\n"))
                    .unwrap_or_default(),
                slot_table(&args, work.path()),
                cap = (args.hold + 64).max(1024)
            ),
            binary: args.daemon.clone(),
            // The default tick: the idle cost a production daemon has.
            tick_ms: 1000,
            daemon_extra: format!(
                "runtime_threads = {}\nrelay_threads = {}\n",
                args.daemon_threads, args.relay_threads
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_ready_within("m", Duration::from_secs(600));
    let worker = daemon.slot("m")["worker_pid"].as_u64().unwrap_or(0) as u32;
    let port = host::engine_port(worker, |_| true).expect("an engine with --port under the worker");
    let engine_pids: Vec<u32> = procs::tree(worker).into_iter().skip(1).collect();
    let direct = format!("http://127.0.0.1:{port}");
    let nginx = if args.skip.iter().any(|s| s == "nginx") {
        None
    } else {
        find_nginx(args.nginx.as_deref())
            .map(|bin| start_nginx(&bin, &work.path().join("nginx"), port))
    };
    if nginx.is_none() {
        eprintln!("no nginx (give --nginx PATH): the floor arm is left out");
    }
    let nginx_pids = nginx
        .as_ref()
        .map(|(c, _)| procs::tree(c.0.id()))
        .unwrap_or_default();
    let watched = Watched {
        roles: vec![
            ("daemon", vec![daemon.pid()]),
            ("worker", vec![worker]),
            ("engine", engine_pids),
            ("nginx", nginx_pids),
        ],
    };
    let openai = format!(
        "http://{}",
        daemon.status()["daemon"]["openai_address"]
            .as_str()
            .unwrap_or_default()
    );
    if args.hold > 0 {
        let git = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.out)
            .expect("results file");
        for round in 0..args.rounds {
            // Alternate which arm goes first.
            let order = if round % 2 == 0 {
                [("direct", &direct), ("openai", &openai)]
            } else {
                [("openai", &openai), ("direct", &direct)]
            };
            for (arm, base) in order {
                let mut rec = rt.block_on(hold::run(
                    arm,
                    base,
                    args.hold,
                    args.tokens,
                    args.token_us,
                    daemon.pid(),
                    worker,
                    round,
                ));
                rec["engine"] = json!(format!("{:?}", args.engine));
                rec["max_in_flight"] = json!(args.max_in_flight.unwrap_or(args.hold));
                rec["max_queue"] = json!(args.max_queue);
                rec["daemon_runtime_threads"] = json!(args.daemon_threads);
                rec["daemon_relay_threads"] = json!(args.relay_threads);
                rec["worker_binary"] = json!(args.worker().display().to_string());
                rec["label"] = json!(args.label);
                rec["git"] = json!(git);
                rec["host_at_end"] = host::record();
                rec["unix_ms"] =
                    json!(tt_serving_proto::time::unix_ms(std::time::SystemTime::now()));
                println!("{rec}");
                writeln!(out, "{rec}").expect("write result");
            }
        }
        return;
    }
    let mut arms = vec![Arm::Direct, Arm::OpenAi, Arm::Grpc];
    if nginx.is_some() {
        arms.insert(1, Arm::Nginx);
    }
    arms.retain(|a| !args.skip.iter().any(|s| s == a.name()));
    let nginx_base = nginx.as_ref().map(|(_, p)| format!("http://127.0.0.1:{p}"));
    let client = http::pooled_client(1024);
    let channel = rt.block_on(grpc::connect(&daemon.inference_address()));
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
        .expect("results file");
    let engine_version = daemon.slot("m")["engine_version"].clone();
    // Idle: what each process spends per second while nobody asks anything.
    let before = watched.snapshot();
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let after = watched.snapshot();
    let idle_us_per_s: serde_json::Map<String, serde_json::Value> = watched
        .roles
        .iter()
        .zip(after.ns.iter().zip(&before.ns))
        .map(|((role, _), (a, b))| {
            let us = a.saturating_sub(*b) as f64 / 1e3 / args.idle_secs.max(1) as f64;
            (role.to_string(), json!(us))
        })
        .collect();
    println!(
        "idle: CPU µs per second {}",
        serde_json::Value::Object(idle_us_per_s.clone())
    );

    for &streams in &args.streams {
        let mut tallies = vec![
            Tally {
                ns: vec![0; watched.roles.len()],
                ticks: vec![0; watched.roles.len()],
                ..Default::default()
            };
            arms.len()
        ];
        rt.block_on(async {
            for round in 0..args.rounds * arms.len() {
                // Rotate: round r runs arm (r + r / n) mod n, so each arm
                // takes each place in the order.
                let n = arms.len();
                let which = (round + round / n) % n;
                let arm = arms[which];
                let before = watched.snapshot();
                let start = Instant::now();
                let mut tasks = Vec::new();
                let per_stream = args
                    .round_tokens
                    .div_ceil(streams as u64 * u64::from(args.tokens.max(1)))
                    .max(1);
                for i in 0..streams {
                    let first = 1000 + (round * streams + i) * per_stream as usize;
                    let tokens = args.tokens;
                    let client = client.clone();
                    let base = match arm {
                        Arm::Direct => direct.clone(),
                        Arm::Nginx => nginx_base.clone().unwrap_or_default(),
                        _ => openai.clone(),
                    };
                    let channel = channel.clone();
                    tasks.push(tokio::spawn(async move {
                        let mut got = 0u64;
                        for k in 0..per_stream as usize {
                            // Unique prompts: no prefix cache favours an arm.
                            let prompt = format!("{}. Tell me about the sea", first + k);
                            got += u64::from(match arm {
                                Arm::Grpc => grpc_once(channel.clone(), prompt, tokens).await,
                                _ => http_once(&client, &base, &prompt, tokens).await,
                            });
                        }
                        (got, per_stream)
                    }));
                }
                let (mut tokens, mut requests) = (0u64, 0u64);
                for t in tasks {
                    let (got, made) = t.await.expect("request task");
                    tokens += got;
                    requests += made;
                }
                let wall = start.elapsed();
                let after = watched.snapshot();
                let tally = &mut tallies[which];
                tally.tokens += tokens;
                tally.requests += requests;
                tally.wall += wall;
                for k in 0..watched.roles.len() {
                    tally.ns[k] += after.ns[k].saturating_sub(before.ns[k]);
                    tally.ticks[k] += after.ticks[k].saturating_sub(before.ticks[k]);
                }
            }
        });
        println!(
            "{streams} stream(s), {} tokens per request, {} rounds per arm: CPU µs per token",
            args.tokens, args.rounds
        );
        for (arm, tally) in arms.iter().zip(&tallies) {
            let per_token = |k: usize| tally.ns[k] as f64 / 1e3 / tally.tokens.max(1) as f64;
            let sampled = |k: usize| tally.ticks[k] as f64 * tick_us / tally.tokens.max(1) as f64;
            let by_role = |f: &dyn Fn(usize) -> f64| -> serde_json::Map<String, serde_json::Value> {
                watched
                    .roles
                    .iter()
                    .enumerate()
                    .map(|(k, (role, _))| (role.to_string(), json!(f(k))))
                    .collect()
            };
            let cpu = by_role(&per_token);
            let cpu_sampled = by_role(&sampled);
            let tok_s = tally.tokens as f64 / tally.wall.as_secs_f64();
            println!(
                "  {:<7} {tok_s:>9.0} tok/s  daemon {:>7.1}  worker {:>7.1}  engine {:>7.1}  nginx {:>7.1}",
                arm.name(),
                per_token(0),
                per_token(1),
                per_token(2),
                per_token(3)
            );
            let line = json!({
                "bench": "relay_cpu", "engine": format!("{:?}", args.engine), "arm": arm.name(),
                "streams": streams, "tokens_per_request": args.tokens, "rounds": args.rounds,
                "token_us": (args.engine == EngineKind::Fast).then_some(args.token_us),
                "order": "arms rotated round by round",
                "tokens": tally.tokens, "requests": tally.requests,
                "wall_s": tally.wall.as_secs_f64(), "tok_s": tok_s,
                "cpu_us_per_token": cpu, "cpu_source": "schedstat of live threads",
                "cpu_us_per_token_tick_sampled": cpu_sampled, "idle_cpu_us_per_s": idle_us_per_s, "cpu_ns": tally.ns, "cpu_ticks": tally.ticks, "tick_us": tick_us,
                "engine_version": engine_version,
                "daemon_runtime_threads": args.daemon_threads,
                "daemon_relay_threads": args.relay_threads,
                "worker_binary": args.worker().display().to_string(),
                "daemon_binary": args.daemon.as_ref().map_or_else(|| tt_serving_tests::bin("tt-servingd"), |d| d.clone()).display().to_string(),
                "otlp_endpoint": args.otlp_endpoint,
                "label": args.label,
                "host_at_end": host::record(),
                "daemon_version": env!("CARGO_PKG_VERSION"),
                "git": std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()),
                "unix_ms": tt_serving_proto::time::unix_ms(std::time::SystemTime::now()),
            });
            writeln!(out, "{line}").expect("write result");
        }
    }
    drop(nginx);
}
