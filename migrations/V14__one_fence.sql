-- One fence (issue 28). The four forms of the fence (write or read-only; on a connection that
-- reports the transaction signal or not) were four near-copies, 151 lines; they are one
-- function now, its form two arguments. The old names stay as one-line wrappers so that a
-- replica of the previous release keeps working during a rolling upgrade.
--
-- Statement count per call is what it was: the row read (with the lock before it under READ
-- COMMITTED, after it otherwise), then one PERFORM of every setting, then the marker cursor
-- where the connection does not report the signal.

CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text,
                                          p_read_only boolean, p_signalled boolean)
RETURNS text LANGUAGE plpgsql AS $$
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
END $$;

-- The previous release's names, each its form of the one fence.
CREATE OR REPLACE FUNCTION pgtenant.fence(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
RETURNS text LANGUAGE sql AS $$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, false, false) $$;
CREATE OR REPLACE FUNCTION pgtenant.fence_read(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
RETURNS text LANGUAGE sql AS $$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, true, false) $$;
CREATE OR REPLACE FUNCTION pgtenant.fence_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
RETURNS text LANGUAGE sql AS $$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, false, true) $$;
CREATE OR REPLACE FUNCTION pgtenant.fence_read_signalled(p_key text, p_epoch bigint, p_lock integer, p_idle_ms text)
RETURNS text LANGUAGE sql AS $$ SELECT pgtenant.fence(p_key, p_epoch, p_lock, p_idle_ms, true, true) $$;
