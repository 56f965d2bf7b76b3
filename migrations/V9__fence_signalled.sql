-- pgtenant control plane, version 9: the fence without its per-transaction extras (issue 19).
--
-- On a connection whose server reports the transaction signal (src/wire.rs: PostgreSQL 14+
-- reports every change of default_transaction_read_only), the client learns that work ended
-- the fenced transaction itself from the server's ParameterStatus messages, and decides the
-- session reset itself (it knows which tenant each pooled connection last served). So the
-- fence needs neither the marker cursor (an OPEN in plpgsql, about 13 % of a one-INSERT
-- transaction's server time, and a CLOSE before COMMIT) nor the hygiene check. These variants
-- drop both and set the signal instead; everything else is V6's fence: the tenant's advisory
-- lock held shared (the acquisition's serialization point), then, in a statement of its own
-- (a new snapshot, taken after the lock), the tenant row, the epoch and floor checks and the
-- pinned search_path. It stays plpgsql: one SQL statement would take its snapshot before the
-- lock, and could read an epoch an acquisition moved while the fence waited for it.
--
-- Connections that do not report (an application's own pool, a pooler that filters
-- ParameterStatus, PostgreSQL before 14) keep calling pgtenant.fence and fence_read.
-- New functions only: replicas of the previous release are not affected.

CREATE FUNCTION pgtenant.fence_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_owner text;
    v_schema text;
    v_forgotten bigint;
    v_lock integer;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1885828146, p_lock);
        SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.tenants t WHERE t.key OPERATOR(pg_catalog.=) p_key;
    ELSE
        SELECT r.epoch, r.owner, r.schema_name, r.forgotten_at_epoch, r.lock_key
          INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
          FROM pgtenant.lock_tenant_row(p_key) r;
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
    PERFORM pg_catalog.set_config('search_path', v_schema OPERATOR(pg_catalog.||) ', pg_temp', true),
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true),
            pg_catalog.set_config('default_transaction_read_only', 'off', true);
    RETURN v_schema;
END $$;

-- The read-only variant: the same checks without the lock.
CREATE FUNCTION pgtenant.fence_read_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_owner text;
    v_schema text;
    v_forgotten bigint;
    v_lock integer;
BEGIN
    SELECT t.epoch, t.owner, t.schema_name, t.forgotten_at_epoch, t.lock_key
      INTO v_epoch, v_owner, v_schema, v_forgotten, v_lock
      FROM pgtenant.tenants t WHERE t.key OPERATOR(pg_catalog.=) p_key;
    IF v_lock IS DISTINCT FROM p_lock THEN
        RAISE EXCEPTION 'pgtenant: lock key % is not tenant %''s', p_lock, p_key;
    END IF;
    IF p_epoch OPERATOR(pg_catalog.<) pgtenant.epoch_floor() THEN
        PERFORM pgtenant.fence_refusal_before_failover(p_key, p_epoch);
    END IF;
    IF v_epoch OPERATOR(pg_catalog.<>) p_epoch OR v_owner IS NULL OR v_schema IS NULL
       OR v_forgotten OPERATOR(pg_catalog.>=) p_epoch THEN
        PERFORM pgtenant.fence_refusal(p_key, p_epoch, v_epoch, v_owner, v_schema, v_forgotten);
    END IF;
    PERFORM pg_catalog.set_config('search_path', v_schema OPERATOR(pg_catalog.||) ', pg_temp', true),
            pg_catalog.set_config('idle_in_transaction_session_timeout', p_idle_ms, true),
            pg_catalog.set_config('default_transaction_read_only', 'off', true);
    RETURN v_schema;
END $$;

-- Like the fence: they act on the caller's own session and read what the caller may read.
GRANT EXECUTE ON FUNCTION pgtenant.fence_signalled(text, bigint, integer, text),
                          pgtenant.fence_read_signalled(text, bigint, integer, text) TO PUBLIC;
