# shellcheck shell=bash disable=SC2034  # variables here are used by the sourcing scripts
# Shared by scripts/bench.sh, scripts/compare.sh and scripts/bench-smoke.sh (sourced).
#
# Scenarios, one per line: NAME|MODE|ARGS. MODE "sub" means "drain the backlog that the
# previous "pub" scenario left on its topic" (the caller fills in the topic and
# --expect). Note that a "pub" run's backlog stays in the broker until the "sub" run
# drains it (in memory, for a broker that does not spill to disk), so keep BENCH_RUNFOR
# modest. BENCH_RATE sets the open-loop rate of the latency scenarios (default 50000
# msgs/s): one with the default output buffering (16 KiB / 250 ms, so latency is mostly
# buffer fill time) and one with output_buffer_size -1 (unbuffered delivery).

bench_scenarios() {
  local rate="${BENCH_RATE:-50000}"
  cat <<EOF
pub-200B|pub|--size 200
sub-backlog-200B|sub|--size 200
pubsub-1t1c-200B|pubsub|--size 200
pubsub-1t4c-200B|pubsub|--size 200 --channels 4
pubsub-16t-200B|pubsub|--size 200 --topics 16
pub-4KiB|pub|--size 4096
sub-backlog-4KiB|sub|--size 4096
pubsub-1t1c-4KiB|pubsub|--size 4096
pubsub-rate${rate}-200B|pubsub|--size 200 --rate ${rate}
pubsub-rate${rate}-unbuf-200B|pubsub|--size 200 --rate ${rate} --output-buffer-size=-1
EOF
}

# Scenario lines whose name matches the (bash) regex BENCH_SCENARIOS (default: all).
bench_selected_scenarios() {
  local line
  while IFS= read -r line; do
    if [[ -z "${BENCH_SCENARIOS:-}" || "${line%%|*}" =~ ${BENCH_SCENARIOS} ]]; then
      printf '%s\n' "$line"
    fi
  done < <(bench_scenarios)
}

# CPU time (utime + stime) of PID in clock ticks, or empty if unreadable.
proc_cpu_ticks() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  # Fields after "(comm) ": state is $1, utime $12, stime $13.
  echo "${stat##*) }" | awk '{print $12 + $13}'
}

CLK_TCK="$(getconf CLK_TCK 2>/dev/null || echo 100)"

# shellcheck source=scripts/broker-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/broker-lib.sh"

# start_broker BIN SHARDS DATADIR LOG: starts BIN (this broker or upstream nsqd) on
# loopback ports picked beforehand; sets BROKER_PID, BROKER_TCP and BROKER_HTTP. Returns
# 1 if the ports do not answer within 60 s (scripts/broker-lib.sh).
start_broker() {
  local bin="$1" shards="$2" dir="$3" log="$4"
  mkdir -p "$dir"
  : >"$log"
  BROKER_PID=""; BROKER_TCP=""; BROKER_HTTP=""
  if ! start_daemon "$log" BROKER_PID BROKER_TCP BROKER_HTTP -- "$bin" --shards "$shards" \
    --data-path "$dir"; then
    echo "broker did not start; log:" >&2
    cat "$log" >&2
    return 1
  fi
}

# stop_broker: SIGTERM, wait up to 15 s (then SIGKILL). Sets BROKER_RC.
stop_broker() {
  BROKER_RC=0
  [[ -n "${BROKER_PID:-}" ]] || return 0
  kill -TERM "$BROKER_PID" 2>/dev/null || true
  local _
  for _ in $(seq 1 150); do
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$BROKER_PID" 2>/dev/null; then
    echo "broker $BROKER_PID ignored SIGTERM for 15s; killing it" >&2
    kill -KILL "$BROKER_PID" 2>/dev/null || true
  fi
  wait "$BROKER_PID" 2>/dev/null
  BROKER_RC=$?
  BROKER_PID=""
}

# json_get FILE KEY...: prints a value of the nsq-bench JSON (nested keys), or "".
json_get() {
  python3 - "$@" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    for k in sys.argv[2:]:
        d = d[k]
    print(d)
except Exception:
    print("")
PY
}
