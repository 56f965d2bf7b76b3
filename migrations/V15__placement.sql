-- V15: placement (#30). A replica registers the address its clients reach it at and its
-- placement weight; replica_status shows both, a LeaseHeld refusal carries the address, and
-- pgtenant.locate(key) says who serves a tenant, where, and which replica is its home: the
-- weighted rendezvous choice among the live replicas (pgtenant.home_among), the same answer
-- for every replica and in psql (the view pgtenant.placement: home against owner).

ALTER TABLE pgtenant.replicas ADD COLUMN address text
    CONSTRAINT replicas_address_check CHECK (octet_length(address) BETWEEN 1 AND 1024);
COMMENT ON COLUMN pgtenant.replicas.address IS
    'Where this replica''s clients reach it (RouterOptions::address), as registered by its latest incarnation; NULL when it gave none.';
ALTER TABLE pgtenant.replicas ADD COLUMN weight double precision NOT NULL DEFAULT 1
    CONSTRAINT replicas_weight_check CHECK (weight >= 0 AND weight <= 1000);
COMMENT ON COLUMN pgtenant.replicas.weight IS
    'Its share of the tenants by placement, relative to the other live replicas'' (RouterOptions::placement_weight); 0: the home of none.';

-- ---------------------------------------------------------------------------------------
-- register with an address. The three-argument form stays (a replica of an earlier release
-- registers without one) and keeps its grants; the new one gets the same grants.
-- ---------------------------------------------------------------------------------------
CREATE FUNCTION pgtenant.register(p_replica text, p_ttl_ms integer, p_host text, p_address text,
                                  p_weight double precision)
 RETURNS TABLE(incarnation bigint, expires_at timestamp with time zone, secret text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
           host = p_host,
           address = p_address,
           weight = p_weight
     WHERE r.replica_id = p_replica
    RETURNING r.incarnation, r.expires_at INTO v_incarnation, v_expires;
    INSERT INTO pgtenant.replica_secrets AS s (replica_id, incarnation, secret_hash)
    VALUES (p_replica, v_incarnation, sha256(convert_to(v_secret, 'UTF8')))
    ON CONFLICT (replica_id) DO UPDATE SET incarnation = EXCLUDED.incarnation, secret_hash = EXCLUDED.secret_hash;
    INSERT INTO pgtenant.history (event, replica_id, incarnation, detail)
    VALUES ('registered', p_replica, v_incarnation, p_host);
    RETURN QUERY SELECT v_incarnation, v_expires, v_secret;
END $function$;
REVOKE ALL ON FUNCTION pgtenant.register(text, integer, text, text, double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.register(p_replica text, p_ttl_ms integer, p_host text)
 RETURNS TABLE(incarnation bigint, expires_at timestamp with time zone, secret text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    SELECT * FROM pgtenant.register(p_replica, p_ttl_ms, p_host, NULL, 1)
$function$;

-- ---------------------------------------------------------------------------------------
-- Placement: weighted rendezvous hashing. Each (tenant, replica) pair gets a score
-- weight / -ln(u), u uniform in (0, 1) from md5(key | replica); a tenant's home is the live
-- replica of highest score. When a replica joins, only the tenants it now scores highest on
-- move, and only to it; when one leaves, only its tenants move; a replica of weight w gets
-- w / (sum of weights) of the tenants. md5 (52 of its bits) because every PostgreSQL has it
-- and any client can compute it too.
-- ---------------------------------------------------------------------------------------
CREATE FUNCTION pgtenant.placement_score(p_key text, p_replica text, p_weight double precision)
RETURNS double precision LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pgtenant AS $$
SELECT CASE WHEN p_weight > 0 THEN
    p_weight / -ln((('x' || left(md5(p_key || '|' || p_replica), 13))::bit(52)::bigint::double precision
                    + 0.5) / 4503599627370496.0)
END
$$;
COMMENT ON FUNCTION pgtenant.placement_score(text, text, double precision) IS
    'Weighted rendezvous score of replica p_replica (weight p_weight) for tenant p_key: weight / -ln(u), u in (0, 1) from the first 52 bits of md5(key || ''|'' || replica). NULL for weight 0.';

CREATE FUNCTION pgtenant.home_among(p_key text, p_replicas text[], p_weights double precision[])
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pgtenant AS $$
SELECT c.replica
  FROM unnest(p_replicas, p_weights) AS c(replica, weight)
 WHERE c.weight > 0
 ORDER BY pgtenant.placement_score(p_key, c.replica, c.weight) DESC, c.replica
 LIMIT 1
$$;
COMMENT ON FUNCTION pgtenant.home_among(text, text[], double precision[]) IS
    'The home of tenant p_key among these replicas and weights: the one of highest placement_score (ties by replica id); NULL when every weight is 0.';

-- The replicas placement counts: registered, not deregistered, heartbeat current (the database
-- clock; no pg_locks scan), weight above 0.
CREATE VIEW pgtenant.placement_candidates AS
SELECT r.replica_id, r.weight, r.address
  FROM pgtenant.replicas r
 WHERE r.released_at IS NULL AND r.expires_at > now() AND r.weight > 0;
COMMENT ON VIEW pgtenant.placement_candidates IS
    'The replicas tenants are placed on: registered, heartbeat current, weight above 0.';
REVOKE ALL ON pgtenant.placement_candidates FROM PUBLIC;

CREATE FUNCTION pgtenant.home(p_key text)
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog, pgtenant AS $$
SELECT pgtenant.home_among(p_key, array_agg(c.replica_id), array_agg(c.weight))
  FROM pgtenant.placement_candidates c
$$;
COMMENT ON FUNCTION pgtenant.home(text) IS
    'The home of tenant p_key among the live replicas (placement_candidates).';

CREATE VIEW pgtenant.placement AS
WITH candidates AS MATERIALIZED (
    SELECT array_agg(c.replica_id ORDER BY c.replica_id) AS ids,
           array_agg(c.weight ORDER BY c.replica_id) AS weights
      FROM pgtenant.placement_candidates c
), homed AS (
    SELECT t.key, t.owner, t.epoch, t.reserved_for, t.reserved_until,
           pgtenant.home_among(t.key, c.ids, c.weights) AS home
      FROM pgtenant.tenants t, candidates c
     WHERE t.schema_name IS NOT NULL
)
SELECT h.key AS tenant, h.owner,
       CASE WHEN h.owner IS NULL AND h.reserved_until > now() THEN h.reserved_for END AS reserved_for,
       h.home, r.address AS home_address,
       h.owner IS NOT DISTINCT FROM h.home AS at_home
  FROM homed h
  LEFT JOIN pgtenant.replicas r ON r.replica_id = h.home;
COMMENT ON VIEW pgtenant.placement IS
    'One row per live tenant: its owner (NULL when free), the replica it is reserved for, its home among the live replicas (pgtenant.home) and that replica''s address, and whether it is at home. SELECT count(*) FILTER (WHERE NOT at_home) FROM pgtenant.placement: how many are away.';
-- Readers get it below, with replica_status's.
REVOKE ALL ON pgtenant.placement FROM PUBLIC;

-- ---------------------------------------------------------------------------------------
-- locate: the tenant's owner, epoch and the owner's address; whether the owner's heartbeat is
-- current (no pg_locks scan: that is replica_status's business); the replica it is reserved
-- for; its home. Primary-key reads and one pass over the (few) replicas.
-- ---------------------------------------------------------------------------------------
CREATE FUNCTION pgtenant.locate(p_key text)
RETURNS TABLE (owner text, epoch bigint, address text, owner_alive boolean, reserved_for text,
               reserved_address text, home text, home_address text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
SELECT t.owner, t.epoch, o.address,
       o.replica_id IS NOT NULL AND o.released_at IS NULL AND o.expires_at > now()
           AND o.incarnation = t.owner_incarnation,
       CASE WHEN t.owner IS NULL AND t.reserved_until > now() THEN t.reserved_for END,
       CASE WHEN t.owner IS NULL AND t.reserved_until > now() THEN v.address END,
       h.home, hr.address
  FROM (SELECT pgtenant.home(p_key) AS home) h
  LEFT JOIN pgtenant.tenants t ON t.key = p_key
  LEFT JOIN pgtenant.replicas o ON o.replica_id = t.owner
  LEFT JOIN pgtenant.replicas v ON v.replica_id = t.reserved_for
  LEFT JOIN pgtenant.replicas hr ON hr.replica_id = h.home
$$;
COMMENT ON FUNCTION pgtenant.locate(text) IS
    'Who serves tenant p_key and where: owner, epoch, the owner''s registered address, whether its heartbeat is current, the replica (and address) it is reserved for by a directed handoff, and its home among the live replicas (and that one''s address). epoch NULL: the tenant was never created.';
REVOKE ALL ON FUNCTION pgtenant.locate(text) FROM PUBLIC;

-- A refusal names where the owner is reached.
CREATE OR REPLACE FUNCTION pgtenant.raise_held(p_key text, p_owner text, p_epoch bigint, p_until timestamp with time zone, p_reserved boolean)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PTL01',
        MESSAGE = format(CASE WHEN p_reserved THEN 'tenant %s is reserved for replica %s (epoch %s)'
                              ELSE 'tenant %s is held by replica %s at epoch %s' END,
                         p_key, p_owner, p_epoch),
        DETAIL = json_build_object('owner', p_owner, 'epoch', p_epoch, 'owner_alive', true,
            'expires_in_ms', greatest(0, (extract(epoch FROM p_until - now()) * 1000)::bigint),
            'reserved', p_reserved,
            'address', (SELECT r.address FROM pgtenant.replicas r WHERE r.replica_id = p_owner))::text;
END $function$;

-- ---------------------------------------------------------------------------------------
-- replica_status gains the address: status_report's replica rows carry it, and the view and
-- its function (whose result columns change only by being made again) are made again with
-- exactly the privileges they had, as in V13.
-- ---------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgtenant.status_report(p_retention_ms bigint)
 RETURNS TABLE(fleet jsonb, replicas jsonb)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET jit TO 'off'
 SET work_mem TO '64MB'
 SET "TimeZone" TO 'UTC'
 SET "IntervalStyle" TO 'postgres'
 SET "DateStyle" TO 'ISO, YMD'
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
WITH groups AS MATERIALIZED (
    SELECT t.owner, t.owner_incarnation, t.schema_version AS version,
           t.schema_name IS NOT NULL AS live,
           CASE
               WHEN t.schema_name IS NULL AND t.forgotten_at_epoch > 0 THEN 'forgotten'
               WHEN t.quarantine_cause IS NOT NULL THEN 'quarantined'
               WHEN t.owner IS NULL AND t.reserved_until > now() THEN 'reserved'
               WHEN t.owner IS NULL THEN 'free'
           END AS settled,
           count(*) AS n
      FROM pgtenant.tenants t
     GROUP BY 1, 2, 3, 4, 5
), liveness AS MATERIALIZED (
    -- pg_locks once (the view's own rule).
    SELECT * FROM pgtenant.replica_liveness
), per_state AS MATERIALIZED (
    SELECT coalesce(g.settled,
                    CASE
                        WHEN l.incarnation IS DISTINCT FROM g.owner_incarnation THEN 'owner_reregistered'
                        WHEN l.alive THEN 'held'
                        WHEN l.lock_held THEN 'stalled'
                        ELSE 'owner_gone'
                    END) AS state,
           g.version, g.live, g.n
      FROM groups g
      LEFT JOIN liveness l ON l.replica_id = g.owner
), newest AS (
    SELECT max(p.version) AS version FROM per_state p WHERE p.live
), trash AS (
    SELECT count(*) AS n,
           count(*) FILTER (WHERE x.trashed_at < now() - p_retention_ms * interval '1 millisecond') AS due,
           min(x.trashed_at) AS oldest
      FROM pgtenant.trash x
     WHERE x.swept_at IS NULL
), held AS (
    SELECT g.owner, g.owner_incarnation, sum(g.n)::bigint AS n
      FROM groups g
     WHERE g.owner IS NOT NULL
     GROUP BY g.owner, g.owner_incarnation
), bound AS (
    SELECT b.replica_id, b.incarnation, count(*) AS n
      FROM pgtenant.sessions b
     GROUP BY b.replica_id, b.incarnation
), replica_rows AS (
    SELECT r.replica_id,
           l.alive,
           l.lock_held,
           r.incarnation,
           coalesce(h.n, 0) AS tenants_held,
           CASE WHEN l.alive THEN date_trunc('milliseconds', r.expires_at - now()) END AS expires_in,
           r.backend_pid,
           r.host,
           r.address,
           r.weight,
           r.started_at,
           r.released_at,
           coalesce(b.n, 0) AS sessions,
           s.sealed_at,
           CASE WHEN r.released_at IS NOT NULL THEN 'released'
                WHEN s.sealed_at IS NOT NULL THEN 'sealed'
                WHEN l.alive THEN 'alive'
                WHEN l.lock_held THEN 'stalled'
                ELSE 'gone' END AS state
      FROM pgtenant.replicas r
      JOIN liveness l USING (replica_id)
      LEFT JOIN held h ON h.owner = r.replica_id AND h.owner_incarnation = r.incarnation
      LEFT JOIN bound b ON b.replica_id = r.replica_id AND b.incarnation = r.incarnation
      LEFT JOIN pgtenant.seals s ON s.replica_id = r.replica_id AND s.incarnation = r.incarnation
)
SELECT (SELECT jsonb_build_object(
            'tenants', coalesce(sum(p.n), 0),
            'live', coalesce(sum(p.n) FILTER (WHERE p.live), 0),
            'held', coalesce(sum(p.n) FILTER (WHERE p.state = 'held'), 0),
            'stalled', coalesce(sum(p.n) FILTER (WHERE p.state = 'stalled'), 0),
            'owner_gone', coalesce(sum(p.n) FILTER (WHERE p.state = 'owner_gone'), 0),
            'owner_reregistered', coalesce(sum(p.n) FILTER (WHERE p.state = 'owner_reregistered'), 0),
            -- For operator tools of V10-V12, which read this key: both of the above.
            'expired', coalesce(sum(p.n) FILTER (WHERE p.state IN ('owner_gone', 'owner_reregistered')), 0),
            'free', coalesce(sum(p.n) FILTER (WHERE p.state = 'free'), 0),
            'reserved', coalesce(sum(p.n) FILTER (WHERE p.state = 'reserved'), 0),
            'quarantined', coalesce(sum(p.n) FILTER (WHERE p.state = 'quarantined'), 0),
            'forgotten', coalesce(sum(p.n) FILTER (WHERE p.state = 'forgotten'), 0),
            'newest_version', (SELECT v.version FROM newest v),
            'behind', coalesce(sum(p.n) FILTER (WHERE p.live AND p.state <> 'quarantined'
                                                  AND p.version < (SELECT v.version FROM newest v)), 0),
            'versions', coalesce((SELECT jsonb_object_agg(q.version::text, q.n ORDER BY q.version)
                                    FROM (SELECT p2.version, sum(p2.n)::bigint AS n FROM per_state p2
                                           WHERE p2.live GROUP BY p2.version) q), '{}'::jsonb),
            'trashed', (SELECT x.n FROM trash x),
            'trash_due', (SELECT x.due FROM trash x),
            'oldest_trashed_at', (SELECT x.oldest FROM trash x),
            'replicas', (SELECT count(*) FROM liveness),
            'replicas_alive', (SELECT count(*) FILTER (WHERE l.alive) FROM liveness l))
          FROM per_state p),
       (SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY x.replica_id), '[]'::jsonb) FROM replica_rows x)
$function$;

CREATE TEMP TABLE pgtenant_v15_grants ON COMMIT DROP AS
SELECT 'FUNCTION pgtenant.replica_status_rows()' AS object, a.grantee, a.privilege_type,
       a.is_grantable
  FROM pg_catalog.pg_proc p,
       LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
 WHERE p.oid = 'pgtenant.replica_status_rows()'::regprocedure AND a.grantee <> p.proowner
UNION ALL
SELECT 'TABLE pgtenant.replica_status', a.grantee, a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_class c,
       LATERAL pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault('r', c.relowner))) a
 WHERE c.oid = 'pgtenant.replica_status'::regclass AND a.grantee <> c.relowner
UNION ALL
-- Whoever may register may register with an address; whoever may read replica_status may
-- locate a tenant.
SELECT 'FUNCTION pgtenant.register(text, integer, text, text, double precision)', a.grantee, a.privilege_type,
       a.is_grantable
  FROM pg_catalog.pg_proc p,
       LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
 WHERE p.oid = 'pgtenant.register(text, integer, text)'::regprocedure AND a.grantee <> p.proowner
UNION ALL
SELECT 'FUNCTION pgtenant.locate(text)', a.grantee, 'EXECUTE', a.is_grantable
  FROM pg_catalog.pg_class c,
       LATERAL pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault('r', c.relowner))) a
 WHERE c.oid = 'pgtenant.replica_status'::regclass AND a.grantee <> c.relowner
   AND a.privilege_type = 'SELECT'
UNION ALL
SELECT 'TABLE pgtenant.placement', a.grantee, 'SELECT', a.is_grantable
  FROM pg_catalog.pg_class c,
       LATERAL pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault('r', c.relowner))) a
 WHERE c.oid = 'pgtenant.replica_status'::regclass AND a.grantee <> c.relowner
   AND a.privilege_type = 'SELECT';

DROP VIEW pgtenant.replica_status;
DROP FUNCTION pgtenant.replica_status_rows();

CREATE FUNCTION pgtenant.replica_status_rows()
RETURNS TABLE (replica_id text, alive boolean, lock_held boolean, incarnation bigint,
               tenants_held bigint, expires_in interval, backend_pid integer, host text,
               started_at timestamptz, released_at timestamptz, sessions bigint,
               sealed_at timestamptz, state text, address text, weight double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET jit = off SET search_path = pg_catalog, pgtenant AS $$
SELECT x.*
  FROM pgtenant.status_report(0) s,
       jsonb_to_recordset(s.replicas) AS x(replica_id text, alive boolean, lock_held boolean,
                                           incarnation bigint, tenants_held bigint, expires_in interval,
                                           backend_pid integer, host text, started_at timestamptz,
                                           released_at timestamptz, sessions bigint,
                                           sealed_at timestamptz, state text, address text,
                                           weight double precision)
 ORDER BY x.replica_id
$$;

CREATE VIEW pgtenant.replica_status AS
SELECT * FROM pgtenant.replica_status_rows();
COMMENT ON VIEW pgtenant.replica_status IS
    'One row per replica id: alive, lock_held, incarnation, tenants_held, expires_in, backend_pid, host, started_at, released_at, sessions (bound data sessions), sealed_at, state (alive, stalled, gone, sealed, released), address (where its clients reach it) and weight (its placement weight).';

REVOKE ALL ON FUNCTION pgtenant.replica_status_rows() FROM PUBLIC;
REVOKE ALL ON pgtenant.replica_status FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT * FROM pgtenant_v15_grants LOOP
        EXECUTE pg_catalog.format('GRANT %s ON %s TO %s%s', g.privilege_type, g.object,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;

-- `setup --app-role/--operator-role` grants the new functions too: the application's role
-- registers with an address and locates; the operator's locates.
ALTER FUNCTION pgtenant.grant_roles(name, name) RENAME TO grant_roles_before_v15;
CREATE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    PERFORM pgtenant.grant_roles_before_v15(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION
                            pgtenant.register(text, integer, text, text, double precision),
                            pgtenant.locate(text)
                        TO %I', p_app);
        EXECUTE format('GRANT SELECT ON pgtenant.placement TO %I', p_app);
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.locate(text) TO %I', p_operator);
        EXECUTE format('GRANT SELECT ON pgtenant.placement TO %I', p_operator);
    END IF;
END $$;
REVOKE ALL ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;
