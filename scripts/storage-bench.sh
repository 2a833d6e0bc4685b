#!/usr/bin/env bash
# Storage benchmarks of issue "Storage", side by side in one run, on this machine:
#
#   1. publish+consume throughput: a durable topic (segment store, default sync policy)
#      vs an #ephemeral topic (never touches disk: "storage off"), alternating A B A B;
#   2. the same with --sync-every=1 (every publish answered after its fdatasync, group
#      commit) vs the default policy, alternating;
#   3. RSS with a large backlog on disk (BACKLOG_RUNFOR of publishing, no consumer);
#   4. recovery time of that log after kill -9, with the page cache dropped if allowed.
#
# Usage: scripts/storage-bench.sh            (env: RUNFOR=5s ROUNDS=2 BACKLOG_RUNFOR=8s)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNFOR="${RUNFOR:-5s}"
ROUNDS="${ROUNDS:-2}"
BACKLOG_RUNFOR="${BACKLOG_RUNFOR:-8s}"
SHARDS="${SHARDS:-2}"

cargo build --release -q -p nsqd -p nsq-bench
NSQD="$ROOT/target/release/nsqd"
BENCH="$ROOT/target/release/nsq-bench"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsqd-storage-bench.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME ARGS... -> sets ADDR_<NAME>, HTTP_<NAME>, PID_<NAME>
start() {
  local name="$1"; shift
  local log="$WORK/$name.log"
  "$NSQD" --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 --shards="$SHARDS" \
    --data-path="$WORK/$name" "$@" 2>"$log" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 200); do
    if grep -q "HTTP: listening on" "$log"; then break; fi
    sleep 0.05
  done
  printf -v "ADDR_$name" '%s' "$(grep -o 'TCP: listening on [0-9.:]*' "$log" | awk '{print $4}')"
  printf -v "HTTP_$name" '%s' "$(grep -o 'HTTP: listening on [0-9.:]*' "$log" | awk '{print $4}')"
  printf -v "PID_$name" '%s' "$pid"
}

# run ADDR TOPIC -> prints "pub_msgs_per_sec sub_msgs_per_sec p99_us"
run() {
  "$BENCH" pubsub -q --nsqd-tcp-address "$1" --topic "$2" --runfor "$RUNFOR" --size 200 \
    --batch-size 200 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["pub_msgs_per_sec"], d["sub_msgs_per_sec"], d["latency_us"]["p99"], d["errors"] + d.get("lost", 0))'
}

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.3f}' if b else 'n/a')" "$1" "$2"; }

start def
start sync1 --sync-every=1
echo "== shards=$SHARDS, 200 B messages, MPUB batch 200, pub+sub, $RUNFOR per run, $ROUNDS rounds"
printf '%-6s %-34s %12s %12s %10s %s\n' round case pub/s sub/s p99_us errors
for r in $(seq 1 "$ROUNDS"); do
  read -r dp ds dl de < <(run "$ADDR_def" "durable_$r")
  printf '%-6s %-34s %12.0f %12.0f %10s %s\n' "$r" "durable (default sync)" "$dp" "$ds" "$dl" "$de"
  read -r ep es el ee < <(run "$ADDR_def" "mem_$r#ephemeral")
  printf '%-6s %-34s %12.0f %12.0f %10s %s\n' "$r" "#ephemeral (storage off)" "$ep" "$es" "$el" "$ee"
  read -r sp ss sl se < <(run "$ADDR_sync1" "durable_$r")
  printf '%-6s %-34s %12.0f %12.0f %10s %s\n' "$r" "durable --sync-every=1" "$sp" "$ss" "$sl" "$se"
  echo "       ratios: durable/ephemeral pub $(ratio "$dp" "$ep") sub $(ratio "$ds" "$es");" \
    "sync-every=1/default pub $(ratio "$sp" "$dp") sub $(ratio "$ss" "$ds")"
done
kill -TERM "$PID_def" "$PID_sync1"; wait "$PID_def" "$PID_sync1" 2>/dev/null || true

echo
echo "== backlog: publish for $BACKLOG_RUNFOR with no consumer, then RSS and recovery after kill -9"
SHARDS=1 start backlog
curl -s -X POST "http://$HTTP_backlog/topic/create?topic=backlog" >/dev/null
curl -s -X POST "http://$HTTP_backlog/channel/create?topic=backlog&channel=c" >/dev/null
"$BENCH" pub -q --nsqd-tcp-address "$ADDR_backlog" --topic backlog --runfor "$BACKLOG_RUNFOR" \
  --size 200 --batch-size 200 --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print("published %d messages at %.0f/s" % (d["sent"], d["pub_msgs_per_sec"]))'
sleep 3
echo "RSS with the backlog: $(awk '/VmRSS/ {print $2, $3}' "/proc/$PID_backlog/status")"
curl -s "http://$HTTP_backlog/stats?format=json&topic=backlog" | python3 -c '
import json, sys
c = json.load(sys.stdin)["topics"][0]["channels"][0]
print("channel depth %d, of which on disk only %d" % (c["depth"], c["backend_depth"]))'
echo "on disk: $(du -sh "$WORK/backlog" | cut -f1)"
kill -KILL "$PID_backlog"; wait "$PID_backlog" 2>/dev/null || true
sync
if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then echo "(page cache dropped)"; fi
SHARDS=1 start backlog
grep -o "recovered .*" "$WORK/backlog.log" || true
kill -TERM "$PID_backlog"; wait "$PID_backlog" 2>/dev/null || true
