//! The example service over real HTTP against a real PostgreSQL (a fresh database from the test
//! kit): one replica end to end, two replicas and a handoff, forwarding between two replicas
//! with placement on (one hop, the loop guard, an unreachable owner), health when the router is
//! closed, and the binary itself stopped by SIGTERM.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use pgtenant::{CloseReport, Router, TenantId};
use pgtenant_example_service::{app, install_metrics, router_options, serve};
use pgtenant_testkit::TestDatabase;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Bounds every wait, so that a hang fails the test with a message instead of stalling CI.
const PATIENCE: Duration = Duration::from_secs(60);

/// A fresh database with pgtenant's control plane.
async fn database() -> (TestDatabase, pgtenant::postgres::Client) {
    let db = TestDatabase::create().await.expect("a test database");
    let mut client = db.connect().await.expect("connect to the test database");
    pgtenant::setup(&mut client).await.expect("pgtenant setup");
    (db, client)
}

/// The process has one metrics recorder; every service in this test binary shares it.
fn metrics() -> PrometheusHandle {
    static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();
    METRICS
        .get_or_init(|| install_metrics().expect("install the Prometheus recorder"))
        .clone()
}

/// One replica of the service, in this process, on an ephemeral port.
struct Service {
    addr: SocketAddr,
    router: Router,
    stop: oneshot::Sender<()>,
    served: JoinHandle<std::io::Result<CloseReport>>,
}

/// A listener on an ephemeral port and a router registered with its address.
async fn listen_and_start(url: &str, replica: &str, placement: bool) -> (TcpListener, Router) {
    // Bound before serving: connections made from now on wait in the backlog, no sleep.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let options = router_options(replica, url)
        .expect("options")
        .pool_size(4)
        .address(format!("http://{addr}"))
        .placement(placement);
    let router = Router::start(options).await.expect("router starts");
    (listener, router)
}

impl Service {
    async fn start(url: &str, replica: &str) -> Service {
        Service::start_with(url, replica, false).await
    }

    /// With placement on: tenants have a home replica.
    async fn start_placed(url: &str, replica: &str) -> Service {
        Service::start_with(url, replica, true).await
    }

    async fn start_with(url: &str, replica: &str, placement: bool) -> Service {
        let (listener, router) = listen_and_start(url, replica, placement).await;
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(serve(listener, router.clone(), metrics(), async {
            let _ = stopped.await;
        }));
        Service {
            addr,
            router,
            stop,
            served,
        }
    }

    /// What SIGTERM does in the binary: stop accepting, finish, close the router.
    async fn shut_down(self) -> CloseReport {
        self.stop.send(()).expect("the service is still running");
        tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("graceful shutdown within the patience")
            .expect("serve task")
            .expect("serve")
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn get(&self, path: &str) -> Reply {
        http(self.addr, "GET", path, None).await
    }

    async fn post(&self, path: &str, body: Option<Value>) -> Reply {
        http(self.addr, "POST", path, body).await
    }

    async fn delete(&self, path: &str) -> Reply {
        http(self.addr, "DELETE", path, None).await
    }

    async fn put(&self, path: &str, body: Value) -> Reply {
        http(self.addr, "PUT", path, Some(body)).await
    }
}

/// An HTTP response, as the tiny client below read it.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {self:?}"))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// HTTP/1.1 with `Connection: close`: the server sends one response and closes, so the
/// response is everything read until EOF. Enough for a test, and no client dependency.
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Reply {
    http_with(addr, method, path, &[], body).await
}

/// [`http`] with extra request headers.
async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Reply {
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .expect("connect to the service");
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let extra: String = headers
            .iter()
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .collect();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("receive");
        String::from_utf8(raw).expect("UTF-8 response")
    };
    let raw = tokio::time::timeout(PATIENCE, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no response within {PATIENCE:?}"));
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let reply = Reply {
        status,
        headers,
        body: body.to_owned(),
    };
    assert_eq!(
        reply.header("transfer-encoding"),
        None,
        "this client reads bodies with a length only"
    );
    reply
}

/// `(state, owner)` of a tenant in `pgtenant.lease_status`.
async fn lease(client: &pgtenant::postgres::Client, tenant: &str) -> (String, Option<String>) {
    let row = client
        .query_one(
            "SELECT state, owner FROM pgtenant.lease_status WHERE tenant = $1",
            &[&tenant],
        )
        .await
        .expect("lease_status");
    (row.get(0), row.get(1))
}

fn memos(entries: &Value) -> Vec<&str> {
    entries["entries"]
        .as_array()
        .expect("an entries array")
        .iter()
        .map(|entry| entry["memo"].as_str().expect("a memo"))
        .collect()
}

#[tokio::test]
async fn one_replica_serves_tenants_over_http_and_hands_them_off_on_shutdown() {
    let (db, client) = database().await;
    let a = Service::start(db.url(), "replica-a").await;

    let created = a.post("/tenants/acme/invoices", None).await;
    assert_eq!(created.status, 200, "{created:?}");
    let created = created.json();
    assert_eq!(created["tenant"], "acme/invoices");
    assert_eq!(created["replica"], "replica-a");
    assert!(created["epoch"].as_i64().is_some_and(|epoch| epoch >= 1));

    // One entry through run (a closure borrowing the request body)…
    let entry = json!({ "memo": "coffee", "amount": -450 });
    let added = a.post("/tenants/acme/invoices/entries", Some(entry)).await;
    assert_eq!(added.status, 201, "{added:?}");
    assert_eq!(
        added.json(),
        json!({ "id": 1, "memo": "coffee", "amount": -450 })
    );

    // …several through the guard API, in one transaction.
    let batch =
        json!([{ "memo": "salary", "amount": 100000 }, { "memo": "rent", "amount": -50000 }]);
    let added = a
        .post("/tenants/acme/invoices/entries/batch", Some(batch))
        .await;
    assert_eq!(added.status, 201, "{added:?}");
    assert_eq!(added.json(), json!({ "ids": [2, 3] }));

    // A batch the ledger refuses halfway leaves nothing behind: the guard rolled back.
    let bad = json!([{ "memo": "tip", "amount": 1 }, { "memo": "", "amount": 2 }]);
    let refused = a
        .post("/tenants/acme/invoices/entries/batch", Some(bad))
        .await;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert_eq!(refused.json()["error"], "rejected");

    let read = a.get("/tenants/acme/invoices/entries").await;
    assert_eq!(read.status, 200, "{read:?}");
    let read = read.json();
    assert_eq!(memos(&read), ["coffee", "salary", "rent"]);
    assert_eq!(read["balance"], 100000 - 50000 - 450);

    // Errors by kind.
    let invalid = a.post("/tenants/_acme/invoices", None).await;
    assert_eq!(invalid.status, 400, "{invalid:?}");
    assert_eq!(invalid.json()["error"], "invalid_input");
    let missing = a.get("/tenants/acme/nothing-here/entries").await;
    assert_eq!(missing.status, 404, "{missing:?}");
    assert!(
        missing.json()["message"]
            .as_str()
            .is_some_and(|m| m.contains("POST /tenants/acme/nothing-here")),
        "{missing:?}"
    );
    // A UUID is a tenant id as it is (forgotten again, so that only acme/invoices stays open).
    let uuid = "/tenants/3f2c1a9e-8b7d-4c6e-9f1a-2b3c4d5e6f70/main";
    assert_eq!(a.post(uuid, None).await.status, 200);
    assert_eq!(a.delete(uuid).await.status, 200);

    // Forget: the tenant is gone, its schema in the trash.
    assert_eq!(a.post("/tenants/acme/scratch", None).await.status, 200);
    let forgotten = a.delete("/tenants/acme/scratch").await;
    assert_eq!(forgotten.status, 200, "{forgotten:?}");
    assert!(forgotten.json()["trash_schema"]
        .as_str()
        .is_some_and(|name| name.contains("scratch")));
    assert_eq!(a.get("/tenants/acme/scratch/entries").await.status, 404);
    assert_eq!(lease(&client, "acme/scratch").await.0, "forgotten");

    let health = a.get("/health").await;
    assert_eq!(health.status, 200, "{health:?}");
    let health = health.json();
    assert_eq!(health["replica_id"], "replica-a");
    assert_eq!(health["serving"], true);
    assert_eq!(health["open"], 1, "acme/invoices only: {health}");
    assert_eq!(health["closed"], false);

    let metrics = a.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .header("content-type")
        .is_some_and(|kind| kind.starts_with("text/plain")));
    let acquisitions = metrics
        .body
        .lines()
        .find_map(|line| line.strip_prefix("pgtenant_acquisitions_total "))
        .and_then(|value| value.parse::<f64>().ok());
    assert!(
        acquisitions.is_some_and(|count| count >= 3.0),
        "three tenants were acquired here:\n{}",
        metrics.body
    );

    assert_eq!(
        lease(&client, "acme/invoices").await,
        ("held".into(), Some("replica-a".into()))
    );
    let addr = a.addr;
    let report = a.shut_down().await;
    assert_eq!(report.handed_off, ["acme/invoices"], "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
    assert_eq!(lease(&client, "acme/invoices").await, ("free".into(), None));
}

#[tokio::test]
async fn a_handoff_moves_a_tenant_to_the_second_replica() {
    let (db, client) = database().await;
    let a = Service::start(db.url(), "replica-a").await;
    let b = Service::start(db.url(), "replica-b").await;

    assert_eq!(a.post("/tenants/acme/ledger", None).await.status, 200);
    let entry = json!({ "memo": "written by a", "amount": 1 });
    let added = a.post("/tenants/acme/ledger/entries", Some(entry)).await;
    assert_eq!(added.status, 201, "{added:?}");
    assert_eq!(added.header("x-pgtenant-served-by"), Some("replica-a"));

    // B cannot serve it while A holds it: a request that reaches B is forwarded to A and runs
    // there.
    let entry = json!({ "memo": "sent to b", "amount": 2 });
    let forwarded = b.post("/tenants/acme/ledger/entries", Some(entry)).await;
    assert_eq!(forwarded.status, 201, "{forwarded:?}");
    assert_eq!(forwarded.header("x-pgtenant-served-by"), Some("replica-a"));
    assert_eq!(forwarded.json()["memo"], "sent to b");
    // One that was already forwarded once is refused, naming the owner.
    let entry = json!({ "memo": "forwarded twice", "amount": 3 });
    let held = http_with(
        b.addr,
        "POST",
        "/tenants/acme/ledger/entries",
        &[("x-pgtenant-forwarded", "replica-c")],
        Some(entry),
    )
    .await;
    assert_eq!(held.status, 409, "{held:?}");
    assert_eq!(held.header("x-pgtenant-served-by"), None, "{held:?}");
    assert_eq!(held.json()["owner"], "replica-a");
    assert_eq!(held.json()["owner_address"], a.url(), "{held:?}");
    let not_here = b.post("/tenants/acme/ledger/handoff", None).await;
    assert_eq!(not_here.status, 409, "{not_here:?}");
    assert_eq!(not_here.json()["error"], "not_served_here");
    let nobody = a
        .post("/tenants/acme/ledger/handoff?to=replica-z", None)
        .await;
    assert_eq!(nobody.status, 422, "{nobody:?}");

    let handed = a
        .post("/tenants/acme/ledger/handoff?to=replica-b", None)
        .await;
    assert_eq!(handed.status, 200, "{handed:?}");
    assert_eq!(handed.json()["to"], "replica-b");
    // Reserved for B: A's next request cannot take it back; it is forwarded to B, which
    // opens the tenant reserved for it.
    let reserved = a.get("/tenants/acme/ledger/entries").await;
    assert_eq!(reserved.status, 200, "{reserved:?}");
    assert_eq!(reserved.header("x-pgtenant-served-by"), Some("replica-b"));
    assert_eq!(reserved.json()["replica"], "replica-b");

    let entry = json!({ "memo": "written by b", "amount": 4 });
    let added = b.post("/tenants/acme/ledger/entries", Some(entry)).await;
    assert_eq!(added.status, 201, "{added:?}");
    assert_eq!(added.header("x-pgtenant-served-by"), Some("replica-b"));
    let read = b.get("/tenants/acme/ledger/entries").await;
    assert_eq!(read.status, 200, "{read:?}");
    let read = read.json();
    assert_eq!(read["replica"], "replica-b");
    assert_eq!(memos(&read), ["written by a", "sent to b", "written by b"]);
    assert_eq!(
        lease(&client, "acme/ledger").await,
        ("held".into(), Some("replica-b".into()))
    );
    assert_eq!(a.get("/health").await.json()["open"], 0);
    assert_eq!(b.get("/health").await.json()["open"], 1);

    assert!(a.shut_down().await.handed_off.is_empty());
    let report = b.shut_down().await;
    assert_eq!(report.handed_off, ["acme/ledger"], "{report:?}");
    assert_eq!(lease(&client, "acme/ledger").await, ("free".into(), None));
}

/// The "fee" entries of a ledger, as `replica` serves them.
async fn fees(service: &Service, ledger: &str) -> usize {
    let read = service
        .get(&format!("/tenants/acme/{ledger}/entries"))
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    memos(&read.json())
        .iter()
        .filter(|memo| **memo == "fee")
        .count()
}

/// Polls `condition` every 25 ms until it holds, or panics after the patience saying `what`.
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_recurring_entry_is_an_alarm_that_follows_its_tenant() {
    let (db, client) = database().await;
    let a = Service::start(db.url(), "replica-a").await;
    let b = Service::start(db.url(), "replica-b").await;
    assert_eq!(a.post("/tenants/acme/subscription", None).await.status, 200);
    let too_often = json!({ "memo": "fee", "amount": -5, "every_ms": 10 });
    let refused = a
        .put("/tenants/acme/subscription/recurring/fee", too_often)
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    let every = json!({ "memo": "fee", "amount": -5, "every_ms": 200 });
    let set = a
        .put("/tenants/acme/subscription/recurring/fee", every)
        .await;
    assert_eq!(set.status, 200, "{set:?}");
    until("A added two fees", || async {
        fees(&a, "subscription").await >= 2
    })
    .await;

    // A shuts down: the tenant is free, and B (which no request reached) wakes it for its
    // alarm and goes on adding the fee.
    let report = a.shut_down().await;
    assert_eq!(report.handed_off, ["acme/subscription"], "{report:?}");
    until("B woke the tenant for its alarm", || async {
        lease(&client, "acme/subscription").await == ("held".into(), Some("replica-b".into()))
    })
    .await;
    let at_b = fees(&b, "subscription").await;
    until("B added two more", || async {
        fees(&b, "subscription").await >= at_b + 2
    })
    .await;

    let stopped = b.delete("/tenants/acme/subscription/recurring/fee").await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    let again = b.delete("/tenants/acme/subscription/recurring/fee").await;
    assert_eq!(again.status, 404, "{again:?}");
    let last = fees(&b, "subscription").await;
    // The window in which nothing may happen: two periods.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(fees(&b, "subscription").await, last, "stopped");
    let balance = b.get("/tenants/acme/subscription/entries").await.json()["balance"].clone();
    assert_eq!(balance, json!(-5 * i64::try_from(last).unwrap()));
    b.shut_down().await;
}

/// `acme/{prefix}-N` for the first N whose home (placement over the live replicas) is `home`.
/// With two replicas of equal weight about every other name is, so 64 tries all miss with
/// probability 2^-64.
async fn ledger_homed_at(router: &Router, home: &str, prefix: &str) -> String {
    for n in 0..64 {
        let ledger = format!("{prefix}-{n}");
        let id = TenantId::new("acme", &ledger).expect("a tenant id");
        let location = router.locate(&id).await.expect("locate");
        if location.home.as_ref().is_some_and(|h| h.as_str() == home) {
            return ledger;
        }
    }
    panic!("no acme/{prefix}-N of 64 has its home at {home}");
}

/// The rows of a tenant's ledger, read straight from PostgreSQL.
async fn rows(client: &pgtenant::postgres::Client, schema: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {schema}.entries"), &[])
        .await
        .expect("count the ledger's rows")
        .get(0)
}

fn schema_of(created: &Reply) -> String {
    created.json()["schema"]
        .as_str()
        .unwrap_or_else(|| panic!("no schema in {created:?}"))
        .to_owned()
}

/// With placement on, a request that reaches a replica which does not serve its tenant is sent
/// once to the owner (here: its home), runs there, and is committed once.
#[tokio::test]
async fn a_request_at_another_replica_is_served_by_the_owner_after_one_hop() {
    let (db, client) = database().await;
    let a = Service::start_placed(db.url(), "replica-a").await;
    let b = Service::start_placed(db.url(), "replica-b").await;
    let ledger = ledger_homed_at(&a.router, "replica-b", "hop").await;
    let tenant = format!("acme/{ledger}");
    let base = format!("/tenants/{tenant}");

    // Created through A: nobody serves it yet, so A sends it to its home, B, which creates it.
    let created = a.post(&base, None).await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(created.header("x-pgtenant-served-by"), Some("replica-b"));
    assert_eq!(created.json()["replica"], "replica-b");
    let schema = schema_of(&created);
    assert_eq!(
        lease(&client, &tenant).await,
        ("held".into(), Some("replica-b".into()))
    );

    // An entry sent to A runs at B.
    let entry = json!({ "memo": "sent to a", "amount": 5 });
    let added = a.post(&format!("{base}/entries"), Some(entry)).await;
    assert_eq!(added.status, 201, "{added:?}");
    assert_eq!(added.header("x-pgtenant-served-by"), Some("replica-b"));
    assert_eq!(
        added.json(),
        json!({ "id": 1, "memo": "sent to a", "amount": 5 })
    );

    // Committed once, read through the owner itself.
    let read = b.get(&format!("{base}/entries")).await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.header("x-pgtenant-served-by"), Some("replica-b"));
    let read = read.json();
    assert_eq!(read["replica"], "replica-b");
    assert_eq!(memos(&read), ["sent to a"]);
    assert_eq!(read["balance"], 5);
    assert_eq!(rows(&client, &schema).await, 1);
    // A ran nothing of it: it never opened the tenant.
    assert_eq!(a.get("/health").await.json()["open"], 0);
    assert_eq!(b.get("/health").await.json()["open"], 1);

    assert!(a.shut_down().await.handed_off.is_empty());
    let report = b.shut_down().await;
    assert_eq!(report.handed_off, [tenant.as_str()], "{report:?}");
}

/// The loop guard: a request that was already forwarded once is not forwarded again by a
/// replica that does not serve its tenant, nor run there; the answer names the owner.
#[tokio::test]
async fn a_forwarded_request_is_refused_by_a_replica_that_does_not_own_the_tenant() {
    let (db, client) = database().await;
    let a = Service::start_placed(db.url(), "replica-a").await;
    let b = Service::start_placed(db.url(), "replica-b").await;
    let ledger = ledger_homed_at(&a.router, "replica-b", "guard").await;
    let tenant = format!("acme/{ledger}");
    let entries = format!("/tenants/{tenant}/entries");
    let created = b.post(&format!("/tenants/{tenant}"), None).await;
    assert_eq!(created.status, 200, "{created:?}");
    let schema = schema_of(&created);
    let entry = json!({ "memo": "first", "amount": 1 });
    assert_eq!(b.post(&entries, Some(entry)).await.status, 201);
    assert_eq!(rows(&client, &schema).await, 1);

    let entry = json!({ "memo": "forwarded twice", "amount": 2 });
    let forwarded = [("x-pgtenant-forwarded", "replica-c")];
    let refused = http_with(a.addr, "POST", &entries, &forwarded, Some(entry.clone())).await;
    assert_eq!(refused.status, 409, "{refused:?}");
    assert_eq!(refused.header("x-pgtenant-served-by"), None, "{refused:?}");
    let body = refused.json();
    assert_eq!(body["error"], "held");
    assert_eq!(body["owner"], "replica-b");
    assert_eq!(body["owner_address"], b.url());
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("replica-c") && m.contains("forwarded")),
        "{body}"
    );
    assert_eq!(rows(&client, &schema).await, 1, "the refused request ran");
    assert_eq!(a.get("/health").await.json()["open"], 0);

    // The owner serves the same forwarded request: the guard stops a second hop, not the
    // request.
    let served = http_with(b.addr, "POST", &entries, &forwarded, Some(entry)).await;
    assert_eq!(served.status, 201, "{served:?}");
    assert_eq!(served.header("x-pgtenant-served-by"), Some("replica-b"));
    assert_eq!(rows(&client, &schema).await, 2);

    assert!(a.shut_down().await.handed_off.is_empty());
    b.shut_down().await;
}

/// The owner's HTTP server is gone while its router keeps the tenant's lease: the replica the
/// request reached answers 503 with `Retry-After`, and runs nothing itself.
#[tokio::test]
async fn an_unreachable_owner_is_a_503_and_the_request_runs_nowhere() {
    let (db, client) = database().await;
    let a = Service::start_placed(db.url(), "replica-a").await;
    // B's HTTP server is stopped by itself, without closing its router (serve() would close it).
    let (listener, b_router) = listen_and_start(db.url(), "replica-b", true).await;
    let b_addr = listener.local_addr().expect("local addr");
    let (stop_b, stopped) = oneshot::channel::<()>();
    let b_http = tokio::spawn(
        axum::serve(listener, app(b_router.clone(), metrics()))
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .into_future(),
    );
    let ledger = ledger_homed_at(&a.router, "replica-b", "gone").await;
    let tenant = format!("acme/{ledger}");
    let entries = format!("/tenants/{tenant}/entries");
    // Straight to B: A has no connection to B that could outlive B's server.
    let created = http(b_addr, "POST", &format!("/tenants/{tenant}"), None).await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(created.header("x-pgtenant-served-by"), Some("replica-b"));
    let schema = schema_of(&created);
    let entry = json!({ "memo": "before", "amount": 1 });
    assert_eq!(
        http(b_addr, "POST", &entries, Some(entry)).await.status,
        201
    );

    stop_b.send(()).expect("B's server is running");
    tokio::time::timeout(PATIENCE, b_http)
        .await
        .expect("B's server stops within the patience")
        .expect("serve task")
        .expect("serve");
    assert!(
        TcpStream::connect(b_addr).await.is_err(),
        "B still accepts connections"
    );
    assert_eq!(
        lease(&client, &tenant).await,
        ("held".into(), Some("replica-b".into()))
    );

    let entry = json!({ "memo": "nowhere", "amount": 2 });
    let refused = a.post(&entries, Some(entry)).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"), "{refused:?}");
    assert_eq!(refused.header("x-pgtenant-served-by"), None, "{refused:?}");
    let body = refused.json();
    assert_eq!(body["error"], "owner_unreachable");
    assert_eq!(body["owner"], "replica-b");
    assert_eq!(body["owner_address"], format!("http://{b_addr}"));
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("not run anywhere")),
        "{body}"
    );
    let read = a.get(&entries).await;
    assert_eq!(read.status, 503, "{read:?}");

    // Nothing ran: not at B (its server is gone), not at A (which did not take the tenant).
    assert_eq!(rows(&client, &schema).await, 1);
    assert_eq!(
        lease(&client, &tenant).await,
        ("held".into(), Some("replica-b".into()))
    );
    let id = TenantId::new("acme", &ledger).expect("a tenant id");
    assert!(a.router.handle_of(&id).is_none());
    assert_eq!(a.get("/health").await.json()["open"], 0);

    assert!(a.shut_down().await.handed_off.is_empty());
    let report = b_router.close().await;
    assert_eq!(report.handed_off, [tenant.as_str()], "{report:?}");
}

#[tokio::test]
async fn health_is_503_and_requests_say_retry_once_the_router_is_closed() {
    let (db, _client) = database().await;
    let a = Service::start(db.url(), "replica-a").await;
    assert_eq!(a.post("/tenants/acme/invoices", None).await.status, 200);
    assert_eq!(a.get("/health").await.status, 200);

    // What a load balancer sees between close() and the process's exit.
    let report = a.router.close().await;
    assert_eq!(report.handed_off, ["acme/invoices"]);
    let health = a.get("/health").await;
    assert_eq!(health.status, 503, "{health:?}");
    assert_eq!(health.json()["closed"], true);
    let refused = a.get("/tenants/acme/invoices/entries").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"));
    // Told to the HTTP client, which knows nothing of pgtenant's API: what happened, what to do.
    let message = refused.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("shutting down") && message.contains("retry"),
        "{message}"
    );
    assert!(
        !message.contains("::") && !message.contains("Router") && !message.contains("Event"),
        "{message}"
    );

    // serve() closes the router again: idempotent, nothing more to report.
    let report = a.shut_down().await;
    assert!(
        report.handed_off.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
}

/// The binary, as deployed: it sets up the control plane, serves, and on SIGTERM hands its
/// tenants off and says so.
#[cfg(unix)]
#[tokio::test]
async fn the_binary_hands_its_tenants_off_on_sigterm() {
    let (db, client) = database().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgtenant-example-service"))
        .args(["--database-url", db.url(), "--replica-id", "replica-bin"])
        .args(["--listen", "127.0.0.1:0"])
        .env("TTL", "2s")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the service binary");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(PATIENCE, stdout.next_line())
        .await
        .expect("the service starts within the patience")
        .expect("read stdout")
        .expect("a line saying where it listens");
    let addr: SocketAddr = first
        .rsplit_once("http://")
        .and_then(|(_, addr)| addr.parse().ok())
        .unwrap_or_else(|| panic!("no address in {first:?}"));
    assert_eq!(
        http(addr, "POST", "/tenants/acme/invoices", None)
            .await
            .status,
        200
    );
    assert_eq!(
        lease(&client, "acme/invoices").await.1.as_deref(),
        Some("replica-bin")
    );
    // TTL=2s: the lease is renewed for 2 s at a time, not the default 10 s.
    let left: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM expires_in) * 1000)::bigint FROM pgtenant.lease_status
              WHERE tenant = 'acme/invoices'",
            &[],
        )
        .await
        .expect("expires_in")
        .get(0);
    assert!(left <= 2000, "{left} ms left on a 2 s ttl");

    let pid = child.id().expect("running");
    // The shell's own `kill`: no procps needed on a minimal machine.
    let killed = tokio::process::Command::new("sh")
        .args(["-c", &format!("kill -TERM {pid}")])
        .status()
        .await
        .expect("run kill");
    assert!(killed.success());
    let mut rest = Vec::new();
    while let Some(line) = tokio::time::timeout(PATIENCE, stdout.next_line())
        .await
        .expect("output within the patience")
        .expect("read stdout")
    {
        rest.push(line);
    }
    let status = child.wait().await.expect("wait for the service");
    assert!(status.success(), "{status}: {rest:?}");
    assert!(
        rest.iter()
            .any(|line| line.trim() == "handed off acme/invoices"),
        "{rest:?}"
    );
    assert_eq!(lease(&client, "acme/invoices").await, ("free".into(), None));
}

/// Shutdown order: a request in flight when the signal comes finishes (and commits) before the
/// router closes; only then is the tenant handed off.
#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_before_handing_off() {
    let (db, client) = database().await;
    let a = Service::start(db.url(), "replica-a").await;
    let created = a.post("/tenants/acme/invoices", None).await;
    assert_eq!(created.status, 200, "{created:?}");
    let schema = created.json()["schema"]
        .as_str()
        .expect("a schema name")
        .to_owned();

    // A request whose body is still on its way. `Expect: 100-continue` makes the server say
    // when the handler starts reading the body: from then on the request is in flight.
    let body = json!({ "memo": "in flight at shutdown", "amount": 7 }).to_string();
    let mut slow = TcpStream::connect(a.addr).await.expect("connect");
    let head = format!(
        "POST /tenants/acme/invoices/entries HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        a.addr,
        body.len()
    );
    slow.write_all(head.as_bytes())
        .await
        .expect("send the head");
    let mut reader = BufReader::new(slow);
    let mut line = String::new();
    tokio::time::timeout(PATIENCE, reader.read_line(&mut line))
        .await
        .expect("100 Continue within the patience")
        .expect("read");
    assert!(line.starts_with("HTTP/1.1 100"), "{line:?}");
    let mut blank = String::new();
    reader.read_line(&mut blank).await.expect("read");

    let Service {
        addr,
        router,
        stop,
        served,
    } = a;
    stop.send(()).expect("the service is still running");
    // Nothing announces that the listener is gone; poll for the refused connection.
    tokio::time::timeout(PATIENCE, async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the service stops accepting connections");
    assert!(
        !served.is_finished(),
        "serve returned with a request in flight"
    );
    assert!(!router.summary().closed, "closed with a request in flight");
    assert_eq!(
        lease(&client, "acme/invoices").await,
        ("held".into(), Some("replica-a".into()))
    );

    let mut slow = reader.into_inner();
    slow.write_all(body.as_bytes())
        .await
        .expect("send the body");
    let mut response = String::new();
    tokio::time::timeout(PATIENCE, slow.read_to_string(&mut response))
        .await
        .expect("a response within the patience")
        .expect("read");
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");

    let report = tokio::time::timeout(PATIENCE, served)
        .await
        .expect("shutdown within the patience")
        .expect("serve task")
        .expect("serve");
    assert_eq!(report.handed_off, ["acme/invoices"], "{report:?}");
    assert_eq!(lease(&client, "acme/invoices").await, ("free".into(), None));
    let memos: Vec<String> = client
        .query(&format!("SELECT memo FROM {schema}.entries"), &[])
        .await
        .expect("read the ledger")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(memos, ["in flight at shutdown"]);
}

/// `--ttl` takes a duration, and says what it expected when it gets something else.
#[test]
fn a_bad_ttl_is_refused_with_what_to_write() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_pgtenant-example-service"))
        .args([
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
            "--ttl",
            "3 hours",
        ])
        .output()
        .expect("run the service binary");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--ttl") && stderr.contains("3s"),
        "{stderr}"
    );
}

/// `PLACEMENT` takes 1 or 0, and says so when it gets something else.
#[test]
fn a_bad_placement_value_is_refused_with_what_to_write() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_pgtenant-example-service"))
        .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .env("PLACEMENT", "maybe")
        .output()
        .expect("run the service binary");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("PLACEMENT") && stderr.contains("expected 1"),
        "{stderr}"
    );
}
