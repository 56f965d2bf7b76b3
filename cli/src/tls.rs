//! TLS as psql does it, so that the command works wherever psql does: `sslmode=disable` never
//! encrypts. `prefer` (the default) and `require` encrypt when the server offers it, and
//! `require` refuses a server that does not. The server's certificate is checked only when
//! `PGSSLROOTCERT` names a file of trusted CA certificates (PEM), as libpq checks it only when
//! it has a root certificate: then the certificate must chain to one of them and match the
//! host.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector for every connection the command makes.
pub fn connector() -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let config = match std::env::var_os("PGSSLROOTCERT") {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let certificates = CertificateDer::pem_file_iter(&path)
                .map_err(|e| format!("PGSSLROOTCERT={}: {e}", path.to_string_lossy()))?;
            for certificate in certificates {
                let certificate = certificate
                    .map_err(|e| format!("PGSSLROOTCERT={}: {e}", path.to_string_lossy()))?;
                roots
                    .add(certificate)
                    .map_err(|e| format!("PGSSLROOTCERT={}: {e}", path.to_string_lossy()))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "PGSSLROOTCERT={} holds no certificate",
                    path.to_string_lossy()
                ));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// libpq's `sslmode=require` without a root certificate: the channel is encrypted and the
/// handshake's signatures are checked, but the certificate is not authenticated.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
