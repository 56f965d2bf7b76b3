-- pgtenant control plane, version 3: least privilege (DESIGN G8) and the tenant boundary (G6).
--
-- * Every write to the control plane goes through a SECURITY DEFINER function with a fixed
--   search_path, and acts for a replica only when the caller presents the secret issued to
--   that replica's incarnation at registration (stored as its SHA-256). EXECUTE is revoked from
--   PUBLIC; `pgtenant setup --app-role NAME` (pgtenant.grant_roles) grants the application's
--   role only the protocol functions, SELECT on what the fence and the views read, and CREATE
--   on the database for tenant schemas. Operator functions go to an operator role.
-- * The fence scrubs the session state a previous user of the connection left behind before
--   it admits a tenant's work, pins search_path to the tenant schema with pg_temp explicitly
--   last, and opens a marker cursor whose presence at commit proves the work did not end the
--   fenced transaction itself.
--
-- The V1 functions keep their signatures and bodies (SECURITY INVOKER): replicas of the
-- previous release keep working across this upgrade (a role that owns the control plane can
-- still call them), while a least-privileged application role, which has no table privileges,
-- can do nothing through them.

-- ---------------------------------------------------------------------------------------
-- Settings and secrets.
-- ---------------------------------------------------------------------------------------

-- The roles `setup` granted to, one row. The sweep expects tenant schemas to be owned by
-- app_role (or, without one, by the control plane's owner).
CREATE TABLE pgtenant.config (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    app_role      name,
    operator_role name
);
INSERT INTO pgtenant.config DEFAULT VALUES;
COMMENT ON TABLE pgtenant.config IS
    'The application and operator roles pgtenant setup granted to; tenant schemas are expected to be owned by app_role.';

-- The SHA-256 of the secret issued to each replica's current incarnation. Readable by the
-- control plane's owner only, never through a view.
CREATE TABLE pgtenant.replica_secrets (
    replica_id   text PRIMARY KEY REFERENCES pgtenant.replicas (replica_id) ON DELETE CASCADE,
    incarnation  bigint NOT NULL,
    secret_hash  bytea NOT NULL
);
COMMENT ON TABLE pgtenant.replica_secrets IS
    'SHA-256 of the secret of each replica''s current incarnation: the proof that a caller is that incarnation.';

-- Whether the caller is (p_replica, p_incarnation): true when the incarnation is current and
-- the secret is its own; false when the incarnation is not (or no longer) current, which acts
-- for nobody; raises PTA01 when the incarnation is current but the secret is wrong.
CREATE FUNCTION pgtenant.authenticate(p_replica text, p_incarnation bigint, p_secret text)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_hash bytea;
BEGIN
    SELECT s.secret_hash INTO v_hash FROM pgtenant.replica_secrets s
     WHERE s.replica_id = p_replica AND s.incarnation = p_incarnation;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_secret IS NULL OR sha256(convert_to(p_secret, 'UTF8')) <> v_hash THEN
        RAISE EXCEPTION USING ERRCODE = 'PTA01',
            MESSAGE = format('replica %s incarnation %s: the caller did not prove it is that incarnation', p_replica, p_incarnation),
            HINT = 'only the process that registered an incarnation can act for it (its secret is issued at registration)';
    END IF;
    RETURN true;
END $$;

-- ---------------------------------------------------------------------------------------
-- Session hygiene (G6).
-- ---------------------------------------------------------------------------------------

-- Resets everything a previous user of this connection can have left in the session: session
-- and current role, session settings (back to the connection's startup, role and database
-- defaults), WITH HOLD cursors, LISTEN registrations, session advisory locks, temp objects and
-- SQL-level prepared statements (not the protocol-level ones, so the driver's cached
-- statements, the fence's among them, stay prepared). Then records who the session now serves,
-- so the fence scrubs again only when the connection changes tenant or role.
-- Measured in a loop of 20 000 calls (PostgreSQL 15): about 7 us; the fence's checks that skip
-- it cost about 0.5 us (BENCHMARKS.md, "Session hygiene").
CREATE FUNCTION pgtenant.reset_session(p_tenant text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
BEGIN
    SET SESSION AUTHORIZATION DEFAULT;
    RESET ALL;
    EXECUTE 'CLOSE ALL';
    UNLISTEN *;
    PERFORM pg_catalog.pg_advisory_unlock_all();
    IF pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.<>) 0 THEN
        DISCARD TEMP;
    END IF;
    FOR v_name IN SELECT p.name FROM pg_catalog.pg_prepared_statements p WHERE p.from_sql LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', v_name);
    END LOOP;
    PERFORM pg_catalog.set_config('pgtenant.session_tenant', coalesce(p_tenant, ''), false),
            pg_catalog.set_config('pgtenant.session_user', session_user::text, false);
END $$;

-- The tenant row under a FOR KEY SHARE lock, for fences under REPEATABLE READ or SERIALIZABLE
-- (the application's role has no UPDATE privilege, which row locks need). Not for PUBLIC: a
-- row lock held open would block the tenant's acquisitions.
CREATE FUNCTION pgtenant.lock_tenant_row(p_key text)
RETURNS TABLE (epoch bigint, owner text, schema_name text, forgotten_at_epoch bigint, lock_key integer)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
    SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
      FROM pgtenant.tenants t WHERE t.key = p_key FOR KEY SHARE OF t
$$;

-- The fence (same signature as V1, so replicas of the previous release keep working). New:
-- it scrubs the session when the connection changes tenant or role, puts pg_temp explicitly
-- last in search_path (a temp table never shadows a ledger table), and opens the marker cursor
-- `pgtenant_fenced`, which the client closes in the same message as its COMMIT: if the work
-- ended the fenced transaction itself, the cursor is gone and the commit fails.
--
-- SECURITY INVOKER and EXECUTE for PUBLIC on purpose: it only reads the tenant row (with the
-- caller's SELECT privilege) and changes the caller's own session, so calling it grants
-- nothing; and a role the work switched to with SET ROLE can still call it, so the scrub runs.
-- It cannot have a SET search_path clause, which would undo the search_path it pins: every
-- name in it is schema-qualified instead.
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
    IF v_epoch OPERATOR(pg_catalog.<>) p_epoch OR v_owner IS NULL OR v_schema IS NULL
       OR v_forgotten OPERATOR(pg_catalog.>=) p_epoch THEN
        PERFORM pgtenant.fence_refusal(p_key, p_epoch, v_epoch, v_owner, v_schema, v_forgotten);
    END IF;
    OPEN v_marker FOR SELECT 1;
    RETURN v_schema;
END $$;

-- The read-only variant: the same scrub and checks, no lock.
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
    IF v_epoch OPERATOR(pg_catalog.<>) p_epoch OR v_owner IS NULL OR v_schema IS NULL
       OR v_forgotten OPERATOR(pg_catalog.>=) p_epoch THEN
        PERFORM pgtenant.fence_refusal(p_key, p_epoch, v_epoch, v_owner, v_schema, v_forgotten);
    END IF;
    PERFORM pg_catalog.set_config('search_path', v_schema OPERATOR(pg_catalog.||) ', pg_temp', true),
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true);
    OPEN v_marker FOR SELECT 1;
    RETURN v_schema;
END $$;

-- ---------------------------------------------------------------------------------------
-- Views: an expired owner's lease shows 0 left, not a negative interval.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE VIEW pgtenant.lease_status AS
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
       t.created_at
FROM pgtenant.tenants t
LEFT JOIN pgtenant.replica_liveness l ON l.replica_id = t.owner
ORDER BY t.key;

-- The rows behind replica_status read pgtenant.replicas, which the application's role cannot
-- read directly: they are computed with the owner's rights (no secret is among them).
ALTER FUNCTION pgtenant.replica_status_rows() SECURITY DEFINER;
ALTER FUNCTION pgtenant.replica_status_rows() SET search_path = pg_catalog, pgtenant;

-- ---------------------------------------------------------------------------------------
-- Liveness: register, heartbeat, deregister.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgtenant.replica_lock_key(p_replica text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
    INSERT INTO pgtenant.replicas (replica_id) VALUES (p_replica)
    ON CONFLICT (replica_id) DO UPDATE SET replica_id = EXCLUDED.replica_id
    RETURNING lock_key
$$;

-- Registers a new incarnation and issues its secret (returned once, stored hashed). Called on
-- the lease session right after it took the replica's liveness lock; refuses when this
-- backend does not hold that lock (a transaction-mode pooler moved the session's statements
-- to another backend). V1 callers select only `incarnation` and keep working.
DROP FUNCTION pgtenant.register(text, integer, text);
CREATE FUNCTION pgtenant.register(p_replica text, p_ttl_ms integer, p_host text)
RETURNS TABLE (incarnation bigint, expires_at timestamptz, secret text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_key integer;
    v_incarnation bigint;
    v_expires timestamptz;
    -- gen_random_uuid draws from the server's strong random source: 2 x 122 bits.
    v_secret text := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
BEGIN
    SELECT r.lock_key INTO STRICT v_key FROM pgtenant.replicas r WHERE r.replica_id = p_replica FOR UPDATE;
    IF NOT EXISTS (SELECT 1 FROM pg_locks l
                   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                     AND l.classid = pgtenant.lock_namespace()::oid AND l.objid = v_key::oid
                     AND l.pid = pg_backend_pid()) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTS01',
            MESSAGE = format('the lease session of replica %s does not hold its liveness lock', p_replica),
            HINT = 'connect the lease session directly or through a session-mode pooler, never transaction pooling';
    END IF;
    UPDATE pgtenant.replicas r
       SET incarnation = r.incarnation + 1,
           backend_pid = pg_backend_pid(),
           backend_start = (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()),
           expires_at = now() + p_ttl_ms * interval '1 millisecond',
           started_at = now(),
           released_at = NULL,
           host = p_host
     WHERE r.replica_id = p_replica
    RETURNING r.incarnation, r.expires_at INTO v_incarnation, v_expires;
    INSERT INTO pgtenant.replica_secrets AS s (replica_id, incarnation, secret_hash)
    VALUES (p_replica, v_incarnation, sha256(convert_to(v_secret, 'UTF8')))
    ON CONFLICT (replica_id) DO UPDATE SET incarnation = EXCLUDED.incarnation, secret_hash = EXCLUDED.secret_hash;
    INSERT INTO pgtenant.history (event, replica_id, incarnation, detail)
    VALUES ('registered', p_replica, v_incarnation, p_host);
    RETURN QUERY SELECT v_incarnation, v_expires, v_secret;
END $$;

-- One heartbeat: true when renewed, false when the incarnation expired or was replaced (every
-- lease of it is lost for good). clock_timestamp, not now(): a heartbeat that waited on the row
-- past the expiry must see the expiry, or it would revive an incarnation whose tenants were
-- already taken over. Only the lease session that registered can renew (backend_pid).
CREATE FUNCTION pgtenant.heartbeat(p_replica text, p_incarnation bigint, p_secret text, p_ttl_ms integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    UPDATE pgtenant.replicas r
       SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation AND r.released_at IS NULL
       AND r.expires_at > clock_timestamp() AND r.backend_pid = pg_backend_pid();
    RETURN FOUND;
END $$;

-- Ends an incarnation: marks it released (nobody waits for its expiry), releases every lease it
-- still holds (close() hands tenants off first; these are the ones whose handoff failed, so no
-- tenant is left naming a departed replica), and forgets its secret. The FOR UPDATE waits for
-- acquisitions of this incarnation in flight (they hold the row FOR KEY SHARE); later ones find
-- it released.
CREATE FUNCTION pgtenant.deregister(p_replica text, p_incarnation bigint, p_secret text)
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

-- ---------------------------------------------------------------------------------------
-- Leases.
-- ---------------------------------------------------------------------------------------

-- Acquires a tenant's lease for (p_replica, p_incarnation), bumping its epoch: V1's acquire
-- with the caller's proof of identity, and the replica row held FOR KEY SHARE until the
-- caller's transaction ends, so a concurrent deregistration waits for it (and a later
-- acquisition finds the incarnation released). With p_create, a tenant without a live schema
-- comes back with schema_name NULL: the caller creates the schema and its migrations in the
-- same transaction, so a failed creation leaves nothing behind, not even the epoch bump.
CREATE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text,
                                 p_replica text, p_incarnation bigint, p_secret text, p_create boolean)
RETURNS TABLE (epoch bigint, schema_name text, forgotten_at_epoch bigint,
               schema_version integer, previous_owner text, took_over text, quarantine text,
               lock_key integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    me pgtenant.replicas%ROWTYPE;
    o record;
    v_took_over text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    SELECT * INTO me FROM pgtenant.replicas r WHERE r.replica_id = p_replica FOR KEY SHARE;
    IF NOT FOUND OR me.incarnation <> p_incarnation OR me.released_at IS NOT NULL OR me.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered and alive', p_replica, p_incarnation);
    END IF;
    SELECT * INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        IF NOT p_create THEN
            RAISE EXCEPTION USING ERRCODE = 'PTN01', MESSAGE = format('tenant %s does not exist', p_key);
        END IF;
        INSERT INTO pgtenant.tenants (key, organization, ledger)
        VALUES (p_key, p_organization, p_ledger) ON CONFLICT (key) DO NOTHING;
        SELECT * INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
    END IF;
    IF t.schema_name IS NULL AND NOT p_create THEN
        RAISE EXCEPTION USING ERRCODE = 'PTN01',
            MESSAGE = format('tenant %s has no live schema (forgotten at epoch %s)', p_key, t.forgotten_at_epoch);
    END IF;
    IF t.quarantine_cause IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTQ01',
            MESSAGE = format('tenant %s is quarantined: %s', p_key, t.quarantine_cause),
            DETAIL = json_build_object('cause', t.quarantine_cause, 'repair', t.quarantine_repair)::text;
    END IF;
    IF t.owner IS NOT NULL AND NOT (t.owner = p_replica AND t.owner_incarnation = p_incarnation) THEN
        SELECT * INTO o FROM pgtenant.replica_liveness l WHERE l.replica_id = t.owner;
        IF o.incarnation = t.owner_incarnation AND o.alive THEN
            PERFORM pgtenant.raise_held(p_key, t.owner, t.epoch, o.expires_at, false);
        END IF;
        v_took_over := CASE WHEN o.incarnation = t.owner_incarnation AND o.lock_held THEN 'stalled' ELSE 'dead' END;
    END IF;
    IF t.owner IS NULL AND t.reserved_for IS DISTINCT FROM p_replica AND t.reserved_until > now() THEN
        PERFORM pgtenant.raise_held(p_key, t.reserved_for, t.epoch, t.reserved_until, true);
    END IF;
    -- A tenant whose schema vanished behind pgtenant's back is the tenant's fault, not the
    -- database's: quarantine it (committed, so status shows it) instead of serving nothing.
    IF t.schema_name IS NOT NULL AND to_regnamespace(t.schema_name) IS NULL THEN
        PERFORM pgtenant.quarantine(p_key, format('schema %s is missing', t.schema_name),
            'restore the schema from a backup, or forget the tenant and create it again; then clear the quarantine',
            p_replica);
        RETURN QUERY SELECT t.epoch, t.schema_name, t.forgotten_at_epoch, t.schema_version, t.owner,
                            NULL::text, format('schema %s is missing', t.schema_name), t.lock_key;
        RETURN;
    END IF;
    -- The serialization point: waits for every fenced transaction in flight (they hold this
    -- lock shared until they end); fences that start later see the new epoch.
    PERFORM pg_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
    UPDATE pgtenant.tenants tt
       SET epoch = t.epoch + 1, owner = p_replica, owner_incarnation = p_incarnation,
           acquired_at = now(), reserved_for = NULL, reserved_until = NULL
     WHERE tt.key = p_key;
    IF v_took_over IS NOT NULL THEN
        INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
        VALUES (p_key, 'broken', t.epoch, t.owner, t.owner_incarnation,
                format('taken over by %s: owner %s', p_replica, v_took_over));
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'acquired', t.epoch + 1, p_replica, p_incarnation,
            CASE WHEN v_took_over IS NOT NULL THEN format('from %s (%s)', t.owner, v_took_over) END);
    RETURN QUERY SELECT t.epoch + 1, t.schema_name, t.forgotten_at_epoch, t.schema_version, t.owner, v_took_over, NULL::text, t.lock_key;
END $$;

-- Records the schema a creation made, in the creating transaction, after the tenant's
-- migrations ran in it: the lease must be the caller's, at this epoch.
CREATE FUNCTION pgtenant.schema_created(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint,
                                        p_secret text, p_schema text, p_version integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    IF to_regnamespace(p_schema) IS NULL THEN
        RAISE EXCEPTION 'pgtenant: schema % does not exist', p_schema;
    END IF;
    UPDATE pgtenant.tenants t SET schema_name = p_schema, schema_version = p_version
     WHERE t.key = p_key AND t.epoch = p_epoch AND t.owner = p_replica
       AND t.owner_incarnation = p_incarnation AND t.schema_name IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: tenant %s at epoch %s is not being created by replica %s', p_key, p_epoch, p_replica);
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'created', p_epoch, p_replica, p_incarnation, p_schema);
END $$;

-- Records a tenant's migration to p_version, in the fenced transaction that ran it.
CREATE FUNCTION pgtenant.schema_migrated(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint,
                                         p_secret text, p_version integer, p_detail text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    UPDATE pgtenant.tenants t SET schema_version = p_version
     WHERE t.key = p_key AND t.epoch = p_epoch AND t.owner = p_replica AND t.owner_incarnation = p_incarnation;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: tenant %s at epoch %s is not held by replica %s', p_key, p_epoch, p_replica);
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'migrated', p_epoch, p_replica, p_incarnation, p_detail);
END $$;

-- Quarantines a tenant whose migration failed: one the caller holds at p_epoch, or (p_epoch
-- NULL) one whose creation failed and rolled back, which may not even have a row yet. Not
-- retried until an operator clears it; any lease on it ends.
CREATE FUNCTION pgtenant.quarantine(p_key text, p_organization text, p_ledger text, p_epoch bigint,
                                    p_replica text, p_incarnation bigint, p_secret text,
                                    p_cause text, p_repair text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    IF p_epoch IS NULL THEN
        INSERT INTO pgtenant.tenants (key, organization, ledger)
        VALUES (p_key, p_organization, p_ledger) ON CONFLICT (key) DO NOTHING;
    END IF;
    SELECT * INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
    IF p_epoch IS NOT NULL AND NOT (t.epoch = p_epoch AND t.owner = p_replica AND t.owner_incarnation = p_incarnation) THEN
        RETURN false;
    END IF;
    IF p_epoch IS NULL AND (t.schema_name IS NOT NULL OR t.owner IS NOT NULL) THEN
        -- Created (or taken) by another replica meanwhile: its creation worked.
        RETURN false;
    END IF;
    PERFORM pgtenant.quarantine(p_key, p_cause, p_repair, p_replica);
    RETURN true;
END $$;

-- Ends leases, in one statement for a batch: clears the owner (optionally reserving the tenant
-- for a live replica for a short window), journals it and wakes waiting replicas. One row per
-- input: released false when the lease was no longer the caller's at that epoch. A reservation
-- for a replica that is not registered and alive is refused (PTH01): it would keep the tenant
-- from everyone, its previous owner included, for the whole window.
CREATE FUNCTION pgtenant.release(p_replica text, p_incarnation bigint, p_secret text,
                                 p_keys text[], p_epochs bigint[], p_events text[],
                                 p_reserve_for text[], p_reserve_ms integer[])
RETURNS TABLE (ord bigint, released boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_target text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN QUERY SELECT g::bigint, false FROM generate_subscripts(p_keys, 1) g;
        RETURN;
    END IF;
    FOR v_target IN SELECT DISTINCT r FROM unnest(p_reserve_for) r WHERE r IS NOT NULL LOOP
        IF NOT EXISTS (SELECT 1 FROM pgtenant.replica_liveness l WHERE l.replica_id = v_target AND l.alive) THEN
            RAISE EXCEPTION USING ERRCODE = 'PTH01',
                MESSAGE = format('cannot hand a tenant to replica %s: it is not a registered, live replica', v_target),
                HINT = 'hand off to a running replica (pgtenant.replica_status lists them), or hand off without a target';
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT r.ord, pgtenant.release(r.key, r.epoch, p_replica, p_incarnation, r.event, r.reserve_for, r.reserve_ms)
      FROM unnest(p_keys, p_epochs, p_events, p_reserve_for, p_reserve_ms)
           WITH ORDINALITY AS r(key, epoch, event, reserve_for, reserve_ms, ord)
     ORDER BY r.ord;
END $$;

-- Forgets a tenant under the caller's lease (V1's forget, with the caller's proof of identity).
CREATE FUNCTION pgtenant.forget(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint, p_secret text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: cannot forget tenant %s: replica %s incarnation %s is not registered', p_key, p_replica, p_incarnation);
    END IF;
    RETURN pgtenant.forget(p_key, p_epoch, p_replica, p_incarnation);
END $$;

-- Restores a forgotten tenant as a new life for the caller (V1's restore, with the caller's
-- proof of identity).
CREATE FUNCTION pgtenant.restore(p_key text, p_replica text, p_incarnation bigint, p_secret text,
                                 p_new_schema_for_epoch text)
RETURNS TABLE (epoch bigint, schema_name text, schema_version integer, lock_key integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    RETURN QUERY SELECT * FROM pgtenant.restore(p_key, p_replica, p_incarnation, p_new_schema_for_epoch);
END $$;

-- ---------------------------------------------------------------------------------------
-- Operators: clearing quarantines, recording sweeps, pruning.
-- ---------------------------------------------------------------------------------------

ALTER FUNCTION pgtenant.clear_quarantine(text, text) SECURITY DEFINER;
ALTER FUNCTION pgtenant.clear_quarantine(text, text) SET search_path = pg_catalog, pgtenant;

-- Records that the sweep dropped p_schema (a trashed one, or a masked one outside the trash).
CREATE FUNCTION pgtenant.record_swept(p_schema text, p_tenant text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF to_regnamespace(p_schema) IS NOT NULL THEN
        RAISE EXCEPTION 'pgtenant: schema % still exists; drop it before recording the sweep', p_schema;
    END IF;
    UPDATE pgtenant.trash tr SET swept_at = now() WHERE tr.schema_name = p_schema AND tr.swept_at IS NULL;
    INSERT INTO pgtenant.history (tenant_key, event, detail) VALUES (p_tenant, 'swept', p_schema);
END $$;

-- Prunes journal rows older than p_history_ms, and replicas that ended (deregistered or
-- expired) more than p_replicas_ms ago and that no tenant names.
CREATE FUNCTION pgtenant.prune(p_history_ms bigint, p_replicas_ms bigint)
RETURNS TABLE (history_pruned bigint, replicas_pruned bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_history bigint;
    v_replicas bigint;
BEGIN
    DELETE FROM pgtenant.history h WHERE h.at < now() - p_history_ms * interval '1 millisecond';
    GET DIAGNOSTICS v_history = ROW_COUNT;
    DELETE FROM pgtenant.replicas r
     WHERE coalesce(r.released_at, r.expires_at, r.started_at) < now() - p_replicas_ms * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM pgtenant.replica_liveness l WHERE l.replica_id = r.replica_id AND l.lock_held)
       AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.owner = r.replica_id);
    GET DIAGNOSTICS v_replicas = ROW_COUNT;
    RETURN QUERY SELECT v_history, v_replicas;
END $$;

-- ---------------------------------------------------------------------------------------
-- Privileges.
-- ---------------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA pgtenant FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgtenant FROM PUBLIC;
-- Schema USAGE for everyone: a role the work switched to (SET ROLE) must still reach the
-- fence, whose scrub switches it back. It shows names only; no table is granted to PUBLIC.
GRANT USAGE ON SCHEMA pgtenant TO PUBLIC;
-- Harmless for anyone: they change only the caller's own session or read what a view shows.
GRANT EXECUTE ON FUNCTION pgtenant.fence(text, bigint, integer, text), pgtenant.fence(text, bigint),
                          pgtenant.fence_read(text, bigint, integer, text), pgtenant.reset_session(text),
                          pgtenant.fence_refusal(text, bigint, bigint, text, text, bigint),
                          pgtenant.lock_namespace(), pgtenant.tenant_lock_namespace(),
                          pgtenant.replica_status_rows()
      TO PUBLIC;

-- Grants the application's role (p_app) and the operator role (p_operator) what they need and
-- no more, and records them; NULL leaves a role as it is. Idempotent. Run by `pgtenant setup`
-- as the control plane's owner.
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SCHEMA pgtenant TO %I', p_app);
        -- The fence reads the tenant row with the caller's rights; the views are for status.
        EXECUTE format('GRANT SELECT ON pgtenant.tenants, pgtenant.lease_status, pgtenant.replica_status,
                               pgtenant.replica_liveness, pgtenant.refinery_schema_history TO %I', p_app);
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
            pgtenant.restore(text, text, bigint, text, text)
            TO %I', p_app);
        -- Tenant schemas are created, and owned, by the application's role.
        EXECUTE format('GRANT CREATE ON DATABASE %I TO %I', current_database(), p_app);
        UPDATE pgtenant.config SET app_role = p_app;
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SCHEMA pgtenant TO %I', p_operator);
        EXECUTE format('GRANT SELECT ON pgtenant.tenants, pgtenant.trash, pgtenant.history, pgtenant.replicas,
                               pgtenant.config, pgtenant.lease_status, pgtenant.replica_status,
                               pgtenant.replica_liveness, pgtenant.refinery_schema_history TO %I', p_operator);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.clear_quarantine(text, text),
            pgtenant.record_swept(text, text),
            pgtenant.prune(bigint, bigint)
            TO %I', p_operator);
        UPDATE pgtenant.config SET operator_role = p_operator;
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
