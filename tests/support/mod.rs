//! Shared by the integration tests: fresh databases with a control plane, router options with
//! short leases, and replica child processes driven over a line protocol.
#![allow(dead_code)] // each test binary uses a different part

pub(crate) mod netns;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use pgtenant::{Fencing, Router, RouterOptions, TenantHandle, TenantId};
use pgtenant_testkit::TestDatabase;
use tokio::sync::{mpsc, oneshot};

/// Short leases so takeover tests finish quickly; margin and period leave room for jitter.
pub(crate) const TTL: Duration = Duration::from_millis(1500);

pub(crate) async fn database() -> (TestDatabase, tokio_postgres::Client) {
    let db = TestDatabase::create().await.expect("test database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    (db, client)
}

/// A fresh database whose control plane is owned by the superuser, with a non-superuser
/// application role and operator role granted by `setup_with`.
pub(crate) async fn granted() -> (
    TestDatabase,
    tokio_postgres::Client,
    pgtenant_testkit::TestRole,
    pgtenant_testkit::TestRole,
) {
    let db = TestDatabase::create().await.expect("test database");
    let mut admin = db.connect().await.expect("connect");
    let app = db.create_role("app").await.expect("app role");
    let operator = db.create_role("op").await.expect("operator role");
    pgtenant::admin::setup_with(
        &mut admin,
        &pgtenant::admin::SetupOptions::default()
            .app_role(app.name())
            .operator_role(operator.name()),
    )
    .await
    .expect("setup with roles");
    (db, admin, app, operator)
}

/// The control-plane migrations of every release, in order.
pub(crate) const CONTROL_PLANE: [(&str, &str); 14] = [
    (
        "V1__control_plane",
        include_str!("../../migrations/V1__control_plane.sql"),
    ),
    (
        "V2__owner_index_with_key",
        include_str!("../../migrations/V2__owner_index_with_key.sql"),
    ),
    (
        "V3__least_privilege_and_hygiene",
        include_str!("../../migrations/V3__least_privilege_and_hygiene.sql"),
    ),
    (
        "V4__epoch_floor",
        include_str!("../../migrations/V4__epoch_floor.sql"),
    ),
    (
        "V5__session_fencing",
        include_str!("../../migrations/V5__session_fencing.sql"),
    ),
    (
        "V6__fence_floor",
        include_str!("../../migrations/V6__fence_floor.sql"),
    ),
    (
        "V7__seal_on_takeover",
        include_str!("../../migrations/V7__seal_on_takeover.sql"),
    ),
    (
        "V8__seal_per_incarnation",
        include_str!("../../migrations/V8__seal_per_incarnation.sql"),
    ),
    (
        "V9__fence_signalled",
        include_str!("../../migrations/V9__fence_signalled.sql"),
    ),
    (
        "V10__scale",
        include_str!("../../migrations/V10__scale.sql"),
    ),
    (
        "V11__untracked_work",
        include_str!("../../migrations/V11__untracked_work.sql"),
    ),
    (
        "V12__tenant_boundary",
        include_str!("../../migrations/V12__tenant_boundary.sql"),
    ),
    (
        "V13__first_day",
        include_str!("../../migrations/V13__first_day.sql"),
    ),
    (
        "V14__one_fence",
        include_str!("../../migrations/V14__one_fence.sql"),
    ),
];

/// The names of the control-plane migrations from index `from` on, as setup reports them.
pub(crate) fn migration_names(from: usize) -> Vec<String> {
    CONTROL_PLANE[from..]
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

/// Sets up the control plane exactly as the release whose newest migration is `version` did:
/// the same files, applied by refinery, so the next `pgtenant::setup` sees a real old database.
pub(crate) async fn control_plane_at(client: &mut tokio_postgres::Client, version: usize) {
    client
        .batch_execute("CREATE SCHEMA IF NOT EXISTS pgtenant")
        .await
        .expect("schema");
    let migrations: Vec<refinery::Migration> = CONTROL_PLANE[..version]
        .iter()
        .map(|(name, sql)| refinery::Migration::unapplied(name, sql).expect("migration"))
        .collect();
    let mut runner = refinery::Runner::new(&migrations);
    runner.set_migration_table_name("pgtenant.refinery_schema_history");
    runner.run_async(client).await.expect("old control plane");
}

/// The fencing the tests' routers use: `PGTENANT_TEST_FENCING=session|transaction` (inherited by
/// replica child processes), else the default, which is session fencing on a direct server.
/// `.ci/run` runs the lease and takeover tests once more with `transaction`.
pub(crate) fn fencing() -> Fencing {
    match std::env::var("PGTENANT_TEST_FENCING").as_deref() {
        Ok("session") => Fencing::Session,
        Ok("transaction") => Fencing::Transaction,
        _ => Fencing::Auto,
    }
}

pub(crate) fn options(url: &str, replica: &str) -> RouterOptions {
    RouterOptions::from_url(replica, url)
        .expect("url")
        .ttl(TTL)
        .margin(Duration::from_millis(400))
        .heartbeat_period(Duration::from_millis(300))
        .reconnect_backoff(Duration::from_millis(100), Duration::from_secs(1))
        .pool_size(8)
        .fencing(fencing())
}

pub(crate) async fn router(url: &str, replica: &str) -> Router {
    Router::start(options(url, replica))
        .await
        .expect("router starts")
}

pub(crate) fn replica(id: &str) -> pgtenant::ReplicaId {
    pgtenant::ReplicaId::new(id).expect("a valid replica id")
}

pub(crate) fn tenant(name: &str) -> TenantId {
    TenantId::new("acme", name).expect("valid id")
}

/// The ledger table every test writes: which epoch committed which sequence number, and the
/// highest epoch already committed when the row was written (the history checker's witness).
pub(crate) async fn create_log(handle: &TenantHandle) {
    try_create_log(handle).await.expect("create log table");
}

pub(crate) async fn try_create_log(handle: &TenantHandle) -> pgtenant::Result<()> {
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS log (
                         epoch bigint NOT NULL, seq bigint NOT NULL, writer text NOT NULL,
                         seen_max_epoch bigint NOT NULL, PRIMARY KEY (writer, seq))",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// The log with a second witness, for the child replicas of the history driver (not on Citus,
/// which runs no triggers on distributed tables): a deferred constraint trigger that sleeps up
/// to 3 ms inside each COMMIT (so a write cut at a random point is often cut mid-COMMIT) and
/// then records the tenant's epoch as the control plane has it at that moment. A row whose
/// recorded epoch is above its own committed after a later epoch was granted: stale, whether or
/// not a later row exists to show it.
pub(crate) async fn try_create_stamped_log(handle: &TenantHandle) -> pgtenant::Result<()> {
    try_create_log(handle).await?;
    handle
        .run(|tx| {
            Box::pin(async move {
                // Asked of the database, not of PGTENANT_TESTKIT: tests/citus.rs runs its own
                // Citus cluster whatever the test kit's source is.
                let citus: bool = tx
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
                        &[],
                    )
                    .await?
                    .get(0);
                if citus {
                    return Ok(());
                }
                tx.batch_execute(
                    "CREATE TABLE IF NOT EXISTS stamps (writer text, seq bigint, row_epoch bigint,
                                                        epoch_at_commit bigint);
                     CREATE OR REPLACE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN
                         PERFORM pg_sleep(random() * 0.003);
                         INSERT INTO stamps
                         SELECT NEW.writer, NEW.seq, NEW.epoch, t.epoch FROM pgtenant.tenants t
                          WHERE t.schema_name = current_schema();
                         RETURN NULL;
                     END $$;
                     DROP TRIGGER IF EXISTS stamp ON log;
                     CREATE CONSTRAINT TRIGGER stamp AFTER INSERT ON log DEFERRABLE INITIALLY DEFERRED
                         FOR EACH ROW EXECUTE FUNCTION stamp();",
                )
                .await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// One log row; `seen_max_epoch` is the highest epoch committed before this write. Written as
/// INSERT … SELECT, which Citus also runs on a distributed table (it refuses a subquery in
/// VALUES).
pub(crate) const APPEND_SQL: &str = "INSERT INTO log (epoch, seq, writer, seen_max_epoch)
     SELECT $1::bigint, $2::bigint, $3::text, coalesce(max(epoch), 0) FROM log";

/// A single bigint from a read-only fenced query.
pub(crate) async fn count_rows(handle: &TenantHandle, sql: &'static str) -> i64 {
    handle
        .read(move |tx| {
            Box::pin(async move { Ok::<_, pgtenant::Error>(tx.query_one(sql, &[]).await?.get(0)) })
        })
        .await
        .expect(sql)
}

/// Polls all the futures concurrently on this task, as concurrent callers would.
pub(crate) async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    futures_util::future::join_all(futures).await
}

pub(crate) async fn append(handle: &TenantHandle, writer: &str, seq: i64) -> pgtenant::Result<()> {
    let epoch = handle.epoch();
    let writer = writer.to_owned();
    handle
        .run(move |tx| {
            Box::pin(async move {
                tx.execute(APPEND_SQL, &[&epoch, &seq, &writer]).await?;
                Ok(())
            })
        })
        .await
}

/// The test binary itself, re-run with one ignored test as entry point: a real, separate
/// replica process the test can kill, pause and resume.
pub(crate) struct ReplicaProcess {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
    pub replica: String,
}

const PREFIX: &str = "@@ ";

impl ReplicaProcess {
    pub(crate) fn spawn(entry: &str, url: &str, replica: &str) -> ReplicaProcess {
        ReplicaProcess::spawn_in(entry, url, replica, None, &[])
    }

    /// Like [`ReplicaProcess::spawn`], with environment variables of its own (e.g.
    /// `PGTENANT_TEST_FENCING` for a test that runs both fencings).
    pub(crate) fn spawn_with(
        entry: &str,
        url: &str,
        replica: &str,
        env: &[(&str, &str)],
    ) -> ReplicaProcess {
        ReplicaProcess::spawn_in(entry, url, replica, None, env)
    }

    /// Like [`ReplicaProcess::spawn_with`], inside network namespace `namespace` when given
    /// (`ip netns exec`, which execs in place: the pid is the replica's own).
    pub(crate) fn spawn_in(
        entry: &str,
        url: &str,
        replica: &str,
        namespace: Option<&str>,
        env: &[(&str, &str)],
    ) -> ReplicaProcess {
        let binary = std::env::current_exe().expect("test binary");
        let mut command = match namespace {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace]).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .args([
                entry,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(env.iter().copied())
            .env("PGTENANT_CHILD_URL", url)
            .env("PGTENANT_CHILD_REPLICA", replica)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn replica process");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest prints "test replica_child ... " without a newline before the first reply.
                if let Some(at) = line.find(PREFIX) {
                    if tx.send(line[at + PREFIX.len()..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        ReplicaProcess {
            child,
            stdin,
            lines,
            replica: replica.to_owned(),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The reply already received, if any (None also when the process went away).
    pub(crate) fn try_reply(&mut self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    /// The next reply, or None when the process went away.
    pub(crate) async fn reply(&mut self) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(60), self.lines.recv())
            .await
            .expect("replica process answers within a minute")
    }

    pub(crate) async fn ready(&mut self) {
        let line = self.reply().await.expect("ready line");
        assert!(line.starts_with("ready"), "{line}");
    }

    /// Sends one command and returns its reply.
    pub(crate) async fn request(&mut self, command: &str) -> Option<String> {
        self.send(command);
        self.reply().await
    }

    pub(crate) fn send(&mut self, command: &str) {
        let _ = writeln!(self.stdin, "{command}");
        let _ = self.stdin.flush();
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal}");
    }

    pub(crate) fn kill(mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
    }

    pub(crate) fn pause(&self) {
        self.signal("-STOP");
    }

    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's side: a router driven by lines on stdin, answering on stdout with `@@ `.
///
/// Commands: `open <ledger>` → `opened <epoch>`; `write <ledger> <seq>` → `ok <seq> <epoch>`;
/// `hold <ledger> <seq> <millis>` writes, then keeps the transaction open, then commits;
/// `cut <ledger> <seq> <micros>` writes, dropping the write's future after `micros` (→ `cut`
/// when it was dropped: its row may or may not be committed); `stream <ledger>` starts a read
/// of a large result consumed slowly (→ `streaming` once the first row arrived), and
/// `copy <ledger>` a `COPY FROM STDIN` that sends one row and never finishes (→ `copying`),
/// both left running, so that a pause of this process leaves a backend blocked sending
/// (`ClientWrite`) or reading (`ClientRead`) inside a fenced transaction. Failures answer
/// `error <Variant> <message>`.
pub(crate) fn child_main() {
    let Ok(url) = std::env::var("PGTENANT_CHILD_URL") else {
        return; // run as an ordinary (ignored) test: nothing to do
    };
    let replica = std::env::var("PGTENANT_CHILD_REPLICA").expect("replica id");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let router = router(&url, &replica).await;
        say(&format!(
            "ready {}",
            router.incarnation().map_or(0, |i| i.get())
        ));
        let mut commands = stdin_lines();
        let mut handles: std::collections::HashMap<String, TenantHandle> = Default::default();
        while let Some(line) = commands.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["open", ledger] => match router.open_or_create(&tenant(ledger)).await {
                    Ok(handle) => match try_create_stamped_log(&handle).await {
                        Ok(()) => {
                            let epoch = handle.epoch();
                            handles.insert(ledger.to_string(), handle);
                            format!("opened {epoch}")
                        }
                        Err(e) => describe(&e),
                    },
                    Err(e) => describe(&e),
                },
                ["write", ledger, seq] => match handles.get(*ledger) {
                    Some(handle) => match append(handle, &replica, seq.parse().expect("seq")).await
                    {
                        Ok(()) => format!("ok {seq} {}", handle.epoch()),
                        Err(e) => describe(&e),
                    },
                    None => "error NotOpen".to_owned(),
                },
                ["hold", ledger, seq, millis] => match handles.get(*ledger) {
                    Some(handle) => {
                        let (seq, millis): (i64, f64) =
                            (seq.parse().expect("seq"), millis.parse().expect("ms"));
                        let (epoch, writer) = (handle.epoch(), replica.clone());
                        let result = handle
                            .run(move |tx| {
                                Box::pin(async move {
                                    tx.execute(APPEND_SQL, &[&epoch, &seq, &writer]).await?;
                                    say("holding");
                                    tx.execute("SELECT pg_sleep($1 / 1000.0)", &[&millis])
                                        .await?;
                                    Ok::<_, pgtenant::Error>(())
                                })
                            })
                            .await;
                        match result {
                            Ok(()) => format!("ok {seq} {epoch}"),
                            Err(e) => describe(&e),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                // Writes `count` rows at once, so the pool binds that many connections.
                ["spread", ledger, first, count] => match handles.get(*ledger) {
                    Some(handle) => {
                        let (first, count): (i64, i64) =
                            (first.parse().expect("first"), count.parse().expect("count"));
                        let writes = (first..first + count)
                            .map(|seq| append(handle, &replica, seq))
                            .collect();
                        let failed = join_all(writes).await.into_iter().find_map(Result::err);
                        match failed {
                            None => format!("ok {count}"),
                            Some(e) => describe(&e),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                ["cut", ledger, seq, micros] => match handles.get(*ledger) {
                    Some(handle) => {
                        let (seq, micros): (i64, u64) =
                            (seq.parse().expect("seq"), micros.parse().expect("micros"));
                        let write = append(handle, &replica, seq);
                        match tokio::time::timeout(Duration::from_micros(micros), write).await {
                            Ok(Ok(())) => format!("ok {seq} {}", handle.epoch()),
                            Ok(Err(e)) => describe(&e),
                            Err(_) => "cut".to_owned(),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                ["stream", ledger] => match handles.get(*ledger) {
                    Some(handle) => {
                        let (first, arrived) = oneshot::channel::<()>();
                        tokio::spawn(stream_slowly(handle.clone(), first));
                        match arrived.await {
                            Ok(()) => "streaming".to_owned(),
                            Err(_) => "error Stream the read failed".to_owned(),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                ["copy", ledger] => match handles.get(*ledger) {
                    Some(handle) => {
                        let (sent, arrived) = oneshot::channel::<()>();
                        tokio::spawn(copy_forever(handle.clone(), replica.clone(), sent));
                        match arrived.await {
                            Ok(()) => "copying".to_owned(),
                            Err(_) => "error Copy the copy failed".to_owned(),
                        }
                    }
                    None => "error NotOpen".to_owned(),
                },
                _ => format!("error BadCommand {line}"),
            };
            say(&reply);
        }
    });
}

/// A large result read in a fenced read-write transaction (one that holds the tenant's fence),
/// consumed one row per millisecond: the server soon blocks sending (`ClientWrite`), and for
/// good once this process is paused.
async fn stream_slowly(handle: TenantHandle, first: oneshot::Sender<()>) {
    let _ = handle
        .run(move |tx| {
            Box::pin(async move {
                let rows = tx
                    .query_raw(
                        "SELECT repeat('x', 2000) FROM generate_series(1, 5000000)",
                        std::iter::empty::<i64>(),
                    )
                    .await?;
                let mut rows = std::pin::pin!(rows);
                let mut first = Some(first);
                // Two seconds at most: long enough to be caught by a pause, short enough not to
                // hold the tenant through a history's quiet phase.
                let until = std::time::Instant::now() + Duration::from_secs(2);
                while let Some(row) = futures_util::StreamExt::next(&mut rows).await {
                    if std::time::Instant::now() > until {
                        break;
                    }
                    row?;
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await;
}

/// A fenced `COPY FROM STDIN` that sends one row and never finishes: the server waits for more
/// (`ClientRead`), holding the tenant's fence, until the copy is dropped two seconds later (or
/// at once on resuming, if this process was paused longer).
async fn copy_forever(handle: TenantHandle, writer: String, sent: oneshot::Sender<()>) {
    let epoch = handle.epoch().get();
    let _ = handle
        .run(move |tx| {
            Box::pin(async move {
                let sink = tx
                    .copy_in("COPY log (epoch, seq, writer, seen_max_epoch) FROM STDIN")
                    .await?;
                let mut sink = std::pin::pin!(sink);
                let row = format!("{epoch}\t-1\t{writer}-copy\t0\n");
                futures_util::SinkExt::send(&mut sink, bytes_of(row)).await?;
                let _ = sent.send(());
                // Never finished: dropped (CopyFail) two seconds later.
                tokio::time::sleep(Duration::from_secs(2)).await;
                Err::<(), _>(pgtenant::Error::RouterClosed)
            })
        })
        .await;
}

/// A row for `copy_in` (its sink takes any `Buf`).
fn bytes_of(row: String) -> std::io::Cursor<Vec<u8>> {
    std::io::Cursor::new(row.into_bytes())
}

/// A child process's commands: its stdin's lines, read on a thread of their own so that a
/// blocked read never stalls the runtime.
pub(crate) fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, commands) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    commands
}

pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}

pub(crate) fn describe(error: &pgtenant::Error) -> String {
    let debug = format!("{error:?}");
    let variant = debug
        .split([' ', '{', '('])
        .next()
        .unwrap_or("Unknown")
        .to_owned();
    format!("error {variant} {error}")
}

/// Takes replica `replica`'s liveness lock on this session, as a lease session does.
pub(crate) async fn take_liveness_lock(client: &tokio_postgres::Client, replica: &str) {
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock(pgtenant.lock_namespace(), pgtenant.replica_lock_key($1))",
            &[&replica],
        )
        .await
        .expect("take the liveness lock")
        .get(0);
    assert!(locked, "the liveness lock of {replica} is free");
}

/// Registers `replica` by hand on this session (its liveness lock first), as a lease session
/// of this release does: (incarnation, secret), with a 60 s ttl.
pub(crate) async fn register_by_hand(
    client: &tokio_postgres::Client,
    replica: &str,
) -> (i64, String) {
    take_liveness_lock(client, replica).await;
    let row = client
        .query_one(
            "SELECT incarnation, secret FROM pgtenant.register($1, 60000, NULL)",
            &[&replica],
        )
        .await
        .expect("register");
    (row.get(0), row.get(1))
}

/// Starts work on `handle` that stays in flight until `release` fires; returns once it runs.
pub(crate) async fn hold_work(
    handle: &TenantHandle,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<pgtenant::Result<()>>,
) {
    let (release, released) = oneshot::channel::<()>();
    let (started_tx, started) = oneshot::channel::<()>();
    let handle = handle.clone();
    let task = tokio::spawn(async move {
        handle
            .run(move |tx| {
                Box::pin(async move {
                    tx.execute("SELECT 1", &[]).await?;
                    let _ = started_tx.send(());
                    let _ = released.await;
                    Ok::<_, pgtenant::Error>(())
                })
            })
            .await
    });
    started.await.expect("work started");
    (release, task)
}

/// The uid and gid of the `postgres` user, which runs the test kit's servers and PgBouncer
/// (they refuse to run as root), from /etc/passwd.
pub(crate) fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres")).then(|| {
                (
                    fields[2].parse().expect("uid"),
                    fields[3].parse().expect("gid"),
                )
            })
        })
        .expect("a postgres user")
}

/// Opens `id`, retrying while its holder is still alive by the database's account, for at most
/// `limit`.
pub(crate) async fn take_over(router: &Router, id: &TenantId, limit: Duration) -> TenantHandle {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match router.open(id).await {
            Ok(handle) => return handle,
            Err(pgtenant::Error::LeaseHeld { expires_in, .. })
                if std::time::Instant::now() < deadline =>
            {
                let wait = expires_in.unwrap_or_default().max(Duration::from_millis(2));
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            }
            Err(other) => panic!("takeover of {id} failed: {other}"),
        }
    }
}

/// How long after its last fault ended a replica must serve again (DESIGN G9): 3 × ttl plus
/// the tests' reconnect backoff (100 ms doubling to 1 s) and room for a loaded machine.
pub(crate) const SERVE_AGAIN_BOUND: Duration = Duration::from_millis(3 * 1500 + 1000 + 2500);

/// Asks `child` to open `ledger` and write to it until a write is acknowledged (G9); returns how
/// long that took, or panics past `bound` with the last refusal.
pub(crate) async fn serves_again(
    child: &mut ReplicaProcess,
    ledger: &str,
    seq: i64,
    bound: Duration,
) -> Duration {
    let started = std::time::Instant::now();
    let mut last = String::new();
    while started.elapsed() < bound {
        let opened = child
            .request(&format!("open {ledger}"))
            .await
            .unwrap_or_default();
        if opened.starts_with("opened") {
            let wrote = child
                .request(&format!("write {ledger} {seq}"))
                .await
                .unwrap_or_default();
            if wrote.starts_with("ok") {
                return started.elapsed();
            }
            last = wrote;
        } else {
            last = opened;
        }
        // A refusal is answered at once; this is the retry pace of a client, not a wait for
        // a condition the test could observe.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "replica {} did not serve again within {bound:?} (G9); last answer: {last}",
        child.replica
    );
}

/// What a history run acknowledged and saw.
#[derive(Default)]
pub(crate) struct History {
    /// Per ledger, the (writer, seq) pairs whose write was acknowledged.
    pub(crate) acked: std::collections::HashMap<String, std::collections::BTreeSet<(String, i64)>>,
    /// Per ledger, the epochs it was opened at, in the order the opens were answered.
    pub(crate) opened: std::collections::HashMap<String, Vec<i64>>,
    pub(crate) kills: u32,
    pub(crate) pauses: u32,
    pub(crate) terminations: u32,
    pub(crate) restarts: u32,
    pub(crate) failovers: u32,
    pub(crate) refusals: u32,
    /// Writes whose future the replica dropped at a random point (their rows may be committed).
    pub(crate) cuts: u32,
    /// Pauses that caught a replica in the middle of a large result or a COPY.
    pub(crate) stalls: u32,
    /// The partitions of a run with [`Faults::partitions`].
    pub(crate) partitions: Vec<netns::Cut>,
    /// When the run began, when its last fault ended (the last pause resumed, the last restart
    /// or promotion done, the last cut link healed and its work in flight answered), and when
    /// it ended.
    pub(crate) started: Option<std::time::Instant>,
    pub(crate) faults_ended: Option<std::time::Instant>,
    pub(crate) ended: Option<std::time::Instant>,
    /// Every acknowledged write: when its reply came, which replica, which ledger.
    pub(crate) acks: Vec<(std::time::Instant, String, String)>,
    /// The tenant and replica states the views showed while the run went on, as
    /// `tenant-state/replica-state` pairs (`-` for a tenant without an owner), and how often
    /// the views were read.
    pub(crate) states_seen: std::collections::BTreeSet<String>,
    pub(crate) views_read: u32,
    /// Where `lease_status` and `replica_status` told different stories, read after read.
    pub(crate) disagreements: Vec<String>,
}

/// Where `lease_status`, `replica_status` and the fleet's counts tell different stories
/// (issue 27): each tenant with an owner against its owner's `replica_status` row (see
/// `TenantState`'s table), `owner_alive` and `expires_in` against the state, and each
/// replica's `tenants_held` against the tenants `lease_status` gives its incarnation. One
/// statement, so one `now()`; `pg_locks` is read once per view, so a lease session that ends
/// between the two reads can differ once (callers read again).
const VIEWS_DISAGREE_SQL: &str = "
SELECT l.tenant || ': ' || l.state || ' (owner ' || coalesce(l.owner, '-') || ' incarnation '
       || coalesce(l.owner_incarnation::text, '-') || ', owner_alive '
       || coalesce(l.owner_alive::text, '-') || ', expires_in '
       || coalesce(l.expires_in::text, '-') || ') beside replica_status '
       || coalesce(r.replica_id || ' ' || r.state || ' incarnation ' || r.incarnation, 'none')
  FROM pgtenant.lease_status l
  LEFT JOIN pgtenant.replica_status r ON r.replica_id = l.owner
 WHERE NOT coalesce(CASE l.state
     WHEN 'held' THEN r.state = 'alive' AND r.incarnation = l.owner_incarnation
                      AND l.owner_alive AND l.expires_in IS NOT NULL
     WHEN 'stalled' THEN r.state IN ('stalled', 'sealed') AND r.lock_held
                         AND r.incarnation = l.owner_incarnation AND NOT l.owner_alive
                         AND l.expires_in = interval '0'
     WHEN 'owner_gone' THEN r.state IN ('gone', 'sealed', 'released') AND NOT r.lock_held
                            AND r.incarnation = l.owner_incarnation AND NOT l.owner_alive
                            AND l.expires_in IS NULL
     WHEN 'owner_reregistered' THEN r.incarnation > l.owner_incarnation AND NOT l.owner_alive
                                    AND l.expires_in IS NULL
     ELSE l.owner IS NULL OR l.state = 'quarantined'
   END, false)
UNION ALL
SELECT 'replica ' || r.replica_id || ' (' || r.state || '): tenants_held ' || r.tenants_held
       || ', lease_status gives its incarnation ' || count(l.tenant)
  FROM pgtenant.replica_status r
  LEFT JOIN pgtenant.lease_status l ON l.owner = r.replica_id AND l.owner_incarnation = r.incarnation
 GROUP BY r.replica_id, r.state, r.tenants_held
HAVING r.tenants_held <> count(l.tenant)
UNION ALL
SELECT 'fleet_status ' || f.key || ' ' || f.value || ', lease_status ' || coalesce(c.n, 0)
  FROM jsonb_each_text((SELECT s.fleet FROM pgtenant.status_report(0) s)) f
  LEFT JOIN (SELECT state, count(*) AS n FROM pgtenant.lease_status GROUP BY state) c
         ON c.state = f.key
 WHERE f.key IN ('held', 'stalled', 'owner_gone', 'owner_reregistered', 'free', 'reserved',
                 'quarantined', 'forgotten')
   AND f.value::bigint <> coalesce(c.n, 0)";

/// The states the views show now, as `tenant-state/replica-state` pairs.
const STATE_PAIRS_SQL: &str = "
SELECT DISTINCT l.state || '/' || coalesce(r.state, '-')
  FROM pgtenant.lease_status l
  LEFT JOIN pgtenant.replica_status r ON r.replica_id = l.owner";

/// Reads the views and returns where they disagree, after up to three reads in a row (a
/// disagreement that a lease session ending between the views' two reads of `pg_locks` made
/// does not survive a second read); None when the session could not read them (a restart).
pub(crate) async fn views_disagree(client: &tokio_postgres::Client) -> Option<Vec<String>> {
    let mut last = Vec::new();
    for _ in 0..3 {
        let rows = client.query(VIEWS_DISAGREE_SQL, &[]).await.ok()?;
        last = rows.iter().map(|row| row.get(0)).collect();
        if last.is_empty() {
            break;
        }
    }
    Some(last)
}

/// Asserts that `lease_status`, `replica_status` and the fleet's counts agree
/// ([`views_disagree`]).
pub(crate) async fn assert_views_agree(client: &tokio_postgres::Client) {
    let disagreements = views_disagree(client).await.expect("read the views");
    assert!(
        disagreements.is_empty(),
        "the status views disagree:\n{}",
        disagreements.join("\n")
    );
}

/// The faults a history run injects, besides kills that respawn the same replica id and pauses
/// past the ttl (always on). Each is a real fault: a signal to a real process, a backend
/// terminated by the server, a server crashed with `-m immediate`, a standby promoted.
#[derive(Default)]
pub(crate) struct Faults<'a> {
    /// `pg_terminate_backend` of a replica's lease session, or of every data connection.
    pub(crate) terminate: bool,
    /// Two crash restarts of this server (`pg_ctl stop -m immediate`, then start).
    pub(crate) restarts: Option<&'a pgtenant_testkit::LocalCluster>,
    /// One failover: the primary crashes and the standby is promoted (the run's URL names both).
    pub(crate) failover: Option<&'a pgtenant_testkit::StandbyPair>,
    /// The application's faults: half the writes have their future dropped after a random
    /// 0–3 ms (before BEGIN, mid-work, or mid-COMMIT: each COMMIT sleeps up to 3 ms in a
    /// deferred trigger, see `try_create_stamped_log`).
    pub(crate) cancel: bool,
    /// Half the pauses catch the replica streaming a large result or in the middle of a COPY
    /// (its backend blocked sending, or waiting for data, inside a fenced transaction).
    pub(crate) stalls: bool,
    /// Each replica in a network namespace of its own, its link cut silently for 0.5–3.5 s
    /// (3 %, and at least every 3 s), half the time with a transaction open across the cut,
    /// while another replica takes over a shared ledger it held ([`netns::PartitionFaults`]).
    pub(crate) partitions: Option<&'a netns::Partitions>,
}

/// How long a history run injects faults, and how long it goes on without any: the quiet part
/// is longer than [`SERVE_AGAIN_BOUND`], so every replica must have served again in it (G9).
/// `PGTENANT_HISTORY_SECS=F` makes the fault phase F seconds for a long run (the `fault_run`
/// tests, ignored by default).
fn phases() -> (Duration, Duration) {
    let fault = std::env::var("PGTENANT_HISTORY_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs);
    (fault, Duration::from_secs(10))
}

/// A superuser session for the faults' SQL, opened again after a restart or a failover.
async fn admin_session(url: &str) -> Option<tokio_postgres::Client> {
    let config: tokio_postgres::Config = url.parse().ok()?;
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(5),
        config.connect(tokio_postgres::NoTls),
    )
    .await
    .ok()?
    .ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// Replica processes `names` (each started through the test binary's `child` entry point) open
/// the shared `ledgers` and one ledger of their own each, and append (tenant, epoch, seq) rows:
/// for the fault phase ([`phases`]) while they are killed and respawned under the same id (3 %), paused for
/// 0.2–3.2 s (3 %), and hit by `faults`, then for the quiet phase without a fault (xorshift
/// from `seed`). [`History::assert_live`] checks that the fleet served again.
pub(crate) async fn run_history(
    child: &str,
    url: &str,
    names: &[&str],
    ledgers: &[&str],
    mut seed: u64,
    faults: &Faults<'_>,
) -> History {
    let spawn = |c: usize| match faults.partitions {
        Some(partitions) => partitions.spawn(child, c, names[c]),
        None => ReplicaProcess::spawn(child, url, names[c]),
    };
    let mut children: Vec<ReplicaProcess> = Vec::new();
    for c in 0..names.len() {
        let mut process = spawn(c);
        process.ready().await;
        children.push(process);
    }
    let mut partitions = faults
        .partitions
        .map(|partitions| netns::PartitionFaults::new(partitions, ledgers));
    let own: Vec<String> = names.iter().map(|name| format!("{name}-own")).collect();
    let mut admin = admin_session(url).await;
    let mut paused_until: Vec<Option<std::time::Instant>> = vec![None; names.len()];
    let mut history = History::default();
    let mut seq = 0_i64;
    let (fault_phase, quiet_phase) = phases();
    let started = std::time::Instant::now();
    let faults_until = started + fault_phase;
    let end = faults_until + quiet_phase;
    let mut faults_ended = started;
    let mut next_view_read = started;
    // Crash restarts at a third and two thirds of the fault phase; the failover at half.
    let mut restarts_at: Vec<std::time::Instant> = match faults.restarts {
        Some(_) => vec![started + fault_phase / 3, started + fault_phase * 2 / 3],
        None => Vec::new(),
    };
    let mut failover_at = faults.failover.map(|_| started + fault_phase / 2);
    while std::time::Instant::now() < end {
        let now = std::time::Instant::now();
        if restarts_at.first().is_some_and(|at| now >= *at) {
            restarts_at.remove(0);
            let cluster = faults.restarts.expect("restarts");
            cluster.stop_immediate().await.expect("crash the server");
            cluster.start_again().await.expect("start the server again");
            history.restarts += 1;
            faults_ended = std::time::Instant::now();
            admin = admin_session(url).await;
        }
        if failover_at.is_some_and(|at| now >= at) {
            failover_at = None;
            let pair = faults.failover.expect("failover");
            pair.stop_primary_immediate()
                .await
                .expect("crash the primary");
            pair.promote_standby().await.expect("promote the standby");
            history.failovers += 1;
            faults_ended = std::time::Instant::now();
            admin = admin_session(url).await;
        }
        let faulting = now < faults_until;
        // The views, read as an operator would at any moment of the run (issue 27): every
        // 100 ms, which leaves the replicas' own work the most of the database.
        let reader = admin.as_ref().filter(|client| !client.is_closed());
        if let Some(client) = reader.filter(|_| now >= next_view_read) {
            next_view_read = now + Duration::from_millis(100);
            if let Some(found) = views_disagree(client).await {
                history.views_read += 1;
                history.disagreements.extend(found);
                if let Ok(rows) = client.query(STATE_PAIRS_SQL, &[]).await {
                    history
                        .states_seen
                        .extend(rows.iter().map(|row| row.get::<_, String>(0)));
                }
            }
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let c = (seed % names.len() as u64) as usize;
        // One pick in three goes to the replica's own ledger, which no other replica contends
        // for: every live replica has something it can always serve.
        let ledger = match (seed >> 8) % (ledgers.len() as u64 + 1) {
            pick if (pick as usize) < ledgers.len() => ledgers[pick as usize],
            _ => own[c].as_str(),
        };
        if let Some(until) = paused_until[c] {
            if std::time::Instant::now() < until && faulting {
                continue;
            }
            children[c].resume();
            paused_until[c] = None;
            faults_ended = std::time::Instant::now();
        }
        if let Some(partitions) = partitions.as_mut() {
            match partitions
                .turn(c, &mut children[c], &mut history, faulting)
                .await
            {
                netns::Turn::Skip => continue,
                netns::Turn::Ended => faults_ended = std::time::Instant::now(),
                netns::Turn::Go => {}
            }
        }
        let dice = if faulting { (seed >> 16) % 100 } else { 99 };
        match dice {
            0..=2 => {
                let old = std::mem::replace(&mut children[c], spawn(c));
                old.kill();
                children[c].ready().await;
                history.kills += 1;
                faults_ended = std::time::Instant::now();
            }
            3..=5 => {
                if faults.stalls && (seed >> 40).is_multiple_of(2) {
                    // On a ledger it holds (its own, which it opened first thing).
                    let work = if (seed >> 41).is_multiple_of(2) {
                        "stream"
                    } else {
                        "copy"
                    };
                    let reply = children[c]
                        .request(&format!("{work} {}", own[c]))
                        .await
                        .unwrap_or_default();
                    if reply == "streaming" || reply == "copying" {
                        history.stalls += 1;
                    }
                }
                children[c].pause();
                let millis = 200 + (seed >> 24) % 3000;
                paused_until[c] = Some(std::time::Instant::now() + Duration::from_millis(millis));
                history.pauses += 1;
            }
            6..=7 if faults.terminate => {
                if admin.as_ref().is_none_or(|client| client.is_closed()) {
                    admin = admin_session(url).await;
                }
                // Half the time the replica's lease session, half every data connection of
                // the database (the lease sessions, the faults' own session and the servers'
                // own processes excepted).
                let sql = if (seed >> 24).is_multiple_of(2) {
                    format!(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                          WHERE datname = current_database() AND application_name = 'pgtenant lease {}'",
                        names[c]
                    )
                } else {
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                      WHERE datname = current_database() AND backend_type = 'client backend'
                        AND pid <> pg_backend_pid() AND application_name NOT LIKE 'pgtenant lease %'
                        AND application_name NOT LIKE 'citus%'"
                        .to_owned()
                };
                if let Some(client) = &admin {
                    if client.simple_query(&sql).await.is_ok() {
                        history.terminations += 1;
                        faults_ended = std::time::Instant::now();
                    }
                }
            }
            26..=28 if partitions.is_some() => {
                seq += 1;
                if let Some(partitions) = partitions.as_mut() {
                    let child = &mut children[c];
                    partitions
                        .cut(c, child, &own[c], seq, seed, &mut history)
                        .await;
                }
            }
            8..=25 => {
                let reply = children[c]
                    .request(&format!("open {ledger}"))
                    .await
                    .unwrap_or_default();
                if let Some(epoch) = reply.strip_prefix("opened ") {
                    history
                        .opened
                        .entry(ledger.to_owned())
                        .or_default()
                        .push(epoch.parse().expect("epoch"));
                }
            }
            _ => {
                seq += 1;
                let command = if faults.cancel && faulting && (seed >> 32).is_multiple_of(2) {
                    // 0–3 ms: a fenced write here takes 1–6 ms, so most cuts land before the
                    // reply, many of them mid-COMMIT (the trigger sleeps up to 3 ms).
                    format!("cut {ledger} {seq} {}", (seed >> 20) % 3000)
                } else {
                    format!("write {ledger} {seq}")
                };
                let mut reply = children[c].request(&command).await.unwrap_or_default();
                if reply == "cut" {
                    history.cuts += 1;
                }
                if !faulting && reply.starts_with("error") {
                    // Without faults a replica opens what it needs (a lease lost in a fault,
                    // or a ledger it never opened), as an application would.
                    let opened = children[c]
                        .request(&format!("open {ledger}"))
                        .await
                        .unwrap_or_default();
                    if !opened.starts_with("opened ")
                        && std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some()
                    {
                        eprintln!("history: {} could not open {ledger}: {opened}", names[c]);
                    }
                    if let Some(epoch) = opened.strip_prefix("opened ") {
                        history
                            .opened
                            .entry(ledger.to_owned())
                            .or_default()
                            .push(epoch.parse().expect("epoch"));
                        seq += 1;
                        reply = children[c]
                            .request(&format!("write {ledger} {seq}"))
                            .await
                            .unwrap_or_default();
                    }
                }
                if reply.starts_with("ok") {
                    history
                        .acked
                        .entry(ledger.to_owned())
                        .or_default()
                        .insert((names[c].to_owned(), seq));
                    history.acks.push((
                        std::time::Instant::now(),
                        names[c].to_owned(),
                        ledger.to_owned(),
                    ));
                } else {
                    history.refusals += 1;
                    // PGTENANT_HISTORY_DEBUG=1: what the replicas answer once the faults ended.
                    if !faulting && std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some() {
                        eprintln!("history: {} refused a write to {ledger}: {reply}", names[c]);
                    }
                }
            }
        }
    }
    for (process, paused) in children.iter().zip(&paused_until) {
        if paused.is_some() {
            process.resume();
        }
    }
    if let Some(partitions) = partitions.as_mut() {
        partitions.heal_all(&mut history);
    }
    history.started = Some(started);
    history.faults_ended = Some(faults_ended);
    history.ended = Some(std::time::Instant::now());
    history
}

impl History {
    /// The operator's view of the run (issue 27): `lease_status`, `replica_status` and the
    /// fleet's counts agreed at every read, whatever state the faults left.
    pub(crate) fn assert_views_agreed(&self) {
        println!(
            "views: read {} times; tenant/replica states seen: {}",
            self.views_read,
            self.states_seen
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(
            self.disagreements.is_empty(),
            "the status views disagreed during the run:\n{}",
            self.disagreements.join("\n")
        );
    }

    /// The liveness half of the verdict (DESIGN G9): every replica id acknowledged writes in the
    /// last third of the run; each served again within [`SERVE_AGAIN_BOUND`] of the last fault's
    /// end; every shared ledger was written after it; and no stretch of the run went without an
    /// acknowledged write for over 10 s. Returns the longest such stretch.
    pub(crate) fn assert_live(&self, names: &[&str], ledgers: &[&str]) -> Duration {
        let (started, faults_ended, ended) = (
            self.started.expect("run"),
            self.faults_ended.expect("run"),
            self.ended.expect("run"),
        );
        let last_third = ended - (ended - started) / 3;
        let mut stretch = Duration::ZERO;
        let mut previous = started;
        for (at, _, _) in &self.acks {
            stretch = stretch.max(at.saturating_duration_since(previous));
            previous = previous.max(*at);
        }
        stretch = stretch.max(ended.saturating_duration_since(previous));
        let mut back = Vec::new();
        for name in names {
            let first_after = self
                .acks
                .iter()
                .find(|(at, replica, _)| replica == name && *at >= faults_ended)
                .map(|(at, _, _)| at.duration_since(faults_ended));
            let in_last_third = self
                .acks
                .iter()
                .any(|(at, replica, _)| replica == name && *at >= last_third);
            assert!(
                in_last_third,
                "replica {name} acknowledged no write in the last third of the run (G9)"
            );
            let first_after = first_after.expect("an ack after the faults");
            assert!(
                first_after <= SERVE_AGAIN_BOUND,
                "replica {name} served again {first_after:?} after the last fault, over {SERVE_AGAIN_BOUND:?} (G9)"
            );
            back.push(first_after);
        }
        for ledger in ledgers {
            assert!(
                self.acks
                    .iter()
                    .any(|(at, _, acked)| acked == ledger && *at >= faults_ended),
                "ledger {ledger} was not written after the last fault (G9)"
            );
        }
        println!(
            "liveness: {} acknowledged writes; last fault ended {:?} into the run; every replica \
             back within {:?}; longest stretch without an acknowledged write {stretch:?}",
            self.acks.len(),
            faults_ended - started,
            back.iter().max().copied().unwrap_or_default()
        );
        assert!(
            stretch <= Duration::from_secs(10),
            "{stretch:?} without an acknowledged write (G9)"
        );
        stretch
    }
}

/// The safety half of the verdict on every ledger of a run (shared and own), through a checker
/// replica that takes each over: see [`check_history`]. Returns how many writes were
/// acknowledged.
pub(crate) async fn check_all(
    history: &History,
    url: &str,
    checker: &str,
    names: &[&str],
    ledgers: &[&str],
) -> usize {
    let checker = router(url, checker).await;
    let own: Vec<String> = names.iter().map(|name| format!("{name}-own")).collect();
    let mut total = 0;
    for ledger in ledgers
        .iter()
        .copied()
        .chain(own.iter().map(String::as_str))
    {
        let handle = take_over(&checker, &tenant(ledger), Duration::from_secs(30)).await;
        total += check_history(&handle, ledger, history).await;
        let epochs = history.opened.get(ledger).cloned().unwrap_or_default();
        assert!(
            epochs.windows(2).all(|w| w[0] <= w[1]),
            "{ledger}: epochs went backwards: {epochs:?}"
        );
    }
    println!(
        "history: {} kills, {} pauses ({} mid-stream or mid-COPY), {} terminations, {} crash \
         restarts, {} failovers, {} writes cut, {} refused writes, {total} acknowledged",
        history.kills,
        history.pauses,
        history.stalls,
        history.terminations,
        history.restarts,
        history.failovers,
        history.cuts,
        history.refusals
    );
    checker.close().await;
    total
}

/// A whole history test: [`run_history`] with `faults`, then both halves of the verdict,
/// liveness ([`History::assert_live`]) and safety ([`check_all`], through a checker replica
/// named `checker`). Returns the history and how many writes were acknowledged.
pub(crate) async fn history_test(
    child: &str,
    url: &str,
    names: &[&str],
    ledgers: &[&str],
    seed: u64,
    faults: &Faults<'_>,
    checker: &str,
) -> (History, usize) {
    let history = run_history(child, url, names, ledgers, seed, faults).await;
    history.assert_views_agreed();
    history.assert_live(names, ledgers);
    let total = check_all(&history, url, checker, names, ledgers).await;
    (history, total)
}

/// A throwaway server of the test's own (one it may crash) with a database and the control
/// plane on it.
pub(crate) async fn own_server() -> (pgtenant_testkit::LocalCluster, TestDatabase) {
    let cluster = pgtenant_testkit::LocalCluster::start()
        .await
        .expect("throwaway cluster");
    let db = cluster.create_database().await.expect("database");
    let mut client = db.connect().await.expect("connect");
    pgtenant::setup(&mut client).await.expect("setup");
    (cluster, db)
}

/// Every row of the ledger's log: (epoch, seq, writer, seen_max_epoch).
pub(crate) async fn log_rows(handle: &TenantHandle) -> Vec<(i64, i64, String, i64)> {
    handle
        .read(|tx| {
            Box::pin(async move {
                Ok::<_, pgtenant::Error>(
                    tx.query("SELECT epoch, seq, writer, seen_max_epoch FROM log", &[])
                        .await?
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                        .collect(),
                )
            })
        })
        .await
        .expect("read the log")
}

/// The history's verdict on one ledger, read through `handle` (the checker's, which took it
/// over): no row committed under an epoch lower than one already committed for the tenant
/// (G1, G3) and every acknowledged row present (G4). Returns how many rows were acknowledged.
pub(crate) async fn check_history(handle: &TenantHandle, ledger: &str, history: &History) -> usize {
    let rows = log_rows(handle).await;
    let stale: Vec<_> = rows
        .iter()
        .filter(|(epoch, _, _, seen)| seen > epoch)
        .collect();
    assert!(
        stale.is_empty(),
        "{ledger}: committed under an epoch lower than one already committed: {stale:?}"
    );
    let stamped_stale: Vec<(String, i64, i64, i64)> = handle
        .read(|tx| {
            Box::pin(async move {
                if tx
                    .query_one("SELECT to_regclass('stamps') IS NOT NULL", &[])
                    .await?
                    .get::<_, bool>(0)
                {
                    Ok::<_, pgtenant::Error>(
                        tx.query(
                            "SELECT writer, seq, row_epoch, epoch_at_commit FROM stamps
                              WHERE epoch_at_commit > row_epoch",
                            &[],
                        )
                        .await?
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                        .collect(),
                    )
                } else {
                    Ok(Vec::new())
                }
            })
        })
        .await
        .expect("read the commit stamps");
    assert!(
        stamped_stale.is_empty(),
        "{ledger}: committed after a later epoch had been granted: {stamped_stale:?}"
    );
    let present: std::collections::BTreeSet<(String, i64)> = rows
        .iter()
        .map(|(_, seq, writer, _)| (writer.clone(), *seq))
        .collect();
    let want = history.acked.get(ledger).cloned().unwrap_or_default();
    let missing: Vec<_> = want.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "{ledger}: acknowledged but missing: {missing:?}"
    );
    let distinct: std::collections::BTreeSet<i64> = rows.iter().map(|r| r.0).collect();
    println!(
        "{ledger}: {} rows ({} acknowledged) over {} epochs",
        rows.len(),
        want.len(),
        distinct.len()
    );
    want.len()
}
