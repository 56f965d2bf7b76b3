-- An operator retries or clears a tenant's parked alarms (issue #31: "list / retry / clear
-- failed"). The alarms are in the tenant's schema and are written only under its lease, so an
-- operator does not write them: it leaves a request, and the tenant's owner (or, for a tenant
-- nobody holds, the replica that wakes it) applies it in a fenced transaction of the tenant, the
-- same transaction that takes the request. A stale owner's application is refused by the fence
-- and the request stays for the next owner.
--
--   alarm_requests                    pending requests: tenant, alarm name (NULL: every parked
--                                     alarm of the tenant), retry or clear, who, when
--   request_alarm(key, name, action)  the operator's call: records the request and makes the
--                                     tenant's hint due now, so due_alarms wakes it
--   parked_alarms(key)                the parked alarms of tenant key (NULL: of every tenant
--                                     whose hint counts failed ones): names, attempts, last
--                                     error, never the payload (the tenant's data), read from
--                                     the tenants' tables for operators, who cannot read them
--   take_alarm_requests(key)          pgtenant's call, inside the fenced firing transaction:
--                                     deletes and returns the tenant's requests
--   note_alarms                       now keeps a tenant with requests due now, so a request
--                                     made while its tenant fires is not lost from the hint
--   due_alarms                        now also wakes a tenant whose owner's lease session is
--                                     gone (its liveness lock free), as acquire takes it over,
--                                     instead of waiting for the owner's heartbeat to lapse
--
-- Measured before the due_alarms change (examples/bench_alarms.rs, kill phase, owner ttl 2 s):
-- alarms of a SIGKILLed owner's tenants fired 1.1 s late at the median and 2.1 s at p99, every
-- tenant waiting out the dead owner's ttl although a request would have taken it over at once.
--
-- A forged take_alarm_requests call (the application's role may call it) can only drop an
-- operator's request; the application's role owns every tenant schema anyway.

CREATE TABLE pgtenant.alarm_requests (
    id bigserial PRIMARY KEY,
    tenant_key text NOT NULL,
    name text,
    action text NOT NULL CHECK (action IN ('retry', 'clear')),
    requested_by text NOT NULL DEFAULT current_user,
    requested_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgtenant.alarm_requests IS
    'Operators'' requests to retry or clear a tenant''s parked alarms (name NULL: all of them), applied and deleted by the tenant''s owner in a fenced transaction of the tenant.';
CREATE INDEX alarm_requests_tenant ON pgtenant.alarm_requests (tenant_key);
REVOKE ALL ON pgtenant.alarm_requests FROM PUBLIC;

CREATE FUNCTION pgtenant.request_alarm(p_key text, p_name text, p_action text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('retry', 'clear') THEN
        RAISE EXCEPTION 'pgtenant: alarm action % is neither retry nor clear', p_action
            USING ERRCODE = '22023', HINT = 'Give ''retry'' or ''clear''.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgtenant.tenants t
                    WHERE t.key = p_key AND t.schema_name IS NOT NULL) THEN
        RAISE EXCEPTION 'pgtenant: no tenant % with a live schema', p_key USING ERRCODE = 'PTN01';
    END IF;
    INSERT INTO pgtenant.alarm_requests (tenant_key, name, action)
    VALUES (p_key, p_name, p_action) RETURNING id INTO v_id;
    INSERT INTO pgtenant.alarm_due AS a (tenant_key, next_due, pending, failed, updated_at)
    VALUES (p_key, now(), 0, 0, now())
    ON CONFLICT (tenant_key) DO UPDATE
       SET next_due = least(a.next_due, EXCLUDED.next_due);
    RETURN v_id;
END $$;
COMMENT ON FUNCTION pgtenant.request_alarm(text, text, text) IS
    'An operator asks tenant p_key''s owner to retry (pending again, due now, attempts from 0) or clear (delete) its parked alarm p_name, or every parked alarm when p_name is NULL. Returns the request''s id; the request is gone from pgtenant.alarm_requests once applied.';
REVOKE ALL ON FUNCTION pgtenant.request_alarm(text, text, text) FROM PUBLIC;

CREATE FUNCTION pgtenant.parked_alarms(p_key text)
RETURNS TABLE (tenant text, name text, id bigint, attempts integer, last_error text,
               failed_at timestamptz, due_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tt.key, tt.schema_name
               FROM pgtenant.tenants tt
               LEFT JOIN pgtenant.alarm_due a ON a.tenant_key = tt.key
              WHERE tt.schema_name IS NOT NULL
                AND CASE WHEN p_key IS NULL THEN a.failed > 0 ELSE tt.key = p_key END
              ORDER BY tt.key LOOP
        CONTINUE WHEN pg_catalog.to_regclass(pg_catalog.format('%I.pgtenant_alarms', t.schema_name)) IS NULL;
        RETURN QUERY EXECUTE pg_catalog.format(
            'SELECT $1, name, seq, attempts, last_error, failed_at, due_at
               FROM %I.pgtenant_alarms WHERE failed_at IS NOT NULL ORDER BY failed_at, name',
            t.schema_name) USING t.key;
    END LOOP;
END $$;
COMMENT ON FUNCTION pgtenant.parked_alarms(text) IS
    'The parked alarms (last attempt failed) of tenant p_key, or of every tenant whose hint in pgtenant.alarm_due counts failed ones when p_key is NULL: name, id (seq), attempts, last error, when parked, when due. Never the payload.';
REVOKE ALL ON FUNCTION pgtenant.parked_alarms(text) FROM PUBLIC;

CREATE FUNCTION pgtenant.take_alarm_requests(p_key text)
RETURNS TABLE (name text, action text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DELETE FROM pgtenant.alarm_requests r WHERE r.tenant_key = p_key RETURNING r.name, r.action
$$;
COMMENT ON FUNCTION pgtenant.take_alarm_requests(text) IS
    'Deletes and returns tenant p_key''s alarm requests; pgtenant calls it inside a fenced transaction of the tenant that applies them, so they commit (or stay) together.';
REVOKE ALL ON FUNCTION pgtenant.take_alarm_requests(text) FROM PUBLIC;

-- As in V18, and a tenant with requests stays due now (a request made during a firing that
-- read the requests before it must not be hidden by the hint that firing writes).
CREATE OR REPLACE FUNCTION pgtenant.note_alarms(p_key text, p_next_due timestamptz,
                                                p_pending integer, p_failed integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_next timestamptz := p_next_due;
BEGIN
    IF EXISTS (SELECT 1 FROM pgtenant.alarm_requests r WHERE r.tenant_key = p_key) THEN
        v_next := least(coalesce(v_next, now()), now());
    ELSIF coalesce(p_pending, 0) <= 0 AND coalesce(p_failed, 0) <= 0 THEN
        DELETE FROM pgtenant.alarm_due WHERE tenant_key = p_key;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.key = p_key) THEN
        RAISE EXCEPTION 'pgtenant: no tenant %', p_key USING ERRCODE = 'PTN01';
    END IF;
    INSERT INTO pgtenant.alarm_due AS a (tenant_key, next_due, pending, failed, updated_at)
    VALUES (p_key, v_next, greatest(coalesce(p_pending, 0), 0),
            greatest(coalesce(p_failed, 0), 0), now())
    ON CONFLICT (tenant_key) DO UPDATE
       SET next_due = EXCLUDED.next_due, pending = EXCLUDED.pending, failed = EXCLUDED.failed,
           updated_at = EXCLUDED.updated_at;
END $$;

CREATE OR REPLACE FUNCTION pgtenant.due_alarms(p_replica text, p_horizon_ms integer,
                                                p_limit integer, p_placement boolean)
RETURNS TABLE (tenant text, next_due timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
SELECT a.tenant_key, a.next_due
  FROM pgtenant.alarm_due a
  JOIN pgtenant.tenants t ON t.key = a.tenant_key
  LEFT JOIN pgtenant.replica_liveness l ON l.replica_id = t.owner
 WHERE a.next_due <= now() + p_horizon_ms * interval '1 millisecond'
   AND t.schema_name IS NOT NULL
   AND (
        -- held here (in this incarnation or an earlier one of the same replica id)
        t.owner = p_replica
        -- free, and not reserved for another replica
        OR (t.owner IS NULL
            AND (t.reserved_for IS NULL OR t.reserved_for = p_replica OR t.reserved_until <= now())
            AND (NOT p_placement OR pgtenant.home(t.key) = p_replica))
        -- held by an incarnation that is not alive (its lease session gone, its heartbeat
        -- lapsed, deregistered or replaced): what acquire takes over (pg_locks read once)
        OR (t.owner IS NOT NULL
            AND (l.replica_id IS NULL OR NOT l.alive
                 OR t.owner_incarnation IS DISTINCT FROM l.incarnation)
            AND (NOT p_placement OR pgtenant.home(t.key) = p_replica)))
 ORDER BY a.next_due
 LIMIT p_limit
$$;

-- Whoever runs replicas (may heartbeat) takes requests; whoever may clear a quarantine (the
-- operators) may request; both may list parked alarms.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.heartbeat(text, bigint, text, integer)'::regprocedure
                AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtenant.take_alarm_requests(text),
                                       pgtenant.parked_alarms(text) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.clear_quarantine(text, text)'::regprocedure
                AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtenant.request_alarm(text, text, text),
                                       pgtenant.parked_alarms(text) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        EXECUTE pg_catalog.format('GRANT SELECT ON pgtenant.alarm_requests TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v19;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v19(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.take_alarm_requests(text),
                                                  pgtenant.parked_alarms(text) TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.request_alarm(text, text, text),
                                                  pgtenant.parked_alarms(text) TO %I', p_operator);
        EXECUTE format('GRANT SELECT ON pgtenant.alarm_requests TO %I', p_operator);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
