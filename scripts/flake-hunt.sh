#!/usr/bin/env bash
# Runs the broker's integration tests (the one test binary of tests/it/) again and again
# to find the ones that fail only sometimes:
#
#   scripts/flake-hunt.sh [-n RUNS] [--release] [FILTER...] [-- HARNESS-ARGS...]
#
#   -n RUNS      how many runs (default 20)
#   --release    the release build of the tests
#   FILTER...    test name filters as `cargo test` takes them (any match runs), e.g.
#                `durability:: crash_attempts::` or `disk_full::full_disk`; none: every test
#   HARNESS-ARGS passed on to the test binary, e.g. `-- --test-threads=1`
#
# Odd runs use the default segment I/O, even runs NSQD_SEGMENT_IO=threads (the
# blocking-thread path FUSE and network filesystems get; an NSQD_SEGMENT_IO set by the
# caller holds for the odd runs too, so NSQD_SEGMENT_IO=threads makes every run use
# it). It builds the test binary (with the `fault-injection` feature, as scripts/test.sh
# does, so the disk-fault tests run too) and nsqlookupd once (cargo; CARGO_TARGET_DIR is
# honoured), then runs the binary itself from the repository root, as cargo does.
# Each run's output is kept in target/flake-hunt/run-<i>.log (FLAKE_OUT to put it
# elsewhere); a run is killed after FLAKE_RUN_TIMEOUT seconds (default 1800) and counts
# as failed. At the end it prints how often each test failed (and with which segment
# I/O), the SKIP lines seen, and exits 1 if any run failed.
set -uo pipefail

# The whole script is one compound command, read before it runs: editing this file
# while a long hunt runs does not change the hunt.
{

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

RUNS=20
PROFILE_ARGS=()
FILTERS=()
HARNESS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--runs) RUNS="$2"; shift ;;
    -n=*|--runs=*) RUNS="${1#*=}" ;;
    --release) PROFILE_ARGS=(--release) ;;
    -h|--help) awk 'NR > 1 && /^set -uo/ {exit} NR > 1' "$0"; exit 0 ;;
    --) shift; HARNESS=("$@"); break ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) FILTERS+=("$1") ;;
  esac
  shift
done
[[ "$RUNS" =~ ^[0-9]+$ && "$RUNS" -ge 1 ]] || { echo "-n wants a positive number" >&2; exit 2; }

OUT="${FLAKE_OUT:-$ROOT/target/flake-hunt}"
TIMEOUT="${FLAKE_RUN_TIMEOUT:-1800}"
mkdir -p "$OUT"
rm -f "$OUT"/run-*.log

echo "== building the test binary and nsqlookupd"
cargo build ${PROFILE_ARGS[@]+"${PROFILE_ARGS[@]}"} -p nsqlookupd --bin nsqlookupd || exit 1
build_log="$OUT/build.log"
if ! cargo test ${PROFILE_ARGS[@]+"${PROFILE_ARGS[@]}"} -p nsqd --features fault-injection --test it --no-run 2>&1 | tee "$build_log"; then
  echo "build failed" >&2
  exit 1
fi
BIN="$(sed -nE 's/^ *Executable tests\/it\/main\.rs \((.*)\)$/\1/p' "$build_log" | tail -n 1)"
[[ -x "$BIN" ]] || { echo "test binary not found in the cargo output" >&2; exit 1; }
echo "== $RUNS runs of $BIN ${FILTERS[*]+${FILTERS[*]}} ${HARNESS[*]+${HARNESS[*]}}"

declare -A FAILS=()     # test -> failed runs
declare -A FAIL_IO=()   # test -> "default threads ..." per failure
declare -A SKIPS=()     # SKIP line -> runs
FAILED_RUNS=0
T0=$(date +%s)
for ((i = 1; i <= RUNS; i++)); do
  io="${NSQD_SEGMENT_IO:-default}"
  env_io=()
  if ((i % 2 == 0)); then io=threads; env_io=(NSQD_SEGMENT_IO=threads); fi
  log="$OUT/run-$i.log"
  t0=$(date +%s)
  env ${env_io[@]+"${env_io[@]}"} timeout -k 10 "$TIMEOUT" "$BIN" \
    ${FILTERS[@]+"${FILTERS[@]}"} ${HARNESS[@]+"${HARNESS[@]}"} >"$log" 2>&1
  rc=$?
  summary="$(grep -E '^test result:' "$log" | tail -n 1)"
  failed="$(grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | sort -u)"
  if [[ $rc -ne 0 ]]; then
    FAILED_RUNS=$((FAILED_RUNS + 1))
    if [[ -z "$failed" ]]; then
      # Killed by the timeout, or crashed outside any one test.
      failed="(run exit $rc: $( [[ $rc -eq 124 || $rc -eq 137 ]] && echo "timed out after ${TIMEOUT}s" || echo "no failed test named"))"
    fi
  fi
  while IFS= read -r t; do
    [[ -z "$t" ]] && continue
    FAILS["$t"]=$(( ${FAILS["$t"]:-0} + 1 ))
    FAIL_IO["$t"]+="$io "
  done <<<"$failed"
  while IFS= read -r s; do
    [[ -z "$s" ]] && continue
    SKIPS["$s"]=$(( ${SKIPS["$s"]:-0} + 1 ))
  done < <(grep -oE 'SKIP: [A-Za-z0-9_:]+: .*$' "$log" | sort -u)
  printf 'run %d/%d (%s segment I/O): exit %d, %ds; %s%s\n' "$i" "$RUNS" "$io" "$rc" \
    "$(( $(date +%s) - t0 ))" "${summary:-no summary}" \
    "$( [[ -n "$failed" ]] && printf '; failed: %s' "$(paste -sd, - <<<"$failed")")"
done

echo
echo "== $RUNS runs in $(( $(date +%s) - T0 ))s: $FAILED_RUNS failed (logs: $OUT/run-<i>.log)"
if [[ ${#SKIPS[@]} -gt 0 ]]; then
  echo "skipped (runs):"
  for s in "${!SKIPS[@]}"; do printf '  %3d  %s\n' "${SKIPS[$s]}" "$s"; done | sort -k2
fi
if [[ ${#FAILS[@]} -eq 0 ]]; then
  echo "no test failed"
  exit 0
fi
echo "failures per test (count of $RUNS, segment I/O of each failed run):"
for t in "${!FAILS[@]}"; do
  printf '  %3d  %s  [%s]\n' "${FAILS[$t]}" "$t" "${FAIL_IO[$t]% }"
done | sort -rn
exit 1
}
