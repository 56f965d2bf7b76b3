-- pgtenant control plane, version 6: the fence itself refuses every epoch from before the
-- database's last failover, and a data session binds only to an incarnation whose lease
-- session is alive (DESIGN §9).
--
-- V4 gave epochs a floor that rises with every promotion, so no epoch is issued twice. That
-- leaves the epochs that *survived* a lossy failover: when a handoff or takeover was lost, the
-- promoted server shows the tenant at its previous owner's epoch E, which a newer owner had
-- superseded (with acknowledged writes) before the crash. The fence compared epochs only, so a
-- handle of E (a paused writer whose client-side checks did not stop it) passed it again. Now
-- the fence and its read variant refuse every epoch below pgtenant.epoch_floor() (PTF01, with
-- a hint): after a promotion every tenant must be acquired again, at or above the new floor,
-- before anything commits — which the replicas do anyway, since their lease sessions dropped.
-- Cost: one inlined call, 0.14 us (V4's header), on every fenced transaction.
--
-- Session fencing's bind checked that the incarnation's heartbeat had not expired; after a
-- failover (or with the lease session killed) the replica row outlives its session by up to a
-- ttl, and a data connection opened in that window could bind to an incarnation nobody seals
-- (no acquirer needs to). Bind now also requires the incarnation's liveness lock to be held by
-- the backend that registered it, as pgtenant.replica_liveness defines "alive".
--
-- Same signatures as before: existing grants stay, and replicas of the previous release keep
-- calling the same functions.

-- The fence's refusal for an epoch from before the last failover.
CREATE FUNCTION pgtenant.fence_refusal_before_failover(p_key text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PTF01',
        MESSAGE = pg_catalog.format('pgtenant fenced: tenant %s, epoch %s is from before the database''s last failover (epochs now start at %s)',
                                    p_key, p_epoch, pgtenant.epoch_floor()),
        HINT = 'the lease was lost in the failover; open the tenant again';
END $$;
GRANT EXECUTE ON FUNCTION pgtenant.fence_refusal_before_failover(text, bigint) TO PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_owner text;
    v_schema text;
    v_forgotten bigint;
    v_lock integer;
    v_marker refcursor := 'pgtenant_fenced';
BEGIN
    IF pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
       OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
       OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true) THEN
        PERFORM pgtenant.reset_session(p_key);
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885828146, p_lock);
        SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.tenants t,
               LATERAL (SELECT pg_catalog.set_config('search_path', coalesce(t.schema_name OPERATOR(pg_catalog.||) ', pg_temp', 'pg_catalog, pg_temp'), true),
                               pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true)) s
         WHERE t.key OPERATOR(pg_catalog.=) p_key;
    ELSE
        SELECT r.epoch, r.owner, r.schema_name, r.forgotten_at_epoch, r.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.lock_tenant_row(p_key) r;
        PERFORM pg_catalog.set_config('search_path', coalesce(v_schema OPERATOR(pg_catalog.||) ', pg_temp', 'pg_catalog, pg_temp'), true),
                pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true);
    END IF;
    IF v_lock IS DISTINCT FROM p_lock THEN
        -- The wrong lock would not serialize with this tenant's acquisitions: never pass.
        RAISE EXCEPTION 'pgtenant: lock key % is not tenant %''s', p_lock, p_key;
    END IF;
    IF p_epoch OPERATOR(pg_catalog.<) pgtenant.epoch_floor() THEN
        PERFORM pgtenant.fence_refusal_before_failover(p_key, p_epoch);
    END IF;
    IF v_epoch OPERATOR(pg_catalog.<>) p_epoch OR v_owner IS NULL OR v_schema IS NULL
       OR v_forgotten OPERATOR(pg_catalog.>=) p_epoch THEN
        PERFORM pgtenant.fence_refusal(p_key, p_epoch, v_epoch, v_owner, v_schema, v_forgotten);
    END IF;
    OPEN v_marker FOR SELECT 1;
    RETURN v_schema;
END $$;

CREATE OR REPLACE FUNCTION pgtenant.fence_read(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_owner text;
    v_schema text;
    v_forgotten bigint;
    v_lock integer;
    v_marker refcursor := 'pgtenant_fenced';
BEGIN
    IF pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
       OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
       OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true) THEN
        PERFORM pgtenant.reset_session(p_key);
    END IF;
    SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
      INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
      FROM pgtenant.tenants t WHERE t.key OPERATOR(pg_catalog.=) p_key;
    IF v_lock IS DISTINCT FROM p_lock THEN
        RAISE EXCEPTION 'pgtenant: lock key % is not tenant %''s', p_lock, p_key;
    END IF;
    IF p_epoch OPERATOR(pg_catalog.<) pgtenant.epoch_floor() THEN
        PERFORM pgtenant.fence_refusal_before_failover(p_key, p_epoch);
    END IF;
    IF v_epoch OPERATOR(pg_catalog.<>) p_epoch OR v_owner IS NULL OR v_schema IS NULL
       OR v_forgotten OPERATOR(pg_catalog.>=) p_epoch THEN
        PERFORM pgtenant.fence_refusal(p_key, p_epoch, v_epoch, v_owner, v_schema, v_forgotten);
    END IF;
    PERFORM pg_catalog.set_config('search_path', v_schema OPERATOR(pg_catalog.||) ', pg_temp', true),
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true);
    OPEN v_marker FOR SELECT 1;
    RETURN v_schema;
END $$;

CREATE OR REPLACE FUNCTION pgtenant.bind(p_replica text, p_incarnation bigint, p_secret text)
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
    -- Alive means its lease session holds the liveness lock, not only an unexpired heartbeat:
    -- after a failover (or a lease session killed) the row may outlive the session by a ttl.
    IF NOT FOUND OR r.sealed_at IS NOT NULL OR r.released_at IS NOT NULL OR r.expires_at <= clock_timestamp()
       OR r.session_fencing_incarnation IS DISTINCT FROM p_incarnation
       OR NOT EXISTS (SELECT 1 FROM pg_locks l
                      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                        AND l.classid = pgtenant.lock_namespace()::oid AND l.objid = r.lock_key::oid
                        AND l.pid = r.backend_pid
                        AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())) THEN
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
