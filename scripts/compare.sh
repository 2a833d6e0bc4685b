#!/usr/bin/env bash
# Compares two running nsqd-compatible servers with nsq-bench:
#
#   scripts/compare.sh ADDRESS_A ADDRESS_B [PID_A PID_B]
#
# Runs the standard scenarios (scripts/bench-lib.sh) against A and B alternately
# (round 1: scenario 1 on A, then on B, scenario 2 on A, then B, ...; then round 2 ...),
# and prints, pair by pair, B/A ratios of throughput (published msgs/s; consumed msgs/s
# for the backlog drain), p99 latency (end-to-end for pub+sub, PUB/MPUB ack for publish
# only) and, when the PIDs are given, broker CPU-seconds per million messages (from
# /proc/PID/stat utime+stime before and after each run; the messages are the published
# ones, or the consumed ones for the backlog drain). A summary gives the geometric mean
# of each ratio per scenario. Ratio > 1 means B is higher (better throughput, worse
# latency and CPU).
#
# Environment:
#   BENCH_RUNFOR     measured time per run (default 5s)
#   BENCH_ROUNDS     rounds (default 2)
#   BENCH_SCENARIOS  regex on scenario names
#   BENCH_RATE       rate of the latency scenario (default 50000)
#   BENCH_ARGS       extra nsq-bench flags for every run
#   BENCH_BIN        nsq-bench binary (default target/release/nsq-bench, built if missing
#                    unless NO_BUILD=1)
# Exit status: 0 when every run passed (no protocol errors, no lost messages).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

if [[ $# -ne 2 && $# -ne 4 ]] || [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  awk 'NR > 1 && /^set -uo/ {exit} NR > 1' "$0" >&2
  exit 2
fi
ADDR=("$1" "$2")
PIDS=("${3:-}" "${4:-}")
LABEL=(A B)
RUNFOR="${BENCH_RUNFOR:-5s}"
ROUNDS="${BENCH_ROUNDS:-2}"
BENCH="${BENCH_BIN:-$ROOT/target/release/nsq-bench}"
if [[ -z "${BENCH_BIN:-}" && "${NO_BUILD:-0}" != 1 ]]; then
  (cd "$ROOT" && cargo build --release -p nsq-bench >&2) || { echo "build failed" >&2; exit 1; }
fi
for i in 0 1; do
  if [[ -n "${PIDS[$i]}" && ! -r "/proc/${PIDS[$i]}/stat" ]]; then
    echo "no process ${PIDS[$i]} (PID_${LABEL[$i]})" >&2
    exit 2
  fi
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsq-compare.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM
PAIRS="$WORK/pairs.tsv"
: >"$PAIRS"
FAILED=0

# run_one SIDE NAME MODE ARGS -> writes $WORK/cur-SIDE.json, sets RC and CPU (seconds or "")
run_one() {
  local side="$1" name="$2" mode="$3" args="$4"
  local json="$WORK/cur-$side.json" extra=(--runfor "$RUNFOR") c0="" c1=""
  case "$mode" in
    pub)
      PUB_TOPIC[$side]="cmp_pub_${RANDOM}_$$_$side"
      extra+=(--topic "${PUB_TOPIC[$side]}")
      ;;
    sub)
      extra=(--runfor 120s --topic "${PUB_TOPIC[$side]}" --expect "${PUB_SENT[$side]}")
      ;;
  esac
  [[ -n "${PIDS[$side]}" ]] && c0="$(proc_cpu_ticks "${PIDS[$side]}")"
  # shellcheck disable=SC2086
  "$BENCH" "$mode" --nsqd-tcp-address="${ADDR[$side]}" --json --quiet "${extra[@]}" \
    $args ${BENCH_ARGS:-} >"$json" 2>"$json.stderr"
  RC=$?
  [[ -n "${PIDS[$side]}" ]] && c1="$(proc_cpu_ticks "${PIDS[$side]}")"
  CPU=""
  if [[ -n "$c0" && -n "$c1" ]]; then
    CPU="$(awk -v a="$c0" -v b="$c1" -v t="$CLK_TCK" 'BEGIN{printf "%.3f", (b-a)/t}')"
  fi
  if [[ $RC -ne 0 ]]; then
    FAILED=1
    echo "   $name on ${LABEL[$side]} (${ADDR[$side]}): FAILED (exit $RC)" >&2
    tail -n 20 "$json.stderr" >&2
  fi
}

# metrics FILE MODE CPU -> "throughput p99_us cpu_s_per_M" ("-" when not available)
metrics() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
path, mode, cpu = sys.argv[1:4]
try:
    d = json.load(open(path))
except Exception:
    print("- - -"); sys.exit()
if mode == "sub":
    tput, msgs, lat = d["sub_msgs_per_sec"], d["received"], None
elif mode == "pub":
    tput, msgs, lat = d["pub_msgs_per_sec"], d["sent"], d["pub_ack_latency_us"]
else:
    tput, msgs, lat = d["pub_msgs_per_sec"], d["sent"], d["latency_us"]
p99 = lat["p99"] if lat and lat["count"] > 0 else "-"
cpm = f"{float(cpu) / (msgs / 1e6):.3f}" if cpu and msgs > 0 else "-"
print(f"{tput:.0f} {p99} {cpm}")
PY
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "-" || b == "-" || a + 0 == 0) print "-"; else printf "%.3f", b / a }'
}

declare -A PUB_TOPIC=() PUB_SENT=()
printf '%-24s %5s  %12s %12s %7s  %9s %9s %7s  %8s %8s %7s\n' \
  scenario round "A msg/s" "B msg/s" "B/A" "A p99us" "B p99us" "B/A" "A cpu/M" "B cpu/M" "B/A"
for round in $(seq 1 "$ROUNDS"); do
  while IFS='|' read -r name mode args; do
    [[ -n "$name" ]] || continue
    if [[ "$mode" == sub && -z "${PUB_TOPIC[0]:-}" ]]; then
      continue
    fi
    if [[ "$mode" == sub && ( "${PUB_SENT[0]:-0}" == 0 || "${PUB_SENT[1]:-0}" == 0 ) ]]; then
      echo "   $name: skipped (the pub scenario before it failed)" >&2
      PUB_TOPIC=()
      PUB_SENT=()
      continue
    fi
    run_one 0 "$name" "$mode" "$args"
    rc_a=$RC
    read -r ta pa ca < <(metrics "$WORK/cur-0.json" "$mode" "$CPU")
    run_one 1 "$name" "$mode" "$args"
    rc_b=$RC
    read -r tb pb cb < <(metrics "$WORK/cur-1.json" "$mode" "$CPU")
    if [[ "$mode" == pub ]]; then
      PUB_SENT[0]="$(json_get "$WORK/cur-0.json" sent)"
      PUB_SENT[1]="$(json_get "$WORK/cur-1.json" sent)"
    fi
    rt="$(ratio "$ta" "$tb")"
    rp="$(ratio "$pa" "$pb")"
    rcpu="$(ratio "$ca" "$cb")"
    flag=""
    [[ $rc_a -ne 0 ]] && flag+=" A:FAIL($rc_a)"
    [[ $rc_b -ne 0 ]] && flag+=" B:FAIL($rc_b)"
    printf '%-24s %5s  %12s %12s %7s  %9s %9s %7s  %8s %8s %7s%s\n' \
      "$name" "$round" "$ta" "$tb" "$rt" "$pa" "$pb" "$rp" "$ca" "$cb" "$rcpu" "$flag"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rt" "$rp" "$rcpu" >>"$PAIRS"
    if [[ "$mode" == sub ]]; then
      PUB_TOPIC=()
      PUB_SENT=()
    fi
  done < <(bench_selected_scenarios)
done

echo
echo "geometric mean of B/A per scenario (throughput, p99, cpu/M):"
python3 - "$PAIRS" <<'PY'
import math, sys
from collections import OrderedDict
acc = OrderedDict()
for line in open(sys.argv[1]):
    name, *r = line.rstrip("\n").split("\t")
    acc.setdefault(name, [[], [], []])
    for i, v in enumerate(r):
        if v != "-":
            acc[name][i].append(float(v))
def gm(v):
    v = [x for x in v if x > 0]
    return f"{math.exp(sum(map(math.log, v)) / len(v)):.3f}" if v else "-"
for name, cols in acc.items():
    print(f"  {name:<24} {gm(cols[0]):>8} {gm(cols[1]):>8} {gm(cols[2]):>8}")
PY

if [[ $FAILED -ne 0 ]]; then
  echo "compare: FAILED (see the errors above)" >&2
  exit 1
fi
exit 0
