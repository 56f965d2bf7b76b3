//! `pgtenant migrate`: bring every tenant behind to the migrations' version, through a router
//! of its own (opening a tenant migrates it under its lease), in parallel lanes that stop at
//! `--max-failures`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::cli::{self, Connection};
use crate::commands::{check_control_plane, connect, start_router, Access};
use crate::error::{explain, CliError};
use crate::output::{self, out, Outcome, TenantMigrated};

pub(crate) async fn run(connection: &Connection, args: &cli::Migrate) -> Result<(), CliError> {
    let dir = args.dir.display().to_string();
    let migrations =
        refinery::load_sql_migrations(&args.dir).map_err(|e| CliError::Migrations {
            dir: dir.clone(),
            reason: explain(&e),
        })?;
    let Some(target_version) = migrations
        .iter()
        .map(|m| pgtenant::SchemaVersion::new(m.version()))
        .max()
    else {
        return Err(CliError::Migrations {
            dir,
            reason: "no V<n>__name.sql files".into(),
        });
    };
    let (target, connected) = connect(connection).await?;
    check_control_plane(&connected.client, Access::Write("migrate")).await?;

    let mut behind = Vec::new();
    let mut query = pgtenant::admin::TenantQuery::default();
    query.behind = Some(target_version);
    query.quarantined = Some(false);
    query.limit = 10_000;
    loop {
        let page = pgtenant::admin::list_tenants(&connected.client, &query).await?;
        let full = page.len() as i64 == query.limit;
        query.after = page.last().map(|record| record.tenant.clone());
        behind.extend(
            page.into_iter()
                .map(|r| (r.tenant.key().to_owned(), r.version)),
        );
        if !full {
            break;
        }
    }
    let total = behind.len();
    if total == 0 {
        if args.output.json {
            return output::json(&output::MigrateReport {
                target_version,
                behind: 0,
                results: Vec::new(),
                stopped: false,
                not_attempted: Vec::new(),
            });
        }
        return out!("every tenant is at version {target_version} or past it: nothing to migrate");
    }

    let replica = args
        .replica
        .clone()
        .unwrap_or_else(|| format!("pgtenant-cli-{}", std::process::id()));
    let options = target
        .router_options(replica, &connected)?
        .migrations(refinery::Runner::new(&migrations));
    let router = Arc::new(start_router(&target, options).await?);

    let run = MigrateRun {
        router: Arc::clone(&router),
        queue: Mutex::new(behind.into()),
        failures: AtomicUsize::new(0),
        max_failures: args.max_failures as usize,
        target_version,
        total,
        done: AtomicUsize::new(0),
        results: Mutex::new(Vec::with_capacity(total)),
        json: args.output.json,
        output_error: Mutex::new(None),
    };
    let run = Arc::new(run);
    // The first tenant alone: a migration that fails everywhere stops the run at one tenant.
    run.lane_once().await;
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let run = Arc::clone(&run);
        lanes.spawn(async move { while run.lane_once().await {} });
    }
    while lanes.join_next().await.is_some() {}
    router.close().await;

    if let Some(error) = lock(&run.output_error).take() {
        return Err(error);
    }
    let results = std::mem::take(&mut *lock(&run.results));
    let not_attempted: Vec<String> = lock(&run.queue)
        .drain(..)
        .map(|(tenant, _)| tenant)
        .collect();
    let failed = results.iter().filter(|r| r.outcome.is_failure()).count();
    let skipped = not_attempted.len();
    let stopped = skipped > 0;
    if args.output.json {
        output::json(&output::MigrateReport {
            target_version,
            behind: total,
            results,
            stopped,
            not_attempted,
        })?;
    } else {
        let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
        out!(
            "{total} tenant(s) behind: {} migrated, {} held elsewhere, {} quarantined, {} failed",
            count(|o| matches!(o, Outcome::Migrated { .. })),
            count(|o| matches!(o, Outcome::HeldElsewhere { .. })),
            count(|o| matches!(o, Outcome::Quarantined { .. })),
            count(|o| matches!(o, Outcome::Failed { .. })),
        )?;
        if stopped {
            out!(
                "stopped after {failed} failure(s) (--max-failures {}): {} tenant(s) not attempted",
                args.max_failures,
                skipped
            )?;
        }
    }
    if failed > 0 || stopped {
        return Err(CliError::MigrationsFailed {
            failed,
            not_attempted: skipped,
            total,
        });
    }
    Ok(())
}

/// One `pgtenant migrate` run, shared by its lanes.
struct MigrateRun {
    router: Arc<pgtenant::Router>,
    queue: Mutex<VecDeque<(String, pgtenant::SchemaVersion)>>,
    failures: AtomicUsize,
    max_failures: usize,
    target_version: pgtenant::SchemaVersion,
    total: usize,
    done: AtomicUsize,
    results: Mutex<Vec<TenantMigrated>>,
    json: bool,
    output_error: Mutex<Option<CliError>>,
}

impl MigrateRun {
    /// Migrates the next tenant; false when there is none or the run has stopped.
    async fn lane_once(&self) -> bool {
        if self.failures.load(Ordering::Acquire) >= self.max_failures {
            return false;
        }
        let Some((tenant, from)) = lock(&self.queue).pop_front() else {
            return false;
        };
        let outcome = self.migrate_one(&tenant, from).await;
        if outcome.is_failure() {
            self.failures.fetch_add(1, Ordering::AcqRel);
        }
        let done = self.done.fetch_add(1, Ordering::AcqRel) + 1;
        if !self.json {
            let printed = out!("  [{done}/{}] {tenant}: {outcome}", self.total);
            if let Err(error) = printed {
                lock(&self.output_error).get_or_insert(error);
            }
        }
        lock(&self.results).push(TenantMigrated { tenant, outcome });
        true
    }

    /// Opening a tenant that is behind migrates it under its lease (and quarantines it when a
    /// migration fails).
    async fn migrate_one(&self, tenant: &str, from: pgtenant::SchemaVersion) -> Outcome {
        let id = match pgtenant::TenantId::parse(tenant) {
            Ok(id) => id,
            Err(error) => {
                return Outcome::Failed {
                    error: error.to_string(),
                }
            }
        };
        match self.router.open(&id).await {
            Ok(handle) => {
                // close() hands off whatever a failed release leaves.
                let _ = handle.release().await;
                Outcome::Migrated {
                    from,
                    to: self.target_version,
                }
            }
            Err(pgtenant::Error::Quarantined { cause, .. }) => Outcome::Quarantined { cause },
            Err(pgtenant::Error::LeaseHeld { owner, .. }) => Outcome::HeldElsewhere {
                owner: owner.to_string(),
            },
            Err(error) => Outcome::Failed {
                error: explain(&error),
            },
        }
    }
}

/// The run's shared state stays consistent if a lane panicked (each change is one push or
/// pop): the other lanes and the report go on.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
