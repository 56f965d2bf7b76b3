-- pgtenant control plane: the current text of every object in schema pgtenant.
--
-- GENERATED from a freshly set-up control plane by tests/schema.rs; do not edit. The
-- migrations in migrations/ are history; this file is the current text (sql/README.md).
-- Regenerate: PGTENANT_WRITE_SCHEMA=1 cargo test --test schema
--
-- Dumped from PostgreSQL 15. Migrations applied:
--   V1__control_plane
--   V2__owner_index_with_key
--   V3__least_privilege_and_hygiene
--   V4__epoch_floor
--   V5__session_fencing
--   V6__fence_floor
--   V7__seal_on_takeover
--   V8__seal_per_incarnation
--   V9__fence_signalled
--   V10__scale
--   V11__untracked_work
--   V12__tenant_boundary
--   V13__first_day
--   V14__one_fence
--   V15__placement
--   V16__rebalancing
--   V17__leaving
--   V18__alarms
--   V19__alarm_requests
--   V20__pickups_and_takeovers
--   V21__reservations_of_the_dead
--   V22__locate_with_a_kept_plan

CREATE SCHEMA pgtenant;
GRANT USAGE ON SCHEMA pgtenant TO PUBLIC;

CREATE DOMAIN pgtenant.fenced_transaction AS text
    CONSTRAINT the_work_ended_the_fenced_transaction CHECK (((VALUE IS NOT NULL) AND (VALUE = 'on'::text)));
COMMENT ON TYPE pgtenant.fenced_transaction IS 'The commit check of a fenced transaction: current_setting(''pgtenant.fenced'', true) cast to this fails once the transaction the fence began has ended.';

CREATE SEQUENCE pgtenant.alarm_requests_id_seq AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 NO CYCLE OWNED BY pgtenant.alarm_requests.id;

CREATE SEQUENCE pgtenant.history_id_seq AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 NO CYCLE OWNED BY pgtenant.history.id;

CREATE SEQUENCE pgtenant.replicas_lock_key_seq AS integer START WITH 1 INCREMENT BY 1 MINVALUE 1 MAXVALUE 2147483647 CACHE 1 NO CYCLE OWNED BY pgtenant.replicas.lock_key;

CREATE SEQUENCE pgtenant.tenants_lock_key_seq AS integer START WITH 1 INCREMENT BY 1 MINVALUE 1 MAXVALUE 2147483647 CACHE 1 NO CYCLE OWNED BY pgtenant.tenants.lock_key;

CREATE TABLE pgtenant.alarm_due (
    tenant_key text NOT NULL,
    next_due timestamp with time zone,
    pending integer DEFAULT 0 NOT NULL,
    failed integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT alarm_due_pkey PRIMARY KEY (tenant_key)
);
CREATE INDEX alarm_due_next ON pgtenant.alarm_due USING btree (next_due) WHERE (next_due IS NOT NULL);
COMMENT ON TABLE pgtenant.alarm_due IS 'Per tenant with alarms: when its next pending alarm is due, how many are pending and how many failed (parked). A hint kept by pgtenant in the transactions that change the tenant''s alarms (its own table pgtenant_alarms holds the truth); read by due_alarms to wake tenants no replica holds.';

CREATE TABLE pgtenant.alarm_requests (
    id bigint DEFAULT nextval('pgtenant.alarm_requests_id_seq'::regclass) NOT NULL,
    tenant_key text NOT NULL,
    name text,
    action text NOT NULL,
    requested_by text DEFAULT CURRENT_USER NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT alarm_requests_action_check CHECK ((action = ANY (ARRAY['retry'::text, 'clear'::text]))),
    CONSTRAINT alarm_requests_pkey PRIMARY KEY (id)
);
CREATE INDEX alarm_requests_tenant ON pgtenant.alarm_requests USING btree (tenant_key);
COMMENT ON TABLE pgtenant.alarm_requests IS 'Operators'' requests to retry or clear a tenant''s parked alarms (name NULL: all of them), applied and deleted by the tenant''s owner in a fenced transaction of the tenant.';

CREATE TABLE pgtenant.config (
    singleton boolean DEFAULT true NOT NULL,
    app_role name,
    operator_role name,
    CONSTRAINT config_pkey PRIMARY KEY (singleton),
    CONSTRAINT config_singleton_check CHECK (singleton)
);
COMMENT ON TABLE pgtenant.config IS 'The application and operator roles pgtenant setup granted to; tenant schemas are expected to be owned by app_role.';

CREATE TABLE pgtenant.handoff_requests (
    tenant_key text NOT NULL,
    requester text NOT NULL,
    requester_incarnation bigint NOT NULL,
    requested_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT handoff_requests_pkey PRIMARY KEY (tenant_key, requester),
    CONSTRAINT handoff_requests_requester_fkey FOREIGN KEY (requester) REFERENCES pgtenant.replicas(replica_id) ON DELETE CASCADE
);
COMMENT ON TABLE pgtenant.handoff_requests IS 'Handoff requests (Router::request_handoff), written by request_handoff for an authenticated requester and consumed by the owner (take_handoff_request); a NOTIFY on pgtenant_handoff without a row here is ignored.';

CREATE TABLE pgtenant.history (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    tenant_key text,
    event text NOT NULL,
    epoch bigint,
    replica_id text,
    incarnation bigint,
    detail text,
    CONSTRAINT history_event_check CHECK ((event = ANY (ARRAY['registered'::text, 'deregistered'::text, 'created'::text, 'acquired'::text, 'released'::text, 'handed_off'::text, 'lost'::text, 'broken'::text, 'forgotten'::text, 'restored'::text, 'swept'::text, 'migrated'::text, 'quarantined'::text, 'cleared'::text]))),
    CONSTRAINT history_pkey PRIMARY KEY (id)
);
CREATE INDEX history_at ON pgtenant.history USING btree (at);
CREATE INDEX history_tenant ON pgtenant.history USING btree (tenant_key, id) WHERE (tenant_key IS NOT NULL);

CREATE TABLE pgtenant.refinery_schema_history (
    version integer NOT NULL,
    name character varying(255),
    applied_on character varying(255),
    checksum character varying(255),
    CONSTRAINT refinery_schema_history_pkey PRIMARY KEY (version)
);

CREATE TABLE pgtenant.replica_secrets (
    replica_id text NOT NULL,
    incarnation bigint NOT NULL,
    secret_hash bytea NOT NULL,
    CONSTRAINT replica_secrets_pkey PRIMARY KEY (replica_id),
    CONSTRAINT replica_secrets_replica_id_fkey FOREIGN KEY (replica_id) REFERENCES pgtenant.replicas(replica_id) ON DELETE CASCADE
);
COMMENT ON TABLE pgtenant.replica_secrets IS 'SHA-256 of the secret of each replica''s current incarnation: the proof that a caller is that incarnation.';

CREATE TABLE pgtenant.replicas (
    replica_id text NOT NULL,
    lock_key integer GENERATED BY DEFAULT AS IDENTITY NOT NULL,
    incarnation bigint DEFAULT 0 NOT NULL,
    backend_pid integer,
    backend_start timestamp with time zone,
    expires_at timestamp with time zone,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    released_at timestamp with time zone,
    host text,
    session_fencing_incarnation bigint,
    address text,
    weight double precision DEFAULT 1 NOT NULL,
    CONSTRAINT replicas_address_check CHECK (((octet_length(address) >= 1) AND (octet_length(address) <= 1024))),
    CONSTRAINT replicas_incarnation_check CHECK ((incarnation >= 0)),
    CONSTRAINT replicas_lock_key_key UNIQUE (lock_key),
    CONSTRAINT replicas_pkey PRIMARY KEY (replica_id),
    CONSTRAINT replicas_replica_id_check CHECK ((replica_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,62}$'::text)),
    CONSTRAINT replicas_weight_check CHECK (((weight >= (0)::double precision) AND (weight <= (1000)::double precision)))
);
COMMENT ON TABLE pgtenant.replicas IS 'One row per replica id. A replica is alive while its lease session holds its advisory lock and expires_at is in the future (DB clock).';
COMMENT ON COLUMN pgtenant.replicas.address IS 'Where this replica''s clients reach it (RouterOptions::address), as registered by its latest incarnation; NULL when it gave none.';
COMMENT ON COLUMN pgtenant.replicas.weight IS 'Its share of the tenants by placement, relative to the other live replicas'' (RouterOptions::placement_weight); 0: the home of none.';

CREATE TABLE pgtenant.seals (
    replica_id text NOT NULL,
    incarnation bigint NOT NULL,
    sealed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT seals_pkey PRIMARY KEY (replica_id, incarnation),
    CONSTRAINT seals_replica_id_fkey FOREIGN KEY (replica_id) REFERENCES pgtenant.replicas(replica_id) ON DELETE CASCADE
);
COMMENT ON TABLE pgtenant.seals IS 'Sealed incarnations (session fencing): a sealed incarnation binds no data session and renews nothing, ever; a later incarnation of the same replica id is not affected.';

CREATE UNLOGGED TABLE pgtenant.sessions (
    pid integer NOT NULL,
    backend_start timestamp with time zone NOT NULL,
    replica_id text NOT NULL,
    incarnation bigint NOT NULL,
    bound_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT sessions_pkey PRIMARY KEY (pid, backend_start)
);
CREATE INDEX sessions_incarnation ON pgtenant.sessions USING btree (replica_id, incarnation);
COMMENT ON TABLE pgtenant.sessions IS 'Data-path backends bound to a replica incarnation (session fencing): terminated when that incarnation is sealed.';

CREATE TABLE pgtenant.tenants (
    key text NOT NULL,
    organization text NOT NULL,
    ledger text NOT NULL,
    schema_name text,
    epoch bigint DEFAULT 0 NOT NULL,
    owner text,
    owner_incarnation bigint,
    forgotten_at_epoch bigint DEFAULT 0 NOT NULL,
    schema_version integer DEFAULT 0 NOT NULL,
    quarantine_cause text,
    quarantine_repair text,
    quarantined_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    acquired_at timestamp with time zone,
    reserved_for text,
    reserved_until timestamp with time zone,
    lock_key integer GENERATED ALWAYS AS IDENTITY NOT NULL,
    CONSTRAINT tenants_check CHECK ((forgotten_at_epoch <= epoch)),
    CONSTRAINT tenants_check1 CHECK ((key = ((organization || '/'::text) || ledger))),
    CONSTRAINT tenants_check2 CHECK (((owner IS NULL) = (owner_incarnation IS NULL))),
    CONSTRAINT tenants_check3 CHECK (((quarantine_cause IS NULL) = (quarantined_at IS NULL))),
    CONSTRAINT tenants_epoch_check CHECK ((epoch >= 0)),
    CONSTRAINT tenants_ledger_check CHECK (((ledger ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$'::text) AND (octet_length(ledger) <= 128))),
    CONSTRAINT tenants_lock_key_key UNIQUE (lock_key),
    CONSTRAINT tenants_organization_check CHECK (((organization ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$'::text) AND (octet_length(organization) <= 128))),
    CONSTRAINT tenants_owner_fkey FOREIGN KEY (owner) REFERENCES pgtenant.replicas(replica_id),
    CONSTRAINT tenants_pkey PRIMARY KEY (key),
    CONSTRAINT tenants_schema_name_check CHECK ((schema_name ~ '^t_[a-z0-9_]{1,55}$'::text)),
    CONSTRAINT tenants_schema_name_key UNIQUE (schema_name)
);
CREATE INDEX tenants_forgotten ON pgtenant.tenants USING btree (key) WHERE (schema_name IS NULL);
CREATE INDEX tenants_owner ON pgtenant.tenants USING btree (owner, owner_incarnation, key) WHERE (owner IS NOT NULL);
CREATE INDEX tenants_quarantined ON pgtenant.tenants USING btree (key) WHERE (quarantine_cause IS NOT NULL);
CREATE INDEX tenants_reserved ON pgtenant.tenants USING btree (reserved_for, key) WHERE ((owner IS NULL) AND (reserved_for IS NOT NULL));
CREATE INDEX tenants_schema_version ON pgtenant.tenants USING btree (schema_version) WHERE (schema_name IS NOT NULL);
CREATE TRIGGER seal_on_takeover BEFORE UPDATE OF epoch ON pgtenant.tenants FOR EACH ROW WHEN (((old.owner IS NOT NULL) AND (new.owner IS NOT NULL) AND (new.epoch <> old.epoch) AND ((new.owner IS DISTINCT FROM old.owner) OR (new.owner_incarnation IS DISTINCT FROM old.owner_incarnation)))) EXECUTE FUNCTION pgtenant.seal_on_takeover();
CREATE TRIGGER tenants_reserved_notify AFTER UPDATE OF reserved_for ON pgtenant.tenants FOR EACH ROW WHEN (((new.owner IS NULL) AND (new.reserved_for IS NOT NULL))) EXECUTE FUNCTION pgtenant.notify_reserved();
COMMENT ON TABLE pgtenant.tenants IS 'One row per tenant id, kept after forget so epochs never repeat. The lease is (owner, owner_incarnation, epoch).';

CREATE TABLE pgtenant.trash (
    schema_name text NOT NULL,
    tenant_key text NOT NULL,
    epoch bigint NOT NULL,
    live_name text NOT NULL,
    schema_version integer DEFAULT 0 NOT NULL,
    trashed_at timestamp with time zone DEFAULT now() NOT NULL,
    swept_at timestamp with time zone,
    sweep_started_at timestamp with time zone,
    CONSTRAINT trash_pkey PRIMARY KEY (schema_name),
    CONSTRAINT trash_tenant_key_fkey FOREIGN KEY (tenant_key) REFERENCES pgtenant.tenants(key)
);
CREATE INDEX trash_tenant ON pgtenant.trash USING btree (tenant_key);
CREATE INDEX trash_unswept ON pgtenant.trash USING btree (trashed_at) WHERE (swept_at IS NULL);
COMMENT ON COLUMN pgtenant.trash.sweep_started_at IS 'When the sweep began dropping this schema''s objects (set in the transaction of its first drop): restore refuses the row from then on.';

CREATE VIEW pgtenant.alarms AS
 SELECT a.tenant_key AS tenant,
    t.owner,
    a.next_due,
    a.pending,
    a.failed,
    a.updated_at
   FROM pgtenant.alarm_due a
     LEFT JOIN pgtenant.tenants t ON t.key = a.tenant_key;
COMMENT ON VIEW pgtenant.alarms IS 'Per tenant with alarms: its owner, when its next pending alarm is due, how many are pending and how many failed (parked after their last attempt). The alarms themselves are in the tenant''s schema, table pgtenant_alarms.';

CREATE VIEW pgtenant.fleet_status AS
 SELECT fleet_status_rows.tenants,
    fleet_status_rows.live,
    fleet_status_rows.held,
    fleet_status_rows.stalled,
    fleet_status_rows.owner_gone,
    fleet_status_rows.owner_reregistered,
    fleet_status_rows.free,
    fleet_status_rows.reserved,
    fleet_status_rows.quarantined,
    fleet_status_rows.forgotten,
    fleet_status_rows.newest_version,
    fleet_status_rows.behind,
    fleet_status_rows.versions,
    fleet_status_rows.trashed,
    fleet_status_rows.trash_due,
    fleet_status_rows.oldest_trashed_at,
    fleet_status_rows.replicas,
    fleet_status_rows.replicas_alive
   FROM pgtenant.fleet_status_rows(7 * 24 * 3600 * 1000::bigint) fleet_status_rows(tenants, live, held, stalled, owner_gone, owner_reregistered, free, reserved, quarantined, forgotten, newest_version, behind, versions, trashed, trash_due, oldest_trashed_at, replicas, replicas_alive);
COMMENT ON VIEW pgtenant.fleet_status IS 'The fleet in one row: tenants per state (as lease_status), migrations (newest version, live tenants behind it, tenants per version), quarantined, the unswept trash and how much of it a sweep with the default 7-day retention drops; fleet_status_rows(retention_ms) for another retention.';

CREATE VIEW pgtenant.lease_rows AS
 SELECT t.key AS tenant,
        CASE
            WHEN t.schema_name IS NULL AND t.forgotten_at_epoch > 0 THEN 'forgotten'::text
            WHEN t.quarantine_cause IS NOT NULL THEN 'quarantined'::text
            WHEN t.owner IS NULL AND t.reserved_until > now() THEN 'reserved'::text
            WHEN t.owner IS NULL THEN 'free'::text
            WHEN l.incarnation IS DISTINCT FROM t.owner_incarnation THEN 'owner_reregistered'::text
            WHEN l.alive THEN 'held'::text
            WHEN l.lock_held THEN 'stalled'::text
            ELSE 'owner_gone'::text
        END AS state,
    t.owner,
    t.epoch,
        CASE
            WHEN t.owner IS NOT NULL THEN COALESCE(l.alive AND l.incarnation = t.owner_incarnation, false)
            ELSE NULL::boolean
        END AS owner_alive,
        CASE
            WHEN t.owner IS NOT NULL AND l.incarnation = t.owner_incarnation AND l.lock_held THEN GREATEST('00:00:00'::interval, date_trunc('milliseconds'::text, l.expires_at - now()))
            ELSE NULL::interval
        END AS expires_in,
    t.schema_name AS schema,
    t.schema_version AS version,
    t.quarantine_cause,
    t.quarantine_repair,
    t.reserved_for,
    t.acquired_at,
    t.created_at,
    t.forgotten_at_epoch,
    t.quarantined_at,
    t.owner_incarnation
   FROM pgtenant.tenants t
     LEFT JOIN pgtenant.replica_liveness l ON l.replica_id = t.owner;
COMMENT ON VIEW pgtenant.lease_rows IS 'One row per tenant, unordered: lease_status without its ORDER BY, for queries that filter, count or page (WHERE, GROUP BY, ORDER BY tenant LIMIT n); lease_status sorts every tenant first.';

CREATE VIEW pgtenant.lease_status AS
 SELECT lease_rows.tenant,
    lease_rows.state,
    lease_rows.owner,
    lease_rows.epoch,
    lease_rows.owner_alive,
    lease_rows.expires_in,
    lease_rows.schema,
    lease_rows.version,
    lease_rows.quarantine_cause,
    lease_rows.quarantine_repair,
    lease_rows.reserved_for,
    lease_rows.acquired_at,
    lease_rows.created_at,
    lease_rows.owner_incarnation
   FROM pgtenant.lease_rows
  ORDER BY lease_rows.tenant;
COMMENT ON VIEW pgtenant.lease_status IS 'One row per tenant. state: held (its owner incarnation is alive), stalled (the owner holds its liveness lock but its heartbeat expired: a paused or starved process; taken over by the next open), owner_gone (the owner''s lease session is gone: taken over at once), owner_reregistered (held by an earlier incarnation of a replica id that has registered again since: taken over at once), free, reserved, quarantined, forgotten. owner_alive: the incarnation holding the lease is alive. expires_in: for held and stalled tenants.';

CREATE VIEW pgtenant.placement AS
 WITH candidates AS MATERIALIZED (
         SELECT c.replica_id,
            c.weight
           FROM pgtenant.placement_candidates c
        ), live AS MATERIALIZED (
         SELECT t.key,
            t.owner,
            t.reserved_for,
            t.reserved_until
           FROM pgtenant.tenants t
          WHERE t.schema_name IS NOT NULL
        ), homes AS (
         SELECT DISTINCT ON (l_1.key) l_1.key,
            c.replica_id AS home
           FROM live l_1
             CROSS JOIN candidates c
          ORDER BY l_1.key, (pgtenant.placement_score(l_1.key, c.replica_id, c.weight)) DESC, c.replica_id
        )
 SELECT l.key AS tenant,
    l.owner,
        CASE
            WHEN l.owner IS NULL AND l.reserved_until > now() THEN l.reserved_for
            ELSE NULL::text
        END AS reserved_for,
    h.home,
    r.address AS home_address,
    NOT l.owner IS DISTINCT FROM h.home AS at_home
   FROM live l
     LEFT JOIN homes h ON h.key = l.key
     LEFT JOIN pgtenant.replicas r ON r.replica_id = h.home;
COMMENT ON VIEW pgtenant.placement IS 'One row per live tenant: its owner (NULL when free), the replica it is reserved for, its home among the live replicas (pgtenant.home) and that replica''s address, and whether it is at home. SELECT count(*) FILTER (WHERE NOT at_home) FROM pgtenant.placement: how many are away.';

CREATE VIEW pgtenant.placement_candidates AS
 SELECT r.replica_id,
    r.weight,
    r.address
   FROM pgtenant.replicas r
  WHERE r.released_at IS NULL AND r.expires_at > now() AND r.weight > 0::double precision;
COMMENT ON VIEW pgtenant.placement_candidates IS 'The replicas tenants are placed on: registered, heartbeat current, weight above 0.';

CREATE VIEW pgtenant.replica_liveness AS
 WITH held AS (
         SELECT l.objid::bigint AS lock_key,
            l.pid
           FROM pg_locks l
          WHERE l.locktype = 'advisory'::text AND l.granted AND l.objsubid = 2 AND l.classid = pgtenant.lock_namespace()::oid AND l.database = (( SELECT pg_database.oid
                   FROM pg_database
                  WHERE pg_database.datname = current_database()))
        )
 SELECT r.replica_id,
    r.incarnation,
    r.lock_key,
    held.pid AS lock_pid,
    held.pid IS NOT NULL AS lock_held,
    held.pid IS NOT NULL AND r.released_at IS NULL AND r.expires_at > now() AS alive,
    r.expires_at
   FROM pgtenant.replicas r
     LEFT JOIN held ON held.lock_key = r.lock_key;

CREATE VIEW pgtenant.replica_status AS
 SELECT replica_status_rows.replica_id,
    replica_status_rows.alive,
    replica_status_rows.lock_held,
    replica_status_rows.incarnation,
    replica_status_rows.tenants_held,
    replica_status_rows.expires_in,
    replica_status_rows.backend_pid,
    replica_status_rows.host,
    replica_status_rows.started_at,
    replica_status_rows.released_at,
    replica_status_rows.sessions,
    replica_status_rows.sealed_at,
    replica_status_rows.state,
    replica_status_rows.address,
    replica_status_rows.weight
   FROM pgtenant.replica_status_rows() replica_status_rows(replica_id, alive, lock_held, incarnation, tenants_held, expires_in, backend_pid, host, started_at, released_at, sessions, sealed_at, state, address, weight);
COMMENT ON VIEW pgtenant.replica_status IS 'One row per replica id: alive, lock_held, incarnation, tenants_held, expires_in, backend_pid, host, started_at, released_at, sessions (bound data sessions), sealed_at, state (alive, stalled, gone, sealed, released), address (where its clients reach it) and weight (its placement weight).';

CREATE VIEW pgtenant.session_status AS
 SELECT s.replica_id,
    s.incarnation,
    s.pid,
    s.backend_start,
    s.bound_at,
    sl.sealed_at IS NOT NULL AS sealed,
    r.incarnation = s.incarnation AS current_incarnation,
    a.state,
    a.xact_start,
    a.state_change,
    a.pid IS NOT NULL AS backend_alive
   FROM pgtenant.sessions s
     LEFT JOIN pgtenant.replicas r ON r.replica_id = s.replica_id
     LEFT JOIN pg_stat_activity a ON a.pid = s.pid AND a.backend_start = s.backend_start
     LEFT JOIN pgtenant.seals sl ON sl.replica_id = s.replica_id AND sl.incarnation = s.incarnation
  ORDER BY s.replica_id, s.incarnation, s.pid;

CREATE VIEW pgtenant.sweep_backlog AS
 SELECT sweep_backlog_rows.trash_due,
    sweep_backlog_rows.trash_kept,
    sweep_backlog_rows.oldest_due_at,
    sweep_backlog_rows.orphan_schemas
   FROM pgtenant.sweep_backlog_rows(7 * 24 * 3600 * 1000::bigint) sweep_backlog_rows(trash_due, trash_kept, oldest_due_at, orphan_schemas);
COMMENT ON VIEW pgtenant.sweep_backlog IS 'What the next sweep (7-day retention) would do: trashed schemas due and kept, the oldest due, orphan schemas; sweep_backlog_rows(retention_ms) for another retention.';

CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text, p_replica text, p_incarnation bigint, p_create boolean)
 RETURNS TABLE(epoch bigint, schema_name text, forgotten_at_epoch bigint, schema_version integer, previous_owner text, took_over text, quarantine text, lock_key integer)
 LANGUAGE plpgsql
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.acquire(text, text, text, text, bigint, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text, p_replica text, p_incarnation bigint, p_secret text, p_create boolean)
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.acquire(text, text, text, text, bigint, text, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.acquire(p_key text, p_organization text, p_ledger text, p_replica text, p_incarnation bigint, p_secret text, p_create boolean, p_grace_ms integer, p_wait_ms integer, p_terminate_ms bigint)
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
REVOKE EXECUTE ON FUNCTION pgtenant.acquire(text, text, text, text, bigint, text, boolean, integer, integer, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.acquire_many(p_keys text[], p_replica text, p_incarnation bigint, p_secret text, p_grace_ms integer, p_wait_ms integer, p_terminate_ms bigint)
 RETURNS TABLE(key text, epoch bigint, schema_name text, previous_owner text, took_over text, quarantine text, schema_version integer, lock_key integer, error_code text, error_message text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    k text;
    a record;
BEGIN
    -- A caller that is not the incarnation is refused as a whole, not key by key.
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    FOR k IN SELECT DISTINCT u.k FROM unnest(p_keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1 LOOP
        key := k;
        BEGIN
            SELECT * INTO a
              FROM pgtenant.acquire(k, NULL, NULL, p_replica, p_incarnation, p_secret, false,
                                    p_grace_ms, p_wait_ms, p_terminate_ms) AS x;
            epoch := a.epoch;
            schema_name := a.schema_name;
            previous_owner := a.previous_owner;
            took_over := a.took_over;
            quarantine := a.quarantine;
            schema_version := a.schema_version;
            lock_key := a.lock_key;
            error_code := NULL;
            error_message := NULL;
        EXCEPTION WHEN OTHERS THEN
            epoch := NULL; schema_name := NULL; previous_owner := NULL; took_over := NULL;
            quarantine := NULL; schema_version := NULL; lock_key := NULL;
            GET STACKED DIAGNOSTICS error_code = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
        END;
        RETURN NEXT;
    END LOOP;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.acquire_many(text[], text, bigint, text, integer, integer, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.authenticate(p_replica text, p_incarnation bigint, p_secret text)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    v_hash bytea;
BEGIN
    SELECT s.secret_hash INTO v_hash FROM pgtenant.replica_secrets s
     WHERE s.replica_id = p_replica AND s.incarnation = p_incarnation;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_secret IS NULL OR sha256(convert_to(p_secret, 'UTF8')) <> v_hash THEN
        RAISE EXCEPTION USING ERRCODE = 'PTA01',
            MESSAGE = format('replica %s incarnation %s: the caller did not prove it is that incarnation', p_replica, p_incarnation),
            HINT = 'only the process that registered an incarnation can act for it (its secret is issued at registration)';
    END IF;
    RETURN true;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.authenticate(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.begin_sweep(p_schema text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    UPDATE pgtenant.trash tr SET sweep_started_at = coalesce(tr.sweep_started_at, now())
     WHERE tr.schema_name = p_schema AND tr.swept_at IS NULL;
    RETURN FOUND;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.begin_sweep(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.bind(p_replica text, p_incarnation bigint, p_secret text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    r pgtenant.replicas%ROWTYPE;
    v_start timestamptz;
    v_why text;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    SELECT * INTO r FROM pgtenant.replicas rr
     WHERE rr.replica_id = p_replica AND rr.incarnation = p_incarnation FOR SHARE;
    -- A separate statement after the lock: it sees a seal that committed while bind waited.
    v_why := CASE
        WHEN NOT FOUND THEN 'it is not the replica''s current incarnation'
        WHEN pgtenant.is_sealed(p_replica, p_incarnation) THEN 'it is sealed (a takeover found it dead or expired)'
        WHEN r.released_at IS NOT NULL THEN 'it deregistered'
        WHEN r.expires_at <= clock_timestamp() THEN 'its heartbeat expired'
        WHEN r.session_fencing_incarnation IS DISTINCT FROM p_incarnation THEN 'it did not declare session fencing'
        -- Alive means its lease session holds the liveness lock, not only an unexpired
        -- heartbeat: after a failover (or a lease session killed) the row may outlive the session.
        WHEN NOT EXISTS (SELECT 1 FROM pg_locks l
                          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                            AND l.classid = pgtenant.lock_namespace()::oid AND l.objid = r.lock_key::oid
                            AND l.pid = r.backend_pid
                            AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))
            THEN 'its lease session no longer holds the liveness lock'
    END;
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTE02',
            MESSAGE = format('replica %s incarnation %s is sealed or no longer alive: it can bind no data session', p_replica, p_incarnation),
            DETAIL = v_why,
            HINT = 'the replica registers again (a new incarnation) and binds its sessions to that';
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid();
    -- A pid reused by a new backend: its old row names a backend that is gone.
    DELETE FROM pgtenant.sessions s WHERE s.pid = pg_backend_pid();
    INSERT INTO pgtenant.sessions (pid, backend_start, replica_id, incarnation)
    VALUES (pg_backend_pid(), v_start, p_replica, p_incarnation);
    RETURN pg_backend_pid();
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.bind(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.can_terminate_sessions()
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    v_owner_super boolean;
    v_target_super boolean;
BEGIN
    SELECT rolsuper INTO v_owner_super FROM pg_roles WHERE rolname = current_user;
    SELECT rolsuper INTO v_target_super FROM pg_roles WHERE rolname = session_user;
    IF v_owner_super THEN
        RETURN NULL;
    END IF;
    IF v_target_super THEN
        RETURN format('data sessions log in as superuser %s, and the control plane''s owner %s is not a superuser', session_user, current_user);
    END IF;
    IF pg_has_role(current_user, session_user::name, 'MEMBER')
       OR pg_has_role(current_user, 'pg_signal_backend', 'MEMBER') THEN
        RETURN NULL;
    END IF;
    RETURN format('the control plane''s owner %s may not terminate backends of %s: GRANT pg_signal_backend TO %s (or %s TO %s)',
                  current_user, session_user, current_user, session_user, current_user);
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.can_terminate_sessions() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.clear_quarantine(p_key text, p_replica text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    UPDATE pgtenant.tenants
       SET quarantine_cause = NULL, quarantine_repair = NULL, quarantined_at = NULL
     WHERE key = p_key AND quarantine_cause IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id)
    SELECT p_key, 'cleared', t.epoch, p_replica FROM pgtenant.tenants t WHERE t.key = p_key;
    PERFORM pg_notify('pgtenant_free', p_key);
    RETURN true;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.clear_quarantine(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.created_here(p_schema text)
 RETURNS boolean
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    WITH me AS (SELECT pg_current_xact_id()::text::bigint AS top)
    SELECT coalesce(
               n.xmin::text::bigint >= 3  -- not a frozen or bootstrap row
               AND pg_xact_status((me.top + ((n.xmin::text::bigint - me.top + 2147483648) % 4294967296
                                             + 4294967296) % 4294967296 - 2147483648)::text::xid8) = 'in progress',
               false)
      FROM me, pg_namespace n WHERE n.nspname = p_schema
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.created_here(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.declare_session_fencing(p_replica text, p_incarnation bigint, p_secret text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    UPDATE pgtenant.replicas r SET session_fencing_incarnation = p_incarnation
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.declare_session_fencing(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.deregister(p_replica text, p_incarnation bigint, p_secret text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    v_released integer;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgtenant.replicas r WHERE r.replica_id = p_replica FOR UPDATE;
    UPDATE pgtenant.replicas r SET released_at = now(), expires_at = now()
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation;
    PERFORM pgtenant.seal_incarnation(p_replica, p_incarnation);
    PERFORM pgtenant.terminate_bound(p_replica, p_incarnation, NULL, 5000);
    WITH freed AS (
        UPDATE pgtenant.tenants t SET owner = NULL, owner_incarnation = NULL
         WHERE t.owner = p_replica AND t.owner_incarnation = p_incarnation
        RETURNING t.key, t.epoch
    ), journal AS (
        INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
        SELECT f.key, 'released', f.epoch, p_replica, p_incarnation, 'replica deregistered' FROM freed f
        RETURNING tenant_key
    )
    SELECT count(pg_notify('pgtenant_free', j.tenant_key)) INTO v_released FROM journal j;
    DELETE FROM pgtenant.replica_secrets s WHERE s.replica_id = p_replica;
    INSERT INTO pgtenant.history (event, replica_id, incarnation) VALUES ('deregistered', p_replica, p_incarnation);
    RETURN v_released;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.deregister(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.derived_schema_name(p_key text, p_epoch bigint, p_salt integer, p_separator text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE STRICT
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT 't_' || lower(translate(left(k.org, w.org_len), '-.', '__')) || p_separator
       || lower(translate(left(k.ledger, least(length(k.ledger), r.readable - w.org_len)), '-.', '__'))
       || '_' || k.epoch || '_'
       || left(pgtenant.fnv1a64(convert_to(p_key, 'UTF8') || '\x00'::bytea || convert_to(k.epoch, 'UTF8')
                                || CASE WHEN p_salt > 0 THEN '\x00'::bytea || convert_to(p_salt::text, 'UTF8')
                                        ELSE ''::bytea END), 10)
  FROM (SELECT split_part(p_key, '/', 1) AS org, split_part(p_key, '/', 2) AS ledger,
               p_epoch::text AS epoch) k,
       LATERAL (SELECT greatest(57 - (2 + length(p_separator) + 2 + length(k.epoch) + 10), 0) AS readable) r,
       LATERAL (SELECT least(length(k.org),
                             greatest(greatest(r.readable - length(k.ledger), 0), r.readable / 2)) AS org_len) w
 WHERE p_key ~ '^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$'
   AND octet_length(k.org) <= 128 AND octet_length(k.ledger) <= 128 AND p_epoch >= 0
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.derived_schema_name(text, bigint, integer, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.derived_schema_names(p_key text, p_epoch bigint)
 RETURNS SETOF text
 LANGUAGE sql
 IMMUTABLE STRICT
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT d.name
  FROM (VALUES (1, 0, '__'), (2, 1, '__'), (3, 2, '__'), (4, 3, '__'), (5, 4, '__'),
               (6, 5, '__'), (7, 6, '__'), (8, 7, '__'), (9, 0, '_')) n(ord, salt, sep),
       LATERAL (SELECT pgtenant.derived_schema_name(p_key, p_epoch, n.salt, n.sep) AS name) d
 WHERE d.name IS NOT NULL
 ORDER BY n.ord
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.derived_schema_names(text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.due_alarms(p_replica text, p_horizon_ms integer, p_limit integer, p_placement boolean)
 RETURNS TABLE(tenant text, next_due timestamp with time zone)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
$function$;
COMMENT ON FUNCTION pgtenant.due_alarms(text, integer, integer, boolean) IS 'Tenants with an alarm due within p_horizon_ms that replica p_replica should fire: those it holds, and those free or held by an incarnation that is over (with p_placement, only those whose home it is). Earliest first, at most p_limit rows (index alarm_due_next).';
REVOKE EXECUTE ON FUNCTION pgtenant.due_alarms(text, integer, integer, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.end_fence_holders(p_lock integer, p_timeout_ms bigint)
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

CREATE OR REPLACE FUNCTION pgtenant.epoch_floor()
 RETURNS bigint
 LANGUAGE sql
AS $function$
    -- A WAL file name is 24 hex digits: timeline, log, segment; the first 8 are the timeline.
    SELECT ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(
                pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint)
            OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) 1099511627776
$function$;
COMMENT ON FUNCTION pgtenant.epoch_floor() IS 'The lowest epoch this server issues: (timeline - 1) << 40, so no epoch of an older timeline (lost in a failover or not) is ever issued again.';

CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint)
 RETURNS text
 LANGUAGE sql
AS $function$
    SELECT pgtenant.fence(p_key, p_epoch,
        coalesce((SELECT lock_key FROM pgtenant.tenants WHERE key = p_key), 0), '0')
$function$;

CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE sql
AS $function$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, false, false) $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text, p_read_only boolean, p_signalled boolean)
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
    -- Without the signal the fence decides the session reset; with it the client does.
    IF NOT p_signalled AND (
           pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
           OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
           OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true)) THEN
        PERFORM pgtenant.reset_session(p_key);
    END IF;
    IF p_read_only THEN
        -- A read commits nothing: no lock.
        SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.tenants t WHERE t.key OPERATOR(pg_catalog.=) p_key;
    ELSIF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885828146, p_lock);
        SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.tenants t WHERE t.key OPERATOR(pg_catalog.=) p_key;
    ELSE
        -- The snapshot predates any lock: the row lock refuses a row updated since (40001)
        -- and is the serialization point; the shared lock after it (the order acquire takes
        -- them in) only makes the fence visible to an acquirer that must end it (V11).
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
    -- Data sessions default to read-only (G6); with the signal nothing else says read-write.
    PERFORM pg_catalog.set_config('search_path', v_schema OPERATOR(pg_catalog.||) ', pg_temp', true),
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true),
            pg_catalog.set_config('pgtenant.fenced', 'on', true),
            CASE WHEN p_signalled
                 THEN pg_catalog.set_config('default_transaction_read_only', 'off', true) END;
    IF NOT p_signalled THEN
        OPEN v_marker FOR SELECT 1;
    END IF;
    RETURN v_schema;
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_holders(p_lock integer)
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

CREATE OR REPLACE FUNCTION pgtenant.fence_read(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE sql
AS $function$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, true, false) $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_read_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE sql
AS $function$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, true, true) $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_refusal(p_key text, p_epoch bigint, v_epoch bigint, v_owner text, v_schema text, v_forgotten bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF v_epoch IS NULL OR v_schema IS NULL OR v_forgotten >= p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF02',
            MESSAGE = format('pgtenant: tenant %s was forgotten; epoch %s can never commit again', p_key, p_epoch);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PTF01',
        MESSAGE = format('pgtenant fenced: tenant %s is at epoch %s (%s); this handle holds epoch %s',
                         p_key, v_epoch, coalesce('owner ' || v_owner, 'released'), p_epoch),
        HINT = 'the lease was lost; open the tenant again';
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_refusal_before_failover(p_key text, p_epoch bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PTF01',
        MESSAGE = pg_catalog.format('pgtenant fenced: tenant %s, epoch %s is from before the database''s last failover (epochs now start at %s)',
                                    p_key, p_epoch, pgtenant.epoch_floor()),
        HINT = 'the lease was lost in the failover; open the tenant again';
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.fence_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
 RETURNS text
 LANGUAGE sql
AS $function$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, false, true) $function$;

CREATE OR REPLACE FUNCTION pgtenant.fleet_status_rows(p_retention_ms bigint)
 RETURNS TABLE(tenants bigint, live bigint, held bigint, stalled bigint, owner_gone bigint, owner_reregistered bigint, free bigint, reserved bigint, quarantined bigint, forgotten bigint, newest_version integer, behind bigint, versions jsonb, trashed bigint, trash_due bigint, oldest_trashed_at timestamp with time zone, replicas bigint, replicas_alive bigint)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT x.*
  FROM pgtenant.status_report(p_retention_ms) s,
       jsonb_to_record(s.fleet) AS x(tenants bigint, live bigint, held bigint, stalled bigint,
                                     owner_gone bigint, owner_reregistered bigint, free bigint,
                                     reserved bigint, quarantined bigint, forgotten bigint,
                                     newest_version integer, behind bigint, versions jsonb,
                                     trashed bigint, trash_due bigint,
                                     oldest_trashed_at timestamptz, replicas bigint,
                                     replicas_alive bigint)
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.fleet_status_rows(bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.fnv1a64(p_bytes bytea)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE STRICT
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.fnv1a64(bytea) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.forget(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    t pgtenant.tenants%ROWTYPE;
    v_trash text;
BEGIN
    SELECT * INTO t FROM pgtenant.tenants
     WHERE key = p_key AND epoch = p_epoch AND owner = p_replica AND owner_incarnation = p_incarnation
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: cannot forget tenant %s: epoch %s of replica %s is not its lease', p_key, p_epoch, p_replica);
    END IF;
    IF t.schema_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF02', MESSAGE = format('tenant %s has no live schema', p_key);
    END IF;
    -- Waits for the fenced transactions in flight; none of this epoch passes the fence after.
    PERFORM pg_advisory_xact_lock(pgtenant.tenant_lock_namespace(), t.lock_key);
    v_trash := 'trash_' || t.schema_name;
    EXECUTE format('ALTER SCHEMA %I RENAME TO %I', t.schema_name, v_trash);
    UPDATE pgtenant.tenants
       SET forgotten_at_epoch = t.epoch, schema_name = NULL, schema_version = 0,
           owner = NULL, owner_incarnation = NULL, reserved_for = NULL, reserved_until = NULL
     WHERE key = p_key;
    INSERT INTO pgtenant.trash (schema_name, tenant_key, epoch, live_name, schema_version)
    VALUES (v_trash, p_key, t.epoch, t.schema_name, t.schema_version);
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'forgotten', t.epoch, p_replica, p_incarnation, 'schema moved to ' || v_trash);
    RETURN v_trash;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.forget(text, bigint, text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.forget(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint, p_secret text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.forget(text, bigint, text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    PERFORM pgtenant.grant_roles_before_v20(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.acquire_many(text[], text, bigint, text, integer, integer, bigint) TO %I', p_app);
    END IF;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v10(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SCHEMA pgtenant TO %I', p_app);
        -- The fence reads the tenant row with the caller's rights; the views are for status.
        EXECUTE format('GRANT SELECT ON pgtenant.tenants, pgtenant.lease_status, pgtenant.replica_status,
                               pgtenant.replica_liveness, pgtenant.refinery_schema_history,
                               pgtenant.session_status TO %I', p_app);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.lock_tenant_row(text),
            pgtenant.replica_lock_key(text),
            pgtenant.register(text, integer, text),
            pgtenant.heartbeat(text, bigint, text, integer),
            pgtenant.deregister(text, bigint, text),
            pgtenant.acquire(text, text, text, text, bigint, text, boolean),
            pgtenant.schema_created(text, bigint, text, bigint, text, text, integer),
            pgtenant.schema_migrated(text, bigint, text, bigint, text, integer, text),
            pgtenant.quarantine(text, text, text, bigint, text, bigint, text, text, text),
            pgtenant.release(text, bigint, text, text[], bigint[], text[], text[], integer[]),
            pgtenant.forget(text, bigint, text, bigint, text),
            pgtenant.restore(text, text, bigint, text, text),
            pgtenant.bind(text, bigint, text),
            pgtenant.declare_session_fencing(text, bigint, text),
            pgtenant.seal_owner(text, text, bigint, text, bigint),
            pgtenant.terminate_work(text, bigint, text, integer[], bigint),
            pgtenant.can_terminate_sessions()
            TO %I', p_app);
        -- Tenant schemas are created, and owned, by the application's role.
        EXECUTE format('GRANT CREATE ON DATABASE %I TO %I', current_database(), p_app);
        UPDATE pgtenant.config SET app_role = p_app;
    END IF;
    IF p_operator IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SCHEMA pgtenant TO %I', p_operator);
        EXECUTE format('GRANT SELECT ON pgtenant.tenants, pgtenant.trash, pgtenant.history, pgtenant.replicas,
                               pgtenant.config, pgtenant.lease_status, pgtenant.replica_status,
                               pgtenant.replica_liveness, pgtenant.refinery_schema_history,
                               pgtenant.sessions, pgtenant.session_status, pgtenant.seals TO %I', p_operator);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            pgtenant.clear_quarantine(text, text),
            pgtenant.record_swept(text, text),
            pgtenant.prune(bigint, bigint)
            TO %I', p_operator);
        UPDATE pgtenant.config SET operator_role = p_operator;
    END IF;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v10(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v12(p_app name, p_operator name)
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
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v12(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v15(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v15(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v16(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v16(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v17(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v17(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v18(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    PERFORM pgtenant.grant_roles_before_v17(p_app, p_operator);
    IF p_app IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgtenant.leave(text, bigint, text) TO %I', p_app);
    END IF;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v18(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v19(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v19(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.grant_roles_before_v20(p_app name, p_operator name)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.grant_roles_before_v20(name, name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.handoff_request_ttl()
 RETURNS interval
 LANGUAGE sql
 IMMUTABLE
AS $function$ SELECT interval '1 minute' $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.handoff_request_ttl() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.heartbeat(p_replica text, p_incarnation bigint, p_secret text, p_ttl_ms integer)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    UPDATE pgtenant.replicas r
       SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
     WHERE r.replica_id = p_replica AND r.incarnation = p_incarnation AND r.released_at IS NULL
       AND r.expires_at > clock_timestamp() AND r.backend_pid = pg_backend_pid()
       AND NOT pgtenant.is_sealed(p_replica, p_incarnation);
    RETURN FOUND;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.heartbeat(text, bigint, text, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.home(p_key text)
 RETURNS text
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT pgtenant.home_among(p_key, array_agg(c.replica_id), array_agg(c.weight))
  FROM pgtenant.placement_candidates c
$function$;
COMMENT ON FUNCTION pgtenant.home(text) IS 'The home of tenant p_key among the live replicas (placement_candidates).';

CREATE OR REPLACE FUNCTION pgtenant.home_among(p_key text, p_replicas text[], p_weights double precision[])
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT c.replica
  FROM unnest(p_replicas, p_weights) AS c(replica, weight)
 WHERE c.weight > 0
 ORDER BY pgtenant.placement_score(p_key, c.replica, c.weight) DESC, c.replica
 LIMIT 1
$function$;
COMMENT ON FUNCTION pgtenant.home_among(text, text[], double precision[]) IS 'The home of tenant p_key among these replicas and weights: the one of highest placement_score (ties by replica id); NULL when every weight is 0.';

CREATE OR REPLACE FUNCTION pgtenant.is_derived_schema_name(p_key text, p_epoch bigint, p_name text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE STRICT
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT p_name = pgtenant.derived_schema_name(p_key, p_epoch, 0, '__')
       OR EXISTS (SELECT 1 FROM pgtenant.derived_schema_names(p_key, p_epoch) d WHERE d = p_name)
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.is_derived_schema_name(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.is_sealed(p_replica text, p_incarnation bigint)
 RETURNS boolean
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT EXISTS (SELECT 1 FROM pgtenant.seals s WHERE s.replica_id = p_replica AND s.incarnation = p_incarnation)
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.is_sealed(text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.leave(p_replica text, p_incarnation bigint, p_secret text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN false;
    END IF;
    -- The registration of the next incarnation sets the weight again (register's p_weight).
    UPDATE pgtenant.replicas SET weight = 0
     WHERE replica_id = p_replica AND incarnation = p_incarnation AND released_at IS NULL;
    RETURN FOUND;
END $function$;
COMMENT ON FUNCTION pgtenant.leave(text, bigint, text) IS 'A closing replica (this incarnation, proven by its secret) stops being the home of any tenant (weight 0), so the others stop moving tenants to it while it hands its own to their next homes. False when the incarnation is not the current one.';
REVOKE EXECUTE ON FUNCTION pgtenant.leave(text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.locate(p_key text)
 RETURNS TABLE(owner text, epoch bigint, address text, owner_alive boolean, reserved_for text, reserved_address text, home text, home_address text)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    RETURN QUERY
    SELECT t.owner, t.epoch, o.address,
           o.replica_id IS NOT NULL AND o.released_at IS NULL AND o.expires_at > now()
               AND o.incarnation = t.owner_incarnation,
           CASE WHEN t.owner IS NULL AND t.reserved_until > now() THEN t.reserved_for END,
           CASE WHEN t.owner IS NULL AND t.reserved_until > now() THEN v.address END,
           h.replica_id, h.address
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (SELECT c.replica_id, c.address
                           FROM pgtenant.placement_candidates c
                          ORDER BY pgtenant.placement_score(p_key, c.replica_id, c.weight) DESC,
                                   c.replica_id
                          LIMIT 1) h ON true
      LEFT JOIN pgtenant.tenants t ON t.key = p_key
      LEFT JOIN pgtenant.replicas o ON o.replica_id = t.owner
      LEFT JOIN pgtenant.replicas v ON v.replica_id = t.reserved_for;
END $function$;
COMMENT ON FUNCTION pgtenant.locate(text) IS 'Who serves tenant p_key and where: owner, epoch, the owner''s registered address, whether its heartbeat is current, the replica (and address) it is reserved for by a directed handoff, and its home among the live replicas (and that one''s address). epoch NULL: the tenant was never created.';
REVOKE EXECUTE ON FUNCTION pgtenant.locate(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.lock_namespace()
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT 1885828145 $function$;

CREATE OR REPLACE FUNCTION pgtenant.lock_tenant_row(p_key text)
 RETURNS TABLE(epoch bigint, owner text, schema_name text, forgotten_at_epoch bigint, lock_key integer)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
      FROM pgtenant.tenants t WHERE t.key = p_key FOR KEY SHARE OF t
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.lock_tenant_row(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.next_epoch(p_current bigint)
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT GREATEST(p_current OPERATOR(pg_catalog.+) 1, pgtenant.epoch_floor())
$function$;

CREATE OR REPLACE FUNCTION pgtenant.note_alarms(p_key text, p_next_due timestamp with time zone, p_pending integer, p_failed integer)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
COMMENT ON FUNCTION pgtenant.note_alarms(text, timestamp with time zone, integer, integer) IS 'Records tenant p_key''s alarm hint (next due, pending, failed), or deletes it when nothing is pending or failed. Called by pgtenant inside the fenced transaction that changed the tenant''s alarms.';
REVOKE EXECUTE ON FUNCTION pgtenant.note_alarms(text, timestamp with time zone, integer, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.notify_reserved()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    PERFORM pg_notify('pgtenant_reserved', NEW.reserved_for);
    RETURN NULL;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.notify_reserved() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.orphaned_homes(p_replica text, p_limit integer)
 RETURNS TABLE(tenant text)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
WITH live AS MATERIALIZED (
    SELECT l.replica_id, l.lock_held FROM pgtenant.replica_liveness l
), members AS MATERIALIZED (
    SELECT c.replica_id, c.weight
      FROM pgtenant.placement_candidates c JOIN live USING (replica_id)
     WHERE live.lock_held
), orphans AS MATERIALIZED (
    -- Held by an incarnation that is over: expired, deregistered, its lease session gone, or
    -- replaced by a newer one. Materialized, so homes are computed for these few only (1.1 s
    -- for 10 000 tenants when the planner pushed the home down to every tenant; 11 ms so).
    SELECT t.key
      FROM pgtenant.replicas r
      JOIN live ON live.replica_id = r.replica_id
      JOIN pgtenant.tenants t ON t.owner = r.replica_id
     WHERE (r.released_at IS NOT NULL OR r.expires_at <= now() OR NOT live.lock_held
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
$function$;
COMMENT ON FUNCTION pgtenant.orphaned_homes(text, integer) IS 'Tenants whose home among the live replicas (lease session holding the liveness lock) is p_replica and that nobody will serve unasked: held by an incarnation that is over (expired, deregistered, lease session gone, or replaced), or free and reserved for a replica that is not a live home (gone or leaving). What p_replica takes over, and nobody else, after a crash or a close. At most p_limit rows.';
REVOKE EXECUTE ON FUNCTION pgtenant.orphaned_homes(text, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.parked_alarms(p_key text)
 RETURNS TABLE(tenant text, name text, id bigint, attempts integer, last_error text, failed_at timestamp with time zone, due_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
COMMENT ON FUNCTION pgtenant.parked_alarms(text) IS 'The parked alarms (last attempt failed) of tenant p_key, or of every tenant whose hint in pgtenant.alarm_due counts failed ones when p_key is NULL: name, id (seq), attempts, last error, when parked, when due. Never the payload.';
REVOKE EXECUTE ON FUNCTION pgtenant.parked_alarms(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.placement_members(p_stable_ms integer)
 RETURNS TABLE(replica_id text, weight double precision, stable boolean)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT c.replica_id, c.weight,
       r.started_at <= now() - p_stable_ms * interval '1 millisecond'
  FROM pgtenant.placement_candidates c
  JOIN pgtenant.replicas r USING (replica_id)
  JOIN pgtenant.replica_liveness l USING (replica_id)
 WHERE l.lock_held
 ORDER BY c.replica_id
$function$;
COMMENT ON FUNCTION pgtenant.placement_members(integer) IS 'The replicas tenants are placed on (placement_candidates) whose lease session holds their liveness lock, their weights, and whether each has been alive, in its current incarnation, for p_stable_ms: rebalancing moves tenants only to stable ones.';
REVOKE EXECUTE ON FUNCTION pgtenant.placement_members(integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.placement_moves(p_replica text, p_stable_ms integer, p_leaving boolean, p_limit integer)
 RETURNS TABLE(tenant text, epoch bigint, home text)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
$function$;
COMMENT ON FUNCTION pgtenant.placement_moves(text, integer, boolean, integer) IS 'The tenants replica p_replica holds whose home is another replica, with that home: among the live replicas stable for p_stable_ms, and p_replica itself unless p_leaving (then every tenant gets its next home). At most p_limit rows.';
REVOKE EXECUTE ON FUNCTION pgtenant.placement_moves(text, integer, boolean, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.placement_score(p_key text, p_replica text, p_weight double precision)
 RETURNS double precision
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT CASE WHEN p_weight > 0 THEN
    p_weight / -ln((('x' || left(md5(p_key || '|' || p_replica), 13))::bit(52)::bigint::double precision
                    + 0.5) / 4503599627370496.0)
END
$function$;
COMMENT ON FUNCTION pgtenant.placement_score(text, text, double precision) IS 'Weighted rendezvous score of replica p_replica (weight p_weight) for tenant p_key: weight / -ln(u), u in (0, 1) from the first 52 bits of md5(key || ''|'' || replica). NULL for weight 0.';

CREATE OR REPLACE FUNCTION pgtenant.prepared_holders(p_schema text, p_lock integer)
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

CREATE OR REPLACE FUNCTION pgtenant.prune(p_history_ms bigint, p_replicas_ms bigint)
 RETURNS TABLE(history_pruned bigint, replicas_pruned bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    v_history bigint;
    v_replicas bigint;
BEGIN
    DELETE FROM pgtenant.history h WHERE h.at < now() - p_history_ms * interval '1 millisecond';
    GET DIAGNOSTICS v_history = ROW_COUNT;
    DELETE FROM pgtenant.sessions s
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.pid AND a.backend_start = s.backend_start);
    DELETE FROM pgtenant.seals s USING pgtenant.replicas r
     WHERE r.replica_id = s.replica_id AND s.incarnation < r.incarnation;
    DELETE FROM pgtenant.replicas r
     WHERE coalesce(r.released_at, r.expires_at, r.started_at) < now() - p_replicas_ms * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM pgtenant.replica_liveness l WHERE l.replica_id = r.replica_id AND l.lock_held)
       AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.owner = r.replica_id);
    GET DIAGNOSTICS v_replicas = ROW_COUNT;
    RETURN QUERY SELECT v_history, v_replicas;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.prune(bigint, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.quarantine(p_key text, p_organization text, p_ledger text, p_epoch bigint, p_replica text, p_incarnation bigint, p_secret text, p_cause text, p_repair text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
    PERFORM pgtenant.quarantine(p_key, p_cause, p_repair, p_replica);
    RETURN true;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.quarantine(text, text, text, bigint, text, bigint, text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.quarantine(p_key text, p_cause text, p_repair text, p_replica text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE pgtenant.tenants
       SET quarantine_cause = p_cause, quarantine_repair = p_repair, quarantined_at = now(),
           owner = NULL, owner_incarnation = NULL
     WHERE key = p_key;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, detail)
    SELECT p_key, 'quarantined', t.epoch, p_replica, p_cause FROM pgtenant.tenants t WHERE t.key = p_key;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.quarantine(text, text, text, text) FROM PUBLIC;

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
REVOKE EXECUTE ON FUNCTION pgtenant.raise_held(text, text, bigint, timestamp with time zone, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.record_swept(p_schema text, p_tenant text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.record_swept(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.register(p_replica text, p_ttl_ms integer, p_host text)
 RETURNS TABLE(incarnation bigint, expires_at timestamp with time zone, secret text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    SELECT * FROM pgtenant.register(p_replica, p_ttl_ms, p_host, NULL, 1)
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.register(text, integer, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.register(p_replica text, p_ttl_ms integer, p_host text, p_address text, p_weight double precision)
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
REVOKE EXECUTE ON FUNCTION pgtenant.register(text, integer, text, text, double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.release(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint, p_event text, p_reserve_for text, p_reserve_ms integer)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE pgtenant.tenants
       SET owner = NULL, owner_incarnation = NULL,
           reserved_for = p_reserve_for,
           reserved_until = CASE WHEN p_reserve_for IS NOT NULL
                                 THEN now() + p_reserve_ms * interval '1 millisecond' END
     WHERE key = p_key AND epoch = p_epoch AND owner = p_replica AND owner_incarnation = p_incarnation;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, p_event, p_epoch, p_replica, p_incarnation,
            CASE WHEN p_reserve_for IS NOT NULL THEN 'reserved for ' || p_reserve_for END);
    PERFORM pg_notify('pgtenant_free', p_key);
    RETURN true;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.release(text, bigint, text, bigint, text, text, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.release(p_replica text, p_incarnation bigint, p_secret text, p_keys text[], p_epochs bigint[], p_events text[], p_reserve_for text[], p_reserve_ms integer[])
 RETURNS TABLE(ord bigint, released boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    v_target text;
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
    RETURN QUERY
    SELECT r.ord, pgtenant.release(r.key, r.epoch, p_replica, p_incarnation, r.event, r.reserve_for, r.reserve_ms)
      FROM unnest(p_keys, p_epochs, p_events, p_reserve_for, p_reserve_ms)
           WITH ORDINALITY AS r(key, epoch, event, reserve_for, reserve_ms, ord)
     ORDER BY r.ord;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.release(text, bigint, text, text[], bigint[], text[], text[], integer[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.replica_lock_key(p_replica text)
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    INSERT INTO pgtenant.replicas (replica_id) VALUES (p_replica)
    ON CONFLICT (replica_id) DO UPDATE SET replica_id = EXCLUDED.replica_id
    RETURNING lock_key
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.replica_lock_key(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.replica_status_rows()
 RETURNS TABLE(replica_id text, alive boolean, lock_held boolean, incarnation bigint, tenants_held bigint, expires_in interval, backend_pid integer, host text, started_at timestamp with time zone, released_at timestamp with time zone, sessions bigint, sealed_at timestamp with time zone, state text, address text, weight double precision)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT x.*
  FROM pgtenant.status_report(0) s,
       jsonb_to_recordset(s.replicas) AS x(replica_id text, alive boolean, lock_held boolean,
                                           incarnation bigint, tenants_held bigint, expires_in interval,
                                           backend_pid integer, host text, started_at timestamptz,
                                           released_at timestamptz, sessions bigint,
                                           sealed_at timestamptz, state text, address text,
                                           weight double precision)
 ORDER BY x.replica_id
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.replica_status_rows() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.request_alarm(p_key text, p_name text, p_action text)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
COMMENT ON FUNCTION pgtenant.request_alarm(text, text, text) IS 'An operator asks tenant p_key''s owner to retry (pending again, due now, attempts from 0) or clear (delete) its parked alarm p_name, or every parked alarm when p_name is NULL. Returns the request''s id; the request is gone from pgtenant.alarm_requests once applied.';
REVOKE EXECUTE ON FUNCTION pgtenant.request_alarm(text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.request_handoff(p_key text, p_replica text, p_incarnation bigint, p_secret text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.request_handoff(text, text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.reserved_for(p_replica text, p_limit integer)
 RETURNS TABLE(tenant text)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT t.key
  FROM pgtenant.tenants t
 WHERE t.reserved_for = p_replica AND t.owner IS NULL AND t.schema_name IS NOT NULL
 ORDER BY t.key
 LIMIT p_limit
$function$;
COMMENT ON FUNCTION pgtenant.reserved_for(text, integer) IS 'Tenants a directed handoff reserved for replica p_replica that nobody has opened since (index tenants_reserved), the reservation current or run out: what the handoff meant for it. A release without a target clears reserved_for, so an idle release is not undone.';
REVOKE EXECUTE ON FUNCTION pgtenant.reserved_for(text, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.reset_session(p_tenant text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
END $function$;

CREATE OR REPLACE FUNCTION pgtenant.restore(p_key text, p_replica text, p_incarnation bigint, p_new_schema_for_epoch text)
 RETURNS TABLE(epoch bigint, schema_name text, schema_version integer, lock_key integer)
 LANGUAGE plpgsql
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.restore(text, text, bigint, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.restore(p_key text, p_replica text, p_incarnation bigint, p_secret text, p_new_schema_for_epoch text)
 RETURNS TABLE(epoch bigint, schema_name text, schema_version integer, lock_key integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.restore(text, text, bigint, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.schema_created(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint, p_secret text, p_schema text, p_version integer)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.schema_created(text, bigint, text, bigint, text, text, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.schema_migrated(p_key text, p_epoch bigint, p_replica text, p_incarnation bigint, p_secret text, p_version integer, p_detail text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    UPDATE pgtenant.tenants t SET schema_version = p_version
     WHERE t.key = p_key AND t.epoch = p_epoch AND t.owner = p_replica AND t.owner_incarnation = p_incarnation;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PTF01',
            MESSAGE = format('pgtenant fenced: tenant %s at epoch %s is not held by replica %s', p_key, p_epoch, p_replica);
    END IF;
    INSERT INTO pgtenant.history (tenant_key, event, epoch, replica_id, incarnation, detail)
    VALUES (p_key, 'migrated', p_epoch, p_replica, p_incarnation, p_detail);
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.schema_migrated(text, bigint, text, bigint, text, integer, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.seal_incarnation(p_replica text, p_incarnation bigint)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM pgtenant.seals s
                WHERE s.replica_id = p_replica AND s.incarnation = p_incarnation) THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pgtenant.replicas r
     WHERE r.replica_id = p_replica AND r.session_fencing_incarnation = p_incarnation
       FOR NO KEY UPDATE;
    IF FOUND THEN
        INSERT INTO pgtenant.seals (replica_id, incarnation) VALUES (p_replica, p_incarnation)
        ON CONFLICT DO NOTHING;
    END IF;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.seal_incarnation(text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.seal_on_takeover()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    PERFORM pgtenant.seal_incarnation(OLD.owner, OLD.owner_incarnation);
    -- Whatever the replica row says now (it may have registered again), nothing bound to the
    -- old incarnation may outlive its epoch.
    PERFORM pgtenant.terminate_bound(OLD.owner, OLD.owner_incarnation, NULL, 5000);
    RETURN NEW;
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.seal_on_takeover() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.seal_owner(p_key text, p_replica text, p_incarnation bigint, p_secret text, p_timeout_ms bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DECLARE
    t record;
    o record;
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RAISE EXCEPTION USING ERRCODE = 'PTL02',
            MESSAGE = format('replica %s incarnation %s is not registered', p_replica, p_incarnation);
    END IF;
    -- The same row lock acquire takes next: nothing about the owner changes in between.
    SELECT tt.owner, tt.owner_incarnation INTO t FROM pgtenant.tenants tt WHERE tt.key = p_key FOR UPDATE;
    IF NOT FOUND OR t.owner IS NULL OR (t.owner = p_replica AND t.owner_incarnation = p_incarnation) THEN
        RETURN 0;
    END IF;
    SELECT * INTO o FROM pgtenant.replica_liveness l WHERE l.replica_id = t.owner;
    IF o.incarnation = t.owner_incarnation AND o.alive THEN
        -- A live owner: acquire refuses (LeaseHeld); nothing to seal.
        RETURN 0;
    END IF;
    PERFORM pgtenant.seal_incarnation(t.owner, t.owner_incarnation);
    RETURN pgtenant.terminate_bound(t.owner, t.owner_incarnation, NULL, p_timeout_ms);
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.seal_owner(text, text, bigint, text, bigint) FROM PUBLIC;

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
REVOKE EXECUTE ON FUNCTION pgtenant.status_report(bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.sweep_backlog_rows(p_retention_ms bigint)
 RETURNS TABLE(trash_due bigint, trash_kept bigint, oldest_due_at timestamp with time zone, orphan_schemas bigint)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
SELECT (SELECT count(*) FROM pgtenant.trash x
         WHERE x.swept_at IS NULL AND x.trashed_at < now() - p_retention_ms * interval '1 millisecond'),
       (SELECT count(*) FROM pgtenant.trash x
         WHERE x.swept_at IS NULL AND x.trashed_at >= now() - p_retention_ms * interval '1 millisecond'),
       (SELECT min(x.trashed_at) FROM pgtenant.trash x
         WHERE x.swept_at IS NULL AND x.trashed_at < now() - p_retention_ms * interval '1 millisecond'),
       -- The sweep's own test (src/admin/sweep.rs); the anti-join first, the regular
       -- expression only on what is left.
       (SELECT count(*)
          FROM (SELECT n.nspname FROM pg_namespace n
                 WHERE n.nspname LIKE 't\_%'
                   AND NOT EXISTS (SELECT 1 FROM pgtenant.tenants t WHERE t.schema_name = n.nspname)
                OFFSET 0) o
         WHERE o.nspname ~ '^t_[a-z0-9_]+_[0-9]+_[0-9a-f]{10}$')
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.sweep_backlog_rows(bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.take_alarm_requests(p_key text)
 RETURNS TABLE(name text, action text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
DELETE FROM pgtenant.alarm_requests r WHERE r.tenant_key = p_key RETURNING r.name, r.action
$function$;
COMMENT ON FUNCTION pgtenant.take_alarm_requests(text) IS 'Deletes and returns tenant p_key''s alarm requests; pgtenant calls it inside a fenced transaction of the tenant that applies them, so they commit (or stay) together.';
REVOKE EXECUTE ON FUNCTION pgtenant.take_alarm_requests(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.take_handoff_request(p_replica text, p_incarnation bigint, p_secret text, p_key text, p_requester text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.take_handoff_request(text, bigint, text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.tenant_lock_namespace()
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT 1885828146 $function$;

CREATE OR REPLACE FUNCTION pgtenant.tenant_owner()
 RETURNS oid
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
    SELECT coalesce((SELECT r.oid FROM pg_roles r, pgtenant.config c WHERE r.rolname = c.app_role),
                    (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgtenant'))
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.tenant_owner() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.terminate_bound(p_replica text, p_incarnation bigint, p_pids integer[], p_timeout_ms bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pgtenant'
 SET client_min_messages TO 'error'
AS $function$
DECLARE
    v_targets integer[];
    v_left integer[];
    v_deadline timestamptz := clock_timestamp() + greatest(p_timeout_ms, 1) * interval '1 millisecond';
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgtenant.sessions ss
                    WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation) THEN
        RETURN 0;
    END IF;
    -- pg_stat_activity is read once per transaction and then cached: clear it to see now.
    PERFORM pg_stat_clear_snapshot();
    SELECT array_agg(ss.pid) INTO v_targets
      FROM pgtenant.sessions ss
      JOIN pg_stat_activity a ON a.pid = ss.pid AND a.backend_start = ss.backend_start
     WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
       AND (p_pids IS NULL OR ss.pid = ANY (p_pids))
       AND ss.pid <> pg_backend_pid();
    IF v_targets IS NOT NULL THEN
        PERFORM pg_terminate_backend(pid) FROM unnest(v_targets) AS pid;
        LOOP
            PERFORM pg_stat_clear_snapshot();
            -- A backend leaves pg_stat_activity after its transaction was aborted (proc_exit
            -- runs the abort before it clears its status entry): gone from here, it commits
            -- nothing more.
            SELECT array_agg(ss.pid) INTO v_left
              FROM pgtenant.sessions ss
              JOIN pg_stat_activity a ON a.pid = ss.pid AND a.backend_start = ss.backend_start
             WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
               AND ss.pid = ANY (v_targets);
            EXIT WHEN v_left IS NULL;
            IF clock_timestamp() >= v_deadline THEN
                RAISE EXCEPTION USING ERRCODE = 'PTE01',
                    MESSAGE = format('backends %s of replica %s incarnation %s did not exit within %s ms',
                                     v_left, p_replica, p_incarnation, p_timeout_ms),
                    HINT = 'retry: nothing moved; the backends are being terminated';
            END IF;
            PERFORM pg_sleep(0.001);
        END LOOP;
    END IF;
    DELETE FROM pgtenant.sessions ss
     WHERE ss.replica_id = p_replica AND ss.incarnation = p_incarnation
       AND (p_pids IS NULL OR ss.pid = ANY (p_pids))
       AND ss.pid <> pg_backend_pid();
    RETURN coalesce(cardinality(v_targets), 0);
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.terminate_bound(text, bigint, integer[], bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.terminate_work(p_replica text, p_incarnation bigint, p_secret text, p_pids integer[], p_timeout_ms bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
BEGIN
    IF NOT pgtenant.authenticate(p_replica, p_incarnation, p_secret) THEN
        RETURN 0;
    END IF;
    RETURN pgtenant.terminate_bound(p_replica, p_incarnation, p_pids, p_timeout_ms);
END $function$;
REVOKE EXECUTE ON FUNCTION pgtenant.terminate_work(text, bigint, text, integer[], bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgtenant.unvouched(p_key text, p_schema text, p_max_epoch bigint)
 RETURNS text
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pgtenant'
AS $function$
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
$function$;
REVOKE EXECUTE ON FUNCTION pgtenant.unvouched(text, text, bigint) FROM PUBLIC;
