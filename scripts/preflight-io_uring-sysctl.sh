#!/usr/bin/env bash
# The preflight with io_uring disabled machine-wide: sets `kernel.io_uring_disabled=2`,
# checks that nsqd exits 1 with one FATAL line naming the sysctl and its fix (no panic),
# and restores the previous value whatever happens (EXIT, INT, TERM). Needs root and a
# writable /proc/sys (a VM or a host, not an unprivileged container); skips otherwise.
#
# Not part of `cargo test` or scripts/test.sh: while the sysctl is set, no process on the
# machine can create an io_uring (other brokers' starts and tests would fail). The window
# is kept to the one nsqd run (well under a second).
#
# Usage: scripts/preflight-io_uring-sysctl.sh [path/to/nsqd]   (default: target/debug/nsqd)
set -euo pipefail
cd "$(dirname "$0")/.."
NSQD=${1:-target/debug/nsqd}
KNOB=/proc/sys/kernel/io_uring_disabled

if [[ ! -e $KNOB ]]; then
  echo "SKIP: $KNOB does not exist (kernel older than 6.6)"; exit 0
fi
if [[ $(id -u) != 0 || ! -w $KNOB ]]; then
  echo "SKIP: needs root and a writable $KNOB"; exit 0
fi
[[ -x $NSQD ]] || cargo build --bin nsqd

DATA=$(mktemp -d)
OUT=$(mktemp)
OLD=$(cat "$KNOB")
restore() {
  echo "$OLD" > "$KNOB"
  rm -rf "$DATA" "$OUT"
}
trap restore EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo 2 > "$KNOB"
set +e
"$NSQD" --data-path="$DATA" --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 \
  --shards=2 >"$OUT" 2>&1
rc=$?
set -e
echo "$OLD" > "$KNOB"

cat "$OUT"
fail() { echo "FAIL: $*"; exit 1; }
[[ $rc == 1 ]] || fail "exit status $rc, want 1"
grep -q panicked "$OUT" && fail "a panic reached the user"
[[ $(grep -c 'FATAL: ' "$OUT") == 1 ]] || fail "want exactly one FATAL line"
grep -q 'FATAL: io_uring is disabled: .*kernel.io_uring_disabled = 2; fix: sysctl -w kernel.io_uring_disabled=0' "$OUT" \
  || fail "the FATAL line does not name the sysctl and its fix"
[[ $(cat "$KNOB") == "$OLD" ]] || fail "kernel.io_uring_disabled was not restored"
echo "PASS: io_uring disabled by sysctl is reported with its fix; kernel.io_uring_disabled restored to $OLD"
