//! TLS for the public port (`inference.tls_cert`, `inference.tls_key`),
//! served by rustls through tonic. Loaded and checked at startup, so a bad
//! certificate or key stops the daemon before it reports READY rather than
//! leaving it without a public port.

use crate::secrets;
use anyhow::Context;
use std::path::Path;
use tonic::transport::{Identity, Server, ServerTlsConfig};

/// Read the certificate chain and key and check that rustls accepts them.
pub fn load(cert: &Path, key: &Path) -> anyhow::Result<ServerTlsConfig> {
    let cert_pem = std::fs::read(cert).with_context(|| {
        format!(
            "cannot read the TLS certificate {} (inference.tls_cert); check the path and that the daemon's user may read it",
            cert.display()
        )
    })?;
    let key_pem = secrets::read(key, "inference.tls_key")?;
    let config = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
    // Building the acceptor parses both files; do it now, not at the first
    // connection.
    Server::builder()
        .tls_config(config.clone())
        .with_context(|| {
            format!(
                "cannot use {} (inference.tls_cert) with {} (inference.tls_key); give a PEM certificate chain and its matching PEM private key",
                cert.display(),
                key.display(),
            )
        })?;
    Ok(config)
}
