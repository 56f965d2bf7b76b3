-- Placement's pickups and takeovers (#30), four parts: `acquire_many` (many acquisitions in one
-- statement), `seal_incarnation` (no lock when sealed already), `placement_members` and
-- `orphaned_homes` (a killed replica seen by its liveness lock), `terminate_bound` (nothing
-- bound, nothing to read).
--
-- Batched acquisitions (#30). A replica picking up the tenants reserved for it (a join's
-- moves, a close's handoffs) or taking over a dead replica's tenants whose home it is opened
-- them one `acquire` each: one round trip and one commit per tenant, ~600 a second on two
-- cores under load, so a joiner's 1 900 tenants stayed unserved for up to 1.5 s after their
-- release. `acquire_many` runs `acquire` for each key in one statement and one commit, each
-- in its own subtransaction: a key that fails (held by another, locked past the bound,
-- quarantined, prepared transactions...) is answered with its SQLSTATE and message and the
-- caller opens it the ordinary way, with the ordinary errors. Keys are taken in order, so two
-- batches cannot deadlock on each other's rows.

CREATE FUNCTION pgtenant.acquire_many(p_keys text[], p_replica text, p_incarnation bigint,
                                      p_secret text, p_grace_ms integer, p_wait_ms integer,
                                      p_terminate_ms bigint)
 RETURNS TABLE(key text, epoch bigint, schema_name text, previous_owner text, took_over text,
               quarantine text, schema_version integer, lock_key integer, error_code text,
               error_message text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    k text;
    a record;
BEGIN
    -- A caller that is not the incarnation is refused as a whole, not key by key.
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    FOR k IN SELECT DISTINCT u.k FROM unnest(p_keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1 LOOP
        key := k;
        BEGIN
            SELECT * INTO a
              FROM pgtenant.acquire(k, NULL, NULL, p_replica, p_incarnation, p_secret, false,
                                    p_grace_ms, p_wait_ms, p_terminate_ms) AS x;
            epoch := a.epoch;
            schema_name := a.schema_name;
            previous_owner := a.previous_owner;
            took_over := a.took_over;
            quarantine := a.quarantine;
            schema_version := a.schema_version;
            lock_key := a.lock_key;
            error_code := NULL;
            error_message := NULL;
        EXCEPTION WHEN OTHERS THEN
            epoch := NULL; schema_name := NULL; previous_owner := NULL; took_over := NULL;
            quarantine := NULL; schema_version := NULL; lock_key := NULL;
            GET STACKED DIAGNOSTICS error_code = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
        END;
        RETURN NEXT;
    END LOOP;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.acquire_many(text[], text, bigint, text, integer, integer, bigint) FROM PUBLIC;

-- Whoever may acquire one tenant may acquire many.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.acquire(text, text, text, text, bigint, text, boolean, integer, integer, bigint)'::regprocedure
                AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtenant.acquire_many(text[], text, bigint, text, integer, integer, bigint) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v20;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v20(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.acquire_many(text[], text, bigint, text, integer, integer, bigint) TO %I', p_app);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;

-- A seal already there needs no lock. Each takeover of a sealed incarnation's tenant locked
-- that replica's row FOR NO KEY UPDATE until its transaction ended, so batches taking over a
-- dead replica's tenants at several survivors ran one after another: 64 takeovers in 410 ms
-- against 16 pickups in 5 ms, lock waits in 40 % of samples of their backends. A committed
-- seal is seen by every later bind (which locks the row and reads the seals), and what bound
-- before it is terminated by terminate_bound, which still runs for each takeover.
CREATE OR REPLACE FUNCTION pgtenant.seal_incarnation(p_replica text, p_incarnation bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgtenant.seals s
                WHERE s.replica_id = p_replica AND s.incarnation = p_incarnation) THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pgtenant.replicas r
     WHERE r.replica_id = p_replica AND r.session_fencing_incarnation = p_incarnation
       FOR NO KEY UPDATE;
    IF FOUND THEN
        INSERT INTO pgtenant.seals (replica_id, incarnation) VALUES (p_replica, p_incarnation)
        ON CONFLICT DO NOTHING;
    END IF;
END $$;

-- Rebalancing sees a replica whose lease session is gone (its liveness lock free: a SIGKILL, a
-- crash of its host) as gone at once, not at its heartbeat's expiry. `acquire` already takes
-- over such an owner's tenants on demand; now their next homes take them unasked within one
-- rebalancing period (250 ms) of the kill, instead of up to a ttl later (1.8 s of a crash's
-- 4.2 s in the placement benchmark, ttl 2 s). The members and the orphans read the liveness
-- locks once (pg_locks), in the two functions only the rebalancing task calls every 250 ms;
-- `locate`, `route`, `home` and the `placement` view keep to the heartbeat (no pg_locks on
-- the request path), so for up to a ttl after a kill the view may show a taken-over tenant
-- away from a home that is dead.
CREATE OR REPLACE FUNCTION pgtenant.placement_members(p_stable_ms integer)
RETURNS TABLE (replica_id text, weight double precision, stable boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
SELECT c.replica_id, c.weight,
       r.started_at <= now() - p_stable_ms * interval '1 millisecond'
  FROM pgtenant.placement_candidates c
  JOIN pgtenant.replicas r USING (replica_id)
  JOIN pgtenant.replica_liveness l USING (replica_id)
 WHERE l.lock_held
 ORDER BY c.replica_id
$$;
COMMENT ON FUNCTION pgtenant.placement_members(integer) IS
    'The replicas tenants are placed on (placement_candidates) whose lease session holds their liveness lock, their weights, and whether each has been alive, in its current incarnation, for p_stable_ms: rebalancing moves tenants only to stable ones.';

CREATE OR REPLACE FUNCTION pgtenant.orphaned_homes(p_replica text, p_limit integer)
RETURNS TABLE (tenant text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
WITH live AS MATERIALIZED (
    SELECT l.replica_id, l.lock_held FROM pgtenant.replica_liveness l
), members AS MATERIALIZED (
    SELECT c.replica_id, c.weight
      FROM pgtenant.placement_candidates c JOIN live USING (replica_id)
     WHERE live.lock_held
), orphans AS MATERIALIZED (
    -- Held by an incarnation that is over: expired, deregistered, its lease session gone, or
    -- replaced by a newer one. Materialized, so homes are computed for these few only (1.1 s
    -- for 10 000 tenants when the planner pushed the home down to every tenant; 11 ms so).
    SELECT t.key
      FROM pgtenant.replicas r
      JOIN live ON live.replica_id = r.replica_id
      JOIN pgtenant.tenants t ON t.owner = r.replica_id
     WHERE (r.released_at IS NOT NULL OR r.expires_at <= now() OR NOT live.lock_held
            OR t.owner_incarnation IS DISTINCT FROM r.incarnation)
       AND t.schema_name IS NOT NULL
    UNION
    -- Free, reserved for a replica that is not a home (gone, expired, leaving): a handoff to
    -- it that it will not pick up. Index tenants_reserved: the reserved tenants only.
    SELECT t.key
      FROM pgtenant.tenants t
     WHERE t.owner IS NULL AND t.reserved_for IS NOT NULL AND t.schema_name IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM members m WHERE m.replica_id = t.reserved_for)
), homes AS (
    SELECT DISTINCT ON (o.key) o.key, m.replica_id AS home
      FROM orphans o CROSS JOIN members m
     ORDER BY o.key, pgtenant.placement_score(o.key, m.replica_id, m.weight) DESC, m.replica_id
)
SELECT h.key FROM homes h WHERE h.home = p_replica ORDER BY h.key LIMIT p_limit
$$;
COMMENT ON FUNCTION pgtenant.orphaned_homes(text, integer) IS
    'Tenants whose home among the live replicas (lease session holding the liveness lock) is p_replica and that nobody will serve unasked: held by an incarnation that is over (expired, deregistered, lease session gone, or replaced), or free and reserved for a replica that is not a live home (gone or leaving). What p_replica takes over, and nobody else, after a crash or a close. At most p_limit rows.';

-- Nothing bound to the incarnation (never session-fenced, or its sessions terminated and
-- forgotten by an earlier takeover): nothing to do, without the two pg_stat_activity snapshots.
-- A takeover runs this twice (acquire, then the seal_on_takeover trigger), and a crash's
-- takeovers each ran it for an incarnation whose rows the first one had deleted. The same
-- answer as V7's body, whose first statement finds no row either.
CREATE OR REPLACE FUNCTION pgtenant.terminate_bound(p_replica text, p_incarnation bigint, p_pids integer[],
                                                    p_timeout_ms bigint)
RETURNS integer
-- A backend that exits between the snapshot and its signal makes pg_terminate_backend warn;
-- it is gone, which is what the seal wants, so the warning is noise.
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant SET client_min_messages = error AS $$
DECLARE
    v_targets integer[];
    v_left integer[];
    v_deadline timestamptz := clock_timestamp() + greatest(p_timeout_ms, 1) * interval '1 millisecond';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgtenant.sessions ss
                    WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation) THEN
        RETURN 0;
    END IF;
    -- pg_stat_activity is read once per transaction and then cached: clear it to see now.
    PERFORM pg_stat_clear_snapshot();
    SELECT array_agg(ss.pid) INTO v_targets
      FROM pgtenant.sessions ss
      JOIN pg_stat_activity a ON a.pid = ss.pid AND a.backend_start = ss.backend_start
     WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
       AND (p_pids IS NULL OR ss.pid = ANY (p_pids))
       AND ss.pid <> pg_backend_pid();
    IF v_targets IS NOT NULL THEN
        PERFORM pg_terminate_backend(pid) FROM unnest(v_targets) AS pid;
        LOOP
            PERFORM pg_stat_clear_snapshot();
            -- A backend leaves pg_stat_activity after its transaction was aborted (proc_exit
            -- runs the abort before it clears its status entry): gone from here, it commits
            -- nothing more.
            SELECT array_agg(ss.pid) INTO v_left
              FROM pgtenant.sessions ss
              JOIN pg_stat_activity a ON a.pid = ss.pid AND a.backend_start = ss.backend_start
             WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
               AND ss.pid = ANY (v_targets);
            EXIT WHEN v_left IS NULL;
            IF clock_timestamp() >= v_deadline THEN
                RAISE EXCEPTION USING ERRCODE = 'PTE01',
                    MESSAGE = format('backends %s of replica %s incarnation %s did not exit within %s ms',
                                     v_left, p_replica, p_incarnation, p_timeout_ms),
                    HINT = 'retry: nothing moved; the backends are being terminated';
            END IF;
            PERFORM pg_sleep(0.001);
        END LOOP;
    END IF;
    DELETE FROM pgtenant.sessions ss
     WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
       AND (p_pids IS NULL OR ss.pid = ANY (p_pids))
       AND ss.pid <> pg_backend_pid();
    RETURN coalesce(cardinality(v_targets), 0);
END $$;
