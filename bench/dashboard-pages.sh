#!/usr/bin/env bash
# Page-load times of the dashboard: starts `ringwork serve` on a schema that already
# holds jobs (e.g. left by `ringwork-bench counts --keep-schema`), loads each page N times with
# curl and prints a Markdown table of the server's response times (time to the last byte).
# Usage: bench/dashboard-pages.sh DATABASE_URL SCHEMA [N]
set -euo pipefail
url=$1 schema=$2 n=${3:-20}
bin=${RINGWORK_BIN:-./target/release/ringwork}
out=$(mktemp)
"$bin" serve --dashboard --listen 127.0.0.1:0 --no-maintenance --database-url "$url" --schema "$schema" >"$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 1 100); do grep -q listening "$out" && break; sleep 0.2; done
base=$(sed -n 's/^listening on //p' "$out")/dashboard
# a job id of each kind of page, from the listings themselves
waiting=$(curl -s "$base/jobs?state=available" | grep -o 'data-job="[0-9]*"' | head -1 | grep -o '[0-9]*')
done_id=$(curl -s "$base/jobs?state=completed" | grep -o 'data-job="[0-9]*"' | head -1 | grep -o '[0-9]*')
next=$(curl -s "$base/jobs?state=available" | grep -o 'id="next" href="[^"]*"' | sed 's/.*href="//; s/"$//; s/&amp;/\&/g')
pages=("" "/queues" "/jobs?state=available" "$next" "/jobs?state=completed" "/jobs/$waiting" "/jobs/$done_id" "/dlq" "/storage")
echo "| page | p50 ms | p90 ms | max ms | bytes |"
echo "| --- | ---: | ---: | ---: | ---: |"
for page in "${pages[@]}"; do
  case $page in /dashboard*) target="${base%/dashboard}$page" ;; *) target="$base$page" ;; esac
  times=$(for _ in $(seq 1 "$n"); do curl -s -o /dev/null -w '%{time_total}\n' "$target"; done | sort -n)
  bytes=$(curl -s "$target" | wc -c)
  pct() { echo "$times" | awk -v p="$1" '{a[NR]=$1} END {i=int((NR-1)*p)+1; printf "%.1f", a[i]*1000}'; }
  label=${page:-/}
  echo "| \`${label:0:60}\` | $(pct 0.5) | $(pct 0.9) | $(pct 1.0) | $bytes |"
done
