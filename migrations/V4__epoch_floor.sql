-- pgtenant control plane, version 4: epochs are never issued twice, also across a lossy
-- database failover (DESIGN G2, §9).
--
-- The problem. An asynchronous standby can be promoted without the primary's last commits,
-- acquisitions among them: measured (tests/failover.rs), the promoted server then hands out the
-- same epoch numbers again, possibly to another owner. The fence compares epochs, not owners,
-- so a handle of a lost acquisition (a paused or partitioned writer whose client-side checks
-- did not stop it) would pass the fence of the re-issued epoch and commit beside its new owner.
--
-- The floor. Every epoch is now issued as pgtenant.next_epoch(current) =
-- greatest(current + 1, (timeline - 1) << 40), where timeline is the server's current WAL
-- timeline. A promotion always starts a new, higher timeline, so every epoch issued after it is
-- at least (N - 1) * 2^40 on timeline N, above every epoch issued on an older timeline (each
-- below (N - 1) * 2^40 as long as one tenant sees fewer than 2^40, about 1.1e12, acquisitions on
-- one timeline), whether or not those reached the standby. A handle of a lost acquisition can
-- therefore never match a tenant's epoch again: the fence itself refuses it, whatever the
-- clocks, pauses or network did. On the first timeline the floor is 0 and nothing changes.
--
-- The timeline comes from pg_walfile_name(pg_current_wal_lsn()): exact from the moment the
-- promoted server accepts writes. pg_control_checkpoint()'s timeline_id is not: it changes only
-- when the first checkpoint on the new timeline completes, which promotion does not wait for.
--
-- What the floor relies on (README, "Database failover"): timeline IDs grow along the chain of
-- promotions. PostgreSQL gives a promoted standby the next ID above every timeline history file
-- it can see (pg_wal and the WAL archive); two standbys promoted one after the other from the
-- same old timeline, without a shared archive, could pick the same ID. Timelines above 2^23
-- would overflow the 63 bits: epoch_floor() fails on them instead of wrapping.
--
-- Changed here, and nothing else in these functions: the epoch computation, `t.epoch + 1`
-- becomes `v_epoch := pgtenant.next_epoch(t.epoch)` in
--   * pgtenant.acquire(text, text, text, text, bigint, text, boolean)  (V3, this release),
--   * pgtenant.acquire(text, text, text, text, bigint, boolean)        (V1, previous release's
--     replicas during a rolling upgrade),
--   * pgtenant.restore(text, text, bigint, text)                       (V1; V3's
--     restore(text, text, bigint, text, text) calls it and is unchanged). restore checks the
--     new life's schema name against that epoch, and the client derives the name from
--     pgtenant.next_epoch(epoch) (src/forget.rs), so both agree.
-- forget issues no epoch (it masks the current one, and a new life is acquired or restored),
-- so it is unchanged.
--
-- Incarnations are re-issued too after a lossy failover: a registration the standby never saw
-- is lost, and the replica's next registration gets the same number again. That is safe
-- without a floor, for two reasons:
--   * every control-plane function acts for (replica, incarnation) only when the caller
--     presents that incarnation's secret (pgtenant.authenticate). A re-issued number comes with
--     a fresh random secret, so a survivor of the lost incarnation that still holds the old
--     secret is refused (PTA01) and can act for nobody;
--   * no lease can name a lost incarnation: the promoted server replayed a prefix of the old
--     primary's WAL, and an incarnation's registration precedes each of its acquisitions in
--     that WAL, so if any of its acquisitions survived, its registration survived as well, and
--     the number is not issued again.
-- Anything that trusted an incarnation number without its secret would lose this: session
-- binding (DESIGN §5) must authenticate with the secret, as every function here does.
-- (tests/failover.rs: a_lossy_failover_reissues_an_incarnation_but_not_its_secret.)

-- The lowest epoch this server may issue now: (timeline - 1) << 40, written as a
-- multiplication, which fails ("bigint out of range") past 2^23 timelines where a shift would
-- wrap around silently. Plain SQL, schema-qualified and without a SET clause, so that the
-- planner inlines it: measured on PostgreSQL 15, 0.14 us a call (200 000 calls in 64 ms, 37 ms
-- of which is the loop itself), against 1.2 us as PL/pgSQL and 2.5 us with SET search_path.
-- Cheap enough for a fence to call on every transaction (see README, "Database failover").
CREATE FUNCTION pgtenant.epoch_floor() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    -- A WAL file name is 24 hex digits: timeline, log, segment; the first 8 are the timeline.
    SELECT ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(
                pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint)
            OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) 1099511627776
$$;
COMMENT ON FUNCTION pgtenant.epoch_floor() IS
    'The lowest epoch this server issues: (timeline - 1) << 40, so no epoch of an older timeline (lost in a failover or not) is ever issued again.';

-- The epoch an acquisition (or restore) moves a tenant to from p_current.
CREATE FUNCTION pgtenant.next_epoch(p_current bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT GREATEST(p_current OPERATOR(pg_catalog.+) 1, pgtenant.epoch_floor())
$$;

-- Both only read the server's WAL position: harmless for anyone. The application's role calls
-- next_epoch to name a restored life's schema.
GRANT EXECUTE ON FUNCTION pgtenant.epoch_floor(), pgtenant.next_epoch(bigint) TO PUBLIC;

-- ---------------------------------------------------------------------------------------
-- V3's acquire: only the epoch computation changes.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text,
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
    v_epoch bigint;
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

-- ---------------------------------------------------------------------------------------
-- V1's acquire (replicas of the previous release): only the epoch computation changes.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text,
                                 p_replica text, p_incarnation bigint, p_create boolean)
RETURNS TABLE (epoch bigint, schema_name text, forgotten_at_epoch bigint,
               schema_version integer, previous_owner text, took_over text, quarantine text,
               lock_key integer)
LANGUAGE plpgsql AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    me pgtenant.replicas%ROWTYPE;
    o record;
    v_took_over text;
    v_epoch bigint;
BEGIN
    SELECT * INTO me FROM pgtenant.replicas r WHERE r.replica_id = p_replica;
    IF NOT FOUND OR me.incarnation <> p_incarnation OR me.released_at IS NOT NULL OR me.expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered and alive', p_replica, p_incarnation);
    END IF;
    SELECT * INTO t FROM pgtenant.tenants WHERE key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        IF NOT p_create THEN
            RAISE EXCEPTION USING ERRCODE = 'PTN01', MESSAGE = format('tenant %s does not exist', p_key);
        END IF;
        INSERT INTO pgtenant.tenants (key, organization, ledger)
        VALUES (p_key, p_organization, p_ledger) ON CONFLICT (key) DO NOTHING;
        SELECT * INTO t FROM pgtenant.tenants WHERE key = p_key FOR UPDATE;
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
    v_epoch := pgtenant.next_epoch(t.epoch);
    UPDATE pgtenant.tenants
       SET epoch = v_epoch, owner = p_replica, owner_incarnation = p_incarnation,
           acquired_at = now(), reserved_for = NULL, reserved_until = NULL
     WHERE key = p_key;
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

-- ---------------------------------------------------------------------------------------
-- V1's restore (called by V3's): only the epoch computation changes.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.restore(p_key text, p_replica text, p_incarnation bigint, p_new_schema_for_epoch text)
RETURNS TABLE (epoch bigint, schema_name text, schema_version integer, lock_key integer)
LANGUAGE plpgsql AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    g pgtenant.trash%ROWTYPE;
    o record;
    v_epoch bigint;
BEGIN
    SELECT * INTO t FROM pgtenant.tenants WHERE key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTN01', MESSAGE = format('tenant %s does not exist', p_key);
    END IF;
    IF t.schema_name IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTR01',
            MESSAGE = format('tenant %s already has a new life (schema %s at epoch %s): restoring would replace it', p_key, t.schema_name, t.epoch),
            HINT = 'forget the new life first if the old one should come back';
    END IF;
    IF t.owner IS NOT NULL THEN
        SELECT * INTO o FROM pgtenant.replica_liveness l WHERE l.replica_id = t.owner;
        IF o.incarnation = t.owner_incarnation AND o.alive AND NOT (t.owner = p_replica AND t.owner_incarnation = p_incarnation) THEN
            PERFORM pgtenant.raise_held(p_key, t.owner, t.epoch, o.expires_at, false);
        END IF;
    END IF;
    SELECT * INTO g FROM pgtenant.trash tr
     WHERE tr.tenant_key = p_key AND tr.swept_at IS NULL AND to_regnamespace(tr.schema_name) IS NOT NULL
     ORDER BY tr.epoch DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTR01',
            MESSAGE = format('tenant %s has nothing in the trash to restore (swept, or never forgotten)', p_key);
    END IF;
    -- The new life's name is derived client-side from the id and the new epoch, which is
    -- pgtenant.next_epoch(t.epoch): the caller passes it for exactly that epoch, checked here.
    v_epoch := pgtenant.next_epoch(t.epoch);
    IF p_new_schema_for_epoch !~ ('_' || v_epoch || '_[0-9a-f]{10}$') THEN
        RAISE EXCEPTION 'schema name % is not for epoch %', p_new_schema_for_epoch, v_epoch;
    END IF;
    PERFORM pg_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
    EXECUTE format('ALTER SCHEMA %I RENAME TO %I', g.schema_name, p_new_schema_for_epoch);
    DELETE FROM pgtenant.trash tr WHERE tr.schema_name = g.schema_name;
    UPDATE pgtenant.tenants
       SET epoch = v_epoch, schema_name = p_new_schema_for_epoch, schema_version = g.schema_version,
           owner = p_replica, owner_incarnation = p_incarnation, acquired_at = now(),
           quarantine_cause = NULL, quarantine_repair = NULL, quarantined_at = NULL
     WHERE key = p_key;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'restored', v_epoch, p_replica, p_incarnation,
            format('from %s (epoch %s) as %s', g.schema_name, g.epoch, p_new_schema_for_epoch));
    RETURN QUERY SELECT v_epoch, p_new_schema_for_epoch, g.schema_version, t.lock_key;
END $$;
