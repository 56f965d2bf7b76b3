//! TLS as libpq does it. Without a root certificate the channel is encrypted but the server is
//! not authenticated (`prefer`, the default, and `require`). With one (`sslrootcert`,
//! `PGSSLROOTCERT`, or `~/.postgresql/root.crt` for the verify modes) the certificate must chain
//! to it (`verify-ca`, and `prefer`/`require` as libpq does), and with `verify-full` also name
//! the host.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::CliError;

/// What the server's certificate is checked against.
#[derive(Debug, Clone)]
pub(crate) enum Verify {
    /// Nothing: encryption only.
    Nothing,
    /// Chains to a CA in this file (PEM); any host name.
    Ca(PathBuf),
    /// Chains to a CA in this file and names the host connected to.
    Full(PathBuf),
}

/// The connector for `verify`.
pub(crate) fn connector(verify: &Verify) -> Result<MakeRustlsConnect, CliError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| CliError::Tls(e.to_string()))?
        .dangerous();
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Nothing => Arc::new(EncryptOnly(provider)),
        Verify::Ca(path) => Arc::new(AnyHostName(webpki(path, provider)?)),
        Verify::Full(path) => webpki(path, provider)?,
    };
    let config = builder
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn webpki(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, CliError> {
    let shown = path.display();
    let mut roots = rustls::RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| CliError::Tls(format!("root certificate {shown}: {e}")))?;
    for certificate in certificates {
        let certificate =
            certificate.map_err(|e| CliError::Tls(format!("root certificate {shown}: {e}")))?;
        roots
            .add(certificate)
            .map_err(|e| CliError::Tls(format!("root certificate {shown}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(CliError::Tls(format!(
            "root certificate file {shown} holds no certificate (PEM expected)"
        )));
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| CliError::Tls(format!("root certificate {shown}: {e}")))
}

/// What went wrong in a TLS handshake, when `error` is a TLS failure (and not, say, a refused
/// TCP connection), in words that say what to do.
pub(crate) fn failure(error: &tokio_postgres::Error) -> Option<String> {
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        // tokio-rustls wraps rustls' error in an io::Error, whose source() skips it.
        let tls = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .or_else(|| inner.downcast_ref::<rustls::Error>());
        if let Some(tls) = tls {
            let why = match tls {
                rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer | CertificateError::BadSignature,
                ) => {
                    "its certificate is not signed by a CA in the root certificate file (sslrootcert / PGSSLROOTCERT)".to_owned()
                }
                rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
                ) => "its certificate does not name the host connected to (sslmode=verify-full checks that; verify-ca does not)".to_owned(),
                rustls::Error::InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. },
                ) => "its certificate has expired".to_owned(),
                other if other.to_string().contains("UnsupportedCertVersion") => {
                    "its certificate is X.509 v1, which can be encrypted to but not verified here: \
                     verifying (verify-ca, verify-full, or a root certificate) needs an X.509 v3 \
                     certificate; without a root certificate, sslmode=prefer or require encrypt \
                     without verifying"
                        .to_owned()
                }
                other => other.to_string(),
            };
            return Some(match tls {
                rustls::Error::InvalidCertificate(_) => {
                    format!("the server's certificate was refused: {why}")
                }
                _ => format!("the TLS handshake failed: {why}"),
            });
        }
        cause = inner.source();
    }
    None
}

/// libpq without a root certificate: the channel is encrypted, the server not authenticated.
/// The handshake signature is not checked either: without an authenticated certificate it
/// proves nothing (whoever sits in between signs with the key of the certificate it sends),
/// and checking it needs webpki to parse the certificate, which refuses the X.509 v1
/// self-signed certificates that psql accepts.
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
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is checked, the host name is not.
#[derive(Debug)]
struct AnyHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // webpki checks the name last, after the chain.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
