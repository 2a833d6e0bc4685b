#!/usr/bin/env bash
# Compares two running nsqd-compatible servers with nsq-bench:
#
#   scripts/compare.sh ADDRESS_A ADDRESS_B [PID_A PID_B]
#
# Runs the standard scenarios (scripts/bench-lib.sh) and then the rows of
# BENCHMARKS.md's side-by-side table (names i9-*) against A and B alternately (round 1: scenario 1 on A,
# then on B, scenario 2 on A, then B, ...; then round 2 ...), and prints, pair by pair,
# B/A ratios of throughput (published msgs/s; consumed msgs/s for the backlog drain), p99
# latency (end-to-end for pub+sub, PUB/MPUB ack for publish only), p99.9 and, when the
# PIDs are given, broker CPU-seconds per million messages (from /proc/PID/stat
# utime+stime before and after each run; the messages are the published ones, or the
# consumed ones for the backlog drain). A summary gives the geometric mean of each ratio
# per scenario. Ratio > 1 means B is higher (better throughput, worse latency and CPU).
#
# The side-by-side rows: i9-sat-200B-mpub200, i9-sat-4KiB-mpub20, i9-sat-64KiB-pub (saturating
# pub+sub), i9-sat-200B-pub-8prod (8 PUB producers), i9-open-500k-mpub200 and
# i9-open-5k-pub (open loop; the 5 k/s row shows the output-buffer tail: compare p99 and
# p99.9), and two special rows:
#   i9-idle-100x100  creates 100 topics x 100 channels over HTTP, no clients, and gives
#                    the broker's CPU over IDLE_SECS in the cpu columns, as % of one CPU
#                    (needs the PIDs; the topics are deleted afterwards);
#   i9-burst-200B    publishes BURST_SECS at 2x the consumers' speed S, then AFTER_SECS
#                    at half of S (S: that broker's consumed msgs/s in its i9-sat-200B
#                    run, or a 3 s run), MPUB 200, --pipeline 16; the msg/s columns then
#                    give the seconds from the end of the burst until the backlog drained
#                    ("-": it did not), p99 and p99.9 the e2e latency (us) of the messages
#                    published after that.
#
# Environment:
#   BENCH_RUNFOR     measured time per run (default 5s)
#   BENCH_ROUNDS     rounds (default 2)
#   BENCH_SCENARIOS  regex on scenario names
#   BENCH_RATE       rate of the latency scenario (default 50000)
#   BENCH_ARGS       extra nsq-bench flags for every run
#   HTTP_A, HTTP_B   HTTP addresses for i9-idle (default: the TCP port + 1)
#   IDLE_SECS        i9-idle measuring time (default 30)
#   BURST_SECS, AFTER_SECS  the i9-burst phases in seconds (default 10 and 30)
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

# Every scenario compare.sh runs: the standard ones, then the side-by-side rows (see above).
compare_scenarios() {
  bench_scenarios
  cat <<EOF
i9-sat-200B-mpub200|pubsub|--size 200 --batch-size 200
i9-sat-4KiB-mpub20|pubsub|--size 4096 --batch-size 20
i9-sat-64KiB-pub|pubsub|--size 65536 --batch-size 1
i9-sat-200B-pub-8prod|pubsub|--size 200 --batch-size 1 --producers 8
i9-open-500k-mpub200|pubsub|--size 200 --batch-size 200 --rate 500000
i9-open-5k-pub|pubsub|--size 200 --batch-size 1 --rate 5000
i9-idle-100x100|idle|
i9-burst-200B|burst|--size 200 --batch-size 200 --pipeline 16
EOF
}

# The scenario lines whose name matches BENCH_SCENARIOS (default: all).
compare_selected_scenarios() {
  local line
  while IFS= read -r line; do
    if [[ -z "${BENCH_SCENARIOS:-}" || "${line%%|*}" =~ ${BENCH_SCENARIOS} ]]; then
      printf '%s\n' "$line"
    fi
  done < <(compare_scenarios)
}

# http_addr SIDE -> the HTTP address of side SIDE (HTTP_A/HTTP_B, else TCP port + 1).
http_addr() {
  local side="$1" v
  if [[ $side == 0 ]]; then v="${HTTP_A:-}"; else v="${HTTP_B:-}"; fi
  if [[ -z "$v" ]]; then
    v="${ADDR[$side]%:*}:$((${ADDR[$side]##*:} + 1))"
  fi
  echo "$v"
}

# idle_topics HTTP_ADDR create|delete: 100 topics x 100 channels (i9-idle).
idle_topics() {
  python3 - "$1" "$2" <<'PY'
import http.client, sys
host, port = sys.argv[1].rsplit(":", 1)
c = http.client.HTTPConnection(host, int(port), timeout=30)
def post(path):
    c.request("POST", path)
    r = c.getresponse()
    r.read()
    if r.status != 200:
        sys.exit(f"POST {path}: HTTP {r.status}")
for t in range(100):
    if sys.argv[2] == "delete":
        post(f"/topic/delete?topic=cmp_idle_{t}")
        continue
    post(f"/topic/create?topic=cmp_idle_{t}")
    for ch in range(100):
        post(f"/channel/create?topic=cmp_idle_{t}&channel=c{ch}")
PY
}

# run_idle SIDE -> sets RC and CPU (% of one CPU over IDLE_SECS, or "")
run_idle() {
  local side="$1" http c0 c1 secs="${IDLE_SECS:-30}"
  http="$(http_addr "$side")"
  CPU=""
  RC=0
  echo '{}' >"$WORK/cur-$side.json"
  if [[ -z "${PIDS[$side]}" ]]; then
    echo "   i9-idle-100x100 on ${LABEL[$side]}: needs the PIDs; skipped" >&2
    return
  fi
  if ! idle_topics "$http" create; then
    RC=1
    FAILED=1
    return
  fi
  sleep 3
  c0="$(proc_cpu_ticks "${PIDS[$side]}")"
  sleep "$secs"
  c1="$(proc_cpu_ticks "${PIDS[$side]}")"
  CPU="$(awk -v a="$c0" -v b="$c1" -v t="$CLK_TCK" -v s="$secs" 'BEGIN{printf "%.2f", 100 * (b-a)/t/s}')"
  idle_topics "$http" delete || true
}

# run_burst SIDE ARGS -> like run_one, with a --rate-schedule from the consumers' speed.
run_burst() {
  local side="$1" args="$2" s
  s="${SAT_RATE[$side]:-}"
  if [[ -z "$s" || "$s" == 0 ]]; then
    # shellcheck disable=SC2086
    "$BENCH" pubsub --nsqd-tcp-address="${ADDR[$side]}" --json --quiet --runfor 3s \
      --size 200 ${BENCH_ARGS:-} >"$WORK/sat-$side.json" 2>/dev/null
    s="$(json_get "$WORK/sat-$side.json" sub_msgs_per_sec)"
  fi
  s="${s%.*}"
  s="${s:-0}"
  if [[ "$s" -le 0 ]]; then
    echo "   i9-burst-200B on ${LABEL[$side]}: no consumer speed measured; skipped" >&2
    RC=1
    FAILED=1
    echo '{}' >"$WORK/cur-$side.json"
    return
  fi
  local sched="${BURST_SECS:-10}s@$((2 * s)),${AFTER_SECS:-30}s@$((s / 2))"
  run_one "$side" i9-burst-200B pubsub "$args --rate-schedule $sched --drain-timeout 120s"
}

# run_one SIDE NAME MODE ARGS -> writes $WORK/cur-SIDE.json, sets RC and CPU (seconds or "")
run_one() {
  local side="$1" name="$2" mode="$3" args="$4"
  local json="$WORK/cur-$side.json" extra=(--runfor "$RUNFOR") c0="" c1=""
  [[ "$args" == *--rate-schedule* ]] && extra=()
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

# metrics FILE MODE CPU -> "throughput p99_us p999_us cpu_s_per_M" ("-" when not
# available; idle: cpu is % of one CPU; burst: throughput is the drain time in s and the
# latencies are those after the drain)
metrics() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
path, mode, cpu = sys.argv[1:4]
if mode == "idle":
    print(f"- - - {cpu or '-'}"); sys.exit()
try:
    d = json.load(open(path))
except Exception:
    print("- - - -"); sys.exit()
if mode == "burst":
    ms, lat = d.get("drain_ms"), d.get("latency_after_drain_us")
    ok = lat and lat["count"] > 0
    tput = f"{ms / 1000:.2f}" if ms is not None else "-"
    print(tput, lat["p99"] if ok else "-", lat["p999"] if ok else "-", "-")
    sys.exit()
if mode == "sub":
    tput, msgs, lat = d["sub_msgs_per_sec"], d["received"], None
elif mode == "pub":
    tput, msgs, lat = d["pub_msgs_per_sec"], d["sent"], d["pub_ack_latency_us"]
else:
    tput, msgs, lat = d["pub_msgs_per_sec"], d["sent"], d["latency_us"]
p99 = lat["p99"] if lat and lat["count"] > 0 else "-"
p999 = lat["p999"] if lat and lat["count"] > 0 else "-"
cpm = f"{float(cpu) / (msgs / 1e6):.3f}" if cpu and msgs > 0 else "-"
print(f"{tput:.0f} {p99} {p999} {cpm}")
PY
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "-" || b == "-" || a + 0 == 0) print "-"; else printf "%.3f", b / a }'
}

declare -A PUB_TOPIC=() PUB_SENT=() SAT_RATE=()
declare -a RCS=(0 0) TP=("" "") P99=("" "") P999=("" "") CPUM=("" "")
printf '%-24s %5s  %12s %12s %7s  %9s %9s %7s  %9s %9s  %8s %8s %7s\n' \
  scenario round "A msg/s" "B msg/s" "B/A" "A p99us" "B p99us" "B/A" "A p999us" "B p999us" \
  "A cpu/M" "B cpu/M" "B/A"
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
    for side in 0 1; do
      case "$mode" in
        idle) run_idle "$side" ;;
        burst) run_burst "$side" "$args" ;;
        *) run_one "$side" "$name" "$mode" "$args" ;;
      esac
      RCS[side]=$RC
      read -r "TP[side]" "P99[side]" "P999[side]" "CPUM[side]" \
        < <(metrics "$WORK/cur-$side.json" "$mode" "$CPU")
      if [[ "$name" == i9-sat-200B-mpub200 ]]; then
        SAT_RATE[$side]="$(json_get "$WORK/cur-$side.json" sub_msgs_per_sec)"
      fi
    done
    ta="${TP[0]}" pa="${P99[0]}" qa="${P999[0]}" ca="${CPUM[0]}" rc_a="${RCS[0]}"
    tb="${TP[1]}" pb="${P99[1]}" qb="${P999[1]}" cb="${CPUM[1]}" rc_b="${RCS[1]}"
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
    printf '%-24s %5s  %12s %12s %7s  %9s %9s %7s  %9s %9s  %8s %8s %7s%s\n' \
      "$name" "$round" "$ta" "$tb" "$rt" "$pa" "$pb" "$rp" "$qa" "$qb" "$ca" "$cb" "$rcpu" "$flag"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rt" "$rp" "$rcpu" >>"$PAIRS"
    if [[ "$mode" == sub ]]; then
      PUB_TOPIC=()
      PUB_SENT=()
    fi
  done < <(compare_selected_scenarios)
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
