-- Tenant alarms (issue #31, first part; DESIGN G11, §5 "Alarms"). A tenant's alarms live in
-- its own schema (`pgtenant_alarms`, created by pgtenant on first use under the lease), so they
-- are fenced like any ledger write, move with the tenant on handoff, go to the trash on forget
-- and come back on restore. The control plane keeps only a hint per tenant: when its next alarm
-- is due, and how many are pending and failed, so that a due alarm of a tenant no replica holds
-- is found with one indexed query instead of a scan of every tenant's schema.
--
--   alarm_due                      one row per tenant with alarms (a hint, not the truth)
--   note_alarms(key, next_due,     upserts the hint; pgtenant calls it inside the fenced
--               pending, failed)   transaction that changed the alarms, so it commits or rolls
--                                  back with them (deletes the row when nothing is left)
--   due_alarms(replica, horizon,   tenants whose next alarm is due within the horizon that
--              limit, placement)   this replica should fire: held by it, or free, or held by an
--                                  incarnation that is over (with placement: its home only)
--   alarms                         the psql view: per tenant, owner, next due, pending, failed
--
-- A forged note_alarms call (the application's role may call it) can only move a hint: a wasted
-- wake, or a free tenant's alarm found late, at its next open; the alarms themselves are in the
-- tenant's schema, written only under its lease.

CREATE TABLE pgtenant.alarm_due (
    tenant_key text PRIMARY KEY,
    next_due timestamptz,
    pending integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgtenant.alarm_due IS
    'Per tenant with alarms: when its next pending alarm is due, how many are pending and how many failed (parked). A hint kept by pgtenant in the transactions that change the tenant''s alarms (its own table pgtenant_alarms holds the truth); read by due_alarms to wake tenants no replica holds.';
CREATE INDEX alarm_due_next ON pgtenant.alarm_due (next_due) WHERE next_due IS NOT NULL;
REVOKE ALL ON pgtenant.alarm_due FROM PUBLIC;

CREATE FUNCTION pgtenant.note_alarms(p_key text, p_next_due timestamptz, p_pending integer,
                                     p_failed integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF coalesce(p_pending, 0) <= 0 AND coalesce(p_failed, 0) <= 0 THEN
        DELETE FROM pgtenant.alarm_due WHERE tenant_key = p_key;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.key = p_key) THEN
        RAISE EXCEPTION 'pgtenant: no tenant %', p_key USING ERRCODE = 'PTN01';
    END IF;
    INSERT INTO pgtenant.alarm_due AS a (tenant_key, next_due, pending, failed, updated_at)
    VALUES (p_key, p_next_due, greatest(coalesce(p_pending, 0), 0),
            greatest(coalesce(p_failed, 0), 0), now())
    ON CONFLICT (tenant_key) DO UPDATE
       SET next_due = EXCLUDED.next_due, pending = EXCLUDED.pending, failed = EXCLUDED.failed,
           updated_at = EXCLUDED.updated_at;
END $$;
COMMENT ON FUNCTION pgtenant.note_alarms(text, timestamptz, integer, integer) IS
    'Records tenant p_key''s alarm hint (next due, pending, failed), or deletes it when nothing is pending or failed. Called by pgtenant inside the fenced transaction that changed the tenant''s alarms.';
REVOKE ALL ON FUNCTION pgtenant.note_alarms(text, timestamptz, integer, integer) FROM PUBLIC;

CREATE FUNCTION pgtenant.due_alarms(p_replica text, p_horizon_ms integer, p_limit integer,
                                    p_placement boolean)
RETURNS TABLE (tenant text, next_due timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
SELECT a.tenant_key, a.next_due
  FROM pgtenant.alarm_due a
  JOIN pgtenant.tenants t ON t.key = a.tenant_key
  LEFT JOIN pgtenant.replicas r ON r.replica_id = t.owner
 WHERE a.next_due <= now() + p_horizon_ms * interval '1 millisecond'
   AND t.schema_name IS NOT NULL
   AND (
        -- held here (in this incarnation or an earlier one of the same replica id)
        t.owner = p_replica
        -- free, and not reserved for another replica
        OR (t.owner IS NULL
            AND (t.reserved_for IS NULL OR t.reserved_for = p_replica OR t.reserved_until <= now())
            AND (NOT p_placement OR pgtenant.home(t.key) = p_replica))
        -- held by an incarnation that is over: expired, deregistered or replaced
        OR (t.owner IS NOT NULL
            AND (r.replica_id IS NULL OR r.released_at IS NOT NULL OR r.expires_at <= now()
                 OR t.owner_incarnation IS DISTINCT FROM r.incarnation)
            AND (NOT p_placement OR pgtenant.home(t.key) = p_replica)))
 ORDER BY a.next_due
 LIMIT p_limit
$$;
COMMENT ON FUNCTION pgtenant.due_alarms(text, integer, integer, boolean) IS
    'Tenants with an alarm due within p_horizon_ms that replica p_replica should fire: those it holds, and those free or held by an incarnation that is over (with p_placement, only those whose home it is). Earliest first, at most p_limit rows (index alarm_due_next).';
REVOKE ALL ON FUNCTION pgtenant.due_alarms(text, integer, integer, boolean) FROM PUBLIC;

CREATE VIEW pgtenant.alarms AS
SELECT a.tenant_key AS tenant, t.owner, a.next_due, a.pending, a.failed, a.updated_at
  FROM pgtenant.alarm_due a
  LEFT JOIN pgtenant.tenants t ON t.key = a.tenant_key;
COMMENT ON VIEW pgtenant.alarms IS
    'Per tenant with alarms: its owner, when its next pending alarm is due, how many are pending and how many failed (parked after their last attempt). The alarms themselves are in the tenant''s schema, table pgtenant_alarms.';
REVOKE ALL ON pgtenant.alarms FROM PUBLIC;

-- Whoever runs replicas (may heartbeat) notes and reads alarm hints; whoever can locate can
-- read the view.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.heartbeat(text, bigint, text, integer)'::regprocedure
                AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION
                                       pgtenant.note_alarms(text, timestamptz, integer, integer),
                                       pgtenant.due_alarms(text, integer, integer, boolean) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.locate(text)'::regprocedure AND a.grantee <> p.proowner
                AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtenant.alarms TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v18;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v18(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION
                            pgtenant.note_alarms(text, timestamptz, integer, integer),
                            pgtenant.due_alarms(text, integer, integer, boolean)
                        TO %I', p_app);
        EXECUTE format('GRANT SELECT ON pgtenant.alarms TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON pgtenant.alarms TO %I', p_operator);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
