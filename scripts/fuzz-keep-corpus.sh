#!/usr/bin/env bash
# Keeps what a long AFL++ run learned: copies the queue entries that reached new
# coverage ("+cov" in AFL++'s file name), up to 4 KiB each and at most 300 per target,
# from target/fuzz-out/<target>/default/queue/ into fuzz/corpus/<target>/ as
# afl-<sha256 prefix> (so a rerun adds nothing twice). The seeds of the next run, and
# what `cargo test -p nsq-fuzz` replays.
#
#   scripts/fuzz-keep-corpus.sh [TARGET...]        (default: every target with a queue)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${FUZZ_OUT:-$ROOT/target/fuzz-out}"
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for d in "$OUT"/*/default/queue; do
    [[ -d "$d" ]] && targets+=("$(basename "$(dirname "$(dirname "$d")")")")
  done
fi
for t in "${targets[@]}"; do
  q="$OUT/$t/default/queue"
  [[ -d "$q" && -d "$ROOT/fuzz/corpus/$t" ]] || { echo "$t: no queue or no corpus folder; skipped"; continue; }
  added=0
  while IFS= read -r f; do
    [[ $(stat -c %s "$q/$f") -le 4096 ]] || continue
    h=$(sha256sum "$q/$f" | cut -c1-16)
    dest="$ROOT/fuzz/corpus/$t/afl-$h"
    [[ -e "$dest" ]] && continue
    cp "$q/$f" "$dest"
    added=$((added + 1))
    [[ $added -ge 300 ]] && break
  done < <(ls "$q" | grep -F '+cov' | sort)
  echo "$t: $added inputs added ($(ls "$ROOT/fuzz/corpus/$t" | wc -l) in fuzz/corpus/$t)"
done
