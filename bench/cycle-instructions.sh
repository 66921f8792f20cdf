#!/usr/bin/env bash
# The server's instructions per job cycle: one backend enqueues 5 jobs (JOBS) (`enqueue_jobs`), claims
# them and completes them (`claim` + `complete_batch`), as prepared statements, N times. Counted by
# valgrind's callgrind on a single-user backend (`postgres --single`), so the figure does not move
# with the machine's load: the same schema gives the same count to about 0.1 %, and an A/B of two
# versions of a SQL function is one run each, where timings need many alternating rounds.
#
# usage: bench/cycle-instructions.sh [MODE] [SQL_FILE...]
#   MODE   full (enqueue + claim + complete, default), claim (enqueue + claim), enqueue; spread
#          (four enqueues of JOBS, then one claim of all of them and its completion: the segments
#          spread over two shards, so the claim walks both and cuts between them); and ten
#          jobs a cycle, each cycle two claims and completions of five: plain10 (`enqueue_jobs`),
#          chains (five workflows a -> b in one `enqueue_workflows`), sequence (two jobs to each
#          of five keys in one `enqueue_in_sequence_many`: every append after the first cycle
#          finds its key's tail completed); archive (the copy of a slot's completions into the
#          archive, `archive_slot`, after 60 full cycles: per job archived, counted as the
#          difference from the same 60 cycles without it)
#   SQL_FILE  installed over the schema first, with __S__ replaced by `ringwork`: to measure a
#             variant of a function file (sql/functions/*.sql) against the built schema
#   JOBS=N    (environment) jobs a cycle in the full, claim and enqueue modes, and an enqueue's in
#             spread (1..1024 there: its claim takes four times as many), 1..4096 (default 5):
#             5 shows a statement's fixed cost, 128 a batch's per-job cost as at saturation
# The claim is called as the engine calls it (the six-argument form; the SQL API's shorter form is
# a SQL function whose statement is planned at every call).
# Prints the instructions of one cycle: (count after 120 cycles - count after 20) / 100.
#
# Needs valgrind, the server binaries (pg_config --bindir) and a built `ringwork` CLI
# (target/debug/ringwork, or RINGWORK_CLI). Runs the server as the `postgres` system user when
# started as root (initdb refuses root). Uses port 5441 and a temporary directory.
set -euo pipefail

MODE=${1:-full}
shift || true
case "$MODE" in full | claim | enqueue | spread | plain10 | chains | sequence | archive) ;; *)
    echo "MODE must be full, claim, enqueue, spread, plain10, chains, sequence or archive, got $MODE" >&2
    exit 2
    ;;
esac
JOBS=${JOBS:-5}
case "$JOBS" in '' | *[!0-9]*) echo "JOBS must be a number of jobs, got $JOBS" >&2; exit 2 ;; esac
if [ "$JOBS" -lt 1 ] || [ "$JOBS" -gt 4096 ]; then
    echo "JOBS must be 1..4096, got $JOBS" >&2
    exit 2
fi
if [ "$MODE" = spread ] && [ "$JOBS" -gt 1024 ]; then
    echo "JOBS must be 1..1024 in spread (its claim takes 4 × JOBS), got $JOBS" >&2
    exit 2
fi
# the workflow and sequence modes keep their shape: ten jobs, two claims of five
case "$MODE" in plain10 | chains | sequence) JOBS=5 ;; esac
BIN=$(pg_config --bindir)
CLI=${RINGWORK_CLI:-$(dirname "$0")/../target/debug/ringwork}
PORT=5441
DIR=$(mktemp -d /tmp/ringwork-cycle.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else sh -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
trap 'as_pg "$BIN/pg_ctl -D $DIR/data stop -m immediate" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT

as_pg "$BIN/initdb -D $DIR/data -A trust -U postgres" >/dev/null
as_pg "$BIN/pg_ctl -D $DIR/data -l $DIR/log -o '-p $PORT -c autovacuum=off -k $DIR' start" >/dev/null
psql -q -h 127.0.0.1 -p $PORT -U postgres -c "CREATE DATABASE cycle" >/dev/null
"$CLI" migrate --database-url "postgres://postgres@127.0.0.1:$PORT/cycle" >/dev/null
for f in "$@"; do
    sed 's/__S__/ringwork/g' "$f" | psql -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $PORT -U postgres cycle >/dev/null
done
psql -q -h 127.0.0.1 -p $PORT -U postgres cycle -c "SELECT ringwork.ensure_lane('q', 2::smallint)" >/dev/null
as_pg "$BIN/pg_ctl -D $DIR/data stop" >/dev/null

# the archive copies each job's arguments: there they are about 256 bytes, as in the bench's runs
ARGS='{"a":1}'
[ "$MODE" = archive ] && ARGS="{\"a\": \"$(printf '%0240d' 0)\"}"
ENQUEUE="SELECT count(*) FROM ringwork.enqueue_jobs('q', 2::smallint, array_fill('k'::text, ARRAY[$JOBS]), array_fill('$ARGS'::jsonb, ARRAY[$JOBS]), array_fill(25, ARRAY[$JOBS]), array_fill(NULL::int, ARRAY[$JOBS]), array_fill(NULL::text, ARRAY[$JOBS]))"
CLAIM="SELECT count(*) FROM ringwork.claim('q', $JOBS, interval '5 min', NULL::interval, NULL::interval, false)"
STEP='{"kind": "k", "queue": "q", "args": {"a": 1}}'
CHAIN="[{\"step\": \"a\", \"kind\": \"k\", \"queue\": \"q\", \"args\": {\"a\": 1}}, {\"step\": \"b\", \"kind\": \"k\", \"queue\": \"q\", \"args\": {\"a\": 1}, \"depends_on\": [\"a\"]}]"
PLAIN10="SELECT count(*) FROM ringwork.enqueue_jobs('q', 2::smallint, array_fill('k'::text, ARRAY[10]), array_fill('{\"a\":1}'::jsonb, ARRAY[10]), array_fill(25, ARRAY[10]), array_fill(NULL::int, ARRAY[10]), array_fill(NULL::text, ARRAY[10]))"
CHAINS="SELECT count(*) FROM ringwork.enqueue_workflows('[$CHAIN, $CHAIN, $CHAIN, $CHAIN, $CHAIN]'::jsonb)"
SEQUENCE="SELECT count(*) FROM ringwork.enqueue_in_sequence_many(ARRAY['k1', 'k1', 'k2', 'k2', 'k3', 'k3', 'k4', 'k4', 'k5', 'k5'], array_fill('$STEP'::jsonb, ARRAY[10]), array_fill('run'::text, ARRAY[10]))"
SPREAD="WITH c AS MATERIALIZED (SELECT * FROM ringwork.claim('q', $((JOBS * 4)), interval '5 min', NULL::interval, NULL::interval, false)) SELECT count(*) FROM ringwork.complete_batch(ARRAY(SELECT claim_slot FROM c), ARRAY(SELECT receipt_id FROM c), ARRAY(SELECT job_id FROM c), ARRAY(SELECT run_lease FROM c))"
ARCHIVE="SELECT ringwork.archive_slot(l.ready_slot, l.generation, interval '1 day', interval '7 days', NULL) FROM (SELECT ready_slot, generation FROM ringwork.queue_ring_ledger ORDER BY generation DESC LIMIT 1) l"
CYCLE="WITH c AS MATERIALIZED (SELECT * FROM ringwork.claim('q', $JOBS, interval '5 min', NULL::interval, NULL::interval, false)) SELECT count(*) FROM ringwork.complete_batch(ARRAY(SELECT claim_slot FROM c), ARRAY(SELECT receipt_id FROM c), ARRAY(SELECT job_id FROM c), ARRAY(SELECT run_lease FROM c))"

# instructions of a fresh copy of the cluster running $1 cycles (and, with a second argument, the
# archive copy after them)
instructions() {
    rm -rf "$DIR/run" && cp -a "$DIR/data" "$DIR/run"
    {
        echo "PREPARE e AS $ENQUEUE"
        echo "PREPARE k AS $CLAIM"
        echo "PREPARE c AS $CYCLE"
        echo "PREPARE d AS $SPREAD"
        case "$MODE" in
        plain10) echo "PREPARE t AS $PLAIN10" ;;
        chains) echo "PREPARE t AS $CHAINS" ;;
        sequence) echo "PREPARE t AS $SEQUENCE" ;;
        esac
        for _ in $(seq "$1"); do
            case "$MODE" in
            full | archive) printf 'EXECUTE e\nEXECUTE c\n' ;;
            claim) printf 'EXECUTE e\nEXECUTE k\n' ;;
            enqueue) echo "EXECUTE e" ;;
            spread) printf 'EXECUTE e\nEXECUTE e\nEXECUTE e\nEXECUTE e\nEXECUTE d\n' ;;
            *) printf 'EXECUTE t\nEXECUTE c\nEXECUTE c\n' ;;
            esac
        done
        if [ -n "${2:-}" ]; then echo "$ARCHIVE"; fi
    } >"$DIR/in.sql"
    [ "$(id -u)" = 0 ] && chown -R postgres "$DIR"
    as_pg "cd $DIR && valgrind --tool=callgrind --callgrind-out-file=$DIR/cg.$1 $BIN/postgres --single \
        -D $DIR/run -c autovacuum=off -c synchronous_commit=off cycle < $DIR/in.sql > $DIR/out.$1 2>&1"
    if grep -q "ERROR" "$DIR/out.$1"; then
        grep -m1 -A2 "ERROR" "$DIR/out.$1" >&2
        exit 1
    fi
    grep -o "summary: [0-9]*" "$DIR/cg.$1" | awk '{print $2}'
}
if [ "$MODE" = archive ]; then
    without=$(instructions 60)
    with=$(instructions 60 archive)
    echo "archive: $(((with - without) / (60 * JOBS))) instructions per job archived (of $((60 * JOBS)))"
    exit 0
fi
few=$(instructions 20)
many=$(instructions 120)
case "$MODE" in full | claim | enqueue) jobs=$JOBS ;; spread) jobs=$((JOBS * 4)) ;; *) jobs=10 ;; esac
echo "$MODE: $(((many - few) / 100)) instructions per cycle of $jobs jobs"
