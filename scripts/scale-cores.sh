#!/usr/bin/env bash
# Many-core scaling: this broker with 1, 2, 4, 8 and 16 shards, each run pinned to its
# own CPUs, against upstream nsqd given the same CPUs, under one nsq-bench pub+sub load
# (BENCHMARKS.md, "Many cores"):
#
#   scripts/scale-cores.sh [/path/to/upstream/nsqd]
#
# For each count N: the broker runs under `taskset -c 0-(N-1)` with `--shards N` (each
# shard pinned to one of those CPUs); nsqd runs under the same taskset (Go sizes
# GOMAXPROCS from the affinity mask). nsq-bench runs on the CPUs left over when at least
# 4 are left, else on all of them (the line says "shared"). The load: `nsq-bench pubsub`
# over SCALE_TOPICS topics (64: topics hash to shards, so many topics spread evenly),
# one channel each, SCALE_PRODUCERS producers (8) publishing MPUB batches of
# SCALE_SIZE-byte bodies (200), one consumer per channel, BENCH_RUNFOR (5s) after a 1 s
# warm-up. Both brokers are durable (their default), on a fresh data path under
# SCALE_DATA (default: a temp dir). The disk's O_DIRECT write speed (dd) comes first.
# Prints one line per run (msgs/s received, p99 publish-to-delivery) and a table of
# broker/nsqd ratios. Binaries: target/release/{nsqd,nsq-bench}, or NSQD_RS and
# NSQ_BENCH. SCALE_COUNTS ("1 2 4 8 16") picks the counts; counts above nproc are skipped.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UPSTREAM="${1:-}"
RS="${NSQD_RS:-$ROOT/target/release/nsqd}"
BENCH="${NSQ_BENCH:-$ROOT/target/release/nsq-bench}"
COUNTS="${SCALE_COUNTS:-1 2 4 8 16}"
RUNFOR="${BENCH_RUNFOR:-5s}"
TOPICS="${SCALE_TOPICS:-64}"
PRODUCERS="${SCALE_PRODUCERS:-8}"
SIZE="${SCALE_SIZE:-200}"
DATA="${SCALE_DATA:-$(mktemp -d "${TMPDIR:-/tmp}/scale-cores.XXXXXX")}"
CPUS=$(nproc)
PID=""
cleanup() {
  [[ -n "$PID" ]] && kill -KILL "$PID" 2>/dev/null
  rm -rf "$DATA"
}
trap cleanup EXIT
for b in "$RS" "$BENCH"; do
  [[ -x "$b" ]] || { echo "missing $b (cargo build --release -p nsqd -p nsq-bench)" >&2; exit 2; }
done
mkdir -p "$DATA"

wait_port() {
  local port=$1 deadline=$((SECONDS + 60))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    kill -0 "$PID" 2>/dev/null || return 1
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}

# run_one NAME N -> prints "msgs/s p99_ms" (or "fail fail")
run_one() {
  local name=$1 n=$2 tcp=24150 http=24151 cpus bench_cpus shared=""
  cpus="0-$((n - 1))"
  if ((CPUS - n >= 4)); then bench_cpus="$n-$((CPUS - 1))"; else bench_cpus="0-$((CPUS - 1))"; shared=" (bench shares the broker's CPUs)"; fi
  rm -rf "$DATA/d"; mkdir -p "$DATA/d"
  if [[ "$name" == nsqd-rs ]]; then
    taskset -c "$cpus" "$RS" --shards "$n" --data-path "$DATA/d" \
      --tcp-address "127.0.0.1:$tcp" --http-address "127.0.0.1:$http" >"$DATA/log" 2>&1 &
  else
    taskset -c "$cpus" "$UPSTREAM" --data-path "$DATA/d" \
      --tcp-address "127.0.0.1:$tcp" --http-address "127.0.0.1:$http" >"$DATA/log" 2>&1 &
  fi
  PID=$!
  if ! wait_port "$tcp" || ! wait_port "$http"; then
    echo "$name did not start:" >&2; tail -5 "$DATA/log" >&2
    kill -KILL "$PID" 2>/dev/null; PID=""; echo "fail fail"; return
  fi
  local json
  json=$(taskset -c "$bench_cpus" "$BENCH" pubsub --nsqd-tcp-address "127.0.0.1:$tcp" \
    --topics "$TOPICS" --producers "$PRODUCERS" --size "$SIZE" --warmup 1s \
    --runfor "$RUNFOR" --json -q 2>>"$DATA/bench.err" | head -1)
  kill -TERM "$PID" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=""
  python3 - "$json" "$name" "$n" "$cpus" "$bench_cpus" "$shared" <<'EOF'
import json, sys
raw, name, n, cpus, bcpus, shared = sys.argv[1:]
try:
    r = json.loads(raw)
except ValueError:
    print("%-8s shards/CPUs %2s: no report" % (name, n), file=sys.stderr); print("fail fail"); sys.exit()
print("%-8s CPUs %-5s bench CPUs %-5s: %10.0f msgs/s, p99 %7.2f ms, lost %d dup %d err %d%s" % (
    name, cpus, bcpus, r["sub_msgs_per_sec"], r["latency_us"]["p99"] / 1000.0, r["lost"],
    r["duplicates"], r["errors"], shared), file=sys.stderr)
print("%.0f %.2f" % (r["sub_msgs_per_sec"], r["latency_us"]["p99"] / 1000.0))
EOF
}

echo "== $(date -u +%FT%TZ) $CPUS CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== disk: $(dd if=/dev/zero of="$DATA/dd.bin" bs=1M count=1024 oflag=direct 2>&1 | tail -1)"
rm -f "$DATA/dd.bin"
echo "== pub+sub, $TOPICS topics x 1 channel, $PRODUCERS producers, ${SIZE} B, runfor $RUNFOR"
ROWS=()
for n in $COUNTS; do
  ((n <= CPUS)) || { echo "skip $n (only $CPUS CPUs)" >&2; continue; }
  read -r rs_rate rs_p99 < <(run_one nsqd-rs "$n")
  go_rate=fail go_p99=fail
  if [[ -n "$UPSTREAM" ]]; then read -r go_rate go_p99 < <(run_one nsqd "$n"); fi
  ROWS+=("$n $rs_rate $rs_p99 $go_rate $go_p99")
done
echo
echo "| shards = CPUs | this broker msgs/s | p99 ms | nsqd msgs/s | p99 ms | ratio |"
echo "|---|---|---|---|---|---|"
base=""
for row in "${ROWS[@]}"; do
  read -r n rr rp gr gp <<<"$row"
  python3 -c '
import sys
n, rr, rp, gr, gp = sys.argv[1:]
ratio = "%.2fx" % (float(rr) / float(gr)) if rr != "fail" and gr != "fail" and float(gr) > 0 else "-"
print("| %s | %s | %s | %s | %s | %s |" % (n, rr, rp, gr, gp, ratio))' "$n" "$rr" "$rp" "$gr" "$gp"
done
