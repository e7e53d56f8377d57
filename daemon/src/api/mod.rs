//! The daemon's gRPC front: the public inference port (Inference, health,
//! reflection) and the local control socket (Control, health).
//!
//! Layout:
//! - `control`, `inference`: the services; `convert`: protocol messages.
//! - `auth`: who may do what on the control socket (peer credentials).
//! - `tokens`: bearer tokens on the public port; `tls`: its TLS;
//! - `limits`: Generate streams per public connection; `message_limit`:
//!   oversize request messages answered with the limit, not a decoder error.
//! - `conn`: attaching per-connection facts to every request.

mod auth;
mod conn;
mod control;
pub mod convert;
mod inference;
mod limits;
mod message_limit;
pub mod metrics;
pub mod openai;
pub mod route;
pub(crate) mod tls;
pub(crate) mod tokens;

pub use auth::{group_id, AdminRule};

use crate::config::Config;
use crate::shutdown::Shutdown;
use crate::state::DaemonState;
use anyhow::{bail, Context};
use message_limit::MessageLimit;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tt_serving_proto::v1::control_server::ControlServer;
use tt_serving_proto::v1::inference_server::InferenceServer;

/// The gRPC health service name of the Inference service.
pub const INFERENCE_SERVICE: &str = "tt.serving.v1.Inference";

/// Bind the control socket with the configured mode and group. The daemon
/// removes only what it made: a socket at the path that no live daemon
/// answers on (one a killed daemon left). A live socket means another
/// daemon runs; anything else (a regular file, a directory, a link) is
/// refused untouched, since a typo in the path must not destroy a file.
pub fn bind_control_socket(
    path: &Path,
    mode: u32,
    group: Option<&str>,
) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!(
            "cannot inspect {} (daemon.control_socket): {e}",
            path.display()
        ),
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => bail!(
                    "another tt-servingd is already serving {}; stop it first (systemctl stop tenstorrent-serving) or use another daemon.control_socket",
                    path.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "removing the stale control socket of a daemon that is gone");
                    std::fs::remove_file(path).with_context(|| {
                        format!("cannot remove the stale control socket {}", path.display())
                    })?;
                }
                Err(e) => bail!(
                    "{} (daemon.control_socket) is a socket that cannot be checked ({e}); if no tt-servingd runs, remove it and start again",
                    path.display()
                ),
            }
        }
        Ok(meta) => {
            let kind = if meta.is_dir() {
                "a directory"
            } else if meta.file_type().is_symlink() {
                "a symbolic link"
            } else if meta.is_file() {
                "a regular file"
            } else {
                "not a socket"
            };
            bail!(
                "{} (daemon.control_socket) is {kind}, not a socket; tt-servingd leaves it untouched. Point daemon.control_socket at a path of its own (for example /run/tt-serving/control.sock), or remove it yourself if it is not needed",
                path.display()
            );
        }
    }
    // Binding leaves the socket with umask permissions, which lack the
    // world-write bit connecting needs; we narrow or widen to `mode` next.
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot bind the control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set mode {mode:o} on {}", path.display()))?;
    if let Some(group) = group {
        let gid = nix::unistd::Gid::from_raw(group_id(group, "daemon.control_socket_group")?);
        nix::unistd::chown(path, None, Some(gid)).with_context(|| {
            format!("cannot give {} to group `{group}`; the daemon must run as root or be a member of the group", path.display())
        })?;
    }
    Ok(listener)
}

/// Remove the control socket at shutdown, only if a socket is still there
/// (never a file someone put in its place).
pub fn remove_control_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Serve Control and health on the control socket until shutdown. Each
/// connection carries its peer's credentials for `rule`.
pub async fn serve_control(
    listener: UnixListener,
    state: Arc<DaemonState>,
    rule: AdminRule,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let incoming = UnixListenerStream::new(listener).map(|accepted| {
        accepted.map(|stream| {
            let peer = auth::Peer::of(&stream);
            conn::Tagged::new(stream, peer)
        })
    });
    // Control's Generate is held to the same limits as the public port's.
    let max_prompt = state.config().limits.max_prompt_bytes;
    let control = MessageLimit::new(
        ControlServer::new(control::ControlService::new(state, rule))
            .max_decoding_message_size(message_limit::max_message_bytes(max_prompt)),
        max_prompt,
    );
    Server::builder()
        .add_service(control)
        .add_service(health)
        .serve_with_incoming_shutdown(incoming, shutdown.wait())
        .await
        .context("control socket server failed")
}

/// What the public port enforces, loaded from the config at startup so that
/// an unusable tokens file, certificate or key stops the daemon at once.
#[derive(Debug, Clone)]
pub struct PublicPort {
    /// Bearer tokens in front of Inference and reflection.
    tokens: tokens::TokenCheck,
    /// TLS, when configured.
    tls: Option<ServerTlsConfig>,
}

impl PublicPort {
    /// Load `[inference]`: the tokens file and the TLS certificate and key.
    pub fn load(config: &Config) -> anyhow::Result<PublicPort> {
        let i = &config.inference;
        let tokens = match &i.tokens_file {
            Some(path) => {
                let tokens = tokens::Tokens::load(path)?;
                tracing::info!(
                    tokens = tokens.len(),
                    file = %path.display(),
                    "the inference port requires a bearer token (health stays open)"
                );
                Some(tokens)
            }
            None => None,
        };
        let tls = match (&i.tls_cert, &i.tls_key) {
            (Some(cert), Some(key)) => Some(tls::load(cert, key)?),
            (None, None) => None,
            _ => {
                bail!("inference.tls_cert and inference.tls_key go together; give both or neither")
            }
        };
        let loopback = config
            .daemon
            .listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        if tokens.is_some() && tls.is_none() && !loopback {
            tracing::warn!(listen = %config.daemon.listen, "bearer tokens travel in clear text on a non-loopback port; set inference.tls_cert and inference.tls_key, or terminate TLS in a proxy on this host");
        }
        Ok(PublicPort {
            tokens: tokens::TokenCheck::new(tokens),
            tls,
        })
    }

    /// Whether TLS is served.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether a bearer token is required.
    pub fn tokens_required(&self) -> bool {
        self.tokens.enabled()
    }

    /// The token check, for the OpenAI front door (the same tokens).
    pub fn token_check(&self) -> tokens::TokenCheck {
        self.tokens.clone()
    }
}

/// Serve Inference, health and reflection on the public port until shutdown.
/// Health answers without a token so load balancers can probe it; Inference
/// and reflection need one when tokens are configured. Control is never
/// served here.
pub async fn serve_public(
    listener: TcpListener,
    state: Arc<DaemonState>,
    port: PublicPort,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let reflection_v1 = reflection("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .context("cannot build the reflection service")?;
    let reflection_v1alpha = reflection("grpc.reflection.v1alpha.ServerReflection")
        .build_v1alpha()
        .context("cannot build the reflection service")?;
    // Messages far beyond the prompt limit are refused from their length
    // prefix, before they take memory, with the limit named; the router
    // names it for the rest. tonic's own limit, at the same size, is never
    // reached first.
    let max_prompt = state.config().limits.max_prompt_bytes;
    let inference = MessageLimit::new(
        InferenceServer::new(inference::InferenceService::new(state))
            .max_decoding_message_size(message_limit::max_message_bytes(max_prompt)),
        max_prompt,
    );
    let mut builder = Server::builder();
    if let Some(tls) = port.tls {
        builder = builder
            .tls_config(tls)
            .context("cannot set up TLS on the inference port")?;
    }
    builder
        .add_service(InterceptedService::new(inference, port.tokens.clone()))
        .add_service(health)
        .add_service(InterceptedService::new(reflection_v1, port.tokens.clone()))
        .add_service(InterceptedService::new(reflection_v1alpha, port.tokens))
        .serve_with_incoming_shutdown(incoming_public(listener), shutdown.wait())
        .await
        .context("inference port server failed")
}

/// Reflection advertising what this port serves: the descriptor set also
/// holds Control and Engine, which are not served here and must not be
/// listed as if they were.
fn reflection(itself: &str) -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tt_serving_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(INFERENCE_SERVICE)
        .with_service_name("grpc.health.v1.Health")
        .with_service_name(itself)
}

/// Accepted TCP connections, each with its own Generate stream counter and
/// with Nagle's algorithm off: tokens are small writes, and Nagle plus
/// delayed ACKs would hold each one back.
fn incoming_public(
    listener: TcpListener,
) -> impl tokio_stream::Stream<
    Item = std::io::Result<conn::Tagged<tokio::net::TcpStream, limits::StreamCount>>,
> {
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.map(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            conn::Tagged::new(stream, limits::StreamCount::default())
        })
    })
}

/// Keep gRPC health in step with the slots: `""` (the daemon) is always
/// SERVING; `tt.serving.v1.Inference` is SERVING while any slot is Ready;
/// each configured model's name is SERVING while one of its slots is Ready.
/// Published once now, then again whenever the status bus moves, for as
/// long as the daemon runs (slots know nothing of gRPC).
pub async fn init_health(reporter: &HealthReporter, state: &Arc<DaemonState>) {
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let mut published: std::collections::BTreeMap<String, bool> = Default::default();
    publish_health(reporter, state, &mut published).await;
    let (reporter, state) = (reporter.clone(), state.clone());
    let mut changes = state.subscribe();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            publish_health(&reporter, &state, &mut published).await;
        }
    });
}

/// Set every health status that differs from what was last published.
async fn publish_health(
    reporter: &HealthReporter,
    state: &DaemonState,
    published: &mut std::collections::BTreeMap<String, bool>,
) {
    let slots = state.slots();
    let ready = |model: Option<&str>| {
        slots.iter().any(|s| {
            s.state == crate::slots::SlotState::Ready && model.is_none_or(|m| s.model == m)
        })
    };
    let mut wanted: std::collections::BTreeMap<String, bool> = state
        .config()
        .models
        .keys()
        .map(|m| (m.clone(), ready(Some(m))))
        .collect();
    // A model a reload removed stops serving.
    for gone in published.keys() {
        if gone != INFERENCE_SERVICE && !wanted.contains_key(gone) {
            wanted.insert(gone.clone(), false);
        }
    }
    wanted.insert(INFERENCE_SERVICE.to_string(), ready(None));
    for (service, serving) in wanted {
        if published.get(&service) == Some(&serving) {
            continue;
        }
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter.set_service_status(&service, status).await;
        published.insert(service, serving);
    }
}
