//! Replica child processes: the test binary re-run as a separate replica ([`ReplicaProcess`],
//! the parent's side) and the line protocol it speaks on stdin and stdout ([`child_main`], the
//! child's side, with [`stdin_lines`], [`say`] and [`describe`] for children of their own).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use pgtenant::TenantHandle;
use tokio::sync::{mpsc, oneshot};

use super::alarm_workload::{
    alarms_on, parse_alarms, schedule_alarms, try_create_effects, with_alarm_handler,
};
use super::log::{append, try_create_stamped_log, APPEND_SQL};
use super::routers::{join_all, options, router, tenant};

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

    /// Kills the process and returns every reply it had written before it died: its stdout
    /// reaches end of file at its death, which ends the reader's channel.
    pub(crate) async fn kill_collecting_replies(mut self) -> Vec<String> {
        self.signal("-KILL");
        let _ = self.child.wait();
        let mut replies = Vec::new();
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(10), self.lines.recv()).await
        {
            replies.push(line);
        }
        replies
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
/// (`ClientWrite`) or reading (`ClientRead`) inside a fenced transaction; with
/// `PGTENANT_TEST_ALARMS=1` (the history's alarm workload, `alarm_workload.rs`) the router fires
/// alarms, `open` also creates the effects table, and `alarm <name>=<delay_ms>[,…] <ledger>…`
/// schedules those alarms in one transaction, each due its delay after the database's clock, on
/// the first of the ledgers this replica holds, or else on the first one if it can open it (→
/// `scheduled <ledger> <epoch> <due µs>[,…]`; `unknown <ledger> error …` when it failed,
/// perhaps in its COMMIT; `error NotHeld` when it holds none of them and could not open the
/// first, and nothing was scheduled). Other failures answer `error <Variant> <message>`.
pub(crate) fn child_main() {
    let Ok(url) = std::env::var("PGTENANT_CHILD_URL") else {
        return; // run as an ordinary (ignored) test: nothing to do
    };
    let replica = std::env::var("PGTENANT_CHILD_REPLICA").expect("replica id");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let alarms = alarms_on();
        let router = if alarms {
            pgtenant::Router::start(with_alarm_handler(options(&url, &replica), &replica))
                .await
                .expect("router starts")
        } else {
            router(&url, &replica).await
        };
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
                    Ok(handle) => match create_tables(&handle, alarms).await {
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
                ["alarm", alarms_asked, ledgers @ ..] => {
                    // The first of the ledgers this replica holds now (opened by a command or
                    // woken by an alarm), as an application routes work to the owner.
                    let mut held = ledgers.iter().find_map(|ledger| {
                        router
                            .handle_of(&tenant(ledger))
                            .filter(TenantHandle::is_serving)
                            .map(|handle| (ledger, handle))
                    });
                    // Holding none: the first one, if nobody else holds it (its table is
                    // made sure of as by `open`).
                    if let (None, Some(first)) = (&held, ledgers.first()) {
                        if let Ok(handle) = router.open_or_create(&tenant(first)).await {
                            if create_tables(&handle, alarms).await.is_ok() {
                                held = Some((first, handle));
                            }
                        }
                    }
                    match held {
                        Some((ledger, handle)) => {
                            let asked = parse_alarms(alarms_asked);
                            match schedule_alarms(&handle, asked, &replica).await {
                                Ok(dues) => {
                                    let dues: Vec<String> =
                                        dues.iter().map(i64::to_string).collect();
                                    format!(
                                        "scheduled {ledger} {} {}",
                                        handle.epoch(),
                                        dues.join(",")
                                    )
                                }
                                Err(e) => format!("unknown {ledger} {}", describe(&e)),
                            }
                        }
                        None => "error NotHeld".to_owned(),
                    }
                }
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

/// The tables a child's `open` makes sure of: the stamped log, and with alarms the effects.
async fn create_tables(handle: &TenantHandle, alarms: bool) -> pgtenant::Result<()> {
    try_create_stamped_log(handle).await?;
    if alarms {
        try_create_effects(handle).await?;
    }
    Ok(())
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
