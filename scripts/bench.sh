#!/usr/bin/env bash
# Benchmarks target/release/nsqd with nsq-bench: builds both in release, then for each
# shard count starts the broker on free loopback ports, runs the standard scenarios
# against it, stops it with SIGTERM, and prints one table.
#
# Scenarios (scripts/bench-lib.sh): publish only (MPUB batches of 200), draining that
# backlog (sub), pub+sub with 1 topic/1 channel, 1 topic/4 channels, 16 topics, 200 B
# and 4 KiB bodies, and pub+sub at a moderate open-loop rate for latency.
#
# Environment:
#   BENCH_RUNFOR     measured time per scenario (Go duration, default 5s)
#   BENCH_SHARDS     shard counts to run (default "1 2")
#   BENCH_RATE       rate of the latency scenario, msgs/s (default 50000)
#   BENCH_SCENARIOS  regex on scenario names (e.g. "pubsub-1t1c|pub-200B")
#   BENCH_ARGS       extra nsq-bench flags for every run (e.g. "--producers 4")
#   NSQD_BIN         broker binary (default target/release/nsqd; skips its build)
#   BENCH_BIN        nsq-bench binary (default target/release/nsq-bench)
#   NO_BUILD=1       do not run cargo build
#   BENCH_OUT        keep each run's JSON and the table in this directory
# A pub scenario leaves its backlog in the broker until the next (sub) scenario drains it;
# a broker that keeps it all in memory needs ~320 B per 200 B message (about 6 GB for 5 s
# of --shards 1 here), so raise BENCH_RUNFOR with care.
# Exit status: 0 when every run passed (no errors, no lost messages, broker exit 0).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^set -uo/ {exit} NR > 1' "$0"; exit 0 ;;
esac

RUNFOR="${BENCH_RUNFOR:-5s}"
SHARDS_LIST="${BENCH_SHARDS:-1 2}"
if [[ "${NO_BUILD:-0}" != 1 ]]; then
  pkgs=(-p nsq-bench)
  [[ -z "${NSQD_BIN:-}" ]] && pkgs+=(-p nsqd)
  echo "== cargo build --release ${pkgs[*]}" >&2
  cargo build --release "${pkgs[@]}" >&2 || { echo "build failed" >&2; exit 1; }
fi
NSQD="${NSQD_BIN:-$ROOT/target/release/nsqd}"
BENCH="${BENCH_BIN:-$ROOT/target/release/nsq-bench}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsq-bench.XXXXXX")"
OUT="${BENCH_OUT:-$WORK/out}"
mkdir -p "$OUT"
BROKER_PID=""
cleanup() {
  if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -KILL "$BROKER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

RESULTS="$OUT/results.tsv"
: >"$RESULTS"
FAILED=0
run_no=0
for shards in $SHARDS_LIST; do
  log="$WORK/nsqd-$shards.log"
  if ! start_broker "$NSQD" "$shards" "$WORK/data-$shards" "$log"; then
    FAILED=1
    continue
  fi
  echo "== nsqd --shards $shards on $BROKER_TCP (pid $BROKER_PID), runfor $RUNFOR" >&2
  last_pub_topic=""
  while IFS='|' read -r name mode args; do
    [[ -n "$name" ]] || continue
    run_no=$((run_no + 1))
    json="$OUT/$run_no-shards$shards-$name.json"
    extra=(--runfor "$RUNFOR")
    case "$mode" in
      pub)
        last_pub_topic="bench_pub_${run_no}_$$"
        last_pub_json="$json"
        extra+=(--topic "$last_pub_topic")
        ;;
      sub)
        expect="$(json_get "${last_pub_json:-/nonexistent}" sent)"
        if [[ -z "$last_pub_topic" || -z "$expect" || "$expect" == 0 ]]; then
          echo "   $name: skipped (no successful pub scenario before it)" >&2
          last_pub_topic=""
          continue
        fi
        # Drain: ends once all arrived (or nothing for 1 s; fewer than expected = lost).
        extra=(--runfor 120s --topic "$last_pub_topic" --expect "$expect")
        last_pub_topic=""
        ;;
    esac
    # shellcheck disable=SC2086
    "$BENCH" "$mode" --nsqd-tcp-address="$BROKER_TCP" --json --quiet "${extra[@]}" \
      $args ${BENCH_ARGS:-} >"$json" 2>"$json.stderr"
    rc=$?
    if [[ $rc -ne 0 ]]; then
      FAILED=1
      echo "   $name: FAILED (exit $rc)" >&2
      tail -n 20 "$json.stderr" >&2
    else
      echo "   $name: ok" >&2
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$shards" "$name" "$mode" "$rc" "$json" >>"$RESULTS"
  done < <(bench_selected_scenarios)
  stop_broker
  if [[ $BROKER_RC -ne 0 ]]; then
    echo "   nsqd --shards $shards exited with status $BROKER_RC" >&2
    FAILED=1
  fi
  if grep -q "panicked" "$log"; then
    echo "   nsqd --shards $shards panicked:" >&2
    grep -A5 "panicked" "$log" | head -n 20 >&2
    FAILED=1
  fi
done

python3 - "$RESULTS" <<'PY' | tee "$OUT/table.txt"
import json, sys

def ms(us):
    return "-" if us is None else f"{us / 1000:.2f}"

rows = []
for line in open(sys.argv[1]):
    shards, name, mode, rc, path = line.rstrip("\n").split("\t")
    try:
        d = json.load(open(path))
    except Exception:
        d = None
    if d is None:
        rows.append([shards, name] + ["-"] * 10 + [f"FAIL({rc})"])
        continue
    lat = d["latency_us"] if mode != "pub" else d["pub_ack_latency_us"]
    kind = "e2e" if mode == "pubsub" else ("ack" if mode == "pub" else "-")
    has_lat = kind != "-" and lat["count"] > 0
    q = lambda k: ms(lat[k]) if has_lat else "-"
    rows.append([
        shards, name,
        f"{d['pub_msgs_per_sec']:,.0f}" if mode != "sub" else "-",
        f"{d['pub_mib_per_sec']:.1f}" if mode != "sub" else "-",
        f"{d['sub_msgs_per_sec']:,.0f}" if mode != "pub" else "-",
        f"{d['sub_mib_per_sec']:.1f}" if mode != "pub" else "-",
        kind, q("p50"), q("p99"), q("p999"), q("max"),
        f"{d['errors']}/{d['lost']}",
        "ok" if rc == "0" else f"FAIL({rc})",
    ])
head = ["shards", "scenario", "pub msg/s", "pub MiB/s", "sub msg/s", "sub MiB/s",
        "lat", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "err/lost", "status"]
# The FAIL rows without JSON have one column less for "lat"; pad them.
rows = [r if len(r) == len(head) else r[:2] + ["-"] * (len(head) - 3) + r[-1:] for r in rows]
w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
fmt = lambda r: "  ".join(str(x).rjust(w[i]) if i >= 2 else str(x).ljust(w[i]) for i, x in enumerate(r))
print(fmt(head))
print("  ".join("-" * x for x in w))
for r in rows:
    print(fmt(r))
PY

if [[ -n "${BENCH_OUT:-}" ]]; then
  echo "results kept in $OUT" >&2
fi
if [[ $FAILED -ne 0 ]]; then
  echo "bench: FAILED" >&2
  exit 1
fi
exit 0
