//! The history driver's alarm workload (issue #31, DESIGN G11), off unless [`Faults::alarms`]:
//! the replica children fire alarms with a handler that writes one effect row per committed
//! firing ([`with_alarm_handler`]), the driver asks them during the fault phase to schedule
//! one to three alarms with unique names in a fenced transaction ([`schedule_alarms`]) and
//! records which were acknowledged and which have an unknown outcome ([`AlarmScheduling`]); after
//! the quiet phase it waits for the alarms to drain ([`drain_alarms`]), and the verdict
//! ([`check_alarms`]) reads every shared ledger's effects and alarms back: each acknowledged
//! alarm's effect committed exactly once, an unknown one's at most once, none before it was
//! due (by the database's clock), none left behind.
//!
//! [`Faults::alarms`]: super::history::Faults::alarms

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgtenant::{Alarm, RouterOptions, TenantHandle};

use super::history::History;
use super::routers::tenant;

/// The environment variable that turns the alarm handler on in a replica child.
pub(crate) const ALARMS_ENV: &str = "PGTENANT_TEST_ALARMS";

/// The effects table, in the tenant's schema: one row per committed firing, deliberately
/// without a unique constraint, so that a second commit of one alarm's effect shows as a
/// second row. `fired_at` is the database's clock when the handler wrote the row.
pub(crate) const CREATE_EFFECTS_SQL: &str = "CREATE TABLE IF NOT EXISTS alarm_effects (
    name text NOT NULL, alarm_id bigint NOT NULL, due_at timestamptz NOT NULL,
    fired_at timestamptz NOT NULL DEFAULT clock_timestamp(), attempt integer NOT NULL,
    replica text NOT NULL, backend integer NOT NULL DEFAULT pg_backend_pid())";

/// How long the driver waits, after the quiet phase, for every acknowledged alarm to fire.
pub(crate) const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Whether this replica child runs the alarm handler ([`ALARMS_ENV`]).
pub(crate) fn alarms_on() -> bool {
    std::env::var(ALARMS_ENV).as_deref() == Ok("1")
}

/// `options` with the workload's handler: each firing inserts its effect row, in the fenced
/// transaction that also deletes the alarm. A handler error (a statement cut by a fault) rolls
/// back and is retried after 100 ms, doubling to 1 s, at most the default 5 attempts.
pub(crate) fn with_alarm_handler(options: RouterOptions, replica: &str) -> RouterOptions {
    let replica = replica.to_owned();
    options
        .alarm_backoff(Duration::from_millis(100), Duration::from_secs(1))
        .alarm_handler(move |tx, alarm: Alarm| {
            let replica = replica.clone();
            Box::pin(async move {
                let attempt = i32::try_from(alarm.attempt)?;
                tx.execute(
                    "INSERT INTO alarm_effects (name, alarm_id, due_at, attempt, replica)
                     VALUES ($1, $2, $3, $4, $5)",
                    &[&alarm.name, &alarm.id, &alarm.due, &attempt, &replica],
                )
                .await?;
                Ok(())
            })
        })
}

/// Creates the effects table (the child's `open`, in alarm mode).
pub(crate) async fn try_create_effects(handle: &TenantHandle) -> pgtenant::Result<()> {
    handle
        .run(|tx| {
            Box::pin(async move {
                tx.batch_execute(CREATE_EFFECTS_SQL).await?;
                Ok::<_, pgtenant::Error>(())
            })
        })
        .await
}

/// Schedules `alarms` (name, delay in ms) of the handle's tenant in one fenced transaction,
/// each due its delay after the database's clock at that moment (negative: in the past), with
/// the scheduler's name as payload. Returns their due times in microseconds since the epoch, as
/// stored.
pub(crate) async fn schedule_alarms(
    handle: &TenantHandle,
    alarms: Vec<(String, i64)>,
    by: &str,
) -> pgtenant::Result<Vec<i64>> {
    let by = by.to_owned();
    let dues: Vec<SystemTime> = handle
        .run(move |tx| {
            Box::pin(async move {
                let mut dues = Vec::new();
                for (name, delay_ms) in &alarms {
                    let due: SystemTime = tx
                        .query_one(
                            "SELECT clock_timestamp() + $1::bigint * interval '1 millisecond'",
                            &[delay_ms],
                        )
                        .await?
                        .get(0);
                    let payload = serde_json::json!({ "by": by, "delay_ms": delay_ms });
                    tx.schedule_alarm(name, due, &payload).await?;
                    dues.push(due);
                }
                Ok::<_, pgtenant::Error>(dues)
            })
        })
        .await?;
    Ok(dues.into_iter().map(micros).collect())
}

fn micros(at: SystemTime) -> i64 {
    let since = at.duration_since(UNIX_EPOCH).expect("after 1970");
    i64::try_from(since.as_micros()).expect("in range")
}

/// One scheduling the driver asked for (one the child sent to the database, or might have).
#[derive(Debug, Clone)]
pub(crate) struct AlarmScheduling {
    /// Its name, unique in the run.
    pub(crate) name: String,
    /// The ledger the child scheduled it on, when its answer says (not when it was killed
    /// before answering).
    pub(crate) ledger: Option<String>,
    pub(crate) replica: String,
    pub(crate) delay_ms: i64,
    /// `Some(due)` (microseconds since the epoch) when the child answered that it committed;
    /// None when the outcome is unknown: an error (which may have come from the COMMIT), or the
    /// child was killed before it answered.
    pub(crate) acked: Option<i64>,
    /// What the child answered, or why there was no answer.
    pub(crate) reply: String,
    /// The driver killed the child right after sending the command.
    pub(crate) killed: bool,
}

/// The command that asks a child to schedule `alarms` (name, delay in ms) in one transaction on
/// the first of `ledgers` it holds.
pub(crate) fn alarm_command(alarms: &[(String, i64)], ledgers: &[&str]) -> String {
    let alarms: Vec<String> = alarms
        .iter()
        .map(|(name, delay_ms)| format!("{name}={delay_ms}"))
        .collect();
    format!("alarm {} {}", alarms.join(","), ledgers.join(" "))
}

/// The alarms of an [`alarm_command`], as the child reads them.
pub(crate) fn parse_alarms(word: &str) -> Vec<(String, i64)> {
    word.split(',')
        .map(|alarm| {
            let (name, delay_ms) = alarm.split_once('=').expect("name=delay");
            (name.to_owned(), delay_ms.parse().expect("delay"))
        })
        .collect()
}

impl AlarmScheduling {
    /// The schedulings from the child's answer to [`alarm_command`] for `alarms`, or None when
    /// the child held none of the ledgers (and sent nothing).
    pub(crate) fn from_reply(
        alarms: &[(String, i64)],
        replica: &str,
        reply: Option<&str>,
        killed: bool,
    ) -> Option<Vec<AlarmScheduling>> {
        if reply == Some("error NotHeld") {
            return None;
        }
        let words: Vec<&str> = reply.unwrap_or_default().split_whitespace().collect();
        let (ledger, dues): (Option<&str>, Option<Vec<i64>>) = match words.as_slice() {
            ["scheduled", ledger, _epoch, dues] => (
                Some(*ledger),
                Some(
                    dues.split(',')
                        .map(|due| due.parse().expect("due micros"))
                        .collect(),
                ),
            ),
            ["unknown", ledger, ..] => (Some(*ledger), None),
            _ => (None, None),
        };
        if let Some(dues) = &dues {
            assert_eq!(dues.len(), alarms.len(), "a due time per alarm: {reply:?}");
        }
        Some(
            alarms
                .iter()
                .enumerate()
                .map(|(i, (name, delay_ms))| AlarmScheduling {
                    name: name.clone(),
                    ledger: ledger.map(str::to_owned),
                    replica: replica.to_owned(),
                    delay_ms: *delay_ms,
                    acked: dues.as_ref().map(|dues| dues[i]),
                    reply: reply.unwrap_or("no answer: killed").to_owned(),
                    killed,
                })
                .collect(),
        )
    }
}

/// One effect row, as the verdict reads it.
#[derive(Debug, Clone)]
pub(crate) struct AlarmEffect {
    pub(crate) ledger: String,
    pub(crate) name: String,
    pub(crate) alarm_id: i64,
    /// The alarm's due time when it fired (microseconds since the epoch): the scheduled one at
    /// the first attempt, the retry's after a failed attempt.
    pub(crate) due: i64,
    /// When the handler wrote the row, by the database's clock (microseconds since the epoch).
    pub(crate) fired_at: i64,
    /// `fired_at < due_at`, compared in the database.
    pub(crate) early: bool,
    pub(crate) late_ms: f64,
    pub(crate) attempt: i32,
    pub(crate) replica: String,
}

/// An alarm still in a tenant's `pgtenant_alarms`.
#[derive(Debug, Clone)]
pub(crate) struct LeftAlarm {
    pub(crate) ledger: String,
    pub(crate) name: String,
    pub(crate) due_in_ms: f64,
    pub(crate) attempts: i32,
    pub(crate) failed: bool,
    pub(crate) last_error: Option<String>,
}

/// What the shared ledgers hold: the effect rows and the alarms left, by alarm name (names are
/// unique in a run).
#[derive(Debug, Default)]
pub(crate) struct AlarmState {
    pub(crate) effects: BTreeMap<String, Vec<AlarmEffect>>,
    pub(crate) left: Vec<LeftAlarm>,
}

/// Reads every ledger's effects and alarms through `client` (a superuser session, straight
/// from the tenants' schemas, whoever holds them); None when the session failed.
async fn read_state(client: &tokio_postgres::Client, ledgers: &[&str]) -> Option<AlarmState> {
    let mut state = AlarmState::default();
    for ledger in ledgers {
        let schema: Option<String> = client
            .query_opt(
                "SELECT schema_name FROM pgtenant.tenants WHERE key = $1",
                &[&tenant(ledger).key()],
            )
            .await
            .ok()?
            .and_then(|row| row.get(0));
        let Some(schema) = schema else {
            continue;
        };
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let tables = client
            .query_one(
                "SELECT to_regclass($1 || '.alarm_effects') IS NOT NULL,
                        to_regclass($1 || '.pgtenant_alarms') IS NOT NULL",
                &[&quoted],
            )
            .await
            .ok()?;
        if tables.get::<_, bool>(0) {
            let rows = client
                .query(
                    &format!(
                        "SELECT name, alarm_id, due_at, fired_at < due_at,
                                extract(epoch FROM fired_at - due_at)::float8 * 1000,
                                attempt, replica, fired_at
                           FROM {quoted}.alarm_effects"
                    ),
                    &[],
                )
                .await
                .ok()?;
            for row in &rows {
                let effect = AlarmEffect {
                    ledger: (*ledger).to_owned(),
                    name: row.get(0),
                    alarm_id: row.get(1),
                    due: micros(row.get(2)),
                    early: row.get(3),
                    late_ms: row.get(4),
                    attempt: row.get(5),
                    replica: row.get(6),
                    fired_at: micros(row.get(7)),
                };
                state
                    .effects
                    .entry(effect.name.clone())
                    .or_default()
                    .push(effect);
            }
        }
        if tables.get::<_, bool>(1) {
            let rows = client
                .query(
                    &format!(
                        "SELECT name, extract(epoch FROM due_at - now())::float8 * 1000,
                                attempts, failed_at IS NOT NULL, last_error
                           FROM {quoted}.pgtenant_alarms"
                    ),
                    &[],
                )
                .await
                .ok()?;
            state.left.extend(rows.iter().map(|row| LeftAlarm {
                ledger: (*ledger).to_owned(),
                name: row.get(0),
                due_in_ms: row.get(1),
                attempts: row.get(2),
                failed: row.get(3),
                last_error: row.get(4),
            }));
        }
    }
    Some(state)
}

/// A superuser session on `url` (a multi-host URL reaches the primary), or None.
async fn session(url: &str) -> Option<tokio_postgres::Client> {
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

impl AlarmState {
    /// Every acknowledged alarm has an effect row and no alarm is pending any more (parked ones
    /// aside: they never fire, and the verdict reports them).
    fn drained(&self, history: &History) -> bool {
        let all_acked_fired = history
            .alarms
            .iter()
            .filter(|scheduling| scheduling.acked.is_some())
            .all(|scheduling| self.effects.contains_key(&scheduling.name));
        let pending = self.left.iter().any(|left| !left.failed);
        all_acked_fired && !pending
    }
}

/// After the quiet phase, while the replicas still run: waits until every acknowledged alarm
/// has fired and none is pending ([`AlarmState::drained`]), reading the ledgers every 100 ms,
/// for at most [`DRAIN_LIMIT`]. Returns how long it waited and whether they drained (the
/// verdict says what is missing when they did not).
pub(crate) async fn drain_alarms(
    url: &str,
    history: &History,
    ledgers: &[&str],
) -> (Duration, bool) {
    let started = Instant::now();
    let mut client = session(url).await;
    loop {
        if client.as_ref().is_none_or(|client| client.is_closed()) {
            client = session(url).await;
        }
        if let Some(client) = &client {
            if let Some(state) = read_state(client, ledgers).await {
                if state.drained(history) {
                    return (started.elapsed(), true);
                }
            }
        }
        if started.elapsed() >= DRAIN_LIMIT {
            return (started.elapsed(), false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the verdict found, counted.
#[derive(Debug, Default)]
pub(crate) struct AlarmVerdict {
    pub(crate) scheduled: usize,
    pub(crate) acked: usize,
    pub(crate) unknown: usize,
    pub(crate) unknown_fired: usize,
    pub(crate) fired: usize,
    /// Fired at a later attempt (an earlier one failed: a statement cut by a fault).
    pub(crate) retried: usize,
    /// Fired by another replica than the one that scheduled it (after a takeover or a wake).
    pub(crate) elsewhere: usize,
    pub(crate) lost: Vec<String>,
    pub(crate) duplicated: Vec<String>,
    pub(crate) early: Vec<String>,
    pub(crate) left: Vec<String>,
    pub(crate) strange: Vec<String>,
}

/// The percentile `p` (0–100) of sorted `values`.
fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

/// The alarm verdict (G11), after the run (the replicas are gone, so nothing fires any more),
/// through a superuser session on `url`: every acknowledged scheduling's alarm has exactly one
/// effect row (none: lost; more: duplicated), on the ledger and (at its first attempt) with the
/// due time it was scheduled with; an unknown one at most one; no effect row has `fired_at <
/// due_at`, nor an acknowledged alarm's `fired_at` before the due time it was scheduled with
/// (both the database's clock); no alarm is left in any `pgtenant_alarms` (pending or parked); and every
/// effect row belongs to a scheduling. Prints a one-line summary, then asserts.
pub(crate) async fn check_alarms(history: &History, url: &str, ledgers: &[&str]) -> AlarmVerdict {
    let client = session(url).await.expect("a session for the alarm verdict");
    let state = read_state(&client, ledgers)
        .await
        .expect("read the effects and alarms");
    let mut verdict = AlarmVerdict {
        scheduled: history.alarms.len(),
        ..AlarmVerdict::default()
    };
    let mut lateness: Vec<f64> = Vec::new();
    let mut latest: Vec<(f64, String)> = Vec::new();
    let mut known: BTreeSet<&str> = BTreeSet::new();
    for scheduling in &history.alarms {
        known.insert(scheduling.name.as_str());
        let effects = state
            .effects
            .get(&scheduling.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let what = format!(
            "{} on {} (by {}, due in {} ms, answer {:?}{})",
            scheduling.name,
            scheduling.ledger.as_deref().unwrap_or("?"),
            scheduling.replica,
            scheduling.delay_ms,
            scheduling.reply,
            if scheduling.killed {
                ", killed right after"
            } else {
                ""
            }
        );
        match scheduling.acked {
            Some(due) => {
                verdict.acked += 1;
                if effects.is_empty() {
                    verdict.lost.push(what.clone());
                }
                // A retry moves the due time later; the first attempt fires at the scheduled
                // one. Both times are the database's clock (its clock_timestamp() + delay at
                // the scheduling, and at the handler's insert).
                let ledger = scheduling.ledger.as_deref().unwrap_or_default();
                let other = effects.iter().find(|effect| {
                    effect.ledger != ledger
                        || effect.due < due
                        || (effect.attempt == 1 && effect.due != due)
                });
                if let Some(other) = other {
                    verdict.strange.push(format!(
                        "{what}: fired on {} at attempt {} with due time {} µs, scheduled with \
                         {due} µs",
                        other.ledger, other.attempt, other.due
                    ));
                }
            }
            None => {
                verdict.unknown += 1;
                if std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some() {
                    eprintln!(
                        "alarms: unknown outcome, {} effect rows: {what}",
                        effects.len()
                    );
                }
                if !effects.is_empty() {
                    verdict.unknown_fired += 1;
                }
            }
        }
        if effects.len() > 1 {
            verdict.duplicated.push(format!(
                "{what}: {} effect rows, the first ones {:?}",
                effects.len(),
                &effects[..effects.len().min(3)]
            ));
        }
        for effect in effects {
            verdict.fired += 1;
            if effect.attempt > 1 {
                verdict.retried += 1;
            }
            if effect.replica != scheduling.replica {
                verdict.elsewhere += 1;
            }
            // Lateness from the scheduled due time where known (a retry's delay included).
            let late_ms = match scheduling.acked {
                Some(due) => (effect.fired_at - due) as f64 / 1000.0,
                None => effect.late_ms,
            };
            lateness.push(late_ms);
            latest.push((
                late_ms,
                format!(
                    "{what}: fired by {} at attempt {}, at {:.3}",
                    effect.replica,
                    effect.attempt,
                    effect.fired_at as f64 / 1e6
                ),
            ));
            // Before its due time as it fired, or (acknowledged) as it was scheduled.
            let scheduled_due = scheduling.acked.unwrap_or(effect.due);
            if effect.early || effect.fired_at < scheduled_due {
                verdict.early.push(format!(
                    "{what}: fired at {} µs, due {} µs as it fired, {scheduled_due} µs as \
                     scheduled",
                    effect.fired_at, effect.due
                ));
            }
        }
    }
    for (name, effects) in &state.effects {
        if !known.contains(name.as_str()) {
            verdict.strange.push(format!(
                "{name}: effect rows of an alarm never scheduled: {effects:?}"
            ));
        }
    }
    for alarm in &state.left {
        let acked = history
            .alarms
            .iter()
            .any(|s| s.name == alarm.name && s.acked.is_some());
        verdict.left.push(format!(
            "{} on {} ({}; due {:.0} ms from now, {} attempts, failed {}, last error {:?})",
            alarm.name,
            alarm.ledger,
            if acked {
                "acknowledged"
            } else {
                "unknown outcome"
            },
            alarm.due_in_ms,
            alarm.attempts,
            alarm.failed,
            alarm.last_error
        ));
    }
    lateness.sort_by(f64::total_cmp);
    if std::env::var_os("PGTENANT_HISTORY_DEBUG").is_some() {
        latest.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (late, what) in latest.iter().take(8) {
            eprintln!("alarms: {late:.0} ms late: {what}");
        }
    }
    let (drain, drained) = history.alarm_drain.unwrap_or_default();
    println!(
        "alarms: scheduled={} acked={} unknown={} (fired {}) not_held={} fired={} (retried {}, \
         elsewhere {}) lost={} duplicated={} early={} left={} lateness_ms p50={:.0} p99={:.0} \
         max={:.0}; drained={drained} in {drain:?}; faults: kills={} (right after a \
         scheduling {}) pauses={} terminations={} restarts={} failovers={}",
        verdict.scheduled,
        verdict.acked,
        verdict.unknown,
        verdict.unknown_fired,
        history.alarms_not_held,
        verdict.fired,
        verdict.retried,
        verdict.elsewhere,
        verdict.lost.len(),
        verdict.duplicated.len(),
        verdict.early.len(),
        verdict.left.len(),
        percentile(&lateness, 50),
        percentile(&lateness, 99),
        lateness.last().copied().unwrap_or_default(),
        history.kills,
        history.alarms.iter().filter(|s| s.killed).count(),
        history.pauses,
        history.terminations,
        history.restarts,
        history.failovers,
    );
    let show = |list: &[String]| list.join("\n  ");
    assert!(
        verdict.duplicated.is_empty(),
        "G11: alarm effects committed more than once:\n  {}",
        show(&verdict.duplicated)
    );
    assert!(
        verdict.lost.is_empty(),
        "G11: acknowledged alarms never fired (lost):\n  {}\nleft in pgtenant_alarms:\n  {}",
        show(&verdict.lost),
        show(&verdict.left)
    );
    assert!(
        verdict.early.is_empty(),
        "G11: alarms fired before they were due:\n  {}",
        show(&verdict.early)
    );
    assert!(
        verdict.left.is_empty(),
        "G11: alarms left in pgtenant_alarms after the drain:\n  {}",
        show(&verdict.left)
    );
    assert!(
        verdict.strange.is_empty(),
        "G11: effects that match no scheduling:\n  {}",
        show(&verdict.strange)
    );
    verdict
}
