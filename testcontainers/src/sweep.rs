//! Removal of what killed test runs left behind: databases on long-lived
//! servers and cluster directories whose watchdog could not run.

use std::fs;
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, Instant, SystemTime};

use tokio_postgres::Config;

use crate::admin::{connect_admin, drop_database};
use crate::cluster::temp_dir::{OWNER_FILE, TEMP_PREFIX};
use crate::error::describe_pg;
use crate::names::{created_at, unix_secs};

/// Leftovers younger than this may belong to a test run still going on.
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Sweeps stale cluster directories in the temp dir, once per process.
pub(crate) fn sweep_temp_dirs_once() {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(sweep_temp_dirs);
}

fn sweep_temp_dirs() {
    sweep_temp_dirs_in(&std::env::temp_dir());
}

/// The sweep of one parent directory (tests pass their own, so no concurrent sweep of the
/// shared temp dir races them).
fn sweep_temp_dirs_in(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let path = entry.path();
        // symlink_metadata: never follow a link planted under our prefix.
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age > STALE_AFTER);
        if !meta.is_dir() || !old || owner_alive(&path) {
            continue;
        }
        stop_stale_postmaster(&path.join("data"));
        match fs::remove_dir_all(&path) {
            Ok(()) => tracing::info!(dir = %path.display(), "removed stale test cluster directory"),
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "could not remove stale test cluster directory")
            }
        }
    }
}

/// Whether the process that made the directory still runs (Linux; elsewhere
/// the age alone decides). Our own pid counts as dead: the sweep runs before
/// this process makes any directory, so one with our pid is a leftover of an
/// earlier process that had the same pid.
fn owner_alive(dir: &Path) -> bool {
    fs::read_to_string(dir.join(OWNER_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
}

/// Stops the postmaster named in `data/postmaster.pid`, only if that process
/// really is a postgres (the pid may have been reused since).
fn stop_stale_postmaster(data: &Path) {
    let pidfile = data.join("postmaster.pid");
    let Some(pid) = fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.trim().parse::<libc::pid_t>().ok())
        })
        .filter(|&pid| pid > 0)
    else {
        return;
    };
    let is_postgres =
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres");
    if !is_postgres {
        return;
    }
    // SAFETY: kill has no memory-safety preconditions; the pid was checked to
    // be a postgres process just above.
    unsafe { libc::kill(pid, libc::SIGQUIT) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while pidfile.exists()
        && Path::new(&format!("/proc/{pid}")).exists()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Drops test databases older than [`STALE_AFTER`] on a long-lived server.
pub(crate) async fn sweep_databases(admin: &Config) {
    let client = match connect_admin(admin).await {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(error = %e, "could not sweep stale test databases");
            return;
        }
    };
    let rows = match client
        .query(
            "SELECT datname::text FROM pg_database WHERE datname LIKE 'pgtenant\\_test\\_%'",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %describe_pg(&e), "could not list stale test databases");
            return;
        }
    };
    let cutoff = unix_secs().saturating_sub(STALE_AFTER.as_secs());
    for row in rows {
        let name: String = row.get(0);
        if created_at(&name).is_none_or(|secs| secs >= cutoff) {
            continue;
        }
        match drop_database(admin, &name).await {
            Ok(()) => tracing::info!(database = %name, "dropped stale test database"),
            Err(e) => {
                tracing::warn!(database = %name, error = %e, "could not drop stale test database")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::quote_ident;
    use crate::TestDatabase;

    fn make_dir(root: &Path, name: &str, owner: u32, age: Duration) -> std::path::PathBuf {
        let dir = root.join(format!(
            "{TEMP_PREFIX}sweeptest-{}-{name}",
            std::process::id()
        ));
        fs::create_dir_all(dir.join("data")).expect("create");
        fs::write(dir.join(OWNER_FILE), owner.to_string()).expect("owner");
        // A pid file naming a process that is no postgres: it must survive.
        fs::write(
            dir.join("data/postmaster.pid"),
            format!("{}\n", std::process::id()),
        )
        .expect("pid file");
        let then = SystemTime::now() - age;
        fs::File::open(&dir)
            .and_then(|f| f.set_modified(then))
            .expect("set mtime");
        dir
    }

    #[test]
    fn removes_only_old_directories_of_dead_processes() {
        let hour = Duration::from_secs(3600);
        // Far above any pid_max, so no process has it.
        let root = std::env::temp_dir().join(format!("pgtenant-sweep-unit-{}", std::process::id()));
        fs::create_dir_all(&root).expect("root");
        let stale = make_dir(&root, "stale", 999_999_999, 2 * hour);
        let young = make_dir(&root, "young", 999_999_999, Duration::from_secs(60));
        let live_owner = make_dir(&root, "live", std::os::unix::process::parent_id(), 2 * hour);
        sweep_temp_dirs_in(&root);
        assert!(!stale.exists(), "stale dir kept");
        assert!(young.exists(), "young dir removed");
        assert!(live_owner.exists(), "dir of a live process removed");
        fs::remove_dir_all(root).expect("cleanup");
    }

    #[tokio::test]
    async fn drops_only_old_test_databases() {
        let db = TestDatabase::create().await.expect("a server");
        let admin = db.admin_config();
        let client = connect_admin(&admin).await.expect("admin");
        let pid = std::process::id();
        let old = format!("pgtenant_test_{}_{pid}_sweep_old", unix_secs() - 7200);
        let fresh = format!("pgtenant_test_{}_{pid}_sweep_fresh", unix_secs());
        for name in [&old, &fresh] {
            client
                .batch_execute(&format!(
                    "CREATE DATABASE {} TEMPLATE template0",
                    quote_ident(name)
                ))
                .await
                .expect("create");
        }
        sweep_databases(&admin).await;
        let exists = |name: String| {
            let client = &client;
            async move {
                client
                    .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
                    .await
                    .expect("query")
                    .is_some()
            }
        };
        assert!(!exists(old).await, "old database kept");
        assert!(exists(fresh.clone()).await, "fresh database dropped");
        assert!(
            exists(db.name().to_owned()).await,
            "the live test database dropped"
        );
        drop_database(&admin, &fresh).await.expect("cleanup");
    }
}
