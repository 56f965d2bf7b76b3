-- pgtenant control plane, version 13: a team's first day (issue 27).
--
-- * Tenant ids: each part 1 to 128 ASCII letters, digits, '.', '_' or '-', starting with a
--   letter or digit, case-sensitive (UUIDs, ULIDs and prefixed ids fit as they are); before,
--   1 to 30 lowercase letters, digits or '-'. Schema names are derived as before (a lowercase
--   prefix of each part plus a hash, at most 57 bytes): for an id of the old rules the name
--   is the one the old code derived, so nothing is renamed and the sweep still recognises every
--   schema it made. The new CHECKs are looser than the old ones, so every row passes them.
-- * Lease states that say what happened, the same words in lease_status, replica_status,
--   fleet_status and the CLI: a tenant whose owner incarnation is alive is `held`; one whose
--   owner still holds its liveness lock with its heartbeat expired is `stalled` (the replica is
--   `stalled` too); one whose owner's lease session is gone is `owner_gone` (the replica is
--   `gone`); one held by an earlier incarnation of a replica id that has registered again
--   since is `owner_reregistered` (the replica may well be `alive`: under its new
--   incarnation). Before, the last two were both `expired`, which after a pause read as a
--   contradiction: `expired | owner_alive f` beside a replica `alive`. Replica states:
--   `alive`, `stalled` (was `expired`), `gone` (was `lease session gone`), `sealed`,
--   `released`.
-- * lease_status and lease_rows gain `owner_incarnation` (the incarnation that holds the lease,
--   to set beside replica_status.incarnation); `expires_in` is now shown for `held` and
--   `stalled` tenants only (a gone owner's expiry no longer matters: it is taken over at once).
--
-- Replicas of V10-V12 keep running across this upgrade: every function they call keeps its
-- signature and behaviour. Their Router::status refuses the new state names (it knows only the
-- old ones) until they are rolled; operator tools of those releases read the fleet's `expired`
-- (status_report keeps it, the sum of the two new states) but not fleet_status_rows, whose
-- columns changed.

-- ---------------------------------------------------------------------------------------
-- Tenant ids.
-- ---------------------------------------------------------------------------------------
-- ADD CONSTRAINT takes the table's ACCESS EXCLUSIVE lock until the setup commits (fences wait
-- meanwhile), and validating scans the table under it: 160 ms at 100 000 tenants on 2 cores.
-- The length is checked apart from the pattern: PostgreSQL's regular expressions unroll a
-- bounded repetition, and the same scan with `{0,127}` took 1.3-2.1 s (the old `{0,29}` 0.5 s).
ALTER TABLE pgtenant.tenants
    DROP CONSTRAINT tenants_organization_check,
    DROP CONSTRAINT tenants_ledger_check,
    ADD CONSTRAINT tenants_organization_check
        CHECK (organization ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND octet_length(organization) <= 128),
    ADD CONSTRAINT tenants_ledger_check
        CHECK (ledger ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND octet_length(ledger) <= 128);

-- ---------------------------------------------------------------------------------------
-- lease_rows and lease_status: the states, owner_incarnation.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE VIEW pgtenant.lease_rows AS
SELECT t.key AS tenant,
       CASE
           WHEN t.schema_name IS NULL AND t.forgotten_at_epoch > 0 THEN 'forgotten'
           WHEN t.quarantine_cause IS NOT NULL THEN 'quarantined'
           WHEN t.owner IS NULL AND t.reserved_until > now() THEN 'reserved'
           WHEN t.owner IS NULL THEN 'free'
           WHEN l.incarnation IS DISTINCT FROM t.owner_incarnation THEN 'owner_reregistered'
           WHEN l.alive THEN 'held'
           WHEN l.lock_held THEN 'stalled'
           ELSE 'owner_gone'
       END AS state,
       t.owner,
       t.epoch,
       CASE WHEN t.owner IS NOT NULL
            THEN coalesce(l.alive AND l.incarnation = t.owner_incarnation, false) END AS owner_alive,
       CASE WHEN t.owner IS NOT NULL AND l.incarnation = t.owner_incarnation AND l.lock_held
            THEN greatest(interval '0', date_trunc('milliseconds', l.expires_at - now())) END AS expires_in,
       t.schema_name AS schema,
       t.schema_version AS version,
       t.quarantine_cause,
       t.quarantine_repair,
       t.reserved_for,
       t.acquired_at,
       t.created_at,
       t.forgotten_at_epoch,
       t.quarantined_at,
       t.owner_incarnation
FROM pgtenant.tenants t
LEFT JOIN pgtenant.replica_liveness l ON l.replica_id = t.owner;
COMMENT ON VIEW pgtenant.lease_rows IS
    'One row per tenant, unordered: lease_status without its ORDER BY, for queries that filter, count or page (WHERE, GROUP BY, ORDER BY tenant LIMIT n); lease_status sorts every tenant first.';

CREATE OR REPLACE VIEW pgtenant.lease_status AS
SELECT tenant, state, owner, epoch, owner_alive, expires_in, schema, version, quarantine_cause,
       quarantine_repair, reserved_for, acquired_at, created_at, owner_incarnation
  FROM pgtenant.lease_rows
 ORDER BY tenant;
COMMENT ON VIEW pgtenant.lease_status IS
    'One row per tenant. state: held (its owner incarnation is alive), stalled (the owner holds its liveness lock but its heartbeat expired: a paused or starved process; taken over by the next open), owner_gone (the owner''s lease session is gone: taken over at once), owner_reregistered (held by an earlier incarnation of a replica id that has registered again since: taken over at once), free, reserved, quarantined, forgotten. owner_alive: the incarnation holding the lease is alive. expires_in: for held and stalled tenants.';

-- ---------------------------------------------------------------------------------------
-- status_report: the same states (lease_rows' CASE, split in two as before), replica states.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.status_report(p_retention_ms bigint)
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
                        WHEN l.incarnation IS DISTINCT FROM g.owner_incarnation THEN 'owner_reregistered'
                        WHEN l.alive THEN 'held'
                        WHEN l.lock_held THEN 'stalled'
                        ELSE 'owner_gone'
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
                WHEN l.lock_held THEN 'stalled'
                ELSE 'gone' END AS state
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
            'owner_gone', coalesce(sum(p.n) FILTER (WHERE p.state = 'owner_gone'), 0),
            'owner_reregistered', coalesce(sum(p.n) FILTER (WHERE p.state = 'owner_reregistered'), 0),
            -- For operator tools of V10-V12, which read this key: both of the above.
            'expired', coalesce(sum(p.n) FILTER (WHERE p.state IN ('owner_gone', 'owner_reregistered')), 0),
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

-- ---------------------------------------------------------------------------------------
-- fleet_status: its columns are the states, so it is made again (a function's result columns
-- and a view's change only that way), with exactly the privileges it had: whatever grants
-- V10-V12 and `setup --app-role/--operator-role` gave are copied, PUBLIC's included or not.
-- ---------------------------------------------------------------------------------------
CREATE TEMP TABLE pgtenant_v13_grants ON COMMIT DROP AS
SELECT 'FUNCTION pgtenant.fleet_status_rows(bigint)' AS object, a.grantee, a.privilege_type,
       a.is_grantable
  FROM pg_catalog.pg_proc p,
       LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
 WHERE p.oid = 'pgtenant.fleet_status_rows(bigint)'::regprocedure AND a.grantee <> p.proowner
UNION ALL
SELECT 'TABLE pgtenant.fleet_status', a.grantee, a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_class c,
       LATERAL pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault('r', c.relowner))) a
 WHERE c.oid = 'pgtenant.fleet_status'::regclass AND a.grantee <> c.relowner;

DROP VIEW pgtenant.fleet_status;
DROP FUNCTION pgtenant.fleet_status_rows(bigint);

-- The other half of status_report. Tenants by state (as lease_status says it), migrations
-- (newest version, how many live tenants are below it, how many at each version), the trash
-- and how much of it a sweep with this retention (milliseconds) drops.
CREATE FUNCTION pgtenant.fleet_status_rows(p_retention_ms bigint)
RETURNS TABLE (tenants bigint, live bigint, held bigint, stalled bigint, owner_gone bigint,
               owner_reregistered bigint, free bigint, reserved bigint, quarantined bigint,
               forgotten bigint, newest_version integer, behind bigint, versions jsonb,
               trashed bigint, trash_due bigint, oldest_trashed_at timestamptz,
               replicas bigint, replicas_alive bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET search_path = pg_catalog, pgtenant AS $$
SELECT x.*
  FROM pgtenant.status_report(p_retention_ms) s,
       jsonb_to_record(s.fleet) AS x(tenants bigint, live bigint, held bigint, stalled bigint,
                                     owner_gone bigint, owner_reregistered bigint, free bigint,
                                     reserved bigint, quarantined bigint, forgotten bigint,
                                     newest_version integer, behind bigint, versions jsonb,
                                     trashed bigint, trash_due bigint,
                                     oldest_trashed_at timestamptz, replicas bigint,
                                     replicas_alive bigint)
$$;

CREATE VIEW pgtenant.fleet_status AS
SELECT * FROM pgtenant.fleet_status_rows(7 * 24 * 3600 * 1000::bigint);
COMMENT ON VIEW pgtenant.fleet_status IS
    'The fleet in one row: tenants per state (as lease_status), migrations (newest version, live tenants behind it, tenants per version), quarantined, the unswept trash and how much of it a sweep with the default 7-day retention drops; fleet_status_rows(retention_ms) for another retention.';

-- A new function may be executed by PUBLIC and a new view read by its owner only: both get
-- the privileges listed above, and nothing else.
REVOKE ALL ON FUNCTION pgtenant.fleet_status_rows(bigint) FROM PUBLIC;
REVOKE ALL ON pgtenant.fleet_status FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM pgtenant_v13_grants LOOP
        EXECUTE pg_catalog.format('GRANT %s ON %s TO %s%s', g.privilege_type, g.object,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

-- ---------------------------------------------------------------------------------------
-- The control plane derives the names the library derives (V12) for the new ids too: parts of
-- 1 to 128 bytes of [A-Za-z0-9._-], case kept in the key (and the hash), lowercased with `-`
-- and `.` as `_` in the name. For an id of the old rules the same name as before.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.derived_schema_name(p_key text, p_epoch bigint, p_salt integer, p_separator text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pgtenant AS $$
SELECT 't_' || lower(translate(left(k.org, w.org_len), '-.', '__')) || p_separator
       || lower(translate(left(k.ledger, least(length(k.ledger), r.readable - w.org_len)), '-.', '__'))
       || '_' || k.epoch || '_'
       || left(pgtenant.fnv1a64(convert_to(p_key, 'UTF8') || '\x00'::bytea || convert_to(k.epoch, 'UTF8')
                                || CASE WHEN p_salt > 0 THEN '\x00'::bytea || convert_to(p_salt::text, 'UTF8')
                                        ELSE ''::bytea END), 10)
  FROM (SELECT split_part(p_key, '/', 1) AS org, split_part(p_key, '/', 2) AS ledger,
               p_epoch::text AS epoch) k,
       LATERAL (SELECT greatest(57 - (2 + length(p_separator) + 2 + length(k.epoch) + 10), 0) AS readable) r,
       LATERAL (SELECT least(length(k.org),
                             greatest(greatest(r.readable - length(k.ledger), 0), r.readable / 2)) AS org_len) w
 WHERE p_key ~ '^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$'
   AND octet_length(k.org) <= 128 AND octet_length(k.ledger) <= 128 AND p_epoch >= 0
$$;
