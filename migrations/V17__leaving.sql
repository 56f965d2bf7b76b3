-- A replica that is leaving (Router::close with placement on) stops being a home before it
-- hands its tenants to their next homes, and a tenant reserved for a replica that is no longer
-- a home is taken by its home (issue #30).
--
-- Measured before this: at 10 000 tenants, a replica's close handed every tenant to its next
-- home, but the other replicas still counted the closing replica as a live, stable member until
-- it deregistered, and moved a few of those tenants straight back to it (home: the closing
-- replica), which refused to open them: 1 to 3 tenants stayed free, reserved for a replica that
-- was gone, and nobody picked them up until a request came.
--
--   leave(replica, incarnation, secret)   weight 0 for this incarnation: the home of none
--   orphaned_homes(replica, limit)        also: free tenants reserved for a replica that is
--                                         not a live home (gone, expired, or leaving)

CREATE FUNCTION pgtenant.leave(p_replica text, p_incarnation bigint, p_secret text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    -- The registration of the next incarnation sets the weight again (register's p_weight).
    UPDATE pgtenant.replicas SET weight = 0
     WHERE replica_id = p_replica AND incarnation = p_incarnation AND released_at IS NULL;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION pgtenant.leave(text, bigint, text) IS
    'A closing replica (this incarnation, proven by its secret) stops being the home of any tenant (weight 0), so the others stop moving tenants to it while it hands its own to their next homes. False when the incarnation is not the current one.';
REVOKE ALL ON FUNCTION pgtenant.leave(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.orphaned_homes(p_replica text, p_limit integer)
RETURNS TABLE (tenant text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
WITH members AS MATERIALIZED (
    SELECT c.replica_id, c.weight FROM pgtenant.placement_candidates c
), orphans AS MATERIALIZED (
    -- Held by an incarnation that is over: expired, deregistered, or replaced by a newer one.
    -- Materialized, so homes are computed for these few only (1.1 s for 10 000 tenants when
    -- the planner pushed the home down to every tenant; 11 ms so).
    SELECT t.key
      FROM pgtenant.replicas r
      JOIN pgtenant.tenants t ON t.owner = r.replica_id
     WHERE (r.released_at IS NOT NULL OR r.expires_at <= now()
            OR t.owner_incarnation IS DISTINCT FROM r.incarnation)
       AND t.schema_name IS NOT NULL
    UNION
    -- Free, reserved for a replica that is not a home (gone, expired, leaving): a handoff to
    -- it that it will not pick up. Index tenants_reserved: the reserved tenants only.
    SELECT t.key
      FROM pgtenant.tenants t
     WHERE t.owner IS NULL AND t.reserved_for IS NOT NULL AND t.schema_name IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM members m WHERE m.replica_id = t.reserved_for)
), homes AS (
    SELECT DISTINCT ON (o.key) o.key, m.replica_id AS home
      FROM orphans o CROSS JOIN members m
     ORDER BY o.key, pgtenant.placement_score(o.key, m.replica_id, m.weight) DESC, m.replica_id
)
SELECT h.key FROM homes h WHERE h.home = p_replica ORDER BY h.key LIMIT p_limit
$$;
COMMENT ON FUNCTION pgtenant.orphaned_homes(text, integer) IS
    'Tenants whose home among the live replicas is p_replica and that nobody will serve unasked: held by an incarnation that is over (expired, deregistered or replaced), or free and reserved for a replica that is not a live home (gone or leaving). What p_replica takes over, and nobody else, after a crash or a close. At most p_limit rows.';

-- Whoever can release can leave (the replicas' role, PUBLIC where setup granted no role).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.release(text, bigint, text, text[], bigint[], text[], text[], integer[])'::regprocedure
                AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtenant.leave(text, bigint, text) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v17;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v17(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.leave(text, bigint, text) TO %I', p_app);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgtenant.grant_roles_before_v17(name, name) FROM PUBLIC;
