//! gRPC channels over unix sockets (the control socket, worker sockets).

use hyper_util::rt::TokioIo;
use std::path::Path;
use tonic::transport::{Channel, Endpoint};

/// Connect a tonic channel to the unix socket at `path`. The URI is a
/// placeholder that tonic requires; the connector ignores it.
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = path.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                // Quiet: no wake-up per token when the worker reads what we
                // wrote (see the type's doc).
                let stream = tt_serving_proto::uds::QuietUnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}
