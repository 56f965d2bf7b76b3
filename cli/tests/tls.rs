//! TLS as libpq does it: `prefer` (the default) encrypts without verifying and falls back to
//! plain when TLS cannot be set up; `require` encrypts; `verify-ca`/`verify-full`, or a root
//! certificate, verify.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{assert_fails_saying, command, pgtenant, setup, text};
use pgtenant_testkit::LocalCluster;
use tokio_postgres::Client;

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command (apt-get install openssl)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        text(&output)
    );
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pgtenant-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// A self-signed X.509 *v1* certificate for 127.0.0.1, as `openssl x509 -req -signkey` makes
/// it (no extensions), and its key.
fn v1_certificate(dir: &Path) -> (PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "v1.key",
            "-subj",
            "/CN=127.0.0.1",
            "-out",
            "v1.csr",
        ],
    );
    openssl(
        dir,
        &[
            "x509", "-req", "-in", "v1.csr", "-signkey", "v1.key", "-days", "2", "-out", "v1.crt",
        ],
    );
    let shown = Command::new("openssl")
        .args(["x509", "-in", "v1.crt", "-noout", "-text"])
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        text(&shown).contains("Version: 1 (0x0)"),
        "{}",
        text(&shown)
    );
    (dir.join("v1.crt"), dir.join("v1.key"))
}

/// Serves TLS with `cert` and `key`, these `settings` and this pg_hba.conf, on `admin`'s
/// cluster (reloaded; admin stays connected through any pg_hba change).
async fn serve_tls(
    cluster: &LocalCluster,
    admin: &Client,
    (cert, key): (&Path, &Path),
    settings: &[(&str, &str)],
    hba: &str,
) {
    // The server runs as the data directory's owner, and refuses a key others can read.
    let data = cluster.data_dir();
    let owner = std::fs::metadata(data).expect("the data directory");
    for (from, to) in [(cert, "test-server.crt"), (key, "test-server.key")] {
        let to = data.join(to);
        std::fs::copy(from, &to).expect("copy into the data directory");
        std::os::unix::fs::chown(&to, Some(owner.uid()), Some(owner.gid())).expect("chown");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    std::fs::write(data.join("pg_hba.conf"), hba).expect("pg_hba.conf");
    let mut statements = vec![
        "ALTER SYSTEM SET ssl_cert_file = 'test-server.crt'".to_owned(),
        "ALTER SYSTEM SET ssl_key_file = 'test-server.key'".to_owned(),
    ];
    for (name, value) in settings {
        statements.push(format!("ALTER SYSTEM SET {name} = '{value}'"));
    }
    statements.push("ALTER SYSTEM SET ssl = on".to_owned());
    statements.push("SELECT pg_reload_conf()".to_owned());
    for statement in statements {
        admin.batch_execute(&statement).await.expect(&statement);
    }
    // A reload has no event to wait for: read until this session has it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let on: String = admin
            .query_one("SHOW ssl", &[])
            .await
            .expect("SHOW ssl")
            .get(0);
        if on == "on" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "TLS not on after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

const TLS_ONLY: &str = "local all all trust\n\
                        hostnossl postgres all 127.0.0.1/32 trust\n\
                        hostssl all all 127.0.0.1/32 trust\n";

/// psql connects to a server whose self-signed certificate is X.509 v1; so does pgtenant,
/// encrypted (the server takes TLS connections only), without verifying.
#[tokio::test]
async fn prefer_and_require_encrypt_to_an_x509_v1_certificate() {
    let dir = temp_dir("v1");
    let (cert, key) = v1_certificate(&dir);
    let cluster = LocalCluster::start().await.expect("a cluster");
    let db = cluster.create_database().await.expect("a database");
    let admin = db.connect().await.expect("connect");
    serve_tls(&cluster, &admin, (&cert, &key), &[], TLS_ONLY).await;
    let url = |params: &str| format!("{}{params}", db.url());

    setup(&url(""));
    for params in ["", "?sslmode=prefer", "?sslmode=require"] {
        let status = pgtenant(&["status", "--database-url", &url(params)]);
        assert!(status.status.success(), "{params}: {}", text(&status));
        assert!(status.stderr.is_empty(), "{params}: {}", text(&status));
    }
    assert_fails_saying(
        &pgtenant(&["status", "--database-url", &url("?sslmode=disable")]),
        "no encryption",
    );
    // Verifying needs an X.509 v3 certificate, and says so.
    let verify = pgtenant(&[
        "status",
        "--database-url",
        &url(&format!(
            "?sslmode=verify-ca&sslrootcert={}",
            cert.display()
        )),
    ]);
    assert_fails_saying(&verify, "X.509 v1");
    std::fs::remove_dir_all(dir).ok();
}

/// A server whose TLS the client cannot speak (here: TLS 1.2 with only a cipher suite without
/// forward secrecy, which rustls does not offer): `prefer` falls back to plain as libpq does,
/// `require` refuses.
#[tokio::test]
async fn prefer_falls_back_to_plain_when_tls_cannot_be_set_up() {
    let dir = temp_dir("fallback");
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-subj",
            "/CN=127.0.0.1",
            "-days",
            "2",
            "-out",
            "server.crt",
        ],
    );
    let cluster = LocalCluster::start().await.expect("a cluster");
    let db = cluster.create_database().await.expect("a database");
    let admin = db.connect().await.expect("connect");
    serve_tls(
        &cluster,
        &admin,
        (&dir.join("server.crt"), &dir.join("server.key")),
        &[
            ("ssl_max_protocol_version", "TLSv1.2"),
            ("ssl_ciphers", "AES256-SHA"),
        ],
        "local all all trust\nhost all all 127.0.0.1/32 trust\n",
    )
    .await;

    let prefer = pgtenant(&["setup", "--database-url", db.url()]);
    assert!(prefer.status.success(), "{}", text(&prefer));
    assert!(
        text(&prefer).contains("warning: TLS could not be set up")
            && text(&prefer).contains("connecting without TLS"),
        "{}",
        text(&prefer)
    );
    let require = pgtenant(&[
        "status",
        "--database-url",
        &format!("{}?sslmode=require", db.url()),
    ]);
    assert_fails_saying(&require, "over TLS: the TLS handshake failed");
    std::fs::remove_dir_all(dir).ok();
}

/// Against a server that refuses unencrypted connections, with a certificate for 127.0.0.1
/// signed by a throwaway CA: `require` encrypts; a root certificate (PGSSLROOTCERT or
/// sslrootcert) or verify-ca/verify-full check the chain, verify-full also the host name;
/// another CA authenticates nothing; `disable` is refused by the server, which says why.
#[tokio::test]
async fn verification_follows_sslmode_and_the_root_certificate() {
    let cluster = LocalCluster::start_tls().await.expect("a TLS cluster");
    let db = cluster.create_database().await.expect("database");
    let ca = cluster.tls_root_certificate().expect("its CA").to_owned();
    let url = |params: String| format!("{}?{params}", db.url());
    let by_name = db.url().replace("127.0.0.1", "localhost");

    setup(&url("sslmode=require".into()));
    let run = |url: &str, root: Option<&Path>| {
        let mut run = command(["status", "--database-url", url]);
        // No ~/.postgresql/root.crt either.
        run.env("HOME", "/nonexistent");
        if let Some(root) = root {
            run.env("PGSSLROOTCERT", root);
        }
        run.output().expect("run pgtenant")
    };
    let ca_param = format!("sslrootcert={}", ca.display());
    for (url, root) in [
        (db.url().to_owned(), None),
        (url("sslmode=require".into()), Some(ca.as_path())),
        (url(format!("sslmode=verify-ca&{ca_param}")), None),
        (url("sslmode=verify-full".into()), Some(ca.as_path())),
        (url(format!("sslmode=verify-full&{ca_param}")), None),
        // verify-ca does not check the name.
        (format!("{by_name}?sslmode=verify-ca&{ca_param}"), None),
    ] {
        let output = run(&url, root);
        assert!(output.status.success(), "{url} {root:?}: {}", text(&output));
    }
    assert_fails_saying(
        &run(&format!("{by_name}?sslmode=verify-full&{ca_param}"), None),
        "its certificate does not name the host connected to",
    );
    assert_fails_saying(
        &run(&url("sslmode=verify-full".into()), None),
        "sslmode=verify-full needs a root certificate",
    );
    assert_fails_saying(&run(&url("sslmode=disable".into()), None), "no encryption");

    // Another CA's certificate authenticates nothing here.
    let other = LocalCluster::start_tls()
        .await
        .expect("a second TLS cluster");
    let stranger = other.tls_root_certificate().expect("its CA");
    for url in [
        url("sslmode=require".into()),
        url("sslmode=verify-full".into()),
    ] {
        assert_fails_saying(
            &run(&url, Some(stranger)),
            "its certificate is not signed by a CA in the root certificate file",
        );
    }
}
