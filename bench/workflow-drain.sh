#!/usr/bin/env bash
# Server time of completing workflow steps, without a client runtime in the way: one session
# inserts 10,000 steps of one shape into a fresh schema, then claims them 500 at a time and
# completes each claim with `complete_batch`, until none is left. Prints the steps completed and
# the milliseconds spent inside `complete_batch` (the settle, the releases and the completion
# itself; claims not included). Timings move with the machine's load: compare two versions
# alternating, several runs each.
#
# usage: bench/workflow-drain.sh CLI SHAPE
#   CLI    a built `ringwork` CLI (target/debug/ringwork): its schema is the version measured
#   SHAPE  seq (1,000 keys x 10 sequence jobs, one call), many (1,000 workflows a -> 8 -> z, 500
#          a call), fan (one 1 -> 10,000 -> 1 workflow) or plain (10,000 jobs, one call)
# DATABASE_URL names the server (default postgres://postgres@127.0.0.1:5432/test); the schema
# rw_drain is dropped first and at the end.
set -euo pipefail
cli=${1:?usage: workflow-drain.sh CLI SHAPE}
shape=${2:?usage: workflow-drain.sh CLI SHAPE}
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
psql() { command psql "$url" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -c "DROP SCHEMA IF EXISTS rw_drain CASCADE" 2>/dev/null
"$cli" migrate --database-url "$url" --schema rw_drain >/dev/null
trap 'psql -c "DROP SCHEMA IF EXISTS rw_drain CASCADE" 2>/dev/null' EXIT
job='{"kind": "k", "args": {"n": 1}}'
case $shape in
seq)
    psql -c "SELECT count(*) FROM rw_drain.enqueue_in_sequence_many(
        (SELECT array_agg('key-' || (n % 1000)::text ORDER BY n % 1000, n) FROM generate_series(0, 9999) n),
        (SELECT array_agg('$job'::jsonb) FROM generate_series(0, 9999) n),
        (SELECT array_agg('run'::text) FROM generate_series(0, 9999) n))" >/dev/null ;;
many)
    for _ in 1 2; do
        psql -c "SELECT count(*) FROM rw_drain.enqueue_workflows((SELECT jsonb_agg(w) FROM (
            SELECT jsonb_build_array(jsonb_build_object('step', 'a', 'kind', 'k'))
                || (SELECT jsonb_agg(jsonb_build_object('step', 'm' || m, 'kind', 'k', 'depends_on', jsonb_build_array('a')))
                    FROM generate_series(0, 7) m)
                || jsonb_build_array(jsonb_build_object('step', 'z', 'kind', 'k', 'depends_on',
                                                        (SELECT jsonb_agg('m' || m) FROM generate_series(0, 7) m))) w
            FROM generate_series(1, 500)) x))" >/dev/null
    done ;;
fan)
    psql -c "SELECT count(*) FROM rw_drain.enqueue_workflow((
        SELECT jsonb_build_array(jsonb_build_object('step', 'root', 'kind', 'k'))
            || jsonb_agg(jsonb_build_object('step', 'c' || n, 'kind', 'k', 'depends_on', jsonb_build_array('root')))
            || jsonb_build_array(jsonb_build_object('step', 'fan', 'kind', 'k', 'depends_on',
                                                    (SELECT jsonb_agg('c' || m) FROM generate_series(1, 10000) m)))
        FROM generate_series(1, 10000) n))" >/dev/null ;;
plain)
    psql -c "SELECT count(*) FROM rw_drain.enqueue_jobs('default', 2::smallint,
        (SELECT array_agg('k'::text) FROM generate_series(1, 10000)),
        (SELECT array_agg('{\"n\": 1}'::jsonb) FROM generate_series(1, 10000)),
        (SELECT array_agg(25) FROM generate_series(1, 10000)),
        (SELECT array_agg(NULL::int) FROM generate_series(1, 10000)),
        (SELECT array_agg(NULL::text) FROM generate_series(1, 10000)))" >/dev/null ;;
*)
    echo "unknown shape $shape: seq, many, fan or plain" >&2
    exit 2 ;;
esac
psql -c "
DO \$\$
DECLARE
    v_started timestamptz;
    v_ms float8 := 0;
    v_steps int := 0;
    v_claimed int;
    v_slots int[];
    v_receipts bigint[];
    v_jobs bigint[];
    v_leases bigint[];
BEGIN
    LOOP
        SELECT array_agg(c.claim_slot), array_agg(c.receipt_id), array_agg(c.job_id), array_agg(c.run_lease)
        INTO v_slots, v_receipts, v_jobs, v_leases
        FROM rw_drain.claim('default', 500) c;
        v_claimed := coalesce(cardinality(v_jobs), 0);
        EXIT WHEN v_claimed = 0;
        v_steps := v_steps + v_claimed;
        v_started := clock_timestamp();
        PERFORM rw_drain.complete_batch(v_slots, v_receipts, v_jobs, v_leases);
        v_ms := v_ms + extract(epoch FROM clock_timestamp() - v_started) * 1000;
    END LOOP;
    RAISE NOTICE '% steps completed, % ms in complete_batch', v_steps, round(v_ms::numeric, 1);
END
\$\$" 2>&1 | sed -n 's/^.*NOTICE: *//p'
