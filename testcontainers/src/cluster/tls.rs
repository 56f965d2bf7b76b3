//! Certificates for a cluster that serves TLS ([`LocalCluster::start_tls`]).
//!
//! [`LocalCluster::start_tls`]: crate::cluster::local::LocalCluster::start_tls

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::TestkitError;

/// A CA (`ca.pem`) and a server certificate for 127.0.0.1 signed by it
/// (`server.pem`, `server.key`) in `dir`, made with the openssl command; the key is owned by
/// the server's user, as PostgreSQL requires.
pub(crate) async fn make_certificates(
    dir: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(), TestkitError> {
    async fn openssl(dir: &Path, args: Vec<&str>) -> Result<(), TestkitError> {
        let out = tokio::process::Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .output()
            .await
            .map_err(|e| TestkitError::io("running openssl (apt-get install openssl)", e))?;
        if !out.status.success() {
            return Err(TestkitError::Cluster(format!(
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }
    let new_key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=pgtenant-testkit CA",
    ];
    ca.extend(new_key);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, ca).await?;
    let mut request = vec!["req", "-subj", "/CN=127.0.0.1"];
    request.extend(new_key);
    request.extend(["-keyout", "server.key", "-out", "server.csr"]);
    openssl(dir, request).await?;
    fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
        .map_err(|e| TestkitError::io("writing san.ext", e))?;
    openssl(
        dir,
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    )
    .await?;
    let protect = || -> std::io::Result<()> {
        fs::set_permissions(dir.join("server.key"), fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = owner {
            for file in ["server.key", "server.pem", "ca.pem"] {
                std::os::unix::fs::chown(dir.join(file), Some(uid), Some(gid))?;
            }
        }
        Ok(())
    };
    protect().map_err(|e| TestkitError::io("handing the certificates to the server's user", e))
}
