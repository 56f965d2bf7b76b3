-- Retire the V1 overloads (#20): a migration written, tested, and deliberately NOT in
-- migrations/ yet. Applying it is a release decision; read all of this first.
--
-- What it retires. V3 (least privilege) gave every write a SECURITY DEFINER function that
-- authenticates the caller, and kept the V1 functions with their signatures and bodies, so that
-- replicas of the previous release, 0.1.0-pre (control plane V2), keep working while `setup`
-- runs under them (CHANGELOG, upgrade notes; tests/least_privilege.rs,
-- a_v2_control_plane_is_upgraded_under_a_running_replica_of_the_previous_release). Five are
-- still live:
--
--     pgtenant.acquire(text, text, text, text, bigint, boolean)   -- now ( … , text, boolean)
--     pgtenant.quarantine(text, text, text, text)                  -- now the nine-argument one
--     pgtenant.release(text, bigint, text, bigint, text, text, integer) -- now the batch one
--     pgtenant.forget(text, bigint, text, bigint)                  -- now ( … , text)
--     pgtenant.restore(text, text, bigint, text)                   -- now ( … , text, text)
--
-- (pgtenant.fence(text, bigint), the sixth V1 overload, stays: it is the fence for psql and SQL
-- callers, DESIGN §4, granted to PUBLIC and used by the tests; it calls the current fence.)
--
-- The current library calls none of them, but the current functions do: quarantine and
-- release are V3 wrappers that authenticate and then call the V1 body, and acquire calls the
-- V1 quarantine (forget and restore did too until V12 made each one function). So this
-- migration first inlines those bodies, unchanged, into the current functions (same
-- signatures, same privileges), then drops the overloads.
--
-- When it may be applied. Only once no supported release calls the overloads. 0.1.0-pre calls
-- all five, and the release that ships control plane V8 (and V9 to V12) is rolled out by running
-- setup while 0.1.0-pre replicas still run. So it cannot ship in that release: it belongs in
-- the release after it, as migrations/V<next>__retire_v1_overloads.sql, whose upgrade notes
-- then say "upgrade from 0.1.0-pre through the previous release first; every 0.1.0-pre replica
-- must be gone before setup", and whose least_privilege test upgrades from that previous
-- release's control plane instead of V2.
--
-- It refuses to run on a control plane whose ten functions are not exactly the ones it was
-- written against (V8's, and V12's forget and restore): a later migration that changed one
-- of them would otherwise be undone by the bodies below. Then rewrite those bodies from
-- sql/schema.sql and update the fingerprints (tests/schema.rs prints the current ones when
-- this check fails there).

DO $$
DECLARE
    v_expected CONSTANT text[][] := ARRAY[
        ['pgtenant.acquire(text,text,text,text,bigint,boolean)', '770f19797e6fe49a06a9e425d59aa5ec'],
        ['pgtenant.acquire(text,text,text,text,bigint,text,boolean)', 'c6f4af81cca0a17ca8324eb190316f53'],
        ['pgtenant.forget(text,bigint,text,bigint)', 'e68ac944f1764bc9ac8eb5d16269eb7a'],
        ['pgtenant.forget(text,bigint,text,bigint,text)', '306ec6f85c0825b968c89640a75e7443'],
        ['pgtenant.quarantine(text,text,text,text)', '9f16122a5a2a92453262aac6e1c955fd'],
        ['pgtenant.quarantine(text,text,text,bigint,text,bigint,text,text,text)', '36eeb9563688da377586802518949892'],
        ['pgtenant.release(text,bigint,text,bigint,text,text,integer)', '352d58d650e1394c648c87eb5c3f4c57'],
        ['pgtenant.release(text,bigint,text,text[],bigint[],text[],text[],integer[])', '2c89336923a89c3f70dd47f41eac6bfd'],
        ['pgtenant.restore(text,text,bigint,text)', '802b7714fe0ad31ba0ab4b7c0c6b979e'],
        ['pgtenant.restore(text,text,bigint,text,text)', '434a57cc704c9546e67104437c966cb6']];
    v_found text;
BEGIN
    FOR i IN 1 .. array_length(v_expected, 1) LOOP
        SELECT md5(concat_ws('|', p.prosrc, p.prosecdef, p.provolatile, p.proconfig::text)) INTO v_found
          FROM pg_catalog.pg_proc p WHERE p.oid = pg_catalog.to_regprocedure(v_expected[i][1]);
        IF v_found IS DISTINCT FROM v_expected[i][2] THEN
            RAISE EXCEPTION 'retire_v1_overloads: % is not the function this migration was written against (fingerprint %, expected %)',
                v_expected[i][1], coalesce(v_found, 'none: the function is missing'), v_expected[i][2]
                USING HINT = 'a later migration changed it: rewrite this migration''s bodies from sql/schema.sql and update the fingerprints';
        END IF;
    END LOOP;
END $$;

-- V3's quarantine with the V1 body inlined (its PERFORM pgtenant.quarantine(…) call).
CREATE OR REPLACE FUNCTION pgtenant.quarantine(p_key text, p_organization text, p_ledger text, p_epoch bigint,
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
    UPDATE pgtenant.tenants tt
       SET quarantine_cause = p_cause, quarantine_repair = p_repair, quarantined_at = now(),
           owner = NULL, owner_incarnation = NULL
     WHERE tt.key = p_key;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, detail)
    SELECT p_key, 'quarantined', tt.epoch, p_replica, p_cause FROM pgtenant.tenants tt WHERE tt.key = p_key;
    RETURN true;
END $$;

-- V4's acquire with the V1 quarantine inlined (a tenant whose schema vanished).
CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text,
                                            p_replica text, p_incarnation bigint, p_secret text, p_create boolean)
RETURNS TABLE (epoch bigint, schema_name text, forgotten_at_epoch bigint, schema_version integer,
               previous_owner text, took_over text, quarantine text, lock_key integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    me pgtenant.replicas%ROWTYPE;
    o record;
    v_took_over text;
    v_epoch bigint;
    v_cause text;
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
        v_cause := format('schema %s is missing', t.schema_name);
        UPDATE pgtenant.tenants tt
           SET quarantine_cause = v_cause,
               quarantine_repair = 'restore the schema from a backup, or forget the tenant and create it again; then clear the quarantine',
               quarantined_at = now(), owner = NULL, owner_incarnation = NULL
         WHERE tt.key = p_key;
        INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, detail)
        SELECT p_key, 'quarantined', tt.epoch, p_replica, v_cause FROM pgtenant.tenants tt WHERE tt.key = p_key;
        RETURN QUERY SELECT t.epoch, t.schema_name, t.forgotten_at_epoch, t.schema_version, t.owner,
                            NULL::text, v_cause, t.lock_key;
        RETURN;
    END IF;
    -- The serialization point: waits for every fenced transaction in flight (they hold this
    -- lock shared until they end); fences that start later see the new epoch.
    PERFORM pg_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
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
END $$;

-- V3's batch release with the V1 single release inlined: one tenant after the other, in the
-- order given, as the V1 calls ran.
CREATE OR REPLACE FUNCTION pgtenant.release(p_replica text, p_incarnation bigint, p_secret text,
                                            p_keys text[], p_epochs bigint[], p_events text[],
                                            p_reserve_for text[], p_reserve_ms integer[])
RETURNS TABLE (ord bigint, released boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_target text;
    v record;
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
    FOR v IN
        SELECT u.key, u.epoch, u.event, u.reserve_for, u.reserve_ms, u.n
          FROM unnest(p_keys, p_epochs, p_events, p_reserve_for, p_reserve_ms)
               WITH ORDINALITY AS u(key, epoch, event, reserve_for, reserve_ms, n)
         ORDER BY u.n
    LOOP
        UPDATE pgtenant.tenants tt
           SET owner = NULL, owner_incarnation = NULL,
               reserved_for = v.reserve_for,
               reserved_until = CASE WHEN v.reserve_for IS NOT NULL
                                     THEN now() + v.reserve_ms * interval '1 millisecond' END
         WHERE tt.key = v.key AND tt.epoch = v.epoch AND tt.owner = p_replica AND tt.owner_incarnation = p_incarnation;
        released := FOUND;
        IF released THEN
            INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
            VALUES (v.key, v.event, v.epoch, p_replica, p_incarnation,
                    CASE WHEN v.reserve_for IS NOT NULL THEN 'reserved for ' || v.reserve_for END);
            PERFORM pg_notify('pgtenant_free', v.key);
        END IF;
        ord := v.n;
        RETURN NEXT;
    END LOOP;
END $$;

-- forget(…, text) and restore(…, text) need nothing: since V12 they no longer call the V1
-- bodies (each is one self-contained function that also vouches for the schemas it renames).

DROP FUNCTION pgtenant.acquire(text, text, text, text, bigint, boolean);
DROP FUNCTION pgtenant.quarantine(text, text, text, text);
DROP FUNCTION pgtenant.release(text, bigint, text, bigint, text, text, integer);
DROP FUNCTION pgtenant.forget(text, bigint, text, bigint);
DROP FUNCTION pgtenant.restore(text, text, bigint, text);
