-- pgtenant control plane, version 8: a seal belongs to an incarnation, never to a replica id
-- (issue 18, DESIGN G9).
--
-- Up to V7 the seal was one column of the replica's row, `replicas.sealed_at`, which
-- `register` never cleared: the first seal of a replica id barred every later incarnation of
-- it from binding a data session, forever. With stable replica ids (StatefulSet pods, systemd
-- units) one paused replica was enough to stop that id for good, and a fault run stopped the
-- whole fleet within 13 s (PTE02 ~20 times a second per replica, 0 writes for 49 s).
--
-- Now a seal is a row of `pgtenant.seals` keyed by (replica_id, incarnation): a new
-- incarnation has no seal by construction, and a sealed one stays sealed (G3). Sealing still
-- locks the replica row (FOR NO KEY UPDATE, which conflicts with bind's FOR SHARE), so it waits
-- for binds in progress, and a bind that comes after reads the seal in its next statement.
-- The heartbeat refuses a sealed incarnation too: a replica learns at its next renewal that it
-- must register again, not from a refusal it would retry.
--
-- Same signatures throughout: V7 replicas keep running across the upgrade.

CREATE TABLE pgtenant.seals (
    replica_id  text NOT NULL REFERENCES pgtenant.replicas ON DELETE CASCADE,
    incarnation bigint NOT NULL,
    sealed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (replica_id, incarnation)
);
COMMENT ON TABLE pgtenant.seals IS
    'Sealed incarnations (session fencing): a sealed incarnation binds no data session and renews nothing, ever; a later incarnation of the same replica id is not affected.';

-- A V7 seal means something only for the row's current incarnation, and only if that
-- incarnation is not alive: a sealed incarnation never becomes alive again (its heartbeat is
-- refused once expired, and its liveness lock went with its lease session), so a live
-- incarnation's sealed_at is a stale seal of an earlier one.
INSERT INTO pgtenant.seals (replica_id, incarnation, sealed_at)
SELECT r.replica_id, r.incarnation, r.sealed_at
  FROM pgtenant.replicas r
  JOIN pgtenant.replica_liveness l USING (replica_id)
 WHERE r.sealed_at IS NOT NULL AND NOT l.alive;

-- Seals (p_replica, p_incarnation) if that incarnation declared session fencing: waits for its
-- binds in progress (the row lock), then no bind of it passes. Idempotent. Internal.
CREATE FUNCTION pgtenant.seal_incarnation(p_replica text, p_incarnation bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM 1 FROM pgtenant.replicas r
     WHERE r.replica_id = p_replica AND r.session_fencing_incarnation = p_incarnation
       FOR NO KEY UPDATE;
    IF FOUND THEN
        INSERT INTO pgtenant.seals (replica_id, incarnation) VALUES (p_replica, p_incarnation)
        ON CONFLICT DO NOTHING;
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.seal_incarnation(text, bigint) FROM PUBLIC;

-- Whether (p_replica, p_incarnation) is sealed. Internal.
CREATE FUNCTION pgtenant.is_sealed(p_replica text, p_incarnation bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pgtenant AS $$
SELECT EXISTS (SELECT 1 FROM pgtenant.seals s WHERE s.replica_id = p_replica AND s.incarnation = p_incarnation)
$$;
REVOKE ALL ON FUNCTION pgtenant.is_sealed(text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.bind(p_replica text, p_incarnation bigint, p_secret text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    r pgtenant.replicas%ROWTYPE;
    v_start timestamptz;
    v_why text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    SELECT * INTO r FROM pgtenant.replicas rr
     WHERE rr.replica_id = p_replica AND rr.incarnation = p_incarnation FOR SHARE;
    -- A separate statement after the lock: it sees a seal that committed while bind waited.
    v_why := CASE
        WHEN NOT FOUND THEN 'it is not the replica''s current incarnation'
        WHEN pgtenant.is_sealed(p_replica, p_incarnation) THEN 'it is sealed (a takeover found it dead or expired)'
        WHEN r.released_at IS NOT NULL THEN 'it deregistered'
        WHEN r.expires_at <= clock_timestamp() THEN 'its heartbeat expired'
        WHEN r.session_fencing_incarnation IS DISTINCT FROM p_incarnation THEN 'it did not declare session fencing'
        -- Alive means its lease session holds the liveness lock, not only an unexpired
        -- heartbeat: after a failover (or a lease session killed) the row may outlive the session.
        WHEN NOT EXISTS (SELECT 1 FROM pg_locks l
                          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                            AND l.classid = pgtenant.lock_namespace()::oid AND l.objid = r.lock_key::oid
                            AND l.pid = r.backend_pid
                            AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))
            THEN 'its lease session no longer holds the liveness lock'
    END;
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTE02',
            MESSAGE = format('replica %s incarnation %s is sealed or no longer alive: it can bind no data session', p_replica, p_incarnation),
            DETAIL = v_why,
            HINT = 'the replica registers again (a new incarnation) and binds its sessions to that';
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid();
    -- A pid reused by a new backend: its old row names a backend that is gone.
    DELETE FROM pgtenant.sessions s WHERE s.pid = pg_backend_pid();
    INSERT INTO pgtenant.sessions (pid, backend_start, replica_id, incarnation)
    VALUES (pg_backend_pid(), v_start, p_replica, p_incarnation);
    RETURN pg_backend_pid();
END $$;

CREATE OR REPLACE FUNCTION pgtenant.heartbeat(p_replica text, p_incarnation bigint, p_secret text, p_ttl_ms integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    UPDATE pgtenant.replicas r
       SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation AND r.released_at IS NULL
       AND r.expires_at > clock_timestamp() AND r.backend_pid = pg_backend_pid()
       AND NOT pgtenant.is_sealed(p_replica, p_incarnation);
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION pgtenant.seal_owner(p_key text, p_replica text, p_incarnation bigint, p_secret text,
                                               p_timeout_ms bigint)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t record;
    o record;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    -- The same row lock acquire takes next: nothing about the owner changes in between.
    SELECT tt.owner, tt.owner_incarnation INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
    IF NOT FOUND OR t.owner IS NULL OR (t.owner = p_replica AND t.owner_incarnation = p_incarnation) THEN
        RETURN 0;
    END IF;
    SELECT * INTO o FROM pgtenant.replica_liveness l WHERE l.replica_id = t.owner;
    IF o.incarnation = t.owner_incarnation AND o.alive THEN
        -- A live owner: acquire refuses (LeaseHeld); nothing to seal.
        RETURN 0;
    END IF;
    PERFORM pgtenant.seal_incarnation(t.owner, t.owner_incarnation);
    RETURN pgtenant.terminate_bound(t.owner, t.owner_incarnation, NULL, p_timeout_ms);
END $$;

CREATE OR REPLACE FUNCTION pgtenant.seal_on_takeover() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.seal_incarnation(OLD.owner, OLD.owner_incarnation);
    -- Whatever the replica row says now (it may have registered again), nothing bound to the
    -- old incarnation may outlive its epoch.
    PERFORM pgtenant.terminate_bound(OLD.owner, OLD.owner_incarnation, NULL, 5000);
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION pgtenant.deregister(p_replica text, p_incarnation bigint, p_secret text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_released integer;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgtenant.replicas r WHERE r.replica_id = p_replica FOR UPDATE;
    UPDATE pgtenant.replicas r SET released_at = now(), expires_at = now()
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation;
    PERFORM pgtenant.seal_incarnation(p_replica, p_incarnation);
    PERFORM pgtenant.terminate_bound(p_replica, p_incarnation, NULL, 5000);
    WITH freed AS (
        UPDATE pgtenant.tenants t SET owner = NULL, owner_incarnation = NULL
         WHERE t.owner = p_replica AND t.owner_incarnation = p_incarnation
        RETURNING t.key, t.epoch
    ), journal AS (
        INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
        SELECT f.key, 'released', f.epoch, p_replica, p_incarnation, 'replica deregistered' FROM freed f
        RETURNING tenant_key
    )
    SELECT count(pg_notify('pgtenant_free', j.tenant_key)) INTO v_released FROM journal j;
    DELETE FROM pgtenant.replica_secrets s WHERE s.replica_id = p_replica;
    INSERT INTO pgtenant.history (event, replica_id, incarnation) VALUES ('deregistered', p_replica, p_incarnation);
    RETURN v_released;
END $$;

-- Pruning forgets seals of incarnations a later one replaced (they can never bind: only the
-- current incarnation authenticates), besides V5's bindings of gone backends.
CREATE OR REPLACE FUNCTION pgtenant.prune(p_history_ms bigint, p_replicas_ms bigint)
RETURNS TABLE (history_pruned bigint, replicas_pruned bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_history bigint;
    v_replicas bigint;
BEGIN
    DELETE FROM pgtenant.history h WHERE h.at < now() - p_history_ms * interval '1 millisecond';
    GET DIAGNOSTICS v_history = ROW_COUNT;
    DELETE FROM pgtenant.sessions s
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid AND a.backend_start = s.backend_start);
    DELETE FROM pgtenant.seals s USING pgtenant.replicas r
     WHERE r.replica_id = s.replica_id AND s.incarnation < r.incarnation;
    DELETE FROM pgtenant.replicas r
     WHERE coalesce(r.released_at, r.expires_at, r.started_at) < now() - p_replicas_ms * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM pgtenant.replica_liveness l WHERE l.replica_id = r.replica_id AND l.lock_held)
       AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.owner = r.replica_id);
    GET DIAGNOSTICS v_replicas = ROW_COUNT;
    RETURN QUERY SELECT v_history, v_replicas;
END $$;

-- The views read the seal of the incarnation they show (a join, not is_sealed: a view's
-- functions run with the reader's rights, and the seals table is not the application's); replica_status gains `state`, one word
-- for what the row means now (a view's columns change only by recreating it).
DROP VIEW pgtenant.session_status;
CREATE VIEW pgtenant.session_status AS
SELECT s.replica_id, s.incarnation, s.pid, s.backend_start, s.bound_at,
       sl.sealed_at IS NOT NULL AS sealed,
       r.incarnation = s.incarnation AS current_incarnation,
       a.state, a.xact_start, a.state_change,
       a.pid IS NOT NULL AS backend_alive
FROM pgtenant.sessions s
LEFT JOIN pgtenant.replicas r ON r.replica_id = s.replica_id
LEFT JOIN pg_stat_activity a ON a.pid = s.pid AND a.backend_start = s.backend_start
LEFT JOIN pgtenant.seals sl ON sl.replica_id = s.replica_id AND sl.incarnation = s.incarnation
ORDER BY s.replica_id, s.incarnation, s.pid;

DROP VIEW pgtenant.replica_status;
DROP FUNCTION pgtenant.replica_status_rows();
CREATE FUNCTION pgtenant.replica_status_rows()
RETURNS TABLE (replica_id text, alive boolean, lock_held boolean, incarnation bigint,
               tenants_held bigint, expires_in interval, backend_pid integer, host text,
               started_at timestamptz, released_at timestamptz, sessions bigint, sealed_at timestamptz,
               state text)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET search_path = pg_catalog, pgtenant AS $$
SELECT r.replica_id,
       l.alive,
       l.lock_held,
       r.incarnation,
       (SELECT count(*) FROM pgtenant.tenants t
         WHERE t.owner = r.replica_id AND t.owner_incarnation = r.incarnation),
       CASE WHEN l.alive THEN date_trunc('milliseconds', r.expires_at - now()) END,
       r.backend_pid,
       r.host,
       r.started_at,
       r.released_at,
       (SELECT count(*) FROM pgtenant.sessions s
         WHERE s.replica_id = r.replica_id AND s.incarnation = r.incarnation),
       s.sealed_at,
       CASE WHEN r.released_at IS NOT NULL THEN 'released'
            WHEN s.sealed_at IS NOT NULL THEN 'sealed'
            WHEN l.alive THEN 'alive'
            WHEN NOT l.lock_held THEN 'lease session gone'
            ELSE 'expired' END
FROM pgtenant.replicas r
JOIN pgtenant.replica_liveness l USING (replica_id)
LEFT JOIN pgtenant.seals s ON s.replica_id = r.replica_id AND s.incarnation = r.incarnation
ORDER BY r.replica_id
$$;
CREATE VIEW pgtenant.replica_status AS SELECT * FROM pgtenant.replica_status_rows();
REVOKE ALL ON pgtenant.seals, pgtenant.session_status, pgtenant.replica_status FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgtenant.replica_status_rows() TO PUBLIC;

-- The seal lives in pgtenant.seals alone now.
ALTER TABLE pgtenant.replicas DROP COLUMN sealed_at;

-- The roles' grants, with this version's table.
CREATE OR REPLACE FUNCTION pgtenant.grant_roles(p_app name, p_operator name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SCHEMA pgtenant TO %I', p_app);
        -- The fence reads the tenant row with the caller's rights; the views are for status.
        EXECUTE format('GRANT SELECT ON pgtenant.tenants, pgtenant.lease_status, pgtenant.replica_status,
                               pgtenant.replica_liveness, pgtenant.refinery_schema_history,
                               pgtenant.session_status TO %I', p_app);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.lock_tenant_row(text),
            pgtenant.replica_lock_key(text),
            pgtenant.register(text, integer, text),
            pgtenant.heartbeat(text, bigint, text, integer),
            pgtenant.deregister(text, bigint, text),
            pgtenant.acquire(text, text, text, text, bigint, text, boolean),
            pgtenant.schema_created(text, bigint, text, bigint, text, text, integer),
            pgtenant.schema_migrated(text, bigint, text, bigint, text, integer, text),
            pgtenant.quarantine(text, text, text, bigint, text, bigint, text, text, text),
            pgtenant.release(text, bigint, text, text[], bigint[], text[], text[], integer[]),
            pgtenant.forget(text, bigint, text, bigint, text),
            pgtenant.restore(text, text, bigint, text, text),
            pgtenant.bind(text, bigint, text),
            pgtenant.declare_session_fencing(text, bigint, text),
            pgtenant.seal_owner(text, text, bigint, text, bigint),
            pgtenant.terminate_work(text, bigint, text, integer[], bigint),
            pgtenant.can_terminate_sessions()
            TO %I', p_app);
        -- Tenant schemas are created, and owned, by the application's role.
        EXECUTE format('GRANT CREATE ON DATABASE %I TO %I', current_database(), p_app);
        UPDATE pgtenant.config SET app_role = p_app;
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SCHEMA pgtenant TO %I', p_operator);
        EXECUTE format('GRANT SELECT ON pgtenant.tenants, pgtenant.trash, pgtenant.history, pgtenant.replicas,
                               pgtenant.config, pgtenant.lease_status, pgtenant.replica_status,
                               pgtenant.replica_liveness, pgtenant.refinery_schema_history,
                               pgtenant.sessions, pgtenant.session_status, pgtenant.seals TO %I', p_operator);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.clear_quarantine(text, text),
            pgtenant.record_swept(text, text),
            pgtenant.prune(bigint, bigint)
            TO %I', p_operator);
        UPDATE pgtenant.config SET operator_role = p_operator;
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
SELECT pgtenant.grant_roles(c.app_role, c.operator_role) FROM pgtenant.config c;
