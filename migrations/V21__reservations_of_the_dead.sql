-- A tenant handed to a replica that then died stays reserved for it until the reservation runs
-- out (5 s by default), and `acquire` refused everyone else meanwhile: its next home, which
-- rebalancing sends to take over what a dead replica leaves behind (`orphaned_homes` lists
-- such a tenant at once), was refused, and a request for it waited the window out. A
-- reservation now binds only while the replica it is for is alive (`replica_liveness.alive`:
-- lease session holding its liveness lock, registered, not expired); a live target keeps it,
-- as before. The liveness read (pg_locks) runs only for a free tenant reserved for another
-- replica. The rest of the body is V11's. CREATE OR REPLACE keeps the grants.

CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text, p_replica text,
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
    -- A reservation binds while the replica it is for is alive: one whose lease session is
    -- gone, expired or deregistered will not pick the tenant up (V21).
    IF t.owner IS NULL AND t.reserved_for IS DISTINCT FROM p_replica AND t.reserved_until > now()
       AND EXISTS (SELECT 1 FROM pgtenant.replica_liveness l
                    WHERE l.replica_id = t.reserved_for AND l.alive) THEN
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
