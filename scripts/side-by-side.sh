#!/usr/bin/env bash
# One side-by-side run of this broker against upstream nsqd on this machine, for
# BENCHMARKS.md: the device, the store alone, durable vs #ephemeral, and the side-by-side rows.
#
#   scripts/side-by-side.sh /path/to/upstream/nsqd [OUTDIR]
#
# 1. the device's O_DIRECT sequential write speed (dd, 2 GiB) next to the segment store
#    alone (storage/examples/store_bench: writer and sequential reader, 4 KiB records);
# 2. scripts/compare.sh's side-by-side rows (i9-*) (saturating 200 B / 4 KiB / 64 KiB pub+sub, 8 PUB
#    producers, open loop 500 k/s and 5 k/s, idle 100x100 channels, burst), upstream nsqd
#    as A and this broker as B, both with their default (durable) settings, alternating;
# 3. this broker's durable topics against #ephemeral ones (no disk), alternating, at
#    200 B, 4 KiB and 64 KiB (goal: durable within 10 % of ephemeral).
# Both brokers run on loopback ports with data under OUTDIR (default: a temp dir), which
# is removed at the end. Environment: BENCH_RUNFOR (5s), BENCH_ROUNDS (2), SHARDS
# (default: the CPUs this process may use).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
UPSTREAM="${1:?usage: scripts/side-by-side.sh /path/to/upstream/nsqd [OUTDIR]}"
OUT="${2:-$(mktemp -d "${TMPDIR:-/tmp}/side-by-side.XXXXXX")}"
RUNFOR="${BENCH_RUNFOR:-5s}"
ROUNDS="${BENCH_ROUNDS:-2}"
mkdir -p "$OUT"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$OUT/go-data" "$OUT/rs-data" "$OUT/dd.bin" "$OUT/store"
}
trap cleanup EXIT

cargo build --release -q -p nsqd -p nsq-bench || exit 1
cargo build --release -q -p nsq-storage --example store_bench || exit 1
BENCH="$ROOT/target/release/nsq-bench"
echo "== $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== 1. device and store"
dd if=/dev/zero of="$OUT/dd.bin" bs=1M count=2048 oflag=direct 2>&1 | tail -1
rm -f "$OUT/dd.bin"
mkdir -p "$OUT/store"
for i in 1 2; do
  target/release/examples/store_bench "$OUT/store" 2048 4096
done

echo "== starting brokers"
mkdir -p "$OUT/go-data" "$OUT/rs-data"
"$UPSTREAM" -tcp-address=127.0.0.1:24150 -http-address=127.0.0.1:24151 \
  -data-path="$OUT/go-data" >"$OUT/go.log" 2>&1 &
PID_GO=$!
PIDS+=("$PID_GO")
target/release/nsqd --tcp-address=127.0.0.1:14150 --http-address=127.0.0.1:14151 \
  --data-path="$OUT/rs-data" ${SHARDS:+--shards=$SHARDS} >"$OUT/rs.log" 2>&1 &
PID_RS=$!
PIDS+=("$PID_RS")
for port in 24151 14151; do
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/ping" >/dev/null && break
    sleep 0.1
  done
done

echo "== 2. scripts/compare.sh side-by-side rows (i9-*): A = upstream nsqd, B = this broker"
NO_BUILD=1 BENCH_ROUNDS="$ROUNDS" BENCH_RUNFOR="$RUNFOR" BENCH_SCENARIOS='^i9-' \
  HTTP_A=127.0.0.1:24151 HTTP_B=127.0.0.1:14151 \
  scripts/compare.sh 127.0.0.1:24150 127.0.0.1:14150 "$PID_GO" "$PID_RS" | tee "$OUT/compare.txt"

echo "== 3. this broker: durable vs #ephemeral topic and channel (pub+sub msgs/s each way)"
n=0
for round in $(seq 1 "$ROUNDS"); do
  for spec in "200 200" "4096 20" "65536 1"; do
    set -- $spec
    for kind in durable ephemeral; do
      n=$((n + 1))
      topic="sbs$n"; channel=c
      if [[ $kind == ephemeral ]]; then topic="sbs$n#ephemeral"; channel="c#ephemeral"; fi
      r=$("$BENCH" pubsub --nsqd-tcp-address 127.0.0.1:14150 --topic "$topic" \
        --channel "$channel" --size "$1" --batch-size "$2" --runfor "$RUNFOR" --json -q 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(int(d["pub_msgs_per_sec"]), int(d["sub_msgs_per_sec"]), d["lost"], d["latency_us"]["p99"])')
      echo "round $round size $1 $kind: pub sub lost p99us = $r"
      curl -sf -X POST "http://127.0.0.1:14151/topic/delete?topic=${topic//#/%23}" >/dev/null
    done
  done
done
echo "== done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
