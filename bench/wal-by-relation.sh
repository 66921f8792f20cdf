#!/usr/bin/env bash
# Where a run's WAL goes, by record type and relation: runs a command (a `ringwork-bench run`, say)
# while sampling the server's WAL position and the ring's relation names twice a second, then reads
# the WAL of a window of that run with pg_waldump and sums each (record type, relation) pair. Ring
# partitions are truncated as they rotate, which gives them new file numbers, so the names are
# sampled during the run rather than looked up after it; partition numbers are folded (ready_entries_N).
#
# usage: bench/wal-by-relation.sh FROM_S TO_S -- COMMAND...
#   FROM_S, TO_S  the window, in seconds since COMMAND started (a bench phase: its steady part)
# DATABASE_URL names the server (default postgres://postgres@127.0.0.1:5432/test) and PGDATA its data
# directory (pg_waldump reads PGDATA/pg_wal: the server must run on this machine, and as root the
# tool reads it as the `postgres` system user). Prints bytes per second for the top 30 pairs and the
# total: divide by the window's jobs per second for bytes per job.
set -euo pipefail
from=${1:?usage: wal-by-relation.sh FROM_S TO_S -- COMMAND...}
to=${2:?usage: wal-by-relation.sh FROM_S TO_S -- COMMAND...}
shift 2
[ "${1:-}" = "--" ] && shift
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
pgdata=${PGDATA:?PGDATA must name the data directory of the server}
samples=$(mktemp)
records=$(mktemp)
trap 'rm -f "$samples" "$records"' EXIT
started=$(date +%s.%N)
(
    while true; do
        echo "L $(date +%s.%N) $(psql "$url" -X -qAt -c 'SELECT pg_current_wal_lsn()')"
        psql "$url" -X -qAt -F ' ' -c "SELECT 'R', c.relfilenode, c.relname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname LIKE 'ringwork%'" || true
        sleep 0.5
    done
) >"$samples" 2>/dev/null &
sampler=$!
"$@" || status=$?
kill "$sampler"
read -r start_lsn end_lsn <<<"$(awk -v t0="$started" -v from="$from" -v to="$to" '
    $1 == "L" && $3 ~ /\// { s = $2 - t0; if (s >= from && first == "") first = $3; if (s <= to) last = $3 }
    END { print first, last }' "$samples")"
[ -n "$start_lsn" ] && [ -n "$end_lsn" ] || { echo "no samples in the window" >&2; exit 1; }
waldump="$(pg_config --bindir)/pg_waldump -p $pgdata/pg_wal -s $start_lsn -e $end_lsn"
if [ "$(id -u)" = 0 ]; then su postgres -c "$waldump" >"$records" 2>/dev/null || true
else $waldump >"$records" 2>/dev/null || true; fi
python3 - "$samples" "$records" "$((to - from))" <<'EOF'
import collections, re, sys
samples, records, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
names = {}
for line in open(samples):
    part = line.split()
    if part[:1] == ["R"] and len(part) >= 3:
        names[part[1]] = re.sub(r"_\d+(?=_|$)", "_N", part[2], count=1)
sums = collections.defaultdict(lambda: [0, 0])
total = 0
for line in open(records):
    m = re.search(r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*(\d+).*?desc: (\w+)", line)
    if not m:
        continue
    rmgr, size, desc = m.group(1), int(m.group(2)), m.group(3)
    rel = re.search(r"blkref #0: rel \d+/\d+/(\d+)", line)
    name = names.get(rel.group(1), rel.group(1)) if rel else "-"
    sums[(rmgr, desc, name)][0] += 1
    sums[(rmgr, desc, name)][1] += size
    total += size
print(f"| record | relation | records/s | bytes/s |\n|---|---|---|---|")
for (rmgr, desc, name), (n, size) in sorted(sums.items(), key=lambda x: -x[1][1])[:30]:
    print(f"| {rmgr} {desc} | {name} | {n / seconds:.0f} | {size / seconds:.0f} |")
print(f"| all | | | {total / seconds:.0f} |")
EOF
exit "${status:-0}"
