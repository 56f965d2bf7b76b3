-- pgtenant control plane, version 12: the tenant boundary and least privilege, round two
-- (issue 26, items 2, 3, 5, 6 and 7; docs/guide.md's threat model, docs/operations.md's roles).
--
-- * Handoff requests are authenticated: a request is a row written by request_handoff, which
--   checks the requester's secret; the NOTIFY it sends is only a wake-up, and an owner acts on
--   a notice only when take_handoff_request finds (and consumes) that row. Before, any role
--   could NOTIFY pgtenant_handoff and make an owner drain and release a tenant.
-- * The control plane acts only on schemas it can vouch for: schema_created records a schema
--   only if its name is one pgtenant derives for the tenant's new life, it is owned by the
--   tenant-owner role and it was created in the calling transaction; forget and restore rename
--   only such schemas, and restore gives the new life only a derived name. Before, the
--   application's role could have a foreign schema recorded and then renamed by forget.
-- * A restore is whole or refused: the sweep marks a trash row before its first drop
--   (begin_sweep, in the same transaction), and restore refuses a marked row.
-- * reset_session also runs DISCARD SEQUENCES: currval and lastval no longer cross tenants.
-- * The status functions are no longer PUBLIC: replica ids, hosts and pids are for the roles
--   granted by setup (the application's role and the operators), as the views always were.
--
-- Same signatures throughout, and every function an earlier release calls is still there:
-- replicas of the previous release keep running across the upgrade (tests/least_privilege.rs).

-- ---------------------------------------------------------------------------------------
-- Schema names, as src/id.rs derives them, so the control plane can vouch for a name.
-- ---------------------------------------------------------------------------------------

-- FNV-1a, 64-bit, as 16 hex digits (src/id.rs fnv1a64). numeric arithmetic: bigint would
-- overflow on the multiplication, which must wrap modulo 2^64; XOR touches the low byte only.
-- These helpers are SQL functions, not PL/pgSQL: PL/pgSQL keeps a cached plan per expression
-- in every backend that ran it (about 200 KB of CacheMemoryContext for them, in every pooled
-- data connection that ever created a tenant), SQL functions plan per call. They run at
-- creation, forget and restore only: checking a name costs about 0.5 ms (one hash) there.
CREATE FUNCTION pgtenant.fnv1a64(p_bytes bytea) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pgtenant AS $$
WITH RECURSIVE h(i, v) AS (
    SELECT 0, 14695981039346656037::numeric
    UNION ALL
    SELECT h.i + 1,
           mod((h.v - mod(h.v, 256) + (mod(h.v, 256)::integer # get_byte(p_bytes, h.i))) * 1099511628211,
               18446744073709551616)
      FROM h WHERE h.i < length(p_bytes)
)
SELECT lpad(to_hex((h.v - CASE WHEN h.v >= 9223372036854775808 THEN 18446744073709551616 ELSE 0 END)::bigint),
            16, '0')
  FROM h ORDER BY h.i DESC LIMIT 1
$$;
REVOKE ALL ON FUNCTION pgtenant.fnv1a64(bytea) FROM PUBLIC;

-- The salt-th name of the life of tenant p_key that began at p_epoch, with this separator
-- between organization and ledger (TenantId::derive_schema_name): t_ + org + separator +
-- ledger + _ + epoch + _ + 10 hex digits of the hash of key, epoch (and salt), the readable
-- parts shortened to fit 63 bytes less the trash prefix (6). NULL for an invalid key.
CREATE FUNCTION pgtenant.derived_schema_name(p_key text, p_epoch bigint, p_salt integer, p_separator text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pgtenant AS $$
SELECT 't_' || replace(left(k.org, w.org_len), '-', '_') || p_separator
       || replace(left(k.ledger, least(length(k.ledger), r.readable - w.org_len)), '-', '_')
       || '_' || k.epoch || '_'
       || left(pgtenant.fnv1a64(convert_to(p_key, 'UTF8') || '\x00'::bytea || convert_to(k.epoch, 'UTF8')
                                || CASE WHEN p_salt > 0 THEN '\x00'::bytea || convert_to(p_salt::text, 'UTF8')
                                        ELSE ''::bytea END), 10)
  FROM (SELECT split_part(p_key, '/', 1) AS org, split_part(p_key, '/', 2) AS ledger,
               p_epoch::text AS epoch) k,
       LATERAL (SELECT greatest(57 - (2 + length(p_separator) + 2 + length(k.epoch) + 10), 0) AS readable) r,
       LATERAL (SELECT least(length(k.org),
                             greatest(greatest(r.readable - length(k.ledger), 0), r.readable / 2)) AS org_len) w
 WHERE p_key ~ '^[a-z0-9][a-z0-9-]{0,29}/[a-z0-9][a-z0-9-]{0,29}$' AND p_epoch >= 0
$$;
REVOKE ALL ON FUNCTION pgtenant.derived_schema_name(text, bigint, integer, text) FROM PUBLIC;

-- Every name pgtenant ever derived for that life, in the order creation and restore try them:
-- the salted names (TenantId::schema_name_salted, salts 0-7), then the first release's
-- single-underscore form (TenantId::derived_schema_names). None for an invalid key.
CREATE FUNCTION pgtenant.derived_schema_names(p_key text, p_epoch bigint) RETURNS SETOF text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pgtenant AS $$
SELECT d.name
  FROM (VALUES (1, 0, '__'), (2, 1, '__'), (3, 2, '__'), (4, 3, '__'), (5, 4, '__'),
               (6, 5, '__'), (7, 6, '__'), (8, 7, '__'), (9, 0, '_')) n(ord, salt, sep),
       LATERAL (SELECT pgtenant.derived_schema_name(p_key, p_epoch, n.salt, n.sep) AS name) d
 WHERE d.name IS NOT NULL
 ORDER BY n.ord
$$;
REVOKE ALL ON FUNCTION pgtenant.derived_schema_names(text, bigint) FROM PUBLIC;

-- Whether p_name is one of those names. The first name first: it is the one almost every
-- life has, and each name is a hash to compute (about 0.1 ms here).
CREATE FUNCTION pgtenant.is_derived_schema_name(p_key text, p_epoch bigint, p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pgtenant AS $$
SELECT p_name = pgtenant.derived_schema_name(p_key, p_epoch, 0, '__')
       OR EXISTS (SELECT 1 FROM pgtenant.derived_schema_names(p_key, p_epoch) d WHERE d = p_name)
$$;
REVOKE ALL ON FUNCTION pgtenant.is_derived_schema_name(text, bigint, text) FROM PUBLIC;

-- The role tenant schemas belong to: the application's role setup granted to, or the control
-- plane's owner without one (the sweep's own rule, src/protocol/sweep.rs foreign_owner).
CREATE FUNCTION pgtenant.tenant_owner() RETURNS oid
LANGUAGE sql STABLE SET search_path = pg_catalog, pgtenant AS $$
    SELECT coalesce((SELECT r.oid FROM pg_roles r, pgtenant.config c WHERE r.rolname = c.app_role),
                    (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgtenant'))
$$;
REVOKE ALL ON FUNCTION pgtenant.tenant_owner() FROM PUBLIC;

-- Why the control plane cannot vouch for p_schema as a schema of tenant p_key (a live name,
-- or trash_ and a live name) of a life that began at or before p_max_epoch; NULL when it can:
-- the name is one pgtenant derives for the tenant and the epoch the name carries, and the
-- schema exists and belongs to the tenant-owner role. What the functions below check before
-- they record or rename a schema, so that no caller can make them act on a schema of another
-- owner (they run as the control plane's owner, who may rename what the caller may not).
CREATE FUNCTION pgtenant.unvouched(p_key text, p_schema text, p_max_epoch bigint) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pgtenant AS $$
SELECT CASE
           WHEN v.life IS NULL OR v.life > p_max_epoch
                OR NOT coalesce(pgtenant.is_derived_schema_name(p_key, v.life, v.live), false)
               THEN format('schema %s is not a name pgtenant derives for tenant %s', p_schema, p_key)
           WHEN ns.nspowner IS NULL THEN format('schema %s does not exist', p_schema)
           WHEN ns.nspowner IS DISTINCT FROM v.owner
               THEN format('schema %s is owned by %s, not by the tenant-owner role %s', p_schema,
                           pg_get_userbyid(ns.nspowner), coalesce(pg_get_userbyid(v.owner), '?'))
       END
  FROM (SELECT l.live, substring(l.live FROM '_([0-9]{1,18})_[0-9a-f]{10}$')::bigint AS life,
               pgtenant.tenant_owner() AS owner
          FROM (SELECT CASE WHEN p_schema LIKE 'trash\_%' THEN substr(p_schema, 7) ELSE p_schema END AS live) l) v
  LEFT JOIN pg_namespace ns ON ns.nspname = p_schema
$$;
REVOKE ALL ON FUNCTION pgtenant.unvouched(text, text, bigint) FROM PUBLIC;

-- Whether schema p_schema was created (or altered) by the calling transaction: its catalog
-- row is visible and its inserting transaction is still in progress, which for a visible row
-- means this transaction or one of its subtransactions. The row's 32-bit xmin is widened to
-- the full transaction id nearest this transaction's own (subtransactions come after it).
CREATE FUNCTION pgtenant.created_here(p_schema text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pgtenant AS $$
    WITH me AS (SELECT pg_current_xact_id()::text::bigint AS top)
    SELECT coalesce(
               n.xmin::text::bigint >= 3  -- not a frozen or bootstrap row
               AND pg_xact_status((me.top + ((n.xmin::text::bigint - me.top + 2147483648) % 4294967296
                                             + 4294967296) % 4294967296 - 2147483648)::text::xid8) = 'in progress',
               false)
      FROM me, pg_namespace n WHERE n.nspname = p_schema
$$;
REVOKE ALL ON FUNCTION pgtenant.created_here(text) FROM PUBLIC;

-- Records the schema of a tenant's new life: only one pgtenant can vouch for, of exactly the
-- epoch being created, made in this very transaction (creation is one transaction).
CREATE OR REPLACE FUNCTION pgtenant.schema_created(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint,
                                                   p_secret text, p_schema text, p_version integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_why text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    v_why := pgtenant.unvouched(p_key, p_schema, p_epoch);
    IF v_why IS NULL
       AND substring(p_schema FROM '_([0-9]{1,18})_[0-9a-f]{10}$')::bigint IS DISTINCT FROM p_epoch THEN
        v_why := format('schema %s is not named for epoch %s, the life being created', p_schema, p_epoch);
    END IF;
    IF v_why IS NULL AND NOT pgtenant.created_here(p_schema) THEN
        v_why := format('schema %s was not created by this transaction', p_schema);
    END IF;
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTV01',
            MESSAGE = format('pgtenant: cannot record schema %s for tenant %s: %s', p_schema, p_key, v_why),
            HINT = 'a tenant''s schema is created by its creating transaction under the name pgtenant derives, as the tenant-owner role (setup''s --app-role); nothing was changed';
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

-- ---------------------------------------------------------------------------------------
-- Forget and restore: one self-contained function each (no longer the V3 wrapper around the
-- V1 body, which stays, unchanged, for replicas of 0.1.0-pre), renaming only what they can
-- vouch for.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.forget(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint, p_secret text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    v_trash text;
    v_why text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: cannot forget tenant %s: replica %s incarnation %s is not registered', p_key, p_replica, p_incarnation);
    END IF;
    SELECT * INTO t FROM pgtenant.tenants tt
     WHERE tt.key = p_key AND tt.epoch = p_epoch AND tt.owner = p_replica AND tt.owner_incarnation = p_incarnation
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: cannot forget tenant %s: epoch %s of replica %s is not its lease', p_key, p_epoch, p_replica);
    END IF;
    IF t.schema_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF02', MESSAGE = format('tenant %s has no live schema', p_key);
    END IF;
    v_why := pgtenant.unvouched(p_key, t.schema_name, t.epoch);
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTV01',
            MESSAGE = format('pgtenant: cannot forget tenant %s: %s', p_key, v_why),
            HINT = 'pgtenant renames only schemas it made; if this schema really is the tenant''s ledger, give it to the tenant-owner role (ALTER SCHEMA ... OWNER TO) and forget again; nothing was changed';
    END IF;
    -- Waits for the fenced transactions in flight; none of this epoch passes the fence after.
    PERFORM pg_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
    v_trash := 'trash_' || t.schema_name;
    EXECUTE format('ALTER SCHEMA %I RENAME TO %I', t.schema_name, v_trash);
    UPDATE pgtenant.tenants tt
       SET forgotten_at_epoch = t.epoch, schema_name = NULL, schema_version = 0,
           owner = NULL, owner_incarnation = NULL, reserved_for = NULL, reserved_until = NULL
     WHERE tt.key = p_key;
    INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name, schema_version)
    VALUES (v_trash, p_key, t.epoch, t.schema_name, t.schema_version);
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'forgotten', t.epoch, p_replica, p_incarnation, 'schema moved to ' || v_trash);
    RETURN v_trash;
END $$;

-- The sweep's mark: a trash row whose schema lost objects can no longer be restored whole.
ALTER TABLE pgtenant.trash ADD COLUMN sweep_started_at timestamptz;
COMMENT ON COLUMN pgtenant.trash.sweep_started_at IS
    'When the sweep began dropping this schema''s objects (set in the transaction of its first drop): restore refuses the row from then on.';

CREATE OR REPLACE FUNCTION pgtenant.restore(p_key text, p_replica text, p_incarnation bigint, p_secret text,
                                            p_new_schema_for_epoch text)
RETURNS TABLE (epoch bigint, schema_name text, schema_version integer, lock_key integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    g pgtenant.trash%ROWTYPE;
    o record;
    v_epoch bigint;
    v_why text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    SELECT * INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
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
    -- Locked: a sweep marks the row in the transaction of its first drop, so either that
    -- transaction committed before (the mark is seen here) or it waits for this one (and then
    -- finds the row gone, and drops nothing).
    SELECT * INTO g FROM pgtenant.trash tr
     WHERE tr.tenant_key = p_key AND tr.swept_at IS NULL AND to_regnamespace(tr.schema_name) IS NOT NULL
     ORDER BY tr.epoch DESC LIMIT 1
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTR01',
            MESSAGE = format('tenant %s has nothing in the trash to restore (swept, or never forgotten)', p_key);
    END IF;
    IF g.sweep_started_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTR01',
            MESSAGE = format('tenant %s''s trashed schema %s (epoch %s) is being swept since %s and has lost objects: it cannot be restored whole. Let the sweep finish it; then create the tenant anew, or restore from a backup; nothing was changed',
                             p_key, g.schema_name, g.epoch, g.sweep_started_at);
    END IF;
    v_why := pgtenant.unvouched(p_key, g.schema_name, g.epoch);
    IF v_why IS NOT NULL OR g.schema_name IS DISTINCT FROM 'trash_' || g.live_name THEN
        RAISE EXCEPTION USING ERRCODE = 'PTR01',
            MESSAGE = format('tenant %s''s trashed schema %s is not one pgtenant made: %s. Nothing was changed; a person must look at it',
                             p_key, g.schema_name, coalesce(v_why, 'its name is not the trash prefix and the live name'));
    END IF;
    -- The new life's name is derived client-side from the id and the new epoch, which is
    -- pgtenant.next_epoch(t.epoch): the caller passes one of the names derived for exactly
    -- that epoch (a later salt when a name is taken), checked here.
    v_epoch := pgtenant.next_epoch(t.epoch);
    IF NOT coalesce(pgtenant.is_derived_schema_name(p_key, v_epoch, p_new_schema_for_epoch), false) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTV01',
            MESSAGE = format('pgtenant: schema name %s is not one pgtenant derives for tenant %s at epoch %s', p_new_schema_for_epoch, p_key, v_epoch),
            HINT = 'nothing was changed';
    END IF;
    PERFORM pg_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
    EXECUTE format('ALTER SCHEMA %I RENAME TO %I', g.schema_name, p_new_schema_for_epoch);
    DELETE FROM pgtenant.trash tr WHERE tr.schema_name = g.schema_name;
    UPDATE pgtenant.tenants tt
       SET epoch = v_epoch, schema_name = p_new_schema_for_epoch, schema_version = g.schema_version,
           owner = p_replica, owner_incarnation = p_incarnation, acquired_at = now(),
           quarantine_cause = NULL, quarantine_repair = NULL, quarantined_at = NULL
     WHERE tt.key = p_key;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'restored', v_epoch, p_replica, p_incarnation,
            format('from %s (epoch %s) as %s', g.schema_name, g.epoch, p_new_schema_for_epoch));
    RETURN QUERY SELECT v_epoch, p_new_schema_for_epoch, g.schema_version, t.lock_key;
END $$;

-- The sweep calls this in the transaction of each batch it drops from a trashed schema, before
-- the drops: the first one marks the row for good (restore refuses it from then on), and each
-- holds the row's lock until the batch commits. False when the row is gone or swept (restored
-- meanwhile): then the sweep drops nothing.
CREATE FUNCTION pgtenant.begin_sweep(p_schema text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    UPDATE pgtenant.trash tr SET sweep_started_at = coalesce(tr.sweep_started_at, now())
     WHERE tr.schema_name = p_schema AND tr.swept_at IS NULL;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION pgtenant.begin_sweep(text) FROM PUBLIC;

-- Records that the sweep dropped p_schema: now only a name the sweep can have dropped for
-- tenant p_tenant (a trash row of that tenant, or a masked schema: a name derived for one of
-- its forgotten lives), so the journal says nothing a caller made up.
CREATE OR REPLACE FUNCTION pgtenant.record_swept(p_schema text, p_tenant text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_life bigint := substring(p_schema FROM '_([0-9]{1,18})_[0-9a-f]{10}$')::bigint;
BEGIN
    IF to_regnamespace(p_schema) IS NOT NULL THEN
        RAISE EXCEPTION 'pgtenant: schema % still exists; drop it before recording the sweep', p_schema;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgtenant.trash tr WHERE tr.schema_name = p_schema AND tr.tenant_key = p_tenant)
       AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t
                        WHERE t.key = p_tenant AND v_life <= t.forgotten_at_epoch
                          AND pgtenant.is_derived_schema_name(p_tenant, v_life, p_schema)) THEN
        RAISE EXCEPTION 'pgtenant: % is neither a trashed schema of tenant % nor a schema of one of its forgotten lives',
            p_schema, p_tenant;
    END IF;
    UPDATE pgtenant.trash tr SET swept_at = now() WHERE tr.schema_name = p_schema AND tr.swept_at IS NULL;
    INSERT INTO pgtenant.history (tenant_key, event, detail) VALUES (p_tenant, 'swept', p_schema);
END $$;

-- ---------------------------------------------------------------------------------------
-- Handoff requests: a row the requester proves it wrote; NOTIFY only wakes the owner.
-- ---------------------------------------------------------------------------------------
CREATE TABLE pgtenant.handoff_requests (
    tenant_key text NOT NULL,
    requester text NOT NULL REFERENCES pgtenant.replicas (replica_id) ON DELETE CASCADE,
    requester_incarnation bigint NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant_key, requester)
);
COMMENT ON TABLE pgtenant.handoff_requests IS
    'Handoff requests (Router::request_handoff), written by request_handoff for an authenticated requester and consumed by the owner (take_handoff_request); a NOTIFY on pgtenant_handoff without a row here is ignored.';
REVOKE ALL ON pgtenant.handoff_requests FROM PUBLIC;

-- How long a request stays answerable: the owner hears the NOTIFY within milliseconds, so a
-- request older than this was not answered (an owner of the previous release does not consume
-- rows) and a NOTIFY naming it later is not from the requester.
CREATE FUNCTION pgtenant.handoff_request_ttl() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT interval '1 minute' $$;
REVOKE ALL ON FUNCTION pgtenant.handoff_request_ttl() FROM PUBLIC;

CREATE FUNCTION pgtenant.request_handoff(p_key text, p_replica text, p_incarnation bigint, p_secret text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    DELETE FROM pgtenant.handoff_requests h WHERE h.requested_at < clock_timestamp() - pgtenant.handoff_request_ttl();
    IF NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.key = p_key) THEN
        RETURN false;
    END IF;
    INSERT INTO pgtenant.handoff_requests AS h (tenant_key, requester, requester_incarnation)
    VALUES (p_key, p_replica, p_incarnation)
    ON CONFLICT (tenant_key, requester) DO UPDATE
       SET requester_incarnation = EXCLUDED.requester_incarnation, requested_at = EXCLUDED.requested_at;
    -- The previous release's payload: its owners answer this request too (unauthenticated).
    PERFORM pg_notify('pgtenant_handoff', json_build_object('tenant', p_key, 'requester', p_replica)::text);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION pgtenant.request_handoff(text, text, bigint, text) FROM PUBLIC;

-- The owner's half: true, and the request consumed, only when the requester's live current
-- incarnation asked for this tenant within the ttl and the caller holds the tenant.
CREATE FUNCTION pgtenant.take_handoff_request(p_replica text, p_incarnation bigint, p_secret text,
                                              p_key text, p_requester text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    DELETE FROM pgtenant.handoff_requests h
     USING pgtenant.tenants t, pgtenant.replica_liveness l
     WHERE h.tenant_key = p_key AND h.requester = p_requester
       AND h.requested_at >= clock_timestamp() - pgtenant.handoff_request_ttl()
       AND t.key = h.tenant_key AND t.owner = p_replica AND t.owner_incarnation = p_incarnation
       AND l.replica_id = h.requester AND l.incarnation = h.requester_incarnation AND l.alive;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION pgtenant.take_handoff_request(text, bigint, text, text, text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- Session hygiene: DISCARD SEQUENCES too (currval, lastval and sequence caches are session
-- state: after tenant A's nextval, tenant B's lastval() returned A's value).
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.reset_session(p_tenant text) RETURNS void
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
    DISCARD SEQUENCES;
    FOR v_name IN SELECT p.name FROM pg_catalog.pg_prepared_statements p WHERE p.from_sql LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', v_name);
    END LOOP;
    PERFORM pg_catalog.set_config('pgtenant.session_tenant', coalesce(p_tenant, ''), false),
            pg_catalog.set_config('pgtenant.session_user', session_user::text, false);
END $$;

-- ---------------------------------------------------------------------------------------
-- Status for the granted roles only (V3 made replica_status_rows PUBLIC, V10 status_report
-- and fleet_status_rows: SECURITY DEFINER, they showed any role replica ids, hosts, pids).
-- ---------------------------------------------------------------------------------------
REVOKE ALL ON FUNCTION pgtenant.status_report(bigint), pgtenant.replica_status_rows(),
                       pgtenant.fleet_status_rows(bigint) FROM PUBLIC;

-- The grants of the previous version stay as they are (renamed, called first).
ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v12;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v12(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        -- A view's functions are checked against its reader: replica_status and fleet_status
        -- need theirs.
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.replica_status_rows(), pgtenant.fleet_status_rows(bigint),
                            pgtenant.request_handoff(text, text, bigint, text),
                            pgtenant.take_handoff_request(text, bigint, text, text, text)
                        TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.replica_status_rows(), pgtenant.fleet_status_rows(bigint),
                            pgtenant.status_report(bigint), pgtenant.begin_sweep(text)
                        TO %I', p_operator);
        EXECUTE format('GRANT SELECT ON pgtenant.handoff_requests TO %I', p_operator);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtenant.grant_roles_before_v12(name, name) FROM PUBLIC;
SELECT pgtenant.grant_roles(c.app_role, c.operator_role) FROM pgtenant.config c;
