//! TLS: with `RouterOptions::tls`, every connection pgtenant opens itself (lease session,
//! pooler probe, data-path pool, cancel requests) uses the application's connector, against a
//! server that refuses unencrypted connections to the application's database (the test kit's
//! `LocalCluster::start_tls`).

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtenant::{ActiveWork, Error, Router, RouterOptions};
use pgtenant_testkit::LocalCluster;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

fn rustls_connector(ca_pem: &Path) -> MakeRustlsConnect {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let ca = rustls::pki_types::CertificateDer::from_pem_file(ca_pem).expect("read the test CA");
    roots.add(ca).expect("trust the test CA");
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
    let cluster = LocalCluster::start_tls()
        .await
        .expect("a cluster that requires TLS");
    let db = cluster.create_database().await.expect("database");
    let tls = rustls_connector(cluster.tls_root_certificate().expect("a TLS cluster"));
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
}
