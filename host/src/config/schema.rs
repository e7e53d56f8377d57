//! The typed shape of the config file. Every field has a default where a
//! sensible one exists, so a minimal file is short; `example.toml` shows them
//! all.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The whole config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Daemon-level settings.
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// Where the hardware and its tools are.
    #[serde(default)]
    pub hardware: HardwareConfig,
    /// How cards are reset and proven back.
    #[serde(default)]
    pub reset: ResetConfig,
    /// The Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// OpenTelemetry traces.
    #[serde(default)]
    pub tracing: TracingConfig,
    /// The OpenAI-compatible HTTP front door.
    #[serde(default)]
    pub openai: OpenaiConfig,
    /// Who may use the public inference port, and over what.
    #[serde(default)]
    pub inference: InferenceConfig,
    /// Request limits enforced by the daemon before a worker sees a request.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// What the host must keep for itself beside the engines.
    #[serde(default)]
    pub host: HostConfig,
    /// The models to serve, by name. Empty is valid: the daemon then manages
    /// and reports every discovered card and can reset them.
    #[serde(default)]
    pub models: BTreeMap<String, ModelConfig>,
}

impl Config {
    /// How long a clean stop of every slot may take: the slowest model's
    /// drain, then SIGTERM's grace twice (the worker's own bounded drain,
    /// then the wait after SIGKILL), plus 10 s of slack for the rest of the
    /// shutdown. The one formula for the daemon's shutdown, a loan's
    /// drain, a reload's stops and the systemd unit's stop timeout (the NixOS
    /// module renders the same numbers; `check-config` prints the result).
    pub fn stop_limit(&self) -> std::time::Duration {
        let secs = self
            .models
            .values()
            .map(|m| m.drain_timeout_secs + 2 * m.restart.stop_timeout_secs + 10)
            .max()
            .unwrap_or(10);
        std::time::Duration::from_secs(secs)
    }
}

/// Daemon-level settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Address of the public inference gRPC port (also serves
    /// grpc.health.v1 and reflection). Loopback by default.
    pub listen: String,
    /// Path of the control socket that ttctl talks to.
    pub control_socket: PathBuf,
    /// Octal permission bits of the control socket, e.g. "0660".
    pub control_socket_mode: String,
    /// Group that owns the control socket (members may use ttctl). None keeps
    /// the daemon's group.
    pub control_socket_group: Option<String>,
    /// Group whose members may use destructive control operations (card
    /// reset and borrow, slot restart, cache build and removal, reload).
    /// None: root only. Read-only operations are open to whoever can connect
    /// to the control socket.
    pub control_admin_group: Option<String>,
    /// Persistent state (clean-shutdown record, fake hardware for demos).
    pub state_dir: PathBuf,
    /// Root of the tensor caches: `<cache_dir>/<model>/<variant>/`.
    pub cache_dir: PathBuf,
    /// One lock file per card lives here, shared with ttctl and external
    /// scripts that borrow cards.
    pub lock_dir: PathBuf,
    /// `plain` (journald-friendly lines) or `json`.
    pub log_format: LogFormat,
    /// When the daemon tells systemd it is ready: once `all` slots are ready
    /// or once `any` is.
    pub ready_when: ReadyWhen,
    /// How often the daemon pings the systemd watchdog and re-reads card
    /// heartbeats, and how often each Ready worker's `Health` is polled, in
    /// milliseconds. A worker that leaves [`UNANSWERED_HEALTH_POLLS`] polls
    /// in a row unanswered (each given `max(tick_ms, 1000)` ms) is hung.
    pub tick_ms: u64,
    /// How each slot's worker and everything it starts are held together
    /// (killed as one, their memory counted as one): `auto` (a cgroup v2
    /// per slot when the daemon's own cgroup is writable, else the process
    /// tree under `/proc`), `cgroup` (refuse to start without one) or
    /// `process-tree`.
    pub containment: ContainmentMode,
    /// Threads of the daemon's runtime for everything but inference (slot
    /// supervision, resets, cache builds, reloads, the control socket);
    /// 0 (the default): one per CPU.
    pub runtime_threads: u64,
    /// Threads of the runtime that carries inference (the doors, the
    /// router's streams, the workers' gRPC connections), apart so control
    /// work never holds a token back; default 1, which keeps a relayed
    /// token's wake-ups on one thread (docs/PERFORMANCE.md, "CPU per
    /// relayed token"). 0: no runtime of its own, inference shares the
    /// other.
    pub relay_threads: u64,
}

impl DaemonConfig {
    /// Where worker sockets live: `<dir of control_socket>/workers`.
    pub fn worker_socket_dir(&self) -> PathBuf {
        self.control_socket
            .parent()
            .map(|p| p.join("workers"))
            .unwrap_or_else(|| self.state_dir.join("workers"))
    }

    /// The directory the control socket is bound in.
    pub fn control_socket_dir(&self) -> PathBuf {
        self.control_socket
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."))
            .to_path_buf()
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            listen: "127.0.0.1:50051".into(),
            control_socket: "/run/tt-serving/control.sock".into(),
            control_socket_mode: "0660".into(),
            control_socket_group: None,
            control_admin_group: None,
            state_dir: "/var/lib/tt-serving".into(),
            cache_dir: "/var/cache/tt-serving".into(),
            lock_dir: "/run/lock/tenstorrent".into(),
            log_format: LogFormat::Plain,
            ready_when: ReadyWhen::All,
            tick_ms: 1000,
            containment: ContainmentMode::Auto,
            runtime_threads: 0,
            relay_threads: 1,
        }
    }
}

/// Health polls in a row a Ready worker may leave unanswered before the
/// supervisor declares it hung (see [`DaemonConfig::health_poll_timeout`]).
pub const UNANSWERED_HEALTH_POLLS: u32 = 3;

impl DaemonConfig {
    /// How long the Ready watchdog waits for one `Health` answer: one tick,
    /// but at least a second. Health is answered off the engine thread, so
    /// a live worker answers in milliseconds; the floor keeps a loaded host
    /// (or a short `tick_ms`) from getting a healthy worker killed, which
    /// would leave its cards to be reset.
    pub fn health_poll_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.tick_ms.max(1000))
    }

    /// The longest a Ready worker that stopped answering `Health` (frozen
    /// by SIGSTOP, a deadlocked RPC thread) stays Ready: until the next
    /// tick, then [`UNANSWERED_HEALTH_POLLS`] polls of
    /// [`DaemonConfig::health_poll_timeout`] each. Then it leaves routing
    /// and is killed.
    pub fn unanswered_health_bound(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.tick_ms)
            + self.health_poll_timeout() * UNANSWERED_HEALTH_POLLS
    }
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of the HTTP endpoint serving `/metrics`; loopback by
    /// default, empty to turn it off.
    pub listen: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: "127.0.0.1:9464".into(),
        }
    }
}

/// OpenTelemetry traces: spans of every request (door, queue, routing,
/// the worker's generation) and of slot lifecycles, exported over OTLP.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Where spans go: an OTLP/gRPC collector, `http://HOST:PORT` (e.g.
    /// `http://127.0.0.1:4317`). Empty (the default): no spans are made,
    /// and the workers are not asked to make any.
    pub otlp_endpoint: String,
}

/// The OpenAI-compatible HTTP front door (`/v1/completions`,
/// `/v1/chat/completions`, `/v1/models`, `/health`): the same router,
/// queues, limits, tokens and TLS as the gRPC port, on its own address.
///
/// The timeouts and caps keep a slow, silent or greedy client from holding
/// the door: without them 200 idle and trickling connections from one
/// local user stayed open for minutes (issue 46).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpenaiConfig {
    /// Address to serve on, e.g. `127.0.0.1:8000`; empty (the default)
    /// turns the front door off.
    pub listen: String,
    /// Seconds a client has to send a complete request head (the request
    /// line and headers; with TLS, the handshake too), counted from the
    /// connection's accept or from the first byte of a later request.
    /// A client that has not is disconnected.
    pub header_read_timeout_secs: u64,
    /// Seconds a kept-alive connection may wait with no request in progress
    /// before it is closed. A response still streaming is not idle.
    pub idle_timeout_secs: u64,
    /// Connections the door keeps open at once; one more is refused at
    /// accept (a plain-HTTP client reads a 503).
    pub max_connections: u32,
    /// Connections one peer may keep open at once; one more from it is
    /// refused the same way. A peer is an IPv4 address, an IPv6 /64, or
    /// the host itself (every loopback address is one peer). Clients
    /// behind one proxy share it.
    pub max_connections_per_peer: u32,
    /// Seconds a request's body may take to arrive, counted from the end
    /// of its head; one that has not is answered 408 and the connection
    /// closed.
    pub body_read_timeout_secs: u64,
    /// Seconds a client may take nothing the door writes to it (its
    /// socket full) before it is cut: a streamed request is cancelled in
    /// its engine and counted `client_stalled`.
    pub write_timeout_secs: u64,
}

impl Default for OpenaiConfig {
    fn default() -> Self {
        OpenaiConfig {
            listen: String::new(),
            // A client's request head is one write; 10 s is ample on any
            // link that can carry a stream of tokens.
            header_read_timeout_secs: 10,
            // Longer than an SDK's pause between two calls of one job, so
            // connections are reused, and far shorter than minutes.
            idle_timeout_secs: 60,
            // Far below the NixOS unit's LimitNOFILE (65536), so the cap
            // bites before file descriptors run out, and far above the
            // sequences a card set runs at once.
            max_connections: 1024,
            // One client process rarely needs more than its concurrency;
            // 64 leaves room for a benchmark from one host while keeping
            // 16 such peers from taking the whole door.
            max_connections_per_peer: 64,
            // A body is sent right behind its head; even a 4 MiB prompt
            // on a slow link arrives within seconds.
            body_read_timeout_secs: 30,
            // A client that reads nothing for half a minute has gone away
            // or means harm; one that reads slowly but steadily is never
            // cut (any byte taken restarts the clock).
            write_timeout_secs: 30,
        }
    }
}

/// The public inference port's authentication and transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceConfig {
    /// File of bearer tokens, one per line (`#` comments and blank lines
    /// ignored). When set, Inference and reflection need
    /// `authorization: Bearer <token>`; health stays open. The file must not
    /// be readable by every user. Read once at startup.
    pub tokens_file: Option<PathBuf>,
    /// PEM certificate chain for TLS on the public port (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on the public port (with `tls_cert`); must
    /// not be readable by every user.
    pub tls_key: Option<PathBuf>,
    /// Seconds a Generate stream's client may take nothing while the
    /// stream's buffer (`limits.stream_buffer_chunks`) is full before the
    /// request is cancelled in its engine and counted `client_stalled`.
    pub write_timeout_secs: u64,
}

impl Default for InferenceConfig {
    fn default() -> Self {
        InferenceConfig {
            tokens_file: None,
            tls_cert: None,
            tls_key: None,
            // As the OpenAI door's `write_timeout_secs`.
            write_timeout_secs: 30,
        }
    }
}

/// Request limits, checked by the daemon before a request reaches a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Longest prompt in bytes: the prompt text, or the chat messages'
    /// contents together.
    pub max_prompt_bytes: u64,
    /// Largest `max_tokens` a request may ask for (0, the worker's default,
    /// is always allowed). Unset: the serving engine's declared context
    /// (Engine.Info `context_length`) bounds it, so a 131072-token model is
    /// not capped at a small model's number. `check-config` refuses a value
    /// above a model's context as its command line declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Generate streams one client connection may have open at once.
    pub max_streams_per_connection: u32,
    /// Most stop strings one request may give (each is matched against the
    /// output at every token).
    pub max_stop_strings: u32,
    /// Longest stop string in bytes.
    pub max_stop_bytes: u32,
    /// Chunks of a streamed answer the daemon holds for a client that has
    /// not taken them yet (both doors). While there is room the engine
    /// generates at its own pace, whatever the client's; a full buffer
    /// holds the request back, and a client that then takes nothing for
    /// the door's `write_timeout_secs` is cut.
    pub stream_buffer_chunks: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            // About a million tokens of text at four bytes a token: room
            // for a 256k-token context in any script; the engine counts
            // tokens itself.
            max_prompt_bytes: 4 * 1024 * 1024,
            max_tokens: None,
            max_streams_per_connection: 16,
            max_stop_strings: 16,
            max_stop_bytes: 256,
            // A chunk is a token or a few (some 100-300 bytes as SSE):
            // seconds of decode at any engine's pace, and at most a few
            // hundred KiB per stream.
            stream_buffer_chunks: 1024,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// One human-readable line per event.
    Plain,
    /// One JSON object per line.
    Json,
}

/// How a slot's processes are contained (`daemon.containment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContainmentMode {
    /// A cgroup v2 per slot when one can be had, else the process tree.
    Auto,
    /// A cgroup v2 per slot; the daemon refuses to start without one.
    Cgroup,
    /// The process tree under `/proc` (descendants by parent links, and
    /// processes carrying the slot's `TT_WORKER_SOCKET`).
    ProcessTree,
}

impl ContainmentMode {
    /// The config word.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainmentMode::Auto => "auto",
            ContainmentMode::Cgroup => "cgroup",
            ContainmentMode::ProcessTree => "process-tree",
        }
    }
}

/// Which slots must be ready before the daemon reports READY=1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadyWhen {
    /// Every slot.
    All,
    /// At least one slot.
    Any,
}

/// Where the hardware lives. Tests point these at a fake root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HardwareConfig {
    /// Holds `tenstorrent/N` device nodes.
    pub dev_root: PathBuf,
    /// Holds `class/tenstorrent`, `bus/pci/devices` and `module/tenstorrent`.
    pub sys_root: PathBuf,
    /// Holds `driver/tenstorrent/N/pids`.
    pub proc_root: PathBuf,
    /// The tt-smi executable (a path, or a name looked up in PATH).
    pub tt_smi: PathBuf,
}

impl Default for HardwareConfig {
    fn default() -> Self {
        HardwareConfig {
            dev_root: "/dev".into(),
            sys_root: "/sys".into(),
            proc_root: "/proc".into(),
            tt_smi: "tt-smi".into(),
        }
    }
}

/// `[host]`: the host's own share of its memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// RAM, in MiB, that must stay outside the 1 GiB hugepages (the
    /// reservation the slots need, or the host's if larger): the engines'
    /// own host memory (vLLM's processes, weights staged on their way to
    /// the cards, the tokenizer) and the system's live there. The field ran
    /// a 27B model on a 15 GB host with 10 GB in hugepages. `check-config`
    /// and every start refuse less, naming the numbers; 0: not checked.
    pub ram_floor_mib: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            ram_floor_mib: 4096,
        }
    }
}

/// `[models.X.requires]`: the oldest firmware and driver the model's
/// engine build runs on (tt-inference-server model spec
/// `system_requirements`, e.g. Llama-3.1-8B-Instruct on P300: firmware
/// 19.2.0, tt-kmd 2.5.0, both STRICT).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Requirements {
    /// The oldest firmware bundle (each card's `tt_fw_bundle_ver`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// The oldest tt-kmd (`/sys/module/tenstorrent/version`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kmd: Option<String>,
}

fn default_hugepages_per_card() -> u32 {
    4
}

/// When a slot resets its cards before starting its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartReset {
    /// Before every start, clean or not.
    Always,
    /// Only when the last worker on the cards ended uncleanly.
    IfUnclean,
}

/// When the daemon resets cards at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetPolicy {
    /// Reset every managed card at every start.
    Always,
    /// Reset only when the previous run did not record a clean shutdown.
    IfUnclean,
    /// Never reset at startup (resets after worker crashes still happen).
    Never,
}

/// How cards are reset and proven back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResetConfig {
    /// Startup reset policy.
    pub policy: ResetPolicy,
    /// Deadline for one `tt-smi -r` run, in seconds.
    pub tt_smi_timeout_secs: u64,
    /// How long a card may take to reappear with readable sysfs after
    /// tt-smi returns, in seconds.
    pub come_back_timeout_secs: u64,
    /// The heartbeat must advance across this interval, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// Optional site probe (argv) run after the card is back, with
    /// TT_VISIBLE_DEVICES set to the card BDFs; must exit 0. For example a
    /// mesh-open check.
    pub probe_command: Vec<String>,
    /// Deadline for the probe command, in seconds.
    pub probe_timeout_secs: u64,
    /// Reset attempts before a card is quarantined.
    pub attempts: u32,
    /// First backoff between attempts, in milliseconds; doubles each time.
    pub backoff_ms: u64,
}

impl Default for ResetConfig {
    fn default() -> Self {
        ResetConfig {
            policy: ResetPolicy::IfUnclean,
            tt_smi_timeout_secs: 120,
            come_back_timeout_secs: 60,
            heartbeat_interval_ms: 500,
            probe_command: Vec::new(),
            probe_timeout_secs: 120,
            attempts: 3,
            backoff_ms: 2000,
        }
    }
}

/// A card named in the config: a PCI address (stable) or a device index
/// (convenient, resolved to a BDF at startup because indices can change
/// across resets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CardRef {
    /// `/dev/tenstorrent/N` index.
    Index(u32),
    /// PCI address, e.g. `0000:01:00.0`.
    Bdf(String),
}

impl std::fmt::Display for CardRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CardRef::Index(i) => write!(f, "{i}"),
            CardRef::Bdf(b) => write!(f, "{b}"),
        }
    }
}

/// One model and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Tensor parallelism: 1 (one card) or 2 (two cabled cards as a 1x2 mesh).
    pub tp: u32,
    /// The cards of a single replica, in rank order. Use `replicas` instead
    /// for several.
    #[serde(default)]
    pub cards: Vec<CardRef>,
    /// Several replicas, each a list of `tp` cards. Exclusive with `cards`.
    #[serde(default)]
    pub replicas: Vec<Vec<CardRef>>,
    /// The checkpoint the worker loads (passed as TT_WORKER_MODEL).
    pub checkpoint: PathBuf,
    /// Worker command (argv). Empty means the `tt-worker` installed next to
    /// tt-servingd.
    #[serde(default)]
    pub worker: Vec<String>,
    /// When the slot resets its cards before a start: `if-unclean` (only
    /// after an unclean end) or `always`. Default: `always` for a slot of
    /// two or more cards, `if-unclean` for one. A clean stop of a cabled
    /// 2x P150a can leave its Ethernet cores unresettable for the next
    /// open (tt-metal issue 53281), so a multi-card start follows a reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_before_start: Option<StartReset>,
    /// MESH_DEVICE for the worker; default `(1,1)` for TP=1 and `(1,2)`
    /// for TP=2.
    #[serde(default)]
    pub mesh_device: Option<String>,
    /// How TT_VISIBLE_DEVICES names the slot's cards to the worker: `bdf`
    /// (PCI addresses, which tt-umd reads from 0.9.2) or `index` (the
    /// `/dev/tenstorrent/<N>` numbers, resolved at each start, for older
    /// stacks). tt-umd 0.9.1 and older parse a BDF as the integer 0, and
    /// 0.9.3 and newer read an integer as a position in PCI order, so no
    /// one form suits every tt-umd: docs/HARDWARE.md.
    #[serde(default)]
    pub visible_devices: VisibleDevices,
    /// The engine's feature flags, passed as environment variables.
    #[serde(default)]
    pub flags: BTreeMap<String, String>,
    /// Names of flags that change the tensor cache files (a new variant).
    #[serde(default)]
    pub cache_flags: Vec<String>,
    /// Where the cache flags' arms keep their files: one directory per
    /// variant, or one shared directory for engines whose cache file names
    /// carry what the flags change (ttnn names files by dtype and layout).
    #[serde(default)]
    pub cache_layout: CacheLayout,
    /// vLLM-TT's settings, `[models.X.tt]`: passed to the worker as
    /// TT_WORKER_TT_CONFIG and to vLLM as `--additional-config
    /// '{"tt": ...}'` (tt-worker-openai `--engine vllm-tt`). Keys are the
    /// ones vllm-tt-plugin reads (`trace_region_size`,
    /// `sample_on_device_mode`, `optimizations`, ...: checked by name);
    /// `optimizations` changes the weights, so it keys the cache variant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tt: BTreeMap<String, toml::Value>,
    /// Extra environment for every start.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Extra environment for cold starts only (e.g.
    /// TT_TRANSFORMERS_FORCE_MODEL_LOAD=1 for tt-metal engines).
    #[serde(default)]
    pub cold_env: BTreeMap<String, String>,
    /// Extra environment for warm starts only.
    #[serde(default)]
    pub warm_env: BTreeMap<String, String>,
    /// A file of `KEY=VALUE` lines added to the worker's environment at
    /// every start: secrets (API keys, licence tokens) that must stay out of
    /// the config file. Read at each start, refused when every local user
    /// may read it; its values never appear in logs, status or reload plans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_file: Option<PathBuf>,
    /// The fail-closed banner rule.
    #[serde(default)]
    pub banners: BannerConfig,
    /// How readiness is proven.
    #[serde(default)]
    pub readiness: ReadinessConfig,
    /// Restart policy and watchdogs.
    #[serde(default)]
    pub restart: RestartConfig,
    /// Device hangs: tt-metal's own timeout and the capture kept with the
    /// death.
    #[serde(default)]
    pub hang: HangConfig,
    /// 1 GiB hugepages the engine pins per card (tt-metal's host buffers):
    /// Tenstorrent's host setup reserves 4 per card; Llama-3.1-8B on a P150
    /// needs 12 (tt-inference-server issue 4023). 0 for an engine that
    /// pins none (tt-worker, llama-server). `check-config` and every start
    /// refuse slots that need more together than the host reserved.
    #[serde(default = "default_hugepages_per_card")]
    pub hugepages_per_card: u32,
    /// The host the model's engine build needs: firmware and driver
    /// minimums, as tt-inference-server's model specs state them
    /// (`system_requirements`). `check-config` and the slot's start refuse
    /// a card or driver below them by name.
    #[serde(default)]
    pub requires: Requirements,
    /// Requests waiting for a slot beyond this get RESOURCE_EXHAUSTED.
    #[serde(default = "default_max_queue")]
    pub max_queue: u32,
    /// Requests one slot serves at once; more wait in the model's queue.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// With no Ready slot but one on its way back (a restart after a crash
    /// or kill), how long a request may wait in the queue for it, in
    /// seconds; the request's own deadline still bounds the wait. 0: refuse
    /// at once with UNAVAILABLE and a retry hint (engines whose recovery
    /// takes minutes).
    #[serde(default = "default_recovery_wait_secs")]
    pub recovery_wait_secs: u64,
    /// The longest a request may wait in the queue for a place, in
    /// seconds: one the model is expected not to start within it (or
    /// within its own deadline) is refused at once, one that waited it out
    /// is refused then; both with 503 and `Retry-After` (gRPC:
    /// RESOURCE_EXHAUSTED with a pushback). 0: no bound but the request's
    /// own deadline.
    #[serde(default = "default_max_queue_wait_secs")]
    pub max_queue_wait_secs: u64,
    /// With several Ready replicas, send requests that start alike (a
    /// chat's leading messages, a prompt's first 2 KiB) to the same
    /// replica, where its engine's prefix cache likely holds them, within a
    /// load bound (docs/ARCHITECTURE.md, "Prefix affinity"). false: the
    /// least-loaded replica takes each request.
    #[serde(default = "default_true")]
    pub prefix_affinity: bool,
    /// How long in-flight requests may run when the slot drains, in seconds.
    #[serde(default = "default_drain_timeout_secs")]
    pub drain_timeout_secs: u64,
    /// On reload: when this model's changed definition fails to come up,
    /// bring the old definition back instead of leaving the slot Failed.
    #[serde(default)]
    pub rollback_on_failure: bool,
    /// The most memory a slot's processes may use together, in MiB
    /// (`memory.max` of its cgroup, like systemd's `MemoryMax=`): beyond
    /// it the kernel reclaims, then OOM-kills inside the slot only. Needs
    /// cgroup containment with the memory controller; a start without it
    /// fails rather than run unlimited. None: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max_mib: Option<u64>,
    /// Accuracy gates by task (`[models.X.accuracy.TASK]`): what `ttctl
    /// eval X --task TASK` must score (docs/ACCURACY.md). Applied live.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub accuracy: BTreeMap<String, AccuracyGate>,
}

/// What a task must score: a reference with a tolerance, or a pass mark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccuracyGate {
    /// The reference score, 0 to 1 (with `tolerance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<f64>,
    /// How far below `reference` a score may fall and pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// `"N/M"`: at least N correct of exactly M samples (instead of a
    /// reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_mark: Option<String>,
    /// The task's questions as a JSON-lines file of the built-in
    /// exact-match format (absolute path): what `readiness.accuracy` runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<std::path::PathBuf>,
}

impl AccuracyGate {
    /// The gate as the shared rule reads it (None for a gate validation
    /// would refuse).
    pub fn rule(&self) -> Option<tt_serving_proto::accuracy::Gate> {
        use tt_serving_proto::accuracy::{pass_mark, Gate};
        match (self.reference, self.tolerance, &self.pass_mark) {
            (Some(reference), Some(tolerance), None) => Some(Gate::Reference {
                reference,
                tolerance,
            }),
            (None, None, Some(mark)) => {
                pass_mark(mark).map(|(need, of)| Gate::PassMark { need, of })
            }
            _ => None,
        }
    }
}

fn default_max_queue() -> u32 {
    64
}

fn default_max_in_flight() -> u32 {
    8
}

fn default_max_queue_wait_secs() -> u64 {
    // Past two minutes in a queue an answer is worth more than a place.
    120
}

fn default_recovery_wait_secs() -> u64 {
    30
}

fn default_drain_timeout_secs() -> u64 {
    30
}

fn default_true() -> bool {
    true
}

/// The name of replica `index` of a model: the model's name alone when the
/// model gives `cards` (one replica), `model/N` when it gives `replicas`. A
/// name depends only on the replica's own position, so adding a replica at
/// the end of `replicas` leaves the others' names (and, on reload, their
/// workers) alone.
pub fn slot_name(model: &str, index: usize, numbered: bool) -> String {
    if numbered {
        format!("{model}/{index}")
    } else {
        model.to_string()
    }
}

impl ModelConfig {
    /// The card sets of every replica (from `cards` or `replicas`).
    pub fn card_sets(&self) -> Vec<Vec<CardRef>> {
        if self.replicas.is_empty() {
            vec![self.cards.clone()]
        } else {
            self.replicas.clone()
        }
    }

    /// Whether every start of this model's slots follows a reset of its
    /// cards (`reset_before_start`, default by card count).
    pub fn resets_before_every_start(&self) -> bool {
        match self.reset_before_start {
            Some(StartReset::Always) => true,
            Some(StartReset::IfUnclean) => false,
            None => self.tp > 1,
        }
    }

    /// The `tt` table as the JSON object the worker reads (None when
    /// empty). TOML's values map onto JSON's one to one but for dates,
    /// which no TT setting takes (they become strings, and the key check
    /// refuses them).
    pub fn tt_json(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        if self.tt.is_empty() {
            return None;
        }
        let value = serde_json::to_value(&self.tt).ok()?;
        match value {
            serde_json::Value::Object(map) => Some(map),
            _ => None,
        }
    }

    /// How many readiness pings run at once (`readiness.concurrency`,
    /// default `max_in_flight` up to 4).
    pub fn readiness_concurrency(&self) -> u32 {
        self.readiness
            .concurrency
            .unwrap_or_else(|| self.max_in_flight.min(4))
            .max(1)
    }

    /// MESH_DEVICE for this model's workers.
    pub fn mesh_device(&self) -> String {
        match &self.mesh_device {
            Some(m) => m.clone(),
            // The literal mesh shape the vLLM TT plugin reads: its preset
            // names have no P300, and a bare P150 with one visible card
            // resolves to (1,N) by accident.
            None if self.tp == 2 => "(1,2)".into(),
            None => "(1,1)".into(),
        }
    }
}

/// Which banners must (and must not) appear.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BannerConfig {
    /// Flags covered by the rule: glob patterns over flag names (`*` matches
    /// any run of characters), e.g. `["QWEN*"]`. Empty means every flag.
    pub patterns: Vec<String>,
    /// `truthy`: every covered flag set to a truthy value must print
    /// `<FLAG> engaged`. `both`: also, no covered flag set to a falsy value may
    /// print it (for A/B control arms). `off`: no check.
    pub mode: BannerMode,
}

impl Default for BannerConfig {
    fn default() -> Self {
        BannerConfig {
            patterns: Vec::new(),
            mode: BannerMode::Truthy,
        }
    }
}

/// The form of TT_VISIBLE_DEVICES a model's engine reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VisibleDevices {
    /// Full lower-case PCI addresses (`0000:01:00.0`), rank order: tt-umd
    /// 0.9.2 and newer (`pci_device.cpp` enumerate_devices).
    #[default]
    Bdf,
    /// `/dev/tenstorrent/<N>` numbers, rank order, read at each start. The
    /// start is refused unless the host numbers its cards in PCI order from
    /// 0 (then tt-umd up to 0.9.2, which reads the number as the device
    /// node, and 0.9.3 on, which reads it as a position in PCI order, open
    /// the same card).
    Index,
}

/// Where a model's cache arms (the values of its `cache_flags`) keep
/// their files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheLayout {
    /// One directory per variant: each arm is its own variant, built cold
    /// once, removed on its own.
    #[default]
    PerVariant,
    /// One directory for every arm: the marker records which arms were
    /// built cold; an arm not yet built starts cold into the directory
    /// (keeping the others' files), and switching between built arms is
    /// warm both ways.
    Shared,
}

/// How strict the banner rule is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BannerMode {
    /// Truthy flags must show their banner.
    Truthy,
    /// Truthy flags must, falsy flags must not.
    Both,
    /// No banner check.
    Off,
}

/// How a slot proves it is ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadinessConfig {
    /// From worker start to Ready, in seconds (cold builds take long).
    pub deadline_secs: u64,
    /// Prompt of the readiness ping.
    pub ping_prompt: String,
    /// Tokens generated greedily by the ping.
    pub ping_max_tokens: u32,
    /// If set, the ping's output must contain this text.
    pub expect: Option<String>,
    /// Prompt lengths (in tokens, about: a repeated one-token word) to run
    /// once each after the ping, before the slot is Ready, so that no
    /// client meets the engine's first-use compile of that length
    /// (tt_transformers compiles and captures a trace per padded prefill
    /// length: 30-60 s each). Empty: no warm-up.
    #[serde(default)]
    pub warmup_prompt_tokens: Vec<u32>,
    /// A task of `[models.X.accuracy]` (one with a `file`) run before the
    /// slot is Ready, greedily through the worker: a score that fails the
    /// task's gate fails the start, the score in the reason, so a slot
    /// whose numerics broke is never served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<String>,
    /// How many readiness pings (and warm-up requests per length) run at
    /// once, so that failures only a batch shows (an assert above a batch
    /// size, answers cut short, one request's text in another's) fail the
    /// start instead of reaching clients. Every answer must be whole and
    /// the same (greedy, one prompt). Default: `max_in_flight`, at most 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

impl Default for ReadinessConfig {
    fn default() -> Self {
        ReadinessConfig {
            deadline_secs: 1800,
            ping_prompt: "The capital of France is".into(),
            ping_max_tokens: 4,
            expect: None,
            warmup_prompt_tokens: Vec::new(),
            accuracy: None,
            concurrency: None,
        }
    }
}

/// Device hangs, caught as tt-metal reports them (docs/ENGINES.md,
/// "Device hangs"): the engine gets `TT_METAL_OPERATION_TIMEOUT_SECONDS`
/// and a capture command in `TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE`
/// (an engine not built on tt-metal ignores both); the capture also runs
/// when the stall watchdog stops a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HangConfig {
    /// Seconds without dispatch progress before tt-metal declares the
    /// device hung (its own default: never). Tenstorrent's service uses 5;
    /// 30 leaves room for a long traced prefill on a big mesh. 0: not set.
    /// The model's `env` table wins when it sets the variable itself.
    pub operation_timeout_secs: u64,
    /// Whether to capture evidence (the runtime's timeout command, and the
    /// stall watchdog before it stops a worker).
    pub capture: bool,
    /// The capture's time budget, in seconds; the cards are reset only
    /// after it (never while its triage reads them).
    pub capture_timeout_secs: u64,
    /// The capture file's size bound, in KiB.
    pub capture_max_kib: u64,
    /// Tenstorrent's triage program and arguments, run by the capture only
    /// when found on PATH, limited to the slot's cards
    /// (`TT_VISIBLE_DEVICES`). Empty: none.
    pub triage_command: Vec<String>,
}

impl Default for HangConfig {
    fn default() -> Self {
        HangConfig {
            operation_timeout_secs: 30,
            capture: true,
            capture_timeout_secs: 120,
            capture_max_kib: 1024,
            triage_command: vec!["tt-triage".into(), "--disable-progress".into()],
        }
    }
}

/// Restart policy and watchdogs for a model's workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RestartConfig {
    /// Failed starts within `window_secs`, or in a row without serving
    /// (whatever the time between: a start that fails after a 25-minute
    /// load never has two failures in a window), before the slot stays
    /// Failed until `ttctl slot restart`.
    pub max_attempts: u32,
    /// Failed starts in a row with the same cause and reason (numbers
    /// aside) before the slot gives up: a deterministic failure is not
    /// retried for ever. 0: no such limit.
    pub max_identical: u32,
    /// The window for counting attempts, in seconds.
    pub window_secs: u64,
    /// First backoff, in milliseconds; doubles per attempt.
    pub backoff_ms: u64,
    /// Longest backoff, in milliseconds.
    pub backoff_max_ms: u64,
    /// With requests active and no decode progress for this long, in
    /// seconds, the worker is declared hung and killed. (A worker that does
    /// not answer `Health` at all is caught sooner, within
    /// [`DaemonConfig::unanswered_health_bound`].)
    pub stall_timeout_secs: u64,
    /// The slowest prefill the watchdog allows for, in prompt tokens per
    /// second: while the worker reports `prefill_tokens` pending, the stall
    /// bound grows by `prefill_tokens / min_prefill_tokens_per_sec`
    /// seconds, so a long prompt's silent prefill is not taken for a hang
    /// (the field saw ~135 s for 240k tokens). 0: no allowance.
    pub min_prefill_tokens_per_sec: u64,
    /// Worker resident memory limit in MiB; over it the worker is drained
    /// and restarted before the kernel's OOM killer acts. None: no limit.
    pub rss_limit_mib: Option<u64>,
    /// The span over which a serving worker's memory is judged for a
    /// steady growth, in seconds (the field's leak: 10 GB over six days);
    /// 0: not judged.
    pub rss_growth_window_secs: u64,
    /// The growth over that window, in MiB, from which it is reported
    /// (log, status, `tt_serving_worker_memory_growth_bytes_per_hour`).
    pub rss_growth_report_mib: u64,
    /// Grace period between SIGTERM and SIGKILL when stopping, in seconds.
    pub stop_timeout_secs: u64,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            max_attempts: 5,
            max_identical: 2,
            window_secs: 600,
            backoff_ms: 1000,
            backoff_max_ms: 60_000,
            stall_timeout_secs: 120,
            min_prefill_tokens_per_sec: 100,
            rss_limit_mib: None,
            rss_growth_window_secs: 86_400,
            rss_growth_report_mib: 1024,
            stop_timeout_secs: 20,
        }
    }
}
