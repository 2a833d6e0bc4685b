#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser (the targets of fuzz/src/lib.rs), on stable Rust.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#
# With cargo-afl installed (`cargo install cargo-afl`; it builds its own AFL++ runtime)
# every target runs under AFL++ for SECONDS_PER_TARGET: the instrumented binary is built
# into target/afl/ (`cargo afl build --features afl -p nsq-fuzz`), seeded from
# fuzz/corpus/<target>/, with its findings in target/fuzz-out/<target>/. Without
# cargo-afl (or with FUZZ_ENGINE=smoke) it runs the in-process smoke fuzzer
# (fuzz-smoke: corpus plus mutated inputs) for the same time.
# Exits 1 on any crash (a panic: an invariant the harness asserts, or a parser
# panic) or hang (one input over FUZZ_TIMEOUT_MS under AFL++, 1 s in the smoke fuzzer); crashing inputs are copied to fuzz/artifacts/<target>/.
#
# Environment:
#   FUZZ_ENGINE   afl | smoke (default: afl when cargo-afl is installed, else smoke)
#   FUZZ_TARGETS  space-separated subset of the targets (default: all)
#   FUZZ_JOBS     targets fuzzed at once (default 1; the machine may be shared)
# Exit status 3: AFL++ could not be built or started (no crash found); scripts/test.sh
# then runs the in-process fuzzer instead.
#   FUZZ_TIMEOUT_MS  AFL++ hang threshold per input (default 3000; loaded CI machines)
#   FUZZ_OUT      AFL++ output folder (default target/fuzz-out; a target's is emptied first)
#   FUZZ_EXECS    stop a target after about this many executions (AFL++ -E), SECONDS
#                 still being the cap (the 10 M runs of RELIABILITY.md: FUZZ_EXECS=10000000)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECS="${1:-60}"
ENGINE="${FUZZ_ENGINE:-}"
if [[ -z "$ENGINE" ]]; then
  if cargo afl --version >/dev/null 2>&1; then ENGINE=afl; else ENGINE=smoke; fi
fi
TARGETS="${FUZZ_TARGETS:-$(ls fuzz/corpus)}"
JOBS="${FUZZ_JOBS:-1}"

if [[ "$ENGINE" == smoke ]]; then
  echo "== fuzz (in-process smoke fuzzer, ${SECS} s per target, $JOBS at once)"
  cargo build -q -p nsq-fuzz --bin fuzz-smoke || exit 1
  # The targets dealt round-robin to FUZZ_JOBS processes.
  read -r -a all <<<"$(echo $TARGETS)"
  pids=()
  for ((j = 0; j < JOBS; j++)); do
    mine=()
    for ((i = j; i < ${#all[@]}; i += JOBS)); do mine+=("${all[$i]}"); done
    [[ ${#mine[@]} -gt 0 ]] || continue
    target/debug/fuzz-smoke "$SECS" "${mine[@]}" &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  exit $rc
fi

echo "== fuzz (AFL++ via cargo-afl, ${SECS} s per target, $JOBS at once)"
# cargo-afl builds its AFL++ runtime once per toolchain (`cargo afl config --build`,
# about a minute; it refuses, harmlessly, when the runtime is there).
cargo afl config --build >/dev/null 2>&1 || true
export CARGO_TARGET_DIR="$ROOT/target/afl"
# Profile `fuzz` (Cargo.toml): optimised, with overflow checks and debug assertions on.
cargo afl build -q --profile fuzz --features afl -p nsq-fuzz --bin fuzz-afl || exit 3
BIN="$CARGO_TARGET_DIR/fuzz/fuzz-afl"
OUT="${FUZZ_OUT:-$ROOT/target/fuzz-out}"
mkdir -p "$OUT"
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
  AFL_NO_AFFINITY=1

run_one() { # target
  local t="$1"
  rm -rf "${OUT:?}/$t"
  # shellcheck disable=SC2046
  FUZZ_TARGET="$t" timeout $((SECS + 120)) cargo afl fuzz -V "$SECS" \
    $([[ -n "${FUZZ_EXECS:-}" ]] && echo "-E $FUZZ_EXECS") -t "${FUZZ_TIMEOUT_MS:-3000}" -m none \
    -i "fuzz/corpus/$t" -o "$OUT/$t" "$BIN" >"$OUT/$t.log" 2>&1
  echo "rc=$?" >>"$OUT/$t.log"
}

running=0
for t in $TARGETS; do
  run_one "$t" &
  running=$((running + 1))
  if [[ $running -ge $JOBS ]]; then wait -n; running=$((running - 1)); fi
done
wait

fail=0
not_run=0
printf '%-18s %12s %10s %8s %6s %6s\n' target execs execs/s corpus crash hang
for t in $TARGETS; do
  st="$OUT/$t/default/fuzzer_stats"
  if [[ ! -f "$st" ]]; then
    echo "$t: AFL++ did not run (see $OUT/$t.log):"; tail -5 "$OUT/$t.log"; not_run=1; continue
  fi
  get() { awk -v k="$1" '$1 == k {print $3}' "$st"; }
  crashes=$(get saved_crashes); hangs=$(get saved_hangs)
  printf '%-18s %12s %10s %8s %6s %6s\n' "$t" "$(get execs_done)" "$(get execs_per_sec)" \
    "$(get corpus_count)" "$crashes" "$hangs"
  if [[ "$crashes" != 0 || "$hangs" != 0 ]]; then
    fail=1
    mkdir -p "fuzz/artifacts/$t"
    cp "$OUT/$t"/default/crashes/id* "$OUT/$t"/default/hangs/id* "fuzz/artifacts/$t/" 2>/dev/null
    echo "   $t: inputs copied to fuzz/artifacts/$t/ (replay: FUZZ_TARGET=$t $BIN < FILE)"
  fi
done
if [[ $fail -ne 0 ]]; then
  echo "fuzz: FAILED"
  exit 1
fi
if [[ $not_run -ne 0 ]]; then
  echo "fuzz: AFL++ could not run every target (no crash, no hang in those that ran)"
  exit 3
fi
echo "fuzz: no crashes, no hangs"
