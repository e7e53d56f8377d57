//! The daemon's gRPC front: the public inference port (Inference, health,
//! reflection) and the local control socket (Control, health).

mod control;
pub mod convert;
mod inference;
pub mod metrics;

use crate::daemon::DaemonState;
use crate::shutdown::Shutdown;
use anyhow::{bail, Context};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tt_serving_proto::v1::control_server::ControlServer;
use tt_serving_proto::v1::inference_server::InferenceServer;

/// The gRPC health service name of the Inference service.
pub const INFERENCE_SERVICE: &str = "tt.serving.v1.Inference";

/// Bind the control socket with the configured mode and group. A live socket
/// at the path means another daemon runs: refuse rather than steal it.
pub fn bind_control_socket(
    path: &Path,
    mode: u32,
    group: Option<&str>,
) -> anyhow::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| {
            format!(
                "cannot create the control socket's directory {}",
                parent.display()
            )
        })?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "another tt-servingd is already serving {}; stop it first (systemctl stop tenstorrent-serving) or use another daemon.control_socket",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| {
            format!("cannot remove the stale control socket {}", path.display())
        })?;
    }
    // Binding leaves the socket with umask permissions, which lack the
    // world-write bit connecting needs; we narrow or widen to `mode` next.
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot bind the control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set mode {mode:o} on {}", path.display()))?;
    if let Some(group) = group {
        let gid = nix::unistd::Group::from_name(group)
            .with_context(|| format!("cannot look up group `{group}`"))?
            .with_context(|| {
                format!("group `{group}` (daemon.control_socket_group) does not exist; create it or change the config")
            })?
            .gid;
        nix::unistd::chown(path, None, Some(gid)).with_context(|| {
            format!("cannot give {} to group `{group}`; the daemon must run as root or be a member of the group", path.display())
        })?;
    }
    Ok(listener)
}

/// Serve Control and health on the control socket until shutdown.
pub async fn serve_control(
    listener: UnixListener,
    state: Arc<DaemonState>,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    Server::builder()
        .add_service(ControlServer::new(control::ControlService::new(state)))
        .add_service(health)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.wait())
        .await
        .context("control socket server failed")
}

/// Serve Inference, health and reflection on the public port until shutdown.
pub async fn serve_public(
    listener: TcpListener,
    state: Arc<DaemonState>,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tt_serving_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("cannot build the reflection service")?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tt_serving_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("cannot build the reflection service")?;
    Server::builder()
        .add_service(InferenceServer::new(inference::InferenceService::new(
            state,
        )))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming_nodelay(listener), shutdown.wait())
        .await
        .context("inference port server failed")
}

/// Accepted TCP connections with Nagle's algorithm off: tokens are small
/// writes, and Nagle plus delayed ACKs would hold each one back.
fn incoming_nodelay(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        })
    })
}

/// Publish initial health: the daemon ("") serves; each model and the
/// Inference service serve only while a slot of theirs is Ready.
pub async fn init_health(reporter: &HealthReporter, state: &DaemonState) {
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let any_ready = state
        .slots()
        .iter()
        .any(|s| s.state == crate::slots::SlotState::Ready);
    reporter
        .set_service_status(
            INFERENCE_SERVICE,
            if any_ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            },
        )
        .await;
    for model in state.config().models.keys() {
        reporter
            .set_service_status(model, ServingStatus::NotServing)
            .await;
    }
}
