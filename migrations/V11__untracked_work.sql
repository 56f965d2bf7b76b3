-- pgtenant control plane, version 11: work the router stopped tracking (issue 25), and the end of
-- a fenced transaction read from something the work cannot change (issue 26, items 1 and 4).
--
-- * `pgtenant.acquire` (a new overload with bounds) no longer waits without end for the fenced
--   transactions of a superseded lease. A replica that is paused or cut off may leave a
--   backend inside a fenced transaction that no timeout ends: blocked sending a large result
--   (`ClientWrite`) or in the middle of a `COPY FROM STDIN` (`ClientRead`), holding the tenant's
--   fence lock (shared) or, under REPEATABLE READ and SERIALIZABLE, its row (KEY SHARE). Seen:
--   33 s and counting in `active | ClientWrite`, every acquisition waiting on it. The acquirer
--   now ends such backends (pg_terminate_backend, waiting for each to exit: a backend gone from
--   pg_stat_activity commits nothing more): at once when the owner it takes over is dead or
--   expired, after a grace period when the lease was given back (work an abandon left running
--   may still commit, and usually does within milliseconds). Every wait is bounded; a holder
--   that cannot be ended (no right to terminate it, a prepared transaction) is a typed refusal
--   that names it and says what to do.
-- * The seal of a dead or expired session-fenced owner moves into the same function, after the
--   row lock, so the acquisition is one call that the stall rule covers too.
-- * A prepared transaction (`PREPARE TRANSACTION` inside a fenced transaction, where
--   max_prepared_transactions > 0) that holds locks on the tenant's schema or its fence lock
--   keeps the epoch from moving: raised as PTX01 with the transactions' names, which the
--   acquirer rolls back (it is the role that prepared them) before trying again. So a
--   COMMIT PREPARED can only ever land in the epoch that prepared it (G3), and a prepared
--   transaction no longer blocks takeovers for good (G9).
-- * Fences take their shared lock under every isolation level (REPEATABLE READ and SERIALIZABLE
--   took only the row), so every fence in flight is visible in pg_locks, and set the
--   transaction-local `pgtenant.fenced`; the commit checks it with
--   `SELECT current_setting('pgtenant.fenced', true)::pgtenant.fenced_transaction`, which fails
--   (check violation, constraint `the_work_ended_the_fenced_transaction`) once anything ended
--   the transaction the fence began: the work's own COMMIT, ROLLBACK or PREPARE TRANSACTION,
--   whatever it did to session characteristics, and whatever the server reports.
--
-- Signatures of V10 are kept (replicas of V10 keep running across the upgrade); V10's
-- acquire(7) and seal_owner keep their behaviour for them.

CREATE DOMAIN pgtenant.fenced_transaction AS text
    CONSTRAINT the_work_ended_the_fenced_transaction CHECK (VALUE IS NOT NULL AND VALUE = 'on');
COMMENT ON DOMAIN pgtenant.fenced_transaction IS
    'The commit check of a fenced transaction: current_setting(''pgtenant.fenced'', true) cast to this fails once the transaction the fence began has ended.';

-- ---------------------------------------------------------------------------------------
-- Who holds a tenant: the backends inside its fenced transactions, and prepared transactions.
-- ---------------------------------------------------------------------------------------
CREATE FUNCTION pgtenant.fence_holders(p_lock integer)
 RETURNS integer[]
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    SELECT array_agg(DISTINCT l.pid ORDER BY l.pid)
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid = pgtenant.tenant_lock_namespace()::oid AND l.objid = p_lock::oid
       AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND l.mode = 'ShareLock' AND l.pid IS NOT NULL AND l.pid <> pg_backend_pid()
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.fence_holders(integer) FROM PUBLIC;

CREATE FUNCTION pgtenant.prepared_holders(p_schema text, p_lock integer)
 RETURNS text
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    -- A prepared transaction keeps every lock it held, with no backend (pid NULL), under the
    -- virtual transaction that holds the lock on its own transaction id. What it did to the
    -- tenant's ledger holds a lock on one of the schema's relations or on the schema itself; a
    -- fence, the fence lock.
    WITH prepared AS (
        SELECT x.gid, x.owner, x.prepared, l.virtualtransaction
          FROM pg_prepared_xacts x
          JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = x.transaction
                         AND l.pid IS NULL
         WHERE x.database = current_database()
    )
    SELECT json_agg(json_build_object('gid', p.gid, 'owner', p.owner, 'prepared', p.prepared)
                    ORDER BY p.prepared)::text
      FROM prepared p
     WHERE EXISTS (
           SELECT 1 FROM pg_locks l
            WHERE l.virtualtransaction = p.virtualtransaction AND l.pid IS NULL
              AND ((l.locktype = 'relation'
                    AND l.relation IN (SELECT c.oid FROM pg_class c
                                        WHERE c.relnamespace = to_regnamespace(p_schema)))
                   OR (l.locktype = 'object' AND l.classid = 'pg_namespace'::regclass
                       AND l.objid = to_regnamespace(p_schema))
                   OR (l.locktype = 'advisory' AND l.objsubid = 2
                       AND l.classid = pgtenant.tenant_lock_namespace()::oid
                       AND l.objid = p_lock::oid)))
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.prepared_holders(text, integer) FROM PUBLIC;

-- Ends the backends inside the tenant's fenced transactions and waits for each to exit.
-- Returns NULL when they are gone, or why they could not be ended.
CREATE FUNCTION pgtenant.end_fence_holders(p_lock integer, p_timeout_ms bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
 SET client_min_messages TO 'error'
AS $function$
DECLARE
    v_pid integer;
    v_left integer[];
BEGIN
    FOREACH v_pid IN ARRAY coalesce(pgtenant.fence_holders(p_lock), '{}') LOOP
        BEGIN
            -- With a timeout it waits for the backend to exit (false: still there).
            IF NOT pg_terminate_backend(v_pid, greatest(p_timeout_ms, 1)) THEN
                v_left := v_left || v_pid;
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            RETURN format('backend %s holds the fence lock and the control plane''s owner (%s) may not terminate it', v_pid, current_user);
        END;
    END LOOP;
    IF v_left IS NOT NULL THEN
        RETURN format('backends %s were terminated but did not exit within %s ms', v_left, p_timeout_ms);
    END IF;
    RETURN NULL;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.end_fence_holders(integer, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- acquire, bounded: (…, p_create, grace ms, wait ms, terminate timeout ms).
-- ---------------------------------------------------------------------------------------
CREATE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text, p_replica text,
                                 p_incarnation bigint, p_secret text, p_create boolean,
                                 p_grace_ms integer, p_wait_ms integer, p_terminate_ms bigint)
 RETURNS TABLE(epoch bigint, schema_name text, forgotten_at_epoch bigint, schema_version integer, previous_owner text, took_over text, quarantine text, lock_key integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    me pgtenant.replicas%ROWTYPE;
    o record;
    v_took_over text;
    v_epoch bigint;
    v_started timestamptz := clock_timestamp();
    v_deadline timestamptz := clock_timestamp() + greatest(p_wait_ms, 1) * interval '1 millisecond';
    v_lock_timeout text := current_setting('lock_timeout');
    v_why text;
    v_prepared text;
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
    IF p_create THEN
        INSERT INTO pgtenant.tenants (key, organization, ledger)
        VALUES (p_key, p_organization, p_ledger) ON CONFLICT (key) DO NOTHING;
    END IF;
    -- The row, in slices of lock_timeout: between slices, a fence of a superseded lease that
    -- holds it (REPEATABLE READ and SERIALIZABLE fences lock it KEY SHARE) is ended. Another
    -- acquisition or a release holds it for milliseconds and is waited for.
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            SELECT * INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            SELECT * INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key;
            IF t.owner IS NOT NULL AND NOT (t.owner = p_replica AND t.owner_incarnation = p_incarnation) THEN
                SELECT * INTO o FROM pgtenant.replica_liveness l WHERE l.replica_id = t.owner;
                IF o.incarnation = t.owner_incarnation AND o.alive THEN
                    PERFORM pgtenant.raise_held(p_key, t.owner, t.epoch, o.expires_at, false);
                END IF;
            END IF;
            IF t.owner IS NOT NULL OR clock_timestamp() >= v_started + p_grace_ms * interval '1 millisecond' THEN
                v_why := pgtenant.end_fence_holders(t.lock_key, p_terminate_ms);
            END IF;
            IF clock_timestamp() >= v_deadline THEN
                RAISE EXCEPTION USING ERRCODE = 'PTL05',
                    MESSAGE = format('tenant %s: its row stayed locked for %s ms', p_key, p_wait_ms),
                    DETAIL = coalesce(v_why, format('holders of its fence lock: %s', coalesce(pgtenant.fence_holders(t.lock_key)::text, 'none'))),
                    HINT = 'retry; if it lasts, pg_stat_activity and pg_locks show the backends that hold it';
            END IF;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    IF t.key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTN01', MESSAGE = format('tenant %s does not exist', p_key);
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
        -- Session fencing: before the epoch moves, the owner's incarnation is sealed and its
        -- data sessions terminated (a no-op for an owner that did not declare it). The epoch's
        -- UPDATE seals again (trigger seal_on_takeover).
        PERFORM pgtenant.seal_incarnation(t.owner, t.owner_incarnation);
        PERFORM pgtenant.terminate_bound(t.owner, t.owner_incarnation, NULL, p_terminate_ms);
    END IF;
    IF t.owner IS NULL AND t.reserved_for IS DISTINCT FROM p_replica AND t.reserved_until > now() THEN
        PERFORM pgtenant.raise_held(p_key, t.reserved_for, t.epoch, t.reserved_until, true);
    END IF;
    -- A tenant whose schema vanished behind pgtenant's back is the tenant's fault, not the
    -- database's: quarantine it (committed, so status shows it) instead of serving nothing.
    -- (V1's quarantine(4), inlined: sql/retire_v1_overloads.sql drops it.)
    IF t.schema_name IS NOT NULL AND to_regnamespace(t.schema_name) IS NULL THEN
        UPDATE pgtenant.tenants tt
           SET quarantine_cause = format('schema %s is missing', t.schema_name),
               quarantine_repair = 'restore the schema from a backup, or forget the tenant and create it again; then clear the quarantine',
               quarantined_at = now(), owner = NULL, owner_incarnation = NULL
         WHERE tt.key = p_key;
        INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, detail)
        VALUES (p_key, 'quarantined', t.epoch, p_replica, format('schema %s is missing', t.schema_name));
        RETURN QUERY SELECT t.epoch, t.schema_name, t.forgotten_at_epoch, t.schema_version, t.owner,
                            NULL::text, format('schema %s is missing', t.schema_name), t.lock_key;
        RETURN;
    END IF;
    -- A prepared transaction that touched the tenant could be committed after the epoch moved:
    -- the epoch stays until it is gone (the caller rolls it back and tries again).
    IF t.schema_name IS NOT NULL AND EXISTS (SELECT 1 FROM pg_prepared_xacts x WHERE x.database = current_database()) THEN
        v_prepared := pgtenant.prepared_holders(t.schema_name, t.lock_key);
        IF v_prepared IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'PTX01',
                MESSAGE = format('tenant %s is held by prepared transactions (PREPARE TRANSACTION inside its work): its epoch cannot move until they are gone', p_key),
                DETAIL = v_prepared,
                HINT = 'ROLLBACK PREPARED each, as the role that prepared it; pgtenant does this itself when it can';
        END IF;
    END IF;
    -- The serialization point: every fenced transaction in flight holds this lock shared until
    -- it ends; fences that start later see the new epoch. Those of a superseded lease are ended
    -- rather than waited for without end (see the header).
    LOOP
        EXIT WHEN pg_try_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
        IF v_took_over IS NOT NULL OR clock_timestamp() >= v_started + p_grace_ms * interval '1 millisecond' THEN
            v_why := pgtenant.end_fence_holders(t.lock_key, p_terminate_ms);
        END IF;
        IF clock_timestamp() >= v_deadline THEN
            RAISE EXCEPTION USING ERRCODE = 'PTL05',
                MESSAGE = format('tenant %s: fenced transactions of its previous lease still held it after %s ms', p_key, p_wait_ms),
                DETAIL = coalesce(v_why, format('holders of its fence lock: %s', coalesce(pgtenant.fence_holders(t.lock_key)::text, 'none'))),
                HINT = 'retry; to let pgtenant end such backends itself, the control plane''s owner needs the right to terminate them (a member of pg_signal_backend, or of the application role)';
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
    v_epoch := pgtenant.next_epoch(t.epoch);
    UPDATE pgtenant.tenants tt
       SET epoch = v_epoch, owner = p_replica, owner_incarnation = p_incarnation,
           acquired_at = now(), reserved_for = NULL, reserved_until = NULL
     WHERE tt.key = p_key;
    IF v_took_over IS NOT NULL THEN
        INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
        VALUES (p_key, 'broken', t.epoch, t.owner, t.owner_incarnation,
                format('taken over by %s: owner %s', p_replica, v_took_over));
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'acquired', v_epoch, p_replica, p_incarnation,
            CASE WHEN v_took_over IS NOT NULL THEN format('from %s (%s)', t.owner, v_took_over) END);
    RETURN QUERY SELECT v_epoch, t.schema_name, t.forgotten_at_epoch, t.schema_version, t.owner, v_took_over, NULL::text, t.lock_key;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.acquire(text, text, text, text, bigint, text, boolean, integer, integer, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- The signalled fences: the shared lock under every isolation level, and the commit check's
-- setting. Same signatures and results.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.fence_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_epoch bigint;
    v_owner text;
    v_schema text;
    v_forgotten bigint;
    v_lock integer;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885828146, p_lock);
        SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.tenants t WHERE t.key OPERATOR(pg_catalog.=) p_key;
    ELSE
        -- The snapshot predates any lock: the row lock refuses a row updated since (40001)
        -- and is the serialization point; the shared lock after it (the order acquire takes
        -- them in) only makes the fence visible to an acquirer that must end it.
        SELECT r.epoch, r.owner, r.schema_name, r.forgotten_at_epoch, r.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.lock_tenant_row(p_key) r;
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885828146, p_lock);
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
    PERFORM pg_catalog.set_config('search_path', v_schema OPERATOR(pg_catalog.||) ', pg_temp', true),
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true),
            pg_catalog.set_config('default_transaction_read_only', 'off', true),
            pg_catalog.set_config('pgtenant.fenced', 'on', true);
    RETURN v_schema;
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_read_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_epoch bigint;
    v_owner text;
    v_schema text;
    v_forgotten bigint;
    v_lock integer;
BEGIN
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
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true),
            pg_catalog.set_config('default_transaction_read_only', 'off', true),
            pg_catalog.set_config('pgtenant.fenced', 'on', true);
    RETURN v_schema;
END $function$;

-- ---------------------------------------------------------------------------------------
-- The fences of connections without the transaction signal (and session fencing's enter):
-- the commit check's setting too; the fence's shared lock under every isolation level.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
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
        -- The row lock is the serialization point here; the shared lock after it only makes
        -- the fence visible to an acquirer that must end it (V11).
        SELECT r.epoch, r.owner, r.schema_name, r.forgotten_at_epoch, r.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.lock_tenant_row(p_key) r;
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885828146, p_lock);
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
    PERFORM pg_catalog.set_config('pgtenant.fenced', 'on', true);
    OPEN v_marker FOR SELECT 1;
    RETURN v_schema;
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_read(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
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
    PERFORM pg_catalog.set_config('pgtenant.fenced', 'on', true);
    OPEN v_marker FOR SELECT 1;
    RETURN v_schema;
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.enter(p_key text, p_schema text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_marker refcursor := 'pgtenant_fenced';
BEGIN
    IF pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
       OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
       OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true) THEN
        PERFORM pgtenant.reset_session(p_key);
    END IF;
    PERFORM pg_catalog.set_config('search_path', p_schema OPERATOR(pg_catalog.||) ', pg_temp', true);
    PERFORM pg_catalog.set_config('pgtenant.fenced', 'on', true);
    OPEN v_marker FOR SELECT 1;
END $function$;

-- ---------------------------------------------------------------------------------------
-- The application's role may call the new acquire (grant_roles, and the roles granted before).
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    PERFORM pgtenant.grant_roles_before_v10(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON pgtenant.lease_rows, pgtenant.fleet_status TO %I', p_app);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.acquire(text, text, text, text, bigint, text, boolean, integer, integer, bigint)
            TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON pgtenant.lease_rows, pgtenant.fleet_status, pgtenant.sweep_backlog TO %I',
                       p_operator);
        -- A view's functions run with its reader's rights.
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.sweep_backlog_rows(bigint) TO %I', p_operator);
    END IF;
END $function$;
SELECT pgtenant.grant_roles(c.app_role, c.operator_role) FROM pgtenant.config c;
