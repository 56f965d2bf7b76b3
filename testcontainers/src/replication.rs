//! A primary and a streaming standby, for failover tests.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::admin::{connect_admin, quote_ident};
use crate::cluster::{Cluster, Durability};
use crate::error::TestkitError;
use crate::names::new_name;
use crate::sweep;

/// How long the standby may take to start streaming, to catch up, or to be promoted.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(30);

/// How the primary waits for its standby when a transaction commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'` with the default `synchronous_commit = on`: a commit
    /// returns only once the standby has flushed its WAL, so a promoted standby has every
    /// acknowledged commit.
    Synchronous,
    /// No synchronous standby: a commit returns once the primary has flushed it, and the
    /// standby follows as fast as it can. A promoted standby lacks whatever it had not received.
    Asynchronous,
}

/// A primary and a streaming standby of it: two throwaway clusters made with the machine's
/// `initdb`, `pg_basebackup -R` and `postgres`, each on a free port of `127.0.0.1`, with
/// durable settings, trust authentication and the superuser `postgres`.
///
/// It offers what a failover test needs: [`stop_primary_immediate`](Self::stop_primary_immediate)
/// (a crash: `-m immediate`), [`promote_standby`](Self::promote_standby), a multi-host
/// [`url`](Self::url) such as an HA setup hands out, and, for asynchronous replication,
/// [`detach_standby`](Self::detach_standby), which stops the standby from receiving anything
/// more (replication lag made certain), so that a test can show what a lossy failover loses.
///
/// Databases made with [`create_database`](Self::create_database) live as long as the pair;
/// dropping the pair stops both servers and removes their directories (a watchdog does it if
/// the test process dies first).
///
/// ```no_run
/// use pgtenant_testkit::{Replication, StandbyPair};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pair = StandbyPair::start(Replication::Synchronous).await?;
/// let db = pair.create_database().await?;
/// let url = pair.url(&db); // primary first, then the standby; target_session_attrs=read-write
/// // … write through `url` …
/// pair.stop_primary_immediate().await?;
/// pair.promote_standby().await?;
/// // … the same `url` now reaches the promoted standby …
/// # Ok(())
/// # }
/// ```
pub struct StandbyPair {
    primary: Arc<Cluster>,
    standby: Arc<Cluster>,
    mode: Replication,
}

impl StandbyPair {
    /// Starts a primary, makes a standby of it with `pg_basebackup -R`, starts that, and
    /// returns once the standby streams (as the synchronous standby, in that mode).
    pub async fn start(mode: Replication) -> Result<StandbyPair, TestkitError> {
        StandbyPair::start_with_settings(mode, &[]).await
    }

    /// Like [`start`](Self::start), with server settings of the test's own for both servers
    /// (`-c name=value`, after the test kit's own).
    pub async fn start_with_settings(
        mode: Replication,
        settings: &[(&str, &str)],
    ) -> Result<StandbyPair, TestkitError> {
        sweep::sweep_temp_dirs_once();
        let common: Vec<(String, String)> = settings
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let mut on_primary = common.clone();
        if mode == Replication::Synchronous {
            // On the primary's command line only, so that the promoted standby does not wait
            // for a standby of its own, which it does not have.
            on_primary.insert(0, ("synchronous_standby_names".into(), "*".into()));
        }
        let primary = Arc::new(Cluster::start_with(Durability::Durable, on_primary).await?);
        let standby = Arc::new(Cluster::start_standby_of(&primary, common).await?);
        let pair = StandbyPair {
            primary,
            standby,
            mode,
        };
        pair.wait_streaming().await?;
        Ok(pair)
    }

    /// The replication mode the pair was started with.
    pub fn mode(&self) -> Replication {
        self.mode
    }

    /// The primary's TCP port on 127.0.0.1.
    pub fn primary_port(&self) -> u16 {
        self.primary.port()
    }

    /// The standby's TCP port on 127.0.0.1.
    pub fn standby_port(&self) -> u16 {
        self.standby.port()
    }

    /// `postgres://postgres@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/database?target_session_attrs=read-write`:
    /// both servers, primary first, as an HA setup hands out. Before a failover it reaches the
    /// primary; after one, the promoted standby.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
            self.primary_port(),
            self.standby_port()
        )
    }

    /// `postgres://postgres@127.0.0.1:PRIMARY/database`: the (first) primary alone.
    pub fn primary_url(&self, database: &str) -> String {
        self.primary.url(database)
    }

    /// `postgres://postgres@127.0.0.1:STANDBY/database`: the standby (or, once promoted, the
    /// new primary) alone.
    pub fn standby_url(&self, database: &str) -> String {
        self.standby.url(database)
    }

    /// A new database on the primary, returned once the standby has it too. It lives as long
    /// as the pair (no `DROP DATABASE`: after a failover there may be no server to run it on,
    /// and with synchronous replication and no standby it would wait forever).
    pub async fn create_database(&self) -> Result<String, TestkitError> {
        let name = new_name();
        let admin = self.admin(&self.primary).await?;
        admin
            .batch_execute(&format!(
                "CREATE DATABASE {} TEMPLATE template0",
                quote_ident(&name)
            ))
            .await
            .map_err(|e| TestkitError::pg(format!("creating database {name}"), e))?;
        self.wait_for_standby().await?;
        Ok(name)
    }

    /// Waits until the standby has replayed everything the primary had written when this was
    /// called.
    pub async fn wait_for_standby(&self) -> Result<(), TestkitError> {
        let primary = self.admin(&self.primary).await?;
        let target: String = primary
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .map_err(|e| TestkitError::pg("reading the primary's WAL position", e))?
            .get(0);
        let standby = self.admin(&self.standby).await?;
        self.poll("the standby to replay the primary's WAL", || async {
            let caught_up: bool = standby
                .query_one(
                    "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                    &[&target],
                )
                .await
                .map_err(|e| TestkitError::pg("reading the standby's replay position", e))?
                .get(0);
            Ok(caught_up)
        })
        .await
    }

    /// Stops the standby from receiving more WAL (`primary_conninfo = ''`, reloaded) and
    /// returns once it has stopped streaming: whatever the primary commits from now on, the
    /// standby never sees, as with a standby that lags behind or is cut off. For
    /// [`Replication::Asynchronous`] (with a synchronous standby detached, every commit on the
    /// primary would wait forever; this refuses).
    pub async fn detach_standby(&self) -> Result<(), TestkitError> {
        if self.mode == Replication::Synchronous {
            return Err(TestkitError::Cluster(
                "detach_standby on a synchronous pair would make every commit on the primary \
                 wait forever; start the pair with Replication::Asynchronous"
                    .to_owned(),
            ));
        }
        let standby = self.admin(&self.standby).await?;
        // One statement each: ALTER SYSTEM refuses to run inside a transaction block.
        for statement in [
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ] {
            standby
                .batch_execute(statement)
                .await
                .map_err(|e| TestkitError::pg("detaching the standby", e))?;
        }
        self.poll("the standby to stop streaming", || async {
            let receivers: i64 = standby
                .query_one("SELECT count(*) FROM pg_stat_wal_receiver", &[])
                .await
                .map_err(|e| TestkitError::pg("reading pg_stat_wal_receiver", e))?
                .get(0);
            Ok(receivers == 0)
        })
        .await
    }

    /// Stops the primary with `-m immediate` (SIGQUIT), as a crash would: no checkpoint, no
    /// goodbye to clients, whose connections are reset. Returns once it has exited.
    pub async fn stop_primary_immediate(&self) -> Result<(), TestkitError> {
        self.primary.stop_immediate().await
    }

    /// Promotes the standby (`pg_promote`, waiting) and returns once it accepts writes, on a
    /// new timeline.
    pub async fn promote_standby(&self) -> Result<(), TestkitError> {
        let standby = self.admin(&self.standby).await?;
        let promoted: bool = standby
            .query_one(
                "SELECT pg_promote(true, $1)",
                &[&(REPLICATION_TIMEOUT.as_secs() as i32)],
            )
            .await
            .map_err(|e| TestkitError::pg("promoting the standby", e))?
            .get(0);
        if !promoted {
            return Err(TestkitError::Cluster(format!(
                "the standby was not promoted within {}s; see its postgres.log",
                REPLICATION_TIMEOUT.as_secs()
            )));
        }
        Ok(())
    }

    /// The WAL timeline the server on `port` writes (or, on a standby, replays) now.
    pub async fn timeline(&self, port: u16) -> Result<u32, TestkitError> {
        let cluster = if port == self.primary_port() {
            &self.primary
        } else {
            &self.standby
        };
        let client = self.admin(cluster).await?;
        let timeline: i64 = client
            .query_one(
                "SELECT ('x' || substr(pg_walfile_name(CASE WHEN pg_is_in_recovery()
                             THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END), 1, 8))::bit(32)::bigint",
                &[],
            )
            .await
            .map_err(|e| TestkitError::pg("reading the timeline", e))?
            .get(0);
        u32::try_from(timeline)
            .map_err(|_| TestkitError::Cluster(format!("timeline {timeline} is out of range")))
    }

    async fn admin(&self, cluster: &Cluster) -> Result<Client, TestkitError> {
        connect_admin(&cluster.admin_config()).await
    }

    /// Until the standby streams from the primary (as its synchronous standby, in that mode).
    async fn wait_streaming(&self) -> Result<(), TestkitError> {
        let primary = self.admin(&self.primary).await?;
        let sync = self.mode == Replication::Synchronous;
        self.poll("the standby to stream from the primary", || async {
            let streaming: i64 = primary
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication
                      WHERE state = 'streaming' AND (NOT $1 OR sync_state = 'sync')",
                    &[&sync],
                )
                .await
                .map_err(|e| TestkitError::pg("reading pg_stat_replication", e))?
                .get(0);
            Ok(streaming > 0)
        })
        .await
    }

    /// Polls `condition` (every 20 ms) until it holds, for at most [`REPLICATION_TIMEOUT`].
    async fn poll<F, Fut>(&self, what: &str, mut condition: F) -> Result<(), TestkitError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, TestkitError>>,
    {
        let deadline = Instant::now() + REPLICATION_TIMEOUT;
        loop {
            if condition().await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(TestkitError::Cluster(format!(
                    "waited {}s for {what}; see postgres.log in {} and {}",
                    REPLICATION_TIMEOUT.as_secs(),
                    self.primary.dir().display(),
                    self.standby.dir().display()
                )));
            }
            // Replication progress raises no event a client can wait on.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl fmt::Debug for StandbyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandbyPair")
            .field("mode", &self.mode)
            .field("primary_port", &self.primary_port())
            .field("standby_port", &self.standby_port())
            .finish()
    }
}
