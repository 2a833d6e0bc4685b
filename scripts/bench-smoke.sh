#!/usr/bin/env bash
# CI smoke test of nsq-bench and scripts/compare.sh against the broker (about 30 s):
# starts nsqd --shards 2 on free loopback ports, runs nsq-bench for ~2 s in each mode and
# checks that it exits 0, that its JSON parses, that counts match (nothing lost, every
# channel got every message) and that latencies were recorded; checks that protocol
# errors and a dead address make it exit non-zero; runs a short compare.sh of the broker
# against itself; stops the broker with SIGTERM (exit status 0, no panic).
#
# Options:
#   --release     use target/release binaries (default: target/debug, as scripts/test.sh)
#   --no-build    do not run cargo build
# Environment: NSQD_BIN, BENCH_BIN override the binaries (and skip their build).
# Prints "N passed, N failed" last; exits non-zero if anything failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

PROFILE=debug
BUILD=1
for arg in "$@"; do
  case "$arg" in
    --release) PROFILE=release ;;
    --no-build) BUILD=0 ;;
    -h|--help) awk 'NR > 1 && /^set -uo/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
NSQD="${NSQD_BIN:-$ROOT/target/$PROFILE/nsqd}"
BENCH="${BENCH_BIN:-$ROOT/target/$PROFILE/nsq-bench}"
if [[ $BUILD -eq 1 ]]; then
  flags=()
  [[ $PROFILE == release ]] && flags+=(--release)
  if [[ -z "${BENCH_BIN:-}" ]]; then
    cargo build "${flags[@]}" -p nsq-bench --bin nsq-bench || { echo "build failed" >&2; exit 1; }
  fi
  if [[ -z "${NSQD_BIN:-}" ]]; then
    cargo build "${flags[@]}" -p nsqd --bin nsqd || { echo "build failed" >&2; exit 1; }
  fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsq-bench-smoke.XXXXXX")"
BROKER_PID=""
cleanup() {
  if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -KILL "$BROKER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2"; }

# bench NAME EXPECT_RC ARGS... : runs nsq-bench --json; JSON in $WORK/NAME.json
bench() {
  local name="$1" expect="$2"
  shift 2
  timeout 120 "$BENCH" "$@" --json --quiet >"$WORK/$name.json" 2>"$WORK/$name.err"
  local rc=$?
  if [[ $rc -ne $expect ]]; then
    fail "$name" "nsq-bench exited $rc (expected $expect); stderr:"
    tail -n 20 "$WORK/$name.err" | sed 's/^/    /'
    return 1
  fi
  return 0
}

# check NAME PYTHON_EXPR... : each expression over the parsed JSON `d` must hold.
check() {
  local name="$1"
  shift
  local out
  if out="$(python3 - "$WORK/$name.json" "$@" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
lat, ack = d["latency_us"], d["pub_ack_latency_us"]
bad = [e for e in sys.argv[2:] if not eval(e)]
if bad:
    print("failed: " + "; ".join(bad))
    print("json: " + json.dumps({k: d[k] for k in ("sent", "received", "lost", "duplicates",
          "errors", "error_messages", "latency_us", "pub_ack_latency_us")}))
    sys.exit(1)
PY
  )"; then
    pass "$name"
  else
    fail "$name" "$out"
  fi
}

if ! start_broker "$NSQD" 2 "$WORK/data" "$WORK/nsqd.log"; then
  fail "broker start" "see above"
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi
ADDR="$BROKER_TCP"
echo "nsqd --shards 2 on $ADDR (pid $BROKER_PID)"
A=(--nsqd-tcp-address "$ADDR")

# 1. Publish only (MPUB), then drain that backlog with sub.
if bench pub 0 pub "${A[@]}" --runfor 2s --topic smoke_pub --producers 2; then
  check pub 'd["sent"] > 0' 'd["errors"] == 0' 'ack["count"] > 0' 'd["pub_msgs_per_sec"] > 0'
  SENT="$(json_get "$WORK/pub.json" sent)"
  if bench sub 0 sub "${A[@]}" --runfor 60s --topic smoke_pub --consumers 2 --expect "$SENT"; then
    check sub "d['received'] == $SENT" 'd["errors"] == 0' 'd["sub_msgs_per_sec"] > 0'
  fi
fi

# 2. pub+sub, 2 topics x 2 channels: every channel gets every message of its topic, so
#    2 x sent arrive in all; latency recorded.
if bench pubsub 0 pubsub "${A[@]}" --runfor 2s --topics 2 --channels 2 --consumers 2 --size 300 \
  --warmup 500ms; then
  check pubsub 'd["sent"] > 0' 'd["lost"] == 0' 'd["errors"] == 0' \
    'd["received"] == 2 * d["sent"]' 'len(d["channels"]) == 4' \
    'all(c["unique"] == c["sent"] for c in d["channels"])' \
    'lat["count"] > 0' 'lat["p99"] > 0' 'lat["p50"] <= lat["p99"] <= lat["max"]' \
    'd["sub_mib_per_sec"] > 0'
fi

# 3. PUB (batch 1) at an open-loop rate.
if bench pubsub-rate 0 pubsub "${A[@]}" --runfor 2s --batch-size 1 --rate 2000; then
  check pubsub-rate '3000 <= d["sent"] <= 4400' 'd["received"] == d["sent"]' 'd["lost"] == 0' \
    'd["errors"] == 0' 'lat["count"] > 0' 'ack["count"] == d["sent"]'
fi

# 4. DPUB: latency includes the deferral.
if bench dpub 0 pubsub "${A[@]}" --runfor 1s --deferred-ms 300 --rate 500; then
  check dpub 'd["sent"] > 0' 'd["received"] == d["sent"]' 'd["lost"] == 0' \
    'lat["p50"] >= 300000'
fi

# 5. Failures are reported: a protocol error (bad topic name) and a dead address.
if bench bad-topic 1 pub "${A[@]}" --runfor 1s --topic 'bad!topic'; then
  check bad-topic 'd["errors"] > 0' 'any("E_BAD_TOPIC" in e for e in d["error_messages"])'
fi
if bench dead-address 1 pubsub --nsqd-tcp-address 127.0.0.1:1 --runfor 1s; then
  check dead-address 'd["errors"] > 0'
fi

# 6. compare.sh of the broker against itself.
if BENCH_BIN="$BENCH" NO_BUILD=1 BENCH_RUNFOR=1s BENCH_ROUNDS=1 \
  BENCH_SCENARIOS='^(pub-200B|sub-backlog-200B|pubsub-1t1c-200B)$' \
  timeout 300 "$ROOT/scripts/compare.sh" "$ADDR" "$ADDR" "$BROKER_PID" "$BROKER_PID" \
  >"$WORK/compare.out" 2>&1; then
  if grep -q '^pubsub-1t1c-200B ' "$WORK/compare.out" && grep -q 'geometric mean' "$WORK/compare.out" \
    && ! grep -q 'FAIL' "$WORK/compare.out"; then
    pass compare
  else
    fail compare "unexpected output:"
    sed 's/^/    /' "$WORK/compare.out"
  fi
else
  fail compare "compare.sh failed:"
  sed 's/^/    /' "$WORK/compare.out"
fi
sed 's/^/    /' "$WORK/compare.out"

stop_broker
if [[ $BROKER_RC -eq 0 ]] && ! grep -q panicked "$WORK/nsqd.log"; then
  pass "broker exit"
else
  fail "broker exit" "status $BROKER_RC; log tail:"
  tail -n 20 "$WORK/nsqd.log" | sed 's/^/    /'
fi

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
