-- pgtenant control plane, version 10: status at 100 000 tenants (issue 21, docs/scale.md).
--
-- Measured on PostgreSQL 15 (2 cores) with 100 000 tenant rows and 100 replica rows, each
-- replica holding 1 000 tenants (examples/bench_scale.rs has the full table):
--
-- * replica_status counted each replica's tenants with a correlated subquery: 267-278 ms once
--   the visibility map was not fresh. It now reads one grouped pass over the tenants, shared
--   with the new fleet_status (status_report below).
-- * lease_status sorts by tenant inside the view, so PostgreSQL cannot flatten it into a
--   query: every join, aggregate or ORDER BY ... LIMIT over it first sorted all 100 000 rows
--   (an external merge sort at the default work_mem): `pgtenant tenants` (a page of 100) took
--   124 ms, a count by state 138 ms. `pgtenant.lease_rows` is the same rows unordered, which
--   the planner flattens (a page: 1.4 ms, the count by state: 34 ms); lease_status is now
--   lease_rows ordered by tenant, with the same columns, so psql readers see what they saw.
-- * `pgtenant.fleet_status`: what a fleet operator asks first, in one row and one query
--   (tenants per state, behind on migrations, quarantined, trashed and due for the sweep);
--   `pgtenant.sweep_backlog`: what the next sweep would do, orphan schemas included.
--
-- Same signatures throughout: replicas of V8 keep running across the upgrade.

-- ---------------------------------------------------------------------------------------
-- lease_rows (unordered) and lease_status (the same rows by tenant).
-- ---------------------------------------------------------------------------------------
CREATE VIEW pgtenant.lease_rows AS
SELECT t.key AS tenant,
       CASE
           WHEN t.schema_name IS NULL AND t.forgotten_at_epoch > 0 THEN 'forgotten'
           WHEN t.quarantine_cause IS NOT NULL THEN 'quarantined'
           WHEN t.owner IS NULL AND t.reserved_until > now() THEN 'reserved'
           WHEN t.owner IS NULL THEN 'free'
           WHEN l.alive AND l.incarnation = t.owner_incarnation THEN 'held'
           WHEN l.lock_held AND l.incarnation = t.owner_incarnation THEN 'stalled'
           ELSE 'expired'
       END AS state,
       t.owner,
       t.epoch,
       CASE WHEN t.owner IS NOT NULL
            THEN coalesce(l.alive AND l.incarnation = t.owner_incarnation, false) END AS owner_alive,
       CASE WHEN t.owner IS NOT NULL AND l.incarnation = t.owner_incarnation
            THEN greatest(interval '0', date_trunc('milliseconds', l.expires_at - now())) END AS expires_in,
       t.schema_name AS schema,
       t.schema_version AS version,
       t.quarantine_cause,
       t.quarantine_repair,
       t.reserved_for,
       t.acquired_at,
       t.created_at,
       t.forgotten_at_epoch,
       t.quarantined_at
FROM pgtenant.tenants t
LEFT JOIN pgtenant.replica_liveness l ON l.replica_id = t.owner;
COMMENT ON VIEW pgtenant.lease_rows IS
    'One row per tenant, unordered: lease_status without its ORDER BY, for queries that filter, count or page (WHERE, GROUP BY, ORDER BY tenant LIMIT n); lease_status sorts every tenant first.';

CREATE OR REPLACE VIEW pgtenant.lease_status AS
SELECT tenant, state, owner, epoch, owner_alive, expires_in, schema, version, quarantine_cause,
       quarantine_repair, reserved_for, acquired_at, created_at
  FROM pgtenant.lease_rows
 ORDER BY tenant;

-- The states an operator looks for are rare among 100 000 tenants: without these, a page of
-- them (`pgtenant tenants --quarantined`, `--state forgotten`) reads every tenant in key order
-- to find none. Partial: only the rows in that state are indexed.
CREATE INDEX tenants_quarantined ON pgtenant.tenants (key) WHERE quarantine_cause IS NOT NULL;
CREATE INDEX tenants_forgotten ON pgtenant.tenants (key) WHERE schema_name IS NULL;
-- The sweep and fleet_status read the unswept trash; swept rows stay (the journal of what went).
CREATE INDEX trash_unswept ON pgtenant.trash (trashed_at) WHERE swept_at IS NULL;

-- ---------------------------------------------------------------------------------------
-- status_report: fleet_status and replica_status from one pass over the tenants.
-- ---------------------------------------------------------------------------------------
-- Both summaries read every tenant row once: at 100 000 tenants held by 100 replicas that is
-- 25-40 ms each on 2 cores, and `pgtenant status`, which shows both, took 80-100 ms reading
-- them one after the other (or side by side on two connections, which two busy cores do not
-- run any faster). This function makes that pass once and returns both, as JSON; the views
-- fleet_status and replica_status read their halves of it, so there is one definition of
-- each count.
--
-- The tenants are grouped first, by owner and by what decides a state without the owner's
-- liveness, and only the groups (about one per replica and version) meet replica_liveness:
-- 27-33 ms at 100 000 tenants against 49-61 ms for the same counts from lease_rows, which
-- joins every tenant to its owner. The state CASE is lease_rows' own, split in two;
-- tests/operations.rs checks that both give the same counts in every state. The planner
-- cannot know that the groups are few (it estimates one per tenant), and at the default
-- work_mem it sorted the 100 000 rows on disk to group them (57-68 ms); with room for a hash
-- table it hashes them. work_mem is a ceiling: the hash table holds the real groups.
--
-- replica_status counted each replica's tenants with a correlated subquery before, one index
-- scan of `tenants_owner` per replica row: 11-16 ms on a freshly vacuumed table (index only),
-- but once acquisitions had cleared the visibility map each of the 100 scans was a bitmap heap
-- scan over ~2 900 of the table's pages: 267-278 ms (BENCHMARKS.md saw 540-590 ms after
-- bench_leases). One grouped pass does not depend on the visibility map.
--
-- Timestamps in the JSON are ISO 8601 in UTC and intervals in the postgres style, whatever
-- the session says (the views cast them back).
CREATE FUNCTION pgtenant.status_report(p_retention_ms bigint)
RETURNS TABLE (fleet jsonb, replicas jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET work_mem = '64MB'
SET TimeZone = 'UTC' SET IntervalStyle = 'postgres' SET DateStyle = 'ISO, YMD'
SET search_path = pg_catalog, pgtenant AS $$
WITH groups AS MATERIALIZED (
    SELECT t.owner, t.owner_incarnation, t.schema_version AS version,
           t.schema_name IS NOT NULL AS live,
           CASE
               WHEN t.schema_name IS NULL AND t.forgotten_at_epoch > 0 THEN 'forgotten'
               WHEN t.quarantine_cause IS NOT NULL THEN 'quarantined'
               WHEN t.owner IS NULL AND t.reserved_until > now() THEN 'reserved'
               WHEN t.owner IS NULL THEN 'free'
           END AS settled,
           count(*) AS n
      FROM pgtenant.tenants t
     GROUP BY 1, 2, 3, 4, 5
), liveness AS MATERIALIZED (
    -- pg_locks once (the view's own rule).
    SELECT * FROM pgtenant.replica_liveness
), per_state AS MATERIALIZED (
    SELECT coalesce(g.settled,
                    CASE
                        WHEN l.alive AND l.incarnation = g.owner_incarnation THEN 'held'
                        WHEN l.lock_held AND l.incarnation = g.owner_incarnation THEN 'stalled'
                        ELSE 'expired'
                    END) AS state,
           g.version, g.live, g.n
      FROM groups g
      LEFT JOIN liveness l ON l.replica_id = g.owner
), newest AS (
    SELECT max(p.version) AS version FROM per_state p WHERE p.live
), trash AS (
    SELECT count(*) AS n,
           count(*) FILTER (WHERE x.trashed_at < now() - p_retention_ms * interval '1 millisecond') AS due,
           min(x.trashed_at) AS oldest
      FROM pgtenant.trash x
     WHERE x.swept_at IS NULL
), held AS (
    SELECT g.owner, g.owner_incarnation, sum(g.n)::bigint AS n
      FROM groups g
     WHERE g.owner IS NOT NULL
     GROUP BY g.owner, g.owner_incarnation
), bound AS (
    SELECT b.replica_id, b.incarnation, count(*) AS n
      FROM pgtenant.sessions b
     GROUP BY b.replica_id, b.incarnation
), replica_rows AS (
    SELECT r.replica_id,
           l.alive,
           l.lock_held,
           r.incarnation,
           coalesce(h.n, 0) AS tenants_held,
           CASE WHEN l.alive THEN date_trunc('milliseconds', r.expires_at - now()) END AS expires_in,
           r.backend_pid,
           r.host,
           r.started_at,
           r.released_at,
           coalesce(b.n, 0) AS sessions,
           s.sealed_at,
           CASE WHEN r.released_at IS NOT NULL THEN 'released'
                WHEN s.sealed_at IS NOT NULL THEN 'sealed'
                WHEN l.alive THEN 'alive'
                WHEN NOT l.lock_held THEN 'lease session gone'
                ELSE 'expired' END AS state
      FROM pgtenant.replicas r
      JOIN liveness l USING (replica_id)
      LEFT JOIN held h ON h.owner = r.replica_id AND h.owner_incarnation = r.incarnation
      LEFT JOIN bound b ON b.replica_id = r.replica_id AND b.incarnation = r.incarnation
      LEFT JOIN pgtenant.seals s ON s.replica_id = r.replica_id AND s.incarnation = r.incarnation
)
SELECT (SELECT jsonb_build_object(
            'tenants', coalesce(sum(p.n), 0),
            'live', coalesce(sum(p.n) FILTER (WHERE p.live), 0),
            'held', coalesce(sum(p.n) FILTER (WHERE p.state = 'held'), 0),
            'stalled', coalesce(sum(p.n) FILTER (WHERE p.state = 'stalled'), 0),
            'expired', coalesce(sum(p.n) FILTER (WHERE p.state = 'expired'), 0),
            'free', coalesce(sum(p.n) FILTER (WHERE p.state = 'free'), 0),
            'reserved', coalesce(sum(p.n) FILTER (WHERE p.state = 'reserved'), 0),
            'quarantined', coalesce(sum(p.n) FILTER (WHERE p.state = 'quarantined'), 0),
            'forgotten', coalesce(sum(p.n) FILTER (WHERE p.state = 'forgotten'), 0),
            'newest_version', (SELECT v.version FROM newest v),
            'behind', coalesce(sum(p.n) FILTER (WHERE p.live AND p.state <> 'quarantined'
                                                  AND p.version < (SELECT v.version FROM newest v)), 0),
            'versions', coalesce((SELECT jsonb_object_agg(q.version::text, q.n ORDER BY q.version)
                                    FROM (SELECT p2.version, sum(p2.n)::bigint AS n FROM per_state p2
                                           WHERE p2.live GROUP BY p2.version) q), '{}'::jsonb),
            'trashed', (SELECT x.n FROM trash x),
            'trash_due', (SELECT x.due FROM trash x),
            'oldest_trashed_at', (SELECT x.oldest FROM trash x),
            'replicas', (SELECT count(*) FROM liveness),
            'replicas_alive', (SELECT count(*) FILTER (WHERE l.alive) FROM liveness l))
          FROM per_state p),
       (SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.replica_id), '[]'::jsonb) FROM replica_rows x)
$$;
REVOKE ALL ON FUNCTION pgtenant.status_report(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgtenant.status_report(bigint) TO PUBLIC;

-- replica_status: its half of the report, the same columns as V8's.
CREATE OR REPLACE FUNCTION pgtenant.replica_status_rows()
RETURNS TABLE (replica_id text, alive boolean, lock_held boolean, incarnation bigint,
               tenants_held bigint, expires_in interval, backend_pid integer, host text,
               started_at timestamptz, released_at timestamptz, sessions bigint, sealed_at timestamptz,
               state text)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET search_path = pg_catalog, pgtenant AS $$
SELECT x.*
  FROM pgtenant.status_report(0) s,
       jsonb_to_recordset(s.replicas) AS x(replica_id text, alive boolean, lock_held boolean,
                                           incarnation bigint, tenants_held bigint, expires_in interval,
                                           backend_pid integer, host text, started_at timestamptz,
                                           released_at timestamptz, sessions bigint,
                                           sealed_at timestamptz, state text)
 ORDER BY x.replica_id
$$;

-- fleet_status: the other half. Tenants by state (as lease_status says it), migrations
-- (newest version, how many live tenants are below it, how many at each version), the trash
-- and how much of it a sweep with this retention (milliseconds) drops.
CREATE FUNCTION pgtenant.fleet_status_rows(p_retention_ms bigint)
RETURNS TABLE (tenants bigint, live bigint, held bigint, stalled bigint, expired bigint, free bigint,
               reserved bigint, quarantined bigint, forgotten bigint,
               newest_version integer, behind bigint, versions jsonb,
               trashed bigint, trash_due bigint, oldest_trashed_at timestamptz,
               replicas bigint, replicas_alive bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET search_path = pg_catalog, pgtenant AS $$
SELECT x.*
  FROM pgtenant.status_report(p_retention_ms) s,
       jsonb_to_record(s.fleet) AS x(tenants bigint, live bigint, held bigint, stalled bigint,
                                     expired bigint, free bigint, reserved bigint,
                                     quarantined bigint, forgotten bigint, newest_version integer,
                                     behind bigint, versions jsonb, trashed bigint, trash_due bigint,
                                     oldest_trashed_at timestamptz, replicas bigint,
                                     replicas_alive bigint)
$$;
REVOKE ALL ON FUNCTION pgtenant.fleet_status_rows(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgtenant.fleet_status_rows(bigint) TO PUBLIC;

-- The sweep's default retention (SweepOptions::default, `pgtenant sweep`): 7 days. Another
-- retention: SELECT * FROM pgtenant.fleet_status_rows(<milliseconds>).
CREATE VIEW pgtenant.fleet_status AS
SELECT * FROM pgtenant.fleet_status_rows(7 * 24 * 3600 * 1000::bigint);
COMMENT ON VIEW pgtenant.fleet_status IS
    'The fleet in one row: tenants per state (as lease_status), migrations (newest version, live tenants behind it, tenants per version), quarantined, the unswept trash and how much of it a sweep with the default 7-day retention drops; fleet_status_rows(retention_ms) for another retention.';

-- What the next sweep would do, given its retention: the trashed schemas it drops and the
-- orphans it looks at (tenant-shaped schemas outside the trash that no tenant names as its
-- live schema: it drops those of a forgotten epoch and reports the others as unknown). Not in
-- fleet_status: finding orphans reads every schema name and every tenant's (70-120 ms at
-- 100 000 tenants), and in normal operation there are none (a creation is one transaction).
CREATE FUNCTION pgtenant.sweep_backlog_rows(p_retention_ms bigint)
RETURNS TABLE (trash_due bigint, trash_kept bigint, oldest_due_at timestamptz, orphan_schemas bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET search_path = pg_catalog, pgtenant AS $$
SELECT (SELECT count(*) FROM pgtenant.trash x
         WHERE x.swept_at IS NULL AND x.trashed_at < now() - p_retention_ms * interval '1 millisecond'),
       (SELECT count(*) FROM pgtenant.trash x
         WHERE x.swept_at IS NULL AND x.trashed_at >= now() - p_retention_ms * interval '1 millisecond'),
       (SELECT min(x.trashed_at) FROM pgtenant.trash x
         WHERE x.swept_at IS NULL AND x.trashed_at < now() - p_retention_ms * interval '1 millisecond'),
       -- The sweep's own test (src/admin/sweep.rs); the anti-join first, the regular
       -- expression only on what is left.
       (SELECT count(*)
          FROM (SELECT n.nspname FROM pg_namespace n
                 WHERE n.nspname LIKE 't\_%'
                   AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.schema_name = n.nspname)
                OFFSET 0) o
         WHERE o.nspname ~ '^t_[a-z0-9_]+_[0-9]+_[0-9a-f]{10}$')
$$;
-- The operators' (grant_roles below), as the trash is: the application's role gets neither.
REVOKE ALL ON FUNCTION pgtenant.sweep_backlog_rows(bigint) FROM PUBLIC;
CREATE VIEW pgtenant.sweep_backlog AS
SELECT * FROM pgtenant.sweep_backlog_rows(7 * 24 * 3600 * 1000::bigint);
COMMENT ON VIEW pgtenant.sweep_backlog IS
    'What the next sweep (7-day retention) would do: trashed schemas due and kept, the oldest due, orphan schemas; sweep_backlog_rows(retention_ms) for another retention.';
REVOKE ALL ON pgtenant.lease_rows, pgtenant.fleet_status, pgtenant.sweep_backlog FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- Grants: the roles that read lease_status read the new views too.
-- ---------------------------------------------------------------------------------------
-- The grants of the previous version stay as they are (renamed, called first): whatever an
-- earlier migration made grant_roles grant, it still grants.
ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v10;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v10(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON pgtenant.lease_rows, pgtenant.fleet_status TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON pgtenant.lease_rows, pgtenant.fleet_status, pgtenant.sweep_backlog TO %I',
                       p_operator);
        -- A view's functions run with its reader's rights.
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.sweep_backlog_rows(bigint) TO %I', p_operator);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtenant.grant_roles_before_v10(name, name) FROM PUBLIC;
SELECT pgtenant.grant_roles(c.app_role, c.operator_role) FROM pgtenant.config c;
