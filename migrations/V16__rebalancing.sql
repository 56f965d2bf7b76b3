-- Rebalancing (issue #30, second part): each replica with placement on moves the tenants it
-- holds whose home is another, stably alive replica there by a directed handoff, picks up at
-- once what another replica reserved for it, and takes over the tenants of a dead incarnation
-- whose home it is (each by its home alone: no herd). Four reads, all SECURITY DEFINER and
-- read-only (they change nothing; every move goes through the authenticated release, every
-- takeover through acquire):
--
--   placement_members(stable_ms)          the live candidates, and which are stable
--   placement_moves(replica, stable_ms,   its held tenants whose home is elsewhere
--                   leaving, limit)
--   reserved_for(replica, limit)          tenants a directed handoff reserved for it
--   orphaned_homes(replica, limit)        tenants a dead incarnation held whose home it is

-- The tenants reserved for a replica, found without a scan: a few rows at a time (a
-- reservation lasts until it is picked up or expires).
CREATE INDEX tenants_reserved ON pgtenant.tenants (reserved_for, key)
    WHERE owner IS NULL AND reserved_for IS NOT NULL;

CREATE FUNCTION pgtenant.placement_members(p_stable_ms integer)
RETURNS TABLE (replica_id text, weight double precision, stable boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
SELECT c.replica_id, c.weight,
       r.started_at <= now() - p_stable_ms * interval '1 millisecond'
  FROM pgtenant.placement_candidates c
  JOIN pgtenant.replicas r USING (replica_id)
 ORDER BY c.replica_id
$$;
COMMENT ON FUNCTION pgtenant.placement_members(integer) IS
    'The replicas tenants are placed on (placement_candidates), their weights, and whether each has been alive, in its current incarnation, for p_stable_ms: rebalancing moves tenants only to stable ones.';
REVOKE ALL ON FUNCTION pgtenant.placement_members(integer) FROM PUBLIC;

-- Homes here are computed set-based (each tenant against each member, DISTINCT ON by score,
-- the same order as home_among: score, then replica id) rather than by a home_among call per
-- tenant: for 2 000 held tenants among 5 members, 86 ms against 430 ms idle (and 3 s against
-- well over that on a loaded 2-core machine, which let the first look of a join lag behind).
CREATE FUNCTION pgtenant.placement_moves(p_replica text, p_stable_ms integer, p_leaving boolean,
                                         p_limit integer)
RETURNS TABLE (tenant text, epoch bigint, home text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
WITH members AS MATERIALIZED (
    SELECT m.replica_id, m.weight
      FROM pgtenant.placement_members(p_stable_ms) m
     WHERE m.weight > 0
       AND CASE WHEN m.replica_id = p_replica THEN NOT p_leaving ELSE m.stable END
), mine AS MATERIALIZED (
    SELECT t.key, t.epoch
      FROM pgtenant.tenants t
      JOIN pgtenant.replicas r ON r.replica_id = p_replica AND t.owner_incarnation = r.incarnation
     WHERE t.owner = p_replica AND t.schema_name IS NOT NULL
), homes AS (
    SELECT DISTINCT ON (mine.key) mine.key, mine.epoch, m.replica_id AS home
      FROM mine CROSS JOIN members m
     ORDER BY mine.key, pgtenant.placement_score(mine.key, m.replica_id, m.weight) DESC,
              m.replica_id
)
SELECT h.key, h.epoch, h.home FROM homes h WHERE h.home <> p_replica ORDER BY h.key LIMIT p_limit
$$;
COMMENT ON FUNCTION pgtenant.placement_moves(text, integer, boolean, integer) IS
    'The tenants replica p_replica holds whose home is another replica, with that home: among the live replicas stable for p_stable_ms, and p_replica itself unless p_leaving (then every tenant gets its next home). At most p_limit rows.';
REVOKE ALL ON FUNCTION pgtenant.placement_moves(text, integer, boolean, integer) FROM PUBLIC;

CREATE FUNCTION pgtenant.reserved_for(p_replica text, p_limit integer)
RETURNS TABLE (tenant text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
SELECT t.key
  FROM pgtenant.tenants t
 WHERE t.reserved_for = p_replica AND t.owner IS NULL AND t.schema_name IS NOT NULL
 ORDER BY t.key
 LIMIT p_limit
$$;
COMMENT ON FUNCTION pgtenant.reserved_for(text, integer) IS
    'Tenants a directed handoff reserved for replica p_replica that nobody has opened since (index tenants_reserved), the reservation current or run out: what the handoff meant for it. A release without a target clears reserved_for, so an idle release is not undone.';
REVOKE ALL ON FUNCTION pgtenant.reserved_for(text, integer) FROM PUBLIC;

CREATE FUNCTION pgtenant.orphaned_homes(p_replica text, p_limit integer)
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
), homes AS (
    SELECT DISTINCT ON (o.key) o.key, m.replica_id AS home
      FROM orphans o CROSS JOIN members m
     ORDER BY o.key, pgtenant.placement_score(o.key, m.replica_id, m.weight) DESC, m.replica_id
)
SELECT h.key FROM homes h WHERE h.home = p_replica ORDER BY h.key LIMIT p_limit
$$;
COMMENT ON FUNCTION pgtenant.orphaned_homes(text, integer) IS
    'Tenants still held by an incarnation that is over (expired, deregistered or replaced) whose home among the live replicas is p_replica: what it takes over, and nobody else, after a crash. At most p_limit rows.';
REVOKE ALL ON FUNCTION pgtenant.orphaned_homes(text, integer) FROM PUBLIC;

-- The placement view, set-based like the functions above: 10 000 tenants among 5 replicas in
-- about 100 ms instead of 1.1 s (V15 called home_among per tenant).
CREATE OR REPLACE VIEW pgtenant.placement AS
WITH candidates AS MATERIALIZED (
    SELECT c.replica_id, c.weight FROM pgtenant.placement_candidates c
), live AS MATERIALIZED (
    SELECT t.key, t.owner, t.reserved_for, t.reserved_until
      FROM pgtenant.tenants t
     WHERE t.schema_name IS NOT NULL
), homes AS (
    SELECT DISTINCT ON (l.key) l.key, c.replica_id AS home
      FROM live l CROSS JOIN candidates c
     ORDER BY l.key, pgtenant.placement_score(l.key, c.replica_id, c.weight) DESC, c.replica_id
)
SELECT l.key AS tenant, l.owner,
       CASE WHEN l.owner IS NULL AND l.reserved_until > now() THEN l.reserved_for END AS reserved_for,
       h.home, r.address AS home_address,
       l.owner IS NOT DISTINCT FROM h.home AS at_home
  FROM live l
  LEFT JOIN homes h ON h.key = l.key
  LEFT JOIN pgtenant.replicas r ON r.replica_id = h.home;

-- A release reserved for a replica also tells that replica (`pgtenant_reserved`, the payload
-- its id), so it picks the tenant up at once rather than at its next request: rebalancing's
-- moves arrive warm. A trigger rather than a change to the release functions, so every path
-- that reserves a tenant tells, and the release bodies stay as sql/retire_v1_overloads.sql was
-- written against. Within one transaction the notices to one replica fold into one. A forged
-- notice costs its target one read of pgtenant.reserved_for, which opens only what is reserved.
CREATE FUNCTION pgtenant.notify_reserved() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pg_notify('pgtenant_reserved', NEW.reserved_for);
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION pgtenant.notify_reserved() FROM PUBLIC;
CREATE TRIGGER tenants_reserved_notify
    AFTER UPDATE OF reserved_for ON pgtenant.tenants
    FOR EACH ROW WHEN (NEW.owner IS NULL AND NEW.reserved_for IS NOT NULL)
    EXECUTE FUNCTION pgtenant.notify_reserved();

-- Whoever can locate (the application's and the operator's roles) can read these too.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee, a.is_grantable
               FROM pg_catalog.pg_proc p,
                    LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
              WHERE p.oid = 'pgtenant.locate(text)'::regprocedure AND a.grantee <> p.proowner
                AND a.privilege_type = 'EXECUTE' LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgtenant.placement_members(integer),
                                       pgtenant.placement_moves(text, integer, boolean, integer),
                                       pgtenant.reserved_for(text, integer),
                                       pgtenant.orphaned_homes(text, integer) TO %s%s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v16;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
DECLARE
    v_role name;
BEGIN
    PERFORM pgtenant.grant_roles_before_v16(p_app, p_operator);
    FOREACH v_role IN ARRAY ARRAY[p_app, p_operator] LOOP
        IF v_role IS NOT NULL THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.placement_members(integer),
                                pgtenant.placement_moves(text, integer, boolean, integer),
                                pgtenant.reserved_for(text, integer),
                                pgtenant.orphaned_homes(text, integer) TO %I', v_role);
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
