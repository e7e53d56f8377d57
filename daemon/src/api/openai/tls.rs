//! TLS on the OpenAI front door, from the same files as the gRPC port
//! (`inference.tls_cert`, `inference.tls_key`): rustls, loaded and checked
//! at startup so a bad pair stops the daemon at once.

use crate::shutdown::Shutdown;
use anyhow::Context;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The front door's TLS acceptor.
#[derive(Clone)]
pub struct HttpTls {
    acceptor: TlsAcceptor,
}

impl HttpTls {
    /// Read the certificate chain and key; refuse a key every user can
    /// read (the same rule as the gRPC port).
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<HttpTls> {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .with_context(|| {
                format!(
                    "cannot read the TLS certificate chain {} (inference.tls_cert); give a PEM file the daemon may read",
                    cert.display()
                )
            })?;
        let key_pem = crate::secrets::read(key, "inference.tls_key")?;
        let key_der = PrivateKeyDer::from_pem_slice(&key_pem).with_context(|| {
            format!(
                "cannot read a private key in {} (inference.tls_key); give a PEM private key",
                key.display()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("rustls has no safe protocol versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key_der)
            .with_context(|| {
                format!(
                    "cannot use {} with {} for TLS; give a certificate chain and its matching private key",
                    cert.display(),
                    key.display()
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(HttpTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Accept TLS connections and serve `app` on each until shutdown.
    pub async fn serve(
        self,
        listener: TcpListener,
        app: axum::Router,
        shutdown: Shutdown,
    ) -> anyhow::Result<()> {
        loop {
            let (tcp, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "OpenAI front door: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.clone().wait() => return Ok(()),
            };
            let (acceptor, app) = (self.acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client that never finishes its handshake holds nothing
                // for long.
                let handshake =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
                let Ok(Ok(stream)) = handshake else {
                    tracing::debug!("OpenAI front door: TLS handshake failed or timed out");
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(30))
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "OpenAI front door connection ended with an error");
                }
            });
        }
    }
}
