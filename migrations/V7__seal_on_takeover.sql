-- pgtenant control plane, version 7: the seal cannot be skipped, and it waits milliseconds, not
-- a tenth of a second per backend. Both found by examples/bench_leases.rs (its takeover runs).
--
-- 1. The seal on takeover moves into the epoch's own UPDATE. seal_owner (V5) reads the owner's
--    liveness in one statement and acquire in the next: an owner whose lease session ended
--    between the two (a lease connection cut while the process lives on) was taken over
--    without a seal, and its bound data sessions could still commit under the old epoch
--    (5 of 120 session-fencing takeovers in the benchmark left bound rows behind). Now every
--    UPDATE that moves a tenant's epoch from one holder to another (acquire of every version,
--    restore) seals the previous holder's incarnation and terminates its bound backends first,
--    in the same statement, whatever the caller did before. seal_owner stays: it does the work
--    ahead of the row's serialization point, so the UPDATE usually finds nothing left to do.
-- 2. terminate_bound signals every bound backend at once, then polls pg_stat_activity every
--    millisecond (after clearing the transaction's stats snapshot). V5 called
--    pg_terminate_backend(pid, timeout) per backend, which polls every 100 ms (takeover p99
--    123 ms with four bound sessions, 23–28 ms this way), and whose false for a backend that
--    exited on its own between the check and the call failed the seal with a misleading
--    "did not exit" (6–7 of 30 takeovers).

CREATE OR REPLACE FUNCTION pgtenant.terminate_bound(p_replica text, p_incarnation bigint, p_pids integer[],
                                                    p_timeout_ms bigint)
RETURNS integer
-- A backend that exits between the snapshot and its signal makes pg_terminate_backend warn;
-- it is gone, which is what the seal wants, so the warning is noise.
LANGUAGE plpgsql SET search_path = pg_catalog, pgtenant SET client_min_messages = error AS $$
DECLARE
    v_targets integer[];
    v_left integer[];
    v_deadline timestamptz := clock_timestamp() + greatest(p_timeout_ms, 1) * interval '1 millisecond';
BEGIN
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
END $$;

-- Seals the incarnation the epoch moves away from (see 1. above). 5 s per seal, as the
-- library's own seal_owner call: a backend that does not exit in time fails the UPDATE, and
-- with it the acquisition (PTE01, retryable), so the epoch never moves under a live backend.
CREATE FUNCTION pgtenant.seal_on_takeover() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgtenant AS $$
BEGIN
    UPDATE pgtenant.replicas r SET sealed_at = clock_timestamp()
     WHERE r.replica_id = OLD.owner AND r.incarnation = OLD.owner_incarnation
       AND r.session_fencing_incarnation = OLD.owner_incarnation AND r.sealed_at IS NULL;
    -- Whatever the replica row says now (it may have re-registered under a new incarnation),
    -- nothing bound to the old one may outlive its epoch.
    PERFORM pgtenant.terminate_bound(OLD.owner, OLD.owner_incarnation, NULL, 5000);
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION pgtenant.seal_on_takeover() FROM PUBLIC;

CREATE TRIGGER seal_on_takeover BEFORE UPDATE OF epoch ON pgtenant.tenants
FOR EACH ROW
WHEN (OLD.owner IS NOT NULL AND NEW.owner IS NOT NULL AND NEW.epoch <> OLD.epoch
      AND (NEW.owner, NEW.owner_incarnation) IS DISTINCT FROM (OLD.owner, OLD.owner_incarnation))
EXECUTE FUNCTION pgtenant.seal_on_takeover();
