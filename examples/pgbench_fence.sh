#!/usr/bin/env bash
# Where a fenced transaction's cost goes, measured with pgbench (a C client, so the numbers are
# the server's): the plain transaction `BEGIN; INSERT; COMMIT` against the same with one more
# statement in front of the INSERT, from an empty `SELECT 1` up to the real fence; and, for
# session fencing, the pinned transaction against `pgtenant.enter` and its pieces.
#
#   bash examples/pgbench_fence.sh [clients] [seconds] [repetitions]
#   VARIANTS="search_path pin_plpgsql enter_no_cursor enter" bash examples/pgbench_fence.sh
#
# Variants (default: all, in this order, interleaved over the repetitions):
#   plain, select_1, empty, lock_only, read_only, search_path, fence: as described above;
#   pin_plpgsql: search_path set by a plpgsql function (enter's call overhead, nothing else);
#   enter_no_cursor: enter's body without the marker cursor (the hygiene check and the pin);
#   enter_sql: the same as one inlinable SQL expression (no plpgsql call);
#   enter: `SELECT pgtenant.enter(key, schema)`, the INSERT, `CLOSE pgtenant_fenced`, COMMIT (the
#     library sends the CLOSE in the COMMIT's message; pgbench's prepared mode cannot, so here it
#     is one more round trip, which a server-bound run does not feel): the hot path before V9;
#   pin_signal: the session-fencing hot path since V9 on a connection that reports the
#     transaction signal: the pin plus `default_transaction_read_only` off for the transaction,
#     the INSERT, COMMIT;
#   fence_signalled: transaction fencing since V9 (since V14 the one `pgtenant.fence` with
#     `signalled` true), the INSERT, COMMIT;
#   pin_fenced: pin_signal plus the commit check's setting (`pgtenant.fenced` on), what the pin
#     sends since V11; pin_check: that, and the commit check before COMMIT (`SELECT
#     current_setting('pgtenant.fenced', true)::pgtenant.fenced_transaction`): the session-fencing
#     hot path as the library sends it since V11; fence_check: fence_signalled with the check,
#     transaction fencing's hot path since V11; tpcb_session_check, tpcb_fence_check: the same
#     around TPC-B;
#   tpcb_pinned, tpcb_session, tpcb_enter, tpcb_fence, tpcb_fence_signalled: pgbench's TPC-B
#     transaction (five statements, in the tenant schema) after the pin, pin_signal, enter (with
#     the CLOSE), fence (with the CLOSE) and fence_signalled; compare them with tpcb_pinned.
#
# Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth), pgbench and a built
# `target/debug/pgtenant` (cargo build -p pgtenant-cli). Creates and drops the database
# pgtenant_pgbench. With PIN_SERVER=1 (root only) PostgreSQL's processes run on CPU 1 and
# pgbench on CPU 0 for the run, as on separate machines, so the client cannot steal the
# server's CPU; the affinity is restored afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-8}
seconds=${2:-8}
repetitions=${3:-2}
db=pgtenant_pgbench
psql_=(psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -q)

"${psql_[@]}" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
target/debug/pgtenant setup --database-url "postgres://postgres@127.0.0.1/$db" >/dev/null
"${psql_[@]}" -d "$db" <<'SQL'
INSERT INTO pgtenant.replicas (replica_id, incarnation) VALUES ('bench', 1);
INSERT INTO pgtenant.tenants (key, organization, ledger, schema_name, epoch, owner, owner_incarnation)
     VALUES ('o/l', 'o', 'l', 't_o_l_1', 1, 'bench', 1);
CREATE SCHEMA t_o_l_1;
CREATE TABLE t_o_l_1.log (client_id integer, n bigint);
-- TPC-B's tables in the tenant schema: 32 branches (so that 8 clients rarely wait for one
-- another's branch row, which at pgbench's scale 1 decides the figures more than the fence
-- does), 320 tellers, 10 000 accounts.
CREATE TABLE t_o_l_1.pgbench_branches (bid integer PRIMARY KEY, bbalance integer NOT NULL, filler char(88));
CREATE TABLE t_o_l_1.pgbench_tellers (tid integer PRIMARY KEY, bid integer, tbalance integer NOT NULL, filler char(84));
CREATE TABLE t_o_l_1.pgbench_accounts (aid integer PRIMARY KEY, bid integer, abalance integer NOT NULL, filler char(84));
CREATE TABLE t_o_l_1.pgbench_history (tid integer, bid integer, aid integer, delta integer, mtime timestamp, filler char(22));
INSERT INTO t_o_l_1.pgbench_branches SELECT b, 0, NULL FROM generate_series(1, 32) b;
INSERT INTO t_o_l_1.pgbench_tellers SELECT t, (t - 1) / 10 + 1, 0, NULL FROM generate_series(1, 320) t;
INSERT INTO t_o_l_1.pgbench_accounts SELECT a, 1, 0, NULL FROM generate_series(1, 10000) a;
-- Pieces of the fence, each alone in a plpgsql function of the same signature.
CREATE FUNCTION public.empty(text, bigint, integer, text) RETURNS text
    LANGUAGE plpgsql AS $$ BEGIN RETURN 'x'; END $$;
CREATE FUNCTION public.lock_only(p_key text, p_epoch bigint, p_lock integer, p_idle text) RETURNS text
    LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock_shared(1885828146, p_lock); RETURN 'x'; END $$;
CREATE FUNCTION public.read_only(p_key text, p_epoch bigint, p_lock integer, p_idle text) RETURNS text
    LANGUAGE plpgsql AS $$ DECLARE v bigint; BEGIN SELECT epoch INTO v FROM pgtenant.tenants WHERE key = p_key; RETURN 'x'; END $$;
-- Pieces of pgtenant.enter (V5).
CREATE FUNCTION public.pin_plpgsql(p_key text, p_schema text) RETURNS void
    LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_catalog.set_config('search_path', p_schema || ', pg_temp', true); END $$;
CREATE FUNCTION public.enter_no_cursor(p_key text, p_schema text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
       OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
       OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true) THEN
        PERFORM pgtenant.reset_session(p_key);
    END IF;
    PERFORM pg_catalog.set_config('search_path', p_schema OPERATOR(pg_catalog.||) ', pg_temp', true);
END $$;
-- enter_no_cursor as one SQL expression, which the planner inlines into the calling statement
-- (a volatile SQL function whose body is a single SELECT): what plpgsql's call costs.
CREATE FUNCTION public.enter_sql(p_key text, p_schema text) RETURNS text
    LANGUAGE sql AS $$
SELECT CASE WHEN pg_catalog.current_setting('pgtenant.session_tenant', true) IS DISTINCT FROM p_key
              OR pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
              OR session_user::text IS DISTINCT FROM pg_catalog.current_setting('pgtenant.session_user', true)
            THEN pgtenant.reset_session(p_key) IS NULL END::text
       OPERATOR(pg_catalog.||) pg_catalog.set_config('search_path', p_schema OPERATOR(pg_catalog.||) ', pg_temp', true)
$$;
SQL
lock_key=$("${psql_[@]}" -d "$db" -At -c "SELECT lock_key FROM pgtenant.tenants WHERE key = 'o/l'")

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
insert="INSERT INTO log (client_id, n) VALUES (1, 1);"
qualified="INSERT INTO t_o_l_1.log (client_id, n) VALUES (1, 1);"
printf 'BEGIN;\n%s\nCOMMIT;\n' "$qualified" >"$dir/plain.sql"
printf 'BEGIN;\nSELECT 1;\n%s\nCOMMIT;\n' "$qualified" >"$dir/select_1.sql"
printf "BEGIN;\nSELECT set_config('search_path', 't_o_l_1', true);\n%s\nCOMMIT;\n" "$insert" >"$dir/search_path.sql"
for f in empty lock_only read_only; do
    printf "BEGIN;\nSELECT public.%s('o/l', 1, %s, '10000');\n%s\nCOMMIT;\n" "$f" "$lock_key" "$qualified" >"$dir/$f.sql"
done
printf "BEGIN;\nSELECT pgtenant.fence('o/l', 1, %s, '10000', false, false);\n%s\nCOMMIT;\n" "$lock_key" "$insert" >"$dir/fence.sql"
for f in pin_plpgsql enter_no_cursor enter_sql; do
    printf "BEGIN;\nSELECT public.%s('o/l', 't_o_l_1');\n%s\nCOMMIT;\n" "$f" "$insert" >"$dir/$f.sql"
done
printf "BEGIN;\nSELECT pgtenant.enter('o/l', 't_o_l_1');\n%s\nCLOSE pgtenant_fenced;\nCOMMIT;\n" "$insert" >"$dir/enter.sql"
printf "BEGIN;\nSELECT set_config('search_path', 't_o_l_1, pg_temp', true), set_config('default_transaction_read_only', 'off', true);\n%s\nCOMMIT;\n" "$insert" >"$dir/pin_signal.sql"
printf "BEGIN;\nSELECT pgtenant.fence('o/l', 1, %s, '10000', false, true);\n%s\nCOMMIT;\n" "$lock_key" "$insert" >"$dir/fence_signalled.sql"
pin_fenced="SELECT set_config('search_path', 't_o_l_1, pg_temp', true), set_config('default_transaction_read_only', 'off', true), set_config('pgtenant.fenced', 'on', true);"
check="SELECT pg_catalog.current_setting('pgtenant.fenced', true)::pgtenant.fenced_transaction;"
printf "BEGIN;\n%s\n%s\nCOMMIT;\n" "$pin_fenced" "$insert" >"$dir/pin_fenced.sql"
printf "BEGIN;\n%s\n%s\n%s\nCOMMIT;\n" "$pin_fenced" "$insert" "$check" >"$dir/pin_check.sql"
printf "BEGIN;\nSELECT pgtenant.fence('o/l', 1, %s, '10000', false, true);\n%s\n%s\nCOMMIT;\n" "$lock_key" "$insert" "$check" >"$dir/fence_check.sql"
tpcb='\set aid random(1, 10000)
\set bid random(1, 32)
\set tid random(1, 320)
\set delta random(-5000, 5000)'
tpcb_body='UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);'
printf "%s\nBEGIN;\nSELECT set_config('search_path', 't_o_l_1', true);\n%s\nCOMMIT;\n" "$tpcb" "$tpcb_body" >"$dir/tpcb_pinned.sql"
printf "%s\nBEGIN;\nSELECT set_config('search_path', 't_o_l_1, pg_temp', true), set_config('default_transaction_read_only', 'off', true);\n%s\nCOMMIT;\n" "$tpcb" "$tpcb_body" >"$dir/tpcb_session.sql"
printf "%s\nBEGIN;\nSELECT pgtenant.enter('o/l', 't_o_l_1');\n%s\nCLOSE pgtenant_fenced;\nCOMMIT;\n" "$tpcb" "$tpcb_body" >"$dir/tpcb_enter.sql"
printf "%s\nBEGIN;\nSELECT pgtenant.fence('o/l', 1, %s, '10000', false, false);\n%s\nCLOSE pgtenant_fenced;\nCOMMIT;\n" "$tpcb" "$lock_key" "$tpcb_body" >"$dir/tpcb_fence.sql"
printf "%s\nBEGIN;\nSELECT pgtenant.fence('o/l', 1, %s, '10000', false, true);\n%s\nCOMMIT;\n" "$tpcb" "$lock_key" "$tpcb_body" >"$dir/tpcb_fence_signalled.sql"
printf "%s\nBEGIN;\n%s\n%s\n%s\nCOMMIT;\n" "$tpcb" "$pin_fenced" "$tpcb_body" "$check" >"$dir/tpcb_session_check.sql"
printf "%s\nBEGIN;\nSELECT pgtenant.fence('o/l', 1, %s, '10000', false, true);\n%s\n%s\nCOMMIT;\n" "$tpcb" "$lock_key" "$tpcb_body" "$check" >"$dir/tpcb_fence_check.sql"
read -r -a variants <<<"${VARIANTS:-plain select_1 empty lock_only read_only search_path fence pin_plpgsql enter_no_cursor enter}"

client_cpu=()
if [ "${PIN_SERVER:-0}" = 1 ]; then
    for pid in $(pgrep -u postgres -x postgres); do taskset -p 0x2 "$pid" >/dev/null; done
    trap 'for pid in $(pgrep -u postgres -x postgres); do taskset -p 0x3 "$pid" >/dev/null; done; rm -rf "$dir"' EXIT
    client_cpu=(taskset 0x1)
fi

declare -A tps
for rep in $(seq 1 "$repetitions"); do
    # The order rotates every repetition: the TPC-B variants update the same rows, and a
    # variant that always ran last would always meet the most dead tuples.
    shift_by=$(( (rep - 1) % ${#variants[@]} ))
    order=("${variants[@]:shift_by}" "${variants[@]:0:shift_by}")
    for v in "${order[@]}"; do
        if [[ $v == tpcb_* ]]; then
            "${psql_[@]}" -d "$db" -c "VACUUM t_o_l_1.pgbench_branches, t_o_l_1.pgbench_tellers, t_o_l_1.pgbench_accounts"
        fi
        t=$("${client_cpu[@]}" pgbench -n -h 127.0.0.1 -U postgres -M prepared -c "$clients" -j 1 \
            -T "$seconds" -f "$dir/$v.sql" "$db" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        tps[$v]="${tps[$v]:-} $t"
    done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
base=${variants[0]}
plain=$(echo "${tps[$base]}" | median)
echo "| statement before the INSERT ($clients clients, ${seconds} s × $repetitions, PIN_SERVER=${PIN_SERVER:-0}) | tps (median) | × $base |"
echo "|---|---:|---:|"
for v in "${variants[@]}"; do
    m=$(echo "${tps[$v]}" | median)
    printf '| %s | %.0f | %.2f |\n' "$v" "$m" "$(echo "$m / $plain" | bc -l)"
done
"${psql_[@]}" -c "DROP DATABASE $db"
