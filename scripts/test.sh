#!/usr/bin/env bash
# The one command that runs every test of this repository:
#
#   1. cargo fmt --all -- --check
#   2. cargo clippy --workspace --all-targets -- -D warnings, then
#      RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps (no broken doc links)
#   3. cargo build (debug: overflow checks and debug assertions stay on)
#   4. cargo test --workspace --features nsqd/fault-injection (the disk-fault tests need
#      the storage fault injection that plain builds leave out; and the storage suites
#      once more on the blocking-thread segment path: NSQD_SEGMENT_IO=threads), then the
#      fuzz smoke: every fuzz target for 60 s, AFL++ where cargo-afl is installed
#      (scripts/fuzz.sh; FUZZ_SMOKE_SECONDS, FUZZ_SMOKE_ENGINE).
#      The broker's integration tests are one binary, tests/it/ (run some by module:
#      `cargo test -p nsqd --test it -- durability::`); a test whose prerequisite is
#      missing passes with a "SKIP: <test>: <reason>" line, counted as skipped in the
#      summary. Tests that fail only sometimes: scripts/flake-hunt.sh runs them N times.
#   4b. network fuzzing and chaos (RELIABILITY.md): netfuzz (mutated V2/HTTP sessions
#      against a running broker, checker messages exactly once, 10 s per shard count
#      1/2/4; NETFUZZ_SECONDS) and chaos (kill -9 under load with --sync-every=1,
#      5 cycles per shard count 1/2/4, no acknowledged message lost; CHAOS_CYCLES; and
#      3 cycles with the default sync policy: losses only within its stated window) and
#      cluster-chaos (a 3-node cluster under load, 5 faults: kill -9 of the leader or a
#      follower, a leader restarted on a deleted data path, SIGSTOP; no acknowledged
#      message lost; CLUSTER_CHAOS_CYCLES; then 2 followers replaced by new members at
#      new addresses through rolling restarts; then 3 leaders cut off from the others
#      while they run (a network partition); then every fault kind once under
#      --sync-every=1, every member killed at once among them; then restarts and wipes
#      under backlogs larger than a snapshot carries)
#   5. scripts/setup-clients.sh (pinned pynsq, gnsq, nsqjs)
#   6. for --shards 1, 2 and 4: start target/debug/nsqd on loopback ports chosen by the
#      kernel (default sync policy; with 4 shards also --retention-time=1h, which the
#      pynsq-seek replay scenario needs and runs with), run every real-client scenario
#      (scripts/clients/*_scenario.*) against it, stop it with SIGTERM and require exit
#      status 0 and no panic in its log.
#   7. pynsq through nsqlookupd, pynsq and nsqjs over TLS (scripts/clients/pynsq_tls.py,
#      nsqjs_tls.js), a 45 s soak (scripts/soak.py --minutes 0.75: mixed pynsq/gnsq/HTTP
#      use with churn, every message accounted for, RSS and fds flat), the
#      nsq-bench smoke test (scripts/bench-smoke.sh) and the live shard page in headless
#      Chromium (scripts/page-test.sh; SKIP when chromium, chromedriver or
#      python3-selenium are missing).
#
# Prints a summary (with the last 30 lines of each failed step's output, which is kept in
# target/test-logs/step-N.log) and exits non-zero if anything failed.
#
# Options:
#   --clients-only   skip steps 1-4 (still builds the broker unless NSQD_BIN is set)
#   --release        build and run target/release/nsqd instead of the debug binary
#   --mock           run the client scenarios against scripts/clients/mock_nsqd.py (a
#                    tiny Python stand-in) to check the scenarios themselves; implies
#                    --clients-only (pynsq-seek is left out: the mock has no seek)
#   --shards "1 2 4" shard counts for step 6
#   --scenarios "pynsq gnsq nsqjs pynsq-snappy pynsq-deflate pynsq-seek"
# Environment:
#   NSQD_BIN          broker command to run instead of the cargo-built binary
#   CLIENT_BUDGET_S   time budget of step 6 in seconds (default 600); scenarios that
#                     would start after it is spent are counted as failed
#   SCENARIO_TIMEOUT  per-scenario timeout inside the client programs (default 120)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/broker-lib.sh
source "$ROOT/scripts/broker-lib.sh"
cd "$ROOT"

# A fresh clone builds everything once: incremental caches would only take disk space.
[[ -n "${CI:-}" ]] && export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

CLIENTS_ONLY=0
PROFILE=debug
MOCK=0
SHARDS="1 2 4"
SCENARIOS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clients-only) CLIENTS_ONLY=1 ;;
    --release) PROFILE=release ;;
    --mock) MOCK=1; CLIENTS_ONLY=1 ;;
    --shards) SHARDS="$2"; shift ;;
    --shards=*) SHARDS="${1#*=}" ;;
    --scenarios) SCENARIOS="$2"; shift ;;
    --scenarios=*) SCENARIOS="${1#*=}" ;;
    -h|--help) awk 'NR > 1 && /^set -uo/ {exit} NR > 1' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [[ -z "$SCENARIOS" ]]; then
  SCENARIOS="pynsq gnsq nsqjs pynsq-snappy pynsq-deflate"
  [[ $MOCK -eq 0 ]] && SCENARIOS+=" pynsq-seek"
fi
# Replay (pynsq-seek) needs consumed messages retained; the mock takes no such flag.
# The broker runs with its default sync policy (records every channel finished quickly are
# never written) except for the shard counts in RETENTION_SHARDS, where it keeps consumed
# records (--retention-time=1h, every record written at publish) for the pynsq-seek replay
# scenario, which runs only there.
RETENTION_SHARDS="${RETENTION_SHARDS:-4}"
broker_flags() { # shards
  BROKER_FLAGS=()
  if [[ $MOCK -eq 0 && " $RETENTION_SHARDS " == *" $1 "* ]]; then
    BROKER_FLAGS=(--retention-time=1h)
  fi
}

CLIENT_BUDGET_S="${CLIENT_BUDGET_S:-600}"
export SCENARIO_TIMEOUT="${SCENARIO_TIMEOUT:-120}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsqd-test.XXXXXX")"
# Broker logs and client output of the last run are kept here (target/ is ignored).
LOGDIR="$ROOT/target/test-logs"
rm -rf "$LOGDIR" && mkdir -p "$LOGDIR"
BROKER_PID=""
cleanup() {
  if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -KILL "$BROKER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

RESULTS=()   # "STATUS|name|detail"
PASSED=0
FAILED=0
SKIPPED=0
T_START=$(date +%s)

hr() { printf '%s\n' "------------------------------------------------------------------------"; }
section() { echo; hr; echo "== $*"; hr; }
record() { # status name [detail]
  RESULTS+=("$1|$2|${3:-}")
  case "$1" in
    PASS) PASSED=$((PASSED + 1)) ;;
    FAIL) FAILED=$((FAILED + 1)) ;;
    SKIP) SKIPPED=$((SKIPPED + 1)) ;;
  esac
  echo ">> $1: $2${3:+ ($3)}"
}
# run_step name command...: runs a command, records PASS/FAIL with its duration. Its
# output also goes to $LOGDIR/step-N.log, whose tail the summary repeats for a failed
# step (a CI log that keeps only its head and tail still shows why).
STEP_N=0
FAILED_STEP_LOGS=()   # "name|log"
run_step() {
  local name="$1"; shift
  local t0=$(date +%s)
  STEP_N=$((STEP_N + 1))
  local log="$LOGDIR/step-$STEP_N.log"
  section "$name: $*"
  # Process substitution, not a pipe: a daemon a step leaves behind holding its output
  # cannot keep the script waiting.
  "$@" > >(tee "$log") 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [[ $rc -eq 0 ]]; then
    record PASS "$name" "${dt}s"
  else
    record FAIL "$name" "exit $rc, ${dt}s"
    FAILED_STEP_LOGS+=("$name|$log")
  fi
  return $rc
}

# ------------------------------------------------------------------ rust checks
BUILD_OK=1
if [[ $CLIENTS_ONLY -eq 0 ]]; then
  if cargo fmt --version >/dev/null 2>&1; then
    # (only the first 100 lines of the diff are shown)
    run_step "cargo fmt" bash -c 'set -o pipefail; cargo fmt --all -- --check 2>&1 | head -n 100'
  else
    echo "WARNING: rustfmt is not installed; skipping cargo fmt --check" >&2
    record SKIP "cargo fmt" "rustfmt not installed"
  fi
  if cargo clippy --version >/dev/null 2>&1; then
    run_step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
  else
    echo "WARNING: clippy is not installed; skipping cargo clippy" >&2
    record SKIP "cargo clippy" "clippy not installed"
  fi
  run_step "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
fi

if [[ $MOCK -eq 1 ]]; then
  NSQD_CMD=(python3 "$ROOT/scripts/clients/mock_nsqd.py")
elif [[ -n "${NSQD_BIN:-}" ]]; then
  read -r -a NSQD_CMD <<<"$NSQD_BIN"
else
  if [[ $PROFILE == release ]]; then
    run_step "cargo build --release" cargo build --release -p nsqd -p nsqlookupd -p nsq-bench --bins || BUILD_OK=0
  else
    run_step "cargo build" cargo build --workspace --all-targets || BUILD_OK=0
  fi
  NSQD_CMD=("$ROOT/target/$PROFILE/nsqd")
fi

if [[ $CLIENTS_ONLY -eq 0 ]]; then
  # tests/it/slow_disk.rs mounts scripts/slowfs.py (FUSE): required, not skipped, where the
  # venv has fusepy (scripts/setup-clients.sh), libfuse2 loads and /dev/fuse exists as
  # root (.ci/run installs them).
  if [[ $BUILD_OK -eq 1 && -e /dev/fuse && "$(id -u)" -eq 0 ]]; then
    bash "$ROOT/scripts/setup-clients.sh" python >/dev/null 2>&1 || true
    if [[ -x "$ROOT/.venv/bin/python" ]] && "$ROOT/.venv/bin/python" -c 'import fuse' >/dev/null 2>&1; then
      export NSQD_TEST_REQUIRE_FUSE=1
    else
      echo "WARN: no fusepy/libfuse2: tests/it/slow_disk.rs skips its FUSE tests"
    fi
  fi
  # The real-client failover tests in tests/it/cluster.rs (pynsq, gnsq, nsqjs) need the
  # pinned clients: installed here, before the tests, rather than only at step 5.
  if [[ $BUILD_OK -eq 1 ]]; then
    bash "$ROOT/scripts/setup-clients.sh" all >/dev/null 2>&1 || true
  fi
  if [[ $BUILD_OK -eq 1 ]]; then
    # The broker's integration tests are one binary (tests/it/main.rs, one module per
    # area); nsqlookupd, which some of them start, is built by the build step above.
    # --no-fail-fast: every test binary runs even when an earlier one failed.
    if ! run_step "cargo test" bash -c 'set -o pipefail; cargo test --workspace --features nsqd/fault-injection --no-fail-fast 2>&1 | tee "$1"' _ "$WORK/cargo-test.log"; then
      failed_tests="$(grep -E '^test .* \.\.\. FAILED$' "$WORK/cargo-test.log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | sort -u)"
      if [[ -n "$failed_tests" ]]; then
        echo "failed Rust tests:"; sed 's/^/  /' <<<"$failed_tests"
        RESULTS[${#RESULTS[@]}-1]+=": $(wc -l <<<"$failed_tests") failed test(s): $(head -5 <<<"$failed_tests" | paste -sd, -)"
      fi
    fi
    # The storage suites again on the blocking-thread segment path that FUSE and network
    # filesystems get (nsq_storage::SegmentIo::Threads), through the store and the broker.
    run_step "cargo test, NSQD_SEGMENT_IO=threads" bash -c 'set -o pipefail; rc=0
      export NSQD_SEGMENT_IO=threads
      cargo test --no-fail-fast -p nsq-storage --features fault-injection --test store 2>&1 | tee "$1" || rc=1
      cargo test -p nsqd --features fault-injection --test it -- disk_faults:: durability:: \
        durable_changes:: crash_attempts:: slow_disk:: 2>&1 | tee -a "$1" || rc=1
      exit $rc' _ "$WORK/cargo-test-threads.log"
    # A test that cannot check what it is for here (a prerequisite missing) passes and
    # prints "SKIP: <test>: <reason>" (tests/it/common::skip; with --test-threads=1 it
    # may follow the harness's "test <name> ... " on its line): each counts as skipped.
    while IFS= read -r line; do
      rest="${line#SKIP: }"
      record SKIP "test ${rest%%: *}" "${rest#*: }"
    done < <(cat "$WORK/cargo-test.log" "$WORK/cargo-test-threads.log" 2>/dev/null |
      grep -oE 'SKIP: [A-Za-z0-9_:]+: .*$' | sort -u)
  else
    record FAIL "cargo test" "not run: build failed"
  fi
fi

# ------------------------------------------------------------- fuzz smoke
# Every fuzz target (fuzz/src/lib.rs) for FUZZ_SMOKE_SECONDS (default 60) each, two at
# once: coverage-guided with AFL++ when cargo-afl is installed (.ci/run installs it; the
# instrumented build takes 2-4 min), seeded from the corpora in fuzz/corpus/; where
# AFL++ cannot be built or started, the in-process smoke fuzzer for the same time (a
# WARN line says so). FUZZ_SMOKE_ENGINE=afl|smoke forces one. Long runs:
# scripts/fuzz.sh [SECONDS] (RELIABILITY.md).
fuzz_smoke() {
  local engine="${FUZZ_SMOKE_ENGINE:-}" secs="${FUZZ_SMOKE_SECONDS:-60}" rc=0
  if [[ -z "$engine" ]]; then
    if cargo afl --version >/dev/null 2>&1; then engine=afl; else engine=smoke; fi
  fi
  FUZZ_ENGINE="$engine" FUZZ_JOBS=2 FUZZ_OUT="$ROOT/target/fuzz-smoke-out" \
    bash "$ROOT/scripts/fuzz.sh" "$secs" || rc=$?
  if [[ $rc -eq 3 && "$engine" == afl ]]; then
    echo "WARN: AFL++ could not run here; the in-process smoke fuzzer instead"
    FUZZ_ENGINE=smoke FUZZ_JOBS=2 bash "$ROOT/scripts/fuzz.sh" "$secs" || return 1
    return 0
  fi
  return $rc
}
if [[ $CLIENTS_ONLY -eq 0 ]]; then
  if [[ $BUILD_OK -eq 1 ]]; then
    run_step "fuzz smoke" fuzz_smoke
  else
    record FAIL "fuzz smoke" "not run: build failed"
  fi
fi

# ------------------------------------------------- network fuzzing and chaos
# netfuzz: fuzz clients send mutated valid V2 and HTTP sessions (flips, truncations,
# splices, huge sizes, drip feeds, abrupt closes) to a running broker while a checker
# publishes and consumes on its own connections: no crash, /ping answers, every checker
# message exactly once per channel (NETFUZZ_SECONDS per shard count, default 10).
# chaos: kill -9 at random instants under load with --sync-every=1, restarted at once
# on the same data path and ports (CHAOS_CYCLES, default 5): no acknowledged message
# lost on either channel; then 3 cycles with the default sync policy (a slow channel
# builds a backlog): nothing acknowledged lost but within 100 ms + --sync-timeout of a
# kill. cluster-chaos: three members (--cluster-address/--cluster-peer) under load, one
# fault per cycle (kill -9 of the leader or a follower, restarted at once; the leader
# restarted on a deleted data path; SIGSTOP of a member for 2 s): every acknowledged
# message reaches the consumer, which follows the leader (CLUSTER_CHAOS_CYCLES, default
# 5); then 2 cycles of fault (f): a follower replaced by a new member at a new cluster
# address, the others restarted with the new list (the topic's replicas move to it);
# then 3 cycles of fault (i): the leader cut off from the others for 2 s while it runs
# (a debug broker with the fault-injection feature), with a slow consumer so that it
# holds a backlog it must stop delivering; then 7 cycles under --sync-every=1, one of each fault kind, among them (g) every
# member killed at once and restarted at once (each rebuilds its Raft log from its
# journal); then 3 cycles of (b), (c) and (f) with 64 KiB bodies and a slow consumer,
# whose backlogs of tens of MB restarted, wiped and new members fetch in pages. All print their seed; NETFUZZ_SEED / CHAOS_SEED replay one.
# Long runs and figures: RELIABILITY.md. The tools are debug builds of the nsq-fuzz
# crate; they drive the broker of this run (NSQD_CMD).
if [[ $CLIENTS_ONLY -eq 0 && $MOCK -eq 0 ]]; then
  if [[ $BUILD_OK -eq 1 ]] && cargo build -q -p nsq-fuzz --bin netfuzz --bin chaos --bin cluster-chaos; then
    run_step "netfuzz" timeout -k 5 300 "$ROOT/target/debug/netfuzz" --nsqd "${NSQD_CMD[0]}" \
      --shards 1,2,4 --duration "${NETFUZZ_SECONDS:-10}" --seed "${NETFUZZ_SEED:-$(date +%s)}"
    run_step "chaos kill -9" timeout -k 5 300 "$ROOT/target/debug/chaos" --nsqd "${NSQD_CMD[0]}" \
      --shards 1,2,4 --cycles "${CHAOS_CYCLES:-5}" --seed "${CHAOS_SEED:-$(date +%s)}"
    run_step "chaos kill -9, default sync" timeout -k 5 300 "$ROOT/target/debug/chaos" \
      --nsqd "${NSQD_CMD[0]}" --sync default --shards 2 --cycles 3 --min-ms 2500 --max-ms 4000 \
      --seed "${CHAOS_SEED:-$(date +%s)}"
    run_step "cluster chaos" timeout -k 5 300 "$ROOT/target/debug/cluster-chaos" \
      --nsqd "${NSQD_CMD[0]}" --cycles "${CLUSTER_CHAOS_CYCLES:-5}" --seed "${CHAOS_SEED:-$(date +%s)}"
    # Fault (i) cuts the leader off while it runs (NSQD_CLUSTER_CUT_FILE): a broker built
    # with the fault-injection feature, as the test suite's own.
    if cargo build -q -p nsqd --bin nsqd --features fault-injection; then
      run_step "cluster chaos, leader cut off" timeout -k 5 300 "$ROOT/target/debug/cluster-chaos" \
        --nsqd "$ROOT/target/debug/nsqd" --faults i --cycles 3 --consumer-ms 5 \
        --seed "${CHAOS_SEED:-$(date +%s)}"
    else
      record FAIL "cluster chaos, leader cut off" "not run: build failed"
    fi
    run_step "cluster chaos, members replaced" timeout -k 5 300 "$ROOT/target/debug/cluster-chaos" \
      --nsqd "${NSQD_CMD[0]}" --faults f --cycles 2 --seed "${CHAOS_SEED:-$(date +%s)}"
    run_step "cluster chaos, journaled" timeout -k 5 300 "$ROOT/target/debug/cluster-chaos" \
      --nsqd "${NSQD_CMD[0]}" --sync-every 1 --faults abcdefgh --cycles 8 --seed "${CHAOS_SEED:-$(date +%s)}"
    run_step "cluster chaos, large backlog" timeout -k 5 300 "$ROOT/target/debug/cluster-chaos" \
      --nsqd "${NSQD_CMD[0]}" --faults bcf --cycles 3 --body-bytes 65536 --consumer-ms 100 \
      --min-ms 3000 --max-ms 5000 --seed "${CHAOS_SEED:-$(date +%s)}"
  else
    record FAIL "netfuzz" "not run: build failed"
    record FAIL "chaos kill -9" "not run: build failed"
    record FAIL "chaos kill -9, default sync" "not run: build failed"
    record FAIL "cluster chaos" "not run: build failed"
    record FAIL "cluster chaos, members replaced" "not run: build failed"
    record FAIL "cluster chaos, journaled" "not run: build failed"
    record FAIL "cluster chaos, large backlog" "not run: build failed"
  fi
fi

# ------------------------------------------------------------- client scenarios
CLIENTS_OK=1
if ! run_step "setup-clients" bash "$ROOT/scripts/setup-clients.sh"; then
  CLIENTS_OK=0
fi

BROKER_LOG=""
TCP_ADDR=""
HTTP_ADDR=""

# start_broker shards: starts the broker in the background on loopback ports picked
# beforehand and waits (60 s at most) until both answer (scripts/broker-lib.sh).
start_broker() {
  local shards="$1"
  local data="$WORK/data-$shards"
  mkdir -p "$data"
  BROKER_LOG="$LOGDIR/nsqd-shards-$shards.log"
  : >"$BROKER_LOG"
  TCP_ADDR=""; HTTP_ADDR=""; BROKER_PID=""
  start_daemon "$BROKER_LOG" BROKER_PID TCP_ADDR HTTP_ADDR -- "${NSQD_CMD[@]}" \
    --shards="$shards" --data-path="$data" ${BROKER_FLAGS[@]+"${BROKER_FLAGS[@]}"}
}

# stop_broker: SIGTERM, wait up to 15 s; returns the exit status (or 124 if it hung).
stop_broker() {
  [[ -z "$BROKER_PID" ]] && return 0
  kill -TERM "$BROKER_PID" 2>/dev/null
  local i rc
  for ((i = 0; i < 150; i++)); do
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then
      wait "$BROKER_PID"; rc=$?
      BROKER_PID=""
      return $rc
    fi
    sleep 0.1
  done
  echo "broker did not exit within 15 s of SIGTERM; killing it" >&2
  kill -KILL "$BROKER_PID" 2>/dev/null
  wait "$BROKER_PID" 2>/dev/null
  BROKER_PID=""
  return 124
}

show_broker_log() {
  echo "---- last 40 lines of the broker log ($1) ----"
  tail -n 40 "$BROKER_LOG" 2>/dev/null
  echo "---- end of broker log ----"
}

scenario_cmd() { # name -> command array in SCN
  case "$1" in
    pynsq) SCN=("$ROOT/.venv/bin/python" "$ROOT/scripts/clients/pynsq_scenario.py") ;;
    pynsq-snappy) SCN=("$ROOT/.venv/bin/python" "$ROOT/scripts/clients/pynsq_snappy_scenario.py") ;;
    pynsq-deflate) SCN=(env PYNSQ_COMPRESSION=deflate "$ROOT/.venv/bin/python" "$ROOT/scripts/clients/pynsq_snappy_scenario.py") ;;
    pynsq-seek) SCN=("$ROOT/.venv/bin/python" "$ROOT/scripts/clients/pynsq_seek_scenario.py") ;;
    gnsq) SCN=("$ROOT/.venv/bin/python" "$ROOT/scripts/clients/gnsq_scenario.py") ;;
    nsqjs) SCN=(node "$ROOT/scripts/clients/nsqjs_scenario.js") ;;
    *) return 1 ;;
  esac
}

if [[ ${#NSQD_CMD[@]} -gt 0 && ! -x "${NSQD_CMD[0]}" ]] && ! command -v "${NSQD_CMD[0]}" >/dev/null 2>&1; then
  BUILD_OK=0
fi

CLIENT_T0=$(date +%s)
for n in $SHARDS; do
  label="shards=$n"
  if [[ $BUILD_OK -eq 0 || $CLIENTS_OK -eq 0 ]]; then
    for s in $SCENARIOS; do record FAIL "$s $label" "not run: $( [[ $BUILD_OK -eq 0 ]] && echo 'no broker binary' || echo 'client setup failed')"; done
    continue
  fi
  broker_flags "$n"
  section "broker ${NSQD_CMD[*]} --shards=$n ${BROKER_FLAGS[*]+${BROKER_FLAGS[*]}}"
  if ! start_broker "$n"; then
    show_broker_log "$label"
    record FAIL "nsqd start $label" "did not come up"
    stop_broker >/dev/null 2>&1
    for s in $SCENARIOS; do record FAIL "$s $label" "not run: broker did not start"; done
    continue
  fi
  echo "broker pid $BROKER_PID: tcp $TCP_ADDR, http $HTTP_ADDR"
  broker_failed=0
  for s in $SCENARIOS; do
    if [[ $s == pynsq-seek && ${#BROKER_FLAGS[@]} -eq 0 ]]; then
      continue  # replay needs retention: runs with the shard counts in RETENTION_SHARDS
    fi
    left=$(( CLIENT_BUDGET_S - ($(date +%s) - CLIENT_T0) ))
    if [[ $left -lt 60 ]]; then
      record FAIL "$s $label" "not run: client time budget (${CLIENT_BUDGET_S}s) spent"
      continue
    fi
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then
      record FAIL "$s $label" "not run: broker is no longer running"
      broker_failed=1
      continue
    fi
    scenario_cmd "$s" || { record FAIL "$s $label" "unknown scenario"; continue; }
    section "$s scenario against $label"
    t0=$(date +%s)
    timeout -k 5 $(( SCENARIO_TIMEOUT + 60 )) "${SCN[@]}" "$TCP_ADDR" "$HTTP_ADDR" 2>&1 |
      tee "$LOGDIR/$s-shards-$n.log"
    rc=${PIPESTATUS[0]}
    dt=$(( $(date +%s) - t0 ))
    if [[ $rc -eq 0 ]]; then
      record PASS "$s $label" "${dt}s"
    else
      [[ $rc -eq 124 || $rc -eq 137 ]] && echo "scenario killed by the outer timeout" >&2
      record FAIL "$s $label" "exit $rc, ${dt}s"
      broker_failed=1
    fi
  done
  section "stopping broker ($label) with SIGTERM"
  alive=0
  kill -0 "$BROKER_PID" 2>/dev/null && alive=1
  stop_broker
  rc=$?
  if [[ $alive -eq 0 ]]; then
    record FAIL "nsqd SIGTERM $label" "broker had already exited (status $rc) before SIGTERM"
    broker_failed=1
  elif [[ $rc -eq 0 ]]; then
    record PASS "nsqd SIGTERM $label" "exit 0"
  else
    record FAIL "nsqd SIGTERM $label" "exit status $rc"
    broker_failed=1
  fi
  if grep -qE "panicked at|RUST_BACKTRACE|FATAL" "$BROKER_LOG"; then
    record FAIL "nsqd log $label" "panic/fatal in the broker log"
    broker_failed=1
  fi
  [[ $broker_failed -eq 1 ]] && show_broker_log "$label"
done

# ------------------------------------------------- nsqlookupd + load generator
# pynsq discovering the broker through this repository's nsqlookupd, pynsq with
# auth_secret against a broker with --auth-http-address (pynsq_auth.py starts its own
# broker and a tiny auth server), and the nsq-bench
# smoke test (every bench mode against the broker, counts checked, compare.sh).
if [[ $MOCK -eq 0 && $BUILD_OK -eq 1 ]]; then
  PROFILE_DIR="$ROOT/target/$PROFILE"
  if [[ -x "$ROOT/.venv/bin/python" ]]; then
    for n in $SHARDS; do
      run_step "pynsq via nsqlookupd --shards=$n" "$ROOT/.venv/bin/python" \
        "$ROOT/scripts/clients/pynsq_lookupd.py" "$PROFILE_DIR/nsqd" "$PROFILE_DIR/nsqlookupd" "$n"
      # pynsq with tls_v1=True (and snappy inside TLS) against a broker with a fresh
      # self-signed certificate (openssl req); the script starts and stops that broker.
      run_step "pynsq TLS --shards=$n" "$ROOT/.venv/bin/python" \
        "$ROOT/scripts/clients/pynsq_tls.py" "$PROFILE_DIR/nsqd" "$n"
      run_step "pynsq with AUTH --shards=$n" "$ROOT/.venv/bin/python" \
        "$ROOT/scripts/clients/pynsq_auth.py" "$PROFILE_DIR/nsqd" "$n"
    done
  else
    record FAIL "pynsq via nsqlookupd / with AUTH" "no .venv (client setup failed)"
  fi
  # Soak (RELIABILITY.md "Soak"): 45 s of mixed pynsq, gnsq and HTTP use against a
  # broker of its own (REQ, timeouts, TOUCH, reconnects, pause/empty/delete of topics and
  # channels, #ephemeral channels); every acknowledged message accounted for, no client
  # error it did not cause, broker RSS and fds flat. SOAK_SEED replays a run; its files
  # (events, resources.csv, soak.png) are kept in target/test-logs/soak.
  run_step "soak checker self-test" python3 "$ROOT/scripts/soak/test_checker.py"
  if [[ -x "$ROOT/.venv/bin/python" ]]; then
    run_step "soak 45 s --shards=2" timeout -k 5 300 "$ROOT/.venv/bin/python" "$ROOT/scripts/soak.py" \
      --minutes 0.75 --shards 2 --nsqd "$PROFILE_DIR/nsqd" --seed "${SOAK_SEED:-$(( $(date +%s) % 100000 ))}" \
      --out "$LOGDIR/soak"
  else
    record FAIL "soak" "no .venv (client setup failed)"
  fi
  # nsqjs with tls: true (the script makes its own certificate and broker).
  if [[ -d "$ROOT/scripts/clients/node_modules/nsqjs" ]]; then
    for n in $SHARDS; do
      run_step "nsqjs TLS --shards=$n" node "$ROOT/scripts/clients/nsqjs_tls.js" \
        "$PROFILE_DIR/nsqd" "$n"
    done
  else
    record FAIL "nsqjs TLS" "no scripts/clients/node_modules (client setup failed)"
  fi
  if [[ $PROFILE == release ]]; then
    run_step "nsq-bench smoke" bash "$ROOT/scripts/bench-smoke.sh" --release
  else
    run_step "nsq-bench smoke" bash "$ROOT/scripts/bench-smoke.sh"
  fi
  # The live shard page (GET /) in headless Chromium; exit 77 = browser not installed.
  page_flags=(--no-build)
  [[ $PROFILE == release ]] && page_flags+=(--release)
  section "shard page in headless Chromium: scripts/page-test.sh ${page_flags[*]}"
  t0=$(date +%s)
  bash "$ROOT/scripts/page-test.sh" "${page_flags[@]}"
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [[ $rc -eq 0 ]]; then
    record PASS "shard page (Chromium)" "${dt}s"
  elif [[ $rc -eq 77 ]]; then
    record SKIP "shard page (Chromium)" "chromium, chromedriver or python3-selenium not installed"
  else
    record FAIL "shard page (Chromium)" "exit $rc, ${dt}s"
  fi
fi

# -------------------------------------------------------------------- summary
section "summary ($(( $(date +%s) - T_START ))s)"
for r in "${RESULTS[@]}"; do
  IFS='|' read -r st name detail <<<"$r"
  printf '  %-4s  %-28s %s\n' "$st" "$name" "$detail"
done
for f in ${FAILED_STEP_LOGS[@]+"${FAILED_STEP_LOGS[@]}"}; do
  echo
  echo "---- last 30 lines of failed step \"${f%%|*}\" (${f#*|}) ----"
  tail -n 30 "${f#*|}" 2>/dev/null | cut -c1-600
done
echo
echo "logs of the broker runs and client scenarios: $LOGDIR"
echo "target/ takes $(du -sh "$ROOT/target" 2>/dev/null | cut -f1); free on its disk: $(df -h --output=avail "$ROOT" 2>/dev/null | tail -1 | tr -d ' ')"
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[[ $FAILED -eq 0 ]]
