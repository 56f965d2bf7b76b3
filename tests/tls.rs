//! TLS: with `RouterOptions::tls`, every connection pgtenant opens itself (lease session,
//! pooler probe, data-path pool, cancel requests) uses the application's connector, against a
//! server that refuses unencrypted connections to the application's database.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtenant::{ActiveWork, Error, Router, RouterOptions};
use pgtenant_testkit::LocalCluster;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// A CA and a server certificate for 127.0.0.1 signed by it, made with the openssl command;
/// the server's files are readable by the `postgres` user that runs the cluster.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("this test needs the openssl command");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=pgtenant test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write san.ext");
    openssl(&[
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
    ]);
    openssl(&["x509", "-in", "ca.pem", "-outform", "der", "-out", "ca.der"]);
    let (uid, gid) = support::postgres_user();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    std::fs::set_permissions(
        dir.join("server.pem"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod cert");
    std::os::unix::fs::chown(dir.join("server.key"), Some(uid), Some(gid)).expect("chown key");
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod key");
}

fn rustls_connector(ca_der: &Path) -> MakeRustlsConnect {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            std::fs::read(ca_der).expect("ca.der"),
        ))
        .expect("the test CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    MakeRustlsConnect::new(config)
}

#[tokio::test]
async fn every_connection_uses_the_applications_tls_connector() {
    let dir = std::env::temp_dir().join(format!("pgtenant-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    make_certificates(&dir);
    let cert = dir.join("server.pem").display().to_string();
    let key = dir.join("server.key").display().to_string();
    let cluster = LocalCluster::start_with_settings(&[
        ("ssl", "on"),
        ("ssl_cert_file", cert.as_str()),
        ("ssl_key_file", key.as_str()),
    ])
    .await
    .expect("a cluster with TLS");
    // Unencrypted connections only to the `postgres` database (the test kit's own); every
    // other database requires TLS.
    std::fs::write(
        cluster.data_dir().join("pg_hba.conf"),
        "local all all trust\nhostnossl postgres all 127.0.0.1/32 trust\nhostssl all all 127.0.0.1/32 trust\n",
    )
    .expect("pg_hba.conf");
    let (admin, admin_connection) =
        tokio_postgres::connect(&cluster.url("postgres"), tokio_postgres::NoTls)
            .await
            .expect("admin connection");
    tokio::spawn(admin_connection);
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let db = cluster.create_database().await.expect("database");
    let tls = rustls_connector(&dir.join("ca.der"));
    let mut config = db.config();
    config.ssl_mode(SslMode::Require);

    let (mut client, connection) = config.connect(tls.clone()).await.expect("TLS connection");
    tokio::spawn(connection);
    pgtenant::setup(&mut client).await.expect("setup over TLS");

    // Without the connector the server refuses, and the error says why.
    let mut plain = db.config();
    plain.ssl_mode(SslMode::Prefer);
    match Router::start(RouterOptions::new("plain", plain)).await {
        Err(error) => assert!(error.to_string().contains("no encryption"), "{error}"),
        Ok(_) => panic!("an unencrypted lease session was accepted"),
    }

    let router = Router::start(
        RouterOptions::new("encrypted", config.clone())
            .tls(tls)
            .drain_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("router over TLS");
    let id = pgtenant::TenantId::new("acme", "secret").unwrap();
    let handle = router.open_or_create(&id).await.expect("open over TLS");
    let encrypted: bool = handle
        .run(|tx| {
            Box::pin(async move {
                let row = tx
                    .query_one(
                        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                        &[],
                    )
                    .await?;
                Ok::<_, Error>(row.get(0))
            })
        })
        .await
        .expect("fenced work over TLS");
    assert!(encrypted, "the data path is encrypted");
    let lease_encrypted: bool = client
        .query_one(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.application_name = 'pgtenant lease encrypted'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(lease_encrypted, "the lease session is encrypted");

    // forget(Cancel) reaches a statement in flight with a cancel request made the same way.
    let working = handle.clone();
    let work = tokio::spawn(async move {
        working
            .run(|tx| {
                Box::pin(async move {
                    tx.execute("SELECT pg_sleep(3)", &[]).await?;
                    Ok::<_, Error>(())
                })
            })
            .await
    });
    while handle.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    handle
        .forget(ActiveWork::Cancel)
        .await
        .expect("forget cancels");
    assert!(work.await.unwrap().is_err(), "the statement was cancelled");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "did not wait for the sleep to end"
    );

    router.close().await;
    drop(db);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
