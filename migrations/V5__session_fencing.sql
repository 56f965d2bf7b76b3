-- pgtenant control plane, version 5: session fencing (DESIGN §5 "Data sessions and session
-- fencing").
--
-- Transaction fencing checks the epoch in every transaction (one statement: about a fifth of a
-- one-INSERT transaction's server time). Session fencing checks once per connection instead:
-- * bind: before its first tenant transaction, a data connection registers its backend
--   (pid, backend_start) for its replica's incarnation, under a FOR SHARE lock on the replica
--   row that checks the incarnation is live and not sealed;
-- * seal: before an epoch moves away from a dead or expired incarnation, the acquirer seals that
--   incarnation (no backend can bind to it any more) and terminates every backend bound to it,
--   waiting for each to exit; only then, in the same transaction, the epoch moves;
-- * voluntary ends: the owner terminates the backends of its own work still in flight before the
--   release commits (terminate_work), and deregistration seals its own incarnation;
-- * hot path: BEGIN READ WRITE; SELECT pgtenant.enter(key, schema); work; COMMIT.

ALTER TABLE pgtenant.replicas ADD COLUMN sealed_at timestamptz;
COMMENT ON COLUMN pgtenant.replicas.sealed_at IS
    'Set when the incarnation was sealed: its data sessions were terminated and it can bind no new one.';
-- The incarnation that declared session fencing (before it served anything): only such an
-- incarnation binds sessions, and only its tenants need a seal before a takeover.
ALTER TABLE pgtenant.replicas ADD COLUMN session_fencing_incarnation bigint;

-- Declares that the caller's incarnation uses session fencing: called on the lease session
-- right after registration, before the replica acquires anything.
CREATE FUNCTION pgtenant.declare_session_fencing(p_replica text, p_incarnation bigint, p_secret text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    UPDATE pgtenant.replicas r SET session_fencing_incarnation = p_incarnation
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation;
END $$;

-- Data sessions bound to a replica's incarnation. Unlogged: sessions die with a crash (and are
-- not on a promoted standby) anyway.
CREATE UNLOGGED TABLE pgtenant.sessions (
    pid           integer NOT NULL,
    backend_start timestamptz NOT NULL,
    replica_id    text NOT NULL,
    incarnation   bigint NOT NULL,
    bound_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pid, backend_start)
);
CREATE INDEX sessions_incarnation ON pgtenant.sessions (replica_id, incarnation);
COMMENT ON TABLE pgtenant.sessions IS
    'Data-path backends bound to a replica incarnation (session fencing): terminated when that incarnation is sealed.';

-- Binds the calling backend to (p_replica, p_incarnation): the incarnation must be current,
-- alive and not sealed. The FOR SHARE lock makes a seal wait for binds in progress (and a bind
-- that comes after a seal sees it). Returns the backend's pid.
CREATE FUNCTION pgtenant.bind(p_replica text, p_incarnation bigint, p_secret text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    r pgtenant.replicas%ROWTYPE;
    v_start timestamptz;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    SELECT * INTO r FROM pgtenant.replicas rr
     WHERE rr.replica_id = p_replica AND rr.incarnation = p_incarnation FOR SHARE;
    IF NOT FOUND OR r.sealed_at IS NOT NULL OR r.released_at IS NOT NULL OR r.expires_at <= clock_timestamp()
       OR r.session_fencing_incarnation IS DISTINCT FROM p_incarnation THEN
        RAISE EXCEPTION USING ERRCODE = 'PTE02',
            MESSAGE = format('replica %s incarnation %s is sealed or no longer alive: it can bind no data session', p_replica, p_incarnation),
            HINT = 'the replica re-registers with a new incarnation and binds its sessions again';
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid();
    -- A pid reused by a new backend: its old row names a backend that is gone.
    DELETE FROM pgtenant.sessions s WHERE s.pid = pg_backend_pid();
    INSERT INTO pgtenant.sessions (pid, backend_start, replica_id, incarnation)
    VALUES (pg_backend_pid(), v_start, p_replica, p_incarnation);
    RETURN pg_backend_pid();
END $$;

-- Terminates the backends bound to (p_replica, p_incarnation) — all of them, or only p_pids —
-- and waits up to p_timeout_ms for each to exit; raises PTE01 (retryable) when one does not.
-- Internal: called by the functions below, which decide whose backends may go.
CREATE FUNCTION pgtenant.terminate_bound(p_replica text, p_incarnation bigint, p_pids integer[],
                                         p_timeout_ms bigint)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    s record;
    v_terminated integer := 0;
BEGIN
    FOR s IN SELECT ss.pid, ss.backend_start FROM pgtenant.sessions ss
              WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
                AND (p_pids IS NULL OR ss.pid = ANY (p_pids))
                AND ss.pid <> pg_backend_pid()
              ORDER BY ss.pid LOOP
        IF EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid AND a.backend_start = s.backend_start) THEN
            IF NOT pg_terminate_backend(s.pid, greatest(p_timeout_ms, 1)) THEN
                RAISE EXCEPTION USING ERRCODE = 'PTE01',
                    MESSAGE = format('backend %s of replica %s incarnation %s did not exit within %s ms',
                                     s.pid, p_replica, p_incarnation, p_timeout_ms),
                    HINT = 'retry: nothing moved; the backend is being terminated';
            END IF;
            v_terminated := v_terminated + 1;
        END IF;
        DELETE FROM pgtenant.sessions ss WHERE ss.pid = s.pid AND ss.backend_start = s.backend_start;
    END LOOP;
    RETURN v_terminated;
END $$;

-- Seals the owner incarnation of tenant p_key if it is dead or expired (not the caller's own),
-- and terminates its bound backends: called in the acquiring (or restoring) transaction right
-- before pgtenant.acquire, which then moves the epoch. Idempotent and cheap when already done
-- (the first acquirer of any of that incarnation's tenants does the work; the replica row lock
-- makes concurrent sealers wait for it). Returns how many backends it terminated.
CREATE FUNCTION pgtenant.seal_owner(p_key text, p_replica text, p_incarnation bigint, p_secret text,
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
    IF NOT EXISTS (SELECT 1 FROM pgtenant.replicas r WHERE r.replica_id = t.owner
                     AND r.session_fencing_incarnation = t.owner_incarnation) THEN
        -- Transaction fencing: every transaction of that owner checks the epoch itself.
        RETURN 0;
    END IF;
    -- Waits for binds in progress (FOR SHARE); later binds see the seal and are refused.
    UPDATE pgtenant.replicas r SET sealed_at = coalesce(r.sealed_at, clock_timestamp())
     WHERE r.replica_id = t.owner AND r.incarnation = t.owner_incarnation;
    RETURN pgtenant.terminate_bound(t.owner, t.owner_incarnation, NULL, p_timeout_ms);
END $$;

-- A replica terminates the backends of its own work still in flight (abandon, a voluntary end
-- past the drain) before it releases: only backends bound to its own incarnation.
CREATE FUNCTION pgtenant.terminate_work(p_replica text, p_incarnation bigint, p_secret text,
                                        p_pids integer[], p_timeout_ms bigint)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN 0;
    END IF;
    RETURN pgtenant.terminate_bound(p_replica, p_incarnation, p_pids, p_timeout_ms);
END $$;

-- Deregistration seals the replica's own incarnation and terminates its data sessions before
-- the leases it still holds are released (work still running past a drain timeout must not
-- outlive the lease under session fencing). Same signature and return as V3.
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
    UPDATE pgtenant.replicas r SET released_at = now(), expires_at = now(),
                                   sealed_at = coalesce(r.sealed_at, clock_timestamp())
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation;
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

-- The session-fencing hot path's one statement (besides BEGIN and COMMIT): the session
-- hygiene of the fence when the connection changes tenant or role, search_path pinned to the
-- tenant schema with pg_temp last, and the marker cursor COMMIT closes. No row read, no lock:
-- the binding and sealing guarantee that only the current owner's backends run.
CREATE FUNCTION pgtenant.enter(p_key text, p_schema text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_marker refcursor := 'pgtenant_fenced';
BEGIN
    IF pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
       OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
       OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true) THEN
        PERFORM pgtenant.reset_session(p_key);
    END IF;
    PERFORM pg_catalog.set_config('search_path', p_schema OPERATOR(pg_catalog.||) ', pg_temp', true);
    OPEN v_marker FOR SELECT 1;
END $$;

-- Whether session fencing can hold for the caller's data sessions: the control plane's owner
-- (whose rights seal_owner and terminate_work run with) must be able to terminate them.
CREATE FUNCTION pgtenant.can_terminate_sessions() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_owner_super boolean;
    v_target_super boolean;
BEGIN
    SELECT rolsuper INTO v_owner_super FROM pg_roles WHERE rolname = current_user;
    SELECT rolsuper INTO v_target_super FROM pg_roles WHERE rolname = session_user;
    IF v_owner_super THEN
        RETURN NULL;
    END IF;
    IF v_target_super THEN
        RETURN format('data sessions log in as superuser %s, and the control plane''s owner %s is not a superuser', session_user, current_user);
    END IF;
    IF pg_has_role(current_user, session_user::name, 'MEMBER')
       OR pg_has_role(current_user, 'pg_signal_backend', 'MEMBER') THEN
        RETURN NULL;
    END IF;
    RETURN format('the control plane''s owner %s may not terminate backends of %s: GRANT pg_signal_backend TO %s (or %s TO %s)',
                  current_user, session_user, current_user, session_user, current_user);
END $$;

-- For psql: which backends belong to which replica and incarnation.
CREATE VIEW pgtenant.session_status AS
SELECT s.replica_id, s.incarnation, s.pid, s.backend_start, s.bound_at,
       r.sealed_at IS NOT NULL AS sealed,
       r.incarnation = s.incarnation AS current_incarnation,
       a.state, a.xact_start, a.state_change,
       a.pid IS NOT NULL AS backend_alive
FROM pgtenant.sessions s
LEFT JOIN pgtenant.replicas r ON r.replica_id = s.replica_id
LEFT JOIN pg_stat_activity a ON a.pid = s.pid AND a.backend_start = s.backend_start
ORDER BY s.replica_id, s.incarnation, s.pid;

-- replica_status gains the bound sessions and the seal (a view's columns can only be appended
-- with OR REPLACE, and the function's row type changes: both are recreated).
DROP VIEW pgtenant.replica_status;
DROP FUNCTION pgtenant.replica_status_rows();
CREATE FUNCTION pgtenant.replica_status_rows()
RETURNS TABLE (replica_id text, alive boolean, lock_held boolean, incarnation bigint,
               tenants_held bigint, expires_in interval, backend_pid integer, host text,
               started_at timestamptz, released_at timestamptz, sessions bigint, sealed_at timestamptz)
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
       r.sealed_at
FROM pgtenant.replicas r
JOIN pgtenant.replica_liveness l USING (replica_id)
ORDER BY r.replica_id
$$;
CREATE VIEW pgtenant.replica_status AS SELECT * FROM pgtenant.replica_status_rows();

-- Pruning also forgets bindings of backends that are gone.
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
    DELETE FROM pgtenant.replicas r
     WHERE coalesce(r.released_at, r.expires_at, r.started_at) < now() - p_replicas_ms * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM pgtenant.replica_liveness l WHERE l.replica_id = r.replica_id AND l.lock_held)
       AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.owner = r.replica_id);
    GET DIAGNOSTICS v_replicas = ROW_COUNT;
    RETURN QUERY SELECT v_history, v_replicas;
END $$;

REVOKE ALL ON pgtenant.sessions, pgtenant.session_status, pgtenant.replica_status FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtenant.bind(text, bigint, text), pgtenant.terminate_bound(text, bigint, integer[], bigint),
                       pgtenant.declare_session_fencing(text, bigint, text),
                       pgtenant.seal_owner(text, text, bigint, text, bigint),
                       pgtenant.terminate_work(text, bigint, text, integer[], bigint),
                       pgtenant.can_terminate_sessions()
    FROM PUBLIC;
-- Like the fence: it acts on the caller's own session only.
GRANT EXECUTE ON FUNCTION pgtenant.enter(text, text), pgtenant.replica_status_rows() TO PUBLIC;

-- The roles' grants, with this version's functions and views.
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
                               pgtenant.sessions, pgtenant.session_status TO %I', p_operator);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.clear_quarantine(text, text),
            pgtenant.record_swept(text, text),
            pgtenant.prune(bigint, bigint)
            TO %I', p_operator);
        UPDATE pgtenant.config SET operator_role = p_operator;
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
-- Roles granted before this version get this version's grants too.
SELECT pgtenant.grant_roles(c.app_role, c.operator_role) FROM pgtenant.config c;
