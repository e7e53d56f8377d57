//! TLS on the OpenAI front door, from the same files as the gRPC port
//! (`inference.tls_cert`, `inference.tls_key`): rustls, loaded and checked
//! at startup so a bad pair stops the daemon at once. Connections are
//! accepted, capped and timed in `connections`, the same as plain ones.

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
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

    /// The server side of the handshake on an accepted connection (the
    /// caller bounds how long it may take).
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        self.acceptor.accept(tcp).await
    }
}
