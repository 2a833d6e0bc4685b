#!/usr/bin/env bash
# Browser test of the live shard page (GET / on the HTTP port, src/page/shards.html):
# starts nsqd --shards 4 on free loopback ports, puts load on it with nsq-bench (a hot
# topic, six lighter ones, a topic with a growing backlog and one with deferred
# messages), opens the page in headless Chromium through chromedriver
# (scripts/page_check.py, Python selenium) and checks that every chart has data, that
# the table lists the topics with their shard, that one shard is marked hottest and that
# the browser console has no errors; saves a screenshot to target/test-logs/page.png.
# Then starts a 3-member cluster and checks a member's replication panel.
# Stops the broker with SIGTERM (exit status 0, no panic in its log).
#
# Needs chromium, chromedriver and Python selenium (Debian: apt-get install chromium
# chromium-driver python3-selenium). Without them it prints a SKIP line and exits 77.
#
# Options:
#   --release     use target/release binaries (default: target/debug, as scripts/test.sh)
#   --no-build    do not run cargo build
# Environment: NSQD_BIN, BENCH_BIN override the binaries (and skip their build);
#   PAGE_WAIT_S   seconds the page collects samples before the checks (default 10)
#   PAGE_SHOT     screenshot path (default target/test-logs/page.png)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

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
PAGE_WAIT_S="${PAGE_WAIT_S:-10}"
LOGDIR="$ROOT/target/test-logs"
SHOT="${PAGE_SHOT:-$LOGDIR/page.png}"
mkdir -p "$LOGDIR"

# ---------------------------------------------------------------- the browser
skip() { echo "SKIP: page test: $*"; exit 77; }
CHROMIUM="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
CHROMEDRIVER="${CHROMEDRIVER:-$(command -v chromedriver || true)}"
[[ -n "$CHROMIUM" ]] || skip "chromium is not installed (apt-get install chromium)"
[[ -n "$CHROMEDRIVER" ]] || skip "chromedriver is not installed (apt-get install chromium-driver)"
PY=""
# Debian's python3-selenium lives in /usr/bin/python3's dist-packages; a pyenv or venv
# python3 earlier on PATH does not see it.
for p in "${PAGE_PYTHON:-}" /usr/bin/python3 python3 "$ROOT/.venv/bin/python"; do
  [[ -n "$p" ]] || continue
  if "$p" -c 'import selenium' >/dev/null 2>&1; then PY="$p"; break; fi
done
[[ -n "$PY" ]] || skip "Python selenium is not installed (apt-get install python3-selenium)"
export CHROMIUM CHROMEDRIVER PAGE_WAIT_S

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

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsqd-page-test.XXXXXX")"
BROKER_PID=""
LOAD_PIDS=()
CLUSTER_PIDS=()
cleanup() {
  for p in "${LOAD_PIDS[@]}" "${CLUSTER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -KILL "$BROKER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

FAILED=0
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1"; }

# ---------------------------------------------------------------- the broker
BROKER_LOG="$LOGDIR/page-nsqd.log"
: >"$BROKER_LOG"
# shellcheck source=scripts/broker-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/broker-lib.sh"
BROKER_PID=""; TCP=""; HTTP=""
if ! start_daemon "$BROKER_LOG" BROKER_PID TCP HTTP -- "$NSQD" --shards=4 --channel-lag-stats --data-path="$WORK"; then
  echo "FAIL broker did not start"; tail -n 40 "$BROKER_LOG"; exit 1
fi
echo "broker pid $BROKER_PID: tcp $TCP, http $HTTP"

# ---------------------------------------------------------------- the load
RUNFOR=$((PAGE_WAIT_S + 40))
load() { # name args...: nsq-bench in the background, output in the log dir
  local name="$1"; shift
  "$BENCH" "$@" --nsqd-tcp-address="$TCP" --runfor="${RUNFOR}s" --quiet \
    >"$LOGDIR/page-load-$name.log" 2>&1 &
  LOAD_PIDS+=($!)
}
# Channels first, so that the backlog and the deferred messages stay in them.
for tc in page_backlog:slow page_deferred:later; do
  curl -fsS -X POST "http://$HTTP/topic/create?topic=${tc%%:*}" >/dev/null &&
    curl -fsS -X POST "http://$HTTP/channel/create?topic=${tc%%:*}&channel=${tc#*:}" >/dev/null ||
    fail "create channel $tc"
done
load hot pubsub --topic=page_hot --channels=2 --rate=2500 --batch-size=25
load many pubsub --topic=page --topics=6 --rate=600 --batch-size=10
load backlog pub --topic=page_backlog --rate=150 --batch-size=5
load deferred pub --topic=page_deferred --rate=40 --batch-size=1 --deferred-ms=600000
sleep 2
TOPICS=(page_hot page-0 page-1 page-2 page-3 page-4 page-5 page_backlog page_deferred)

# The route itself: 200 text/html with the page; an unknown path is still nsqd's 404.
code="$(curl -s -o "$WORK/page.html" -w '%{http_code} %{content_type}' "http://$HTTP/")"
[[ "$code" == "200 text/html; charset=utf-8" ]] || fail "GET / answered '$code'"
grep -q '<title>nsqd shards</title>' "$WORK/page.html" || fail "GET / is not the page"
code="$(curl -s -o /dev/null -w '%{http_code}' "http://$HTTP/nope")"
[[ "$code" == "404" ]] || fail "GET /nope answered $code"

# ---------------------------------------------------------------- the browser
echo "headless Chromium: $("$CHROMIUM" --version 2>/dev/null | head -1); driver $("$CHROMEDRIVER" --version | head -1); python $PY"
if ! timeout -k 5 $((PAGE_WAIT_S + 120)) "$PY" "$ROOT/scripts/page_check.py" --hot=page_hot "$HTTP" "$SHOT" "${TOPICS[@]}" \
  2>&1 | tee "$LOGDIR/page-check.log"; then
  fail "page checks (see above)"
fi

# ---------------------------------------------------------------- shutdown
for p in "${LOAD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${LOAD_PIDS[@]}"; do wait "$p" 2>/dev/null; done
LOAD_PIDS=()
kill -TERM "$BROKER_PID"
rc=124
for _ in $(seq 1 150); do
  if ! kill -0 "$BROKER_PID" 2>/dev/null; then wait "$BROKER_PID"; rc=$?; break; fi
  sleep 0.1
done
BROKER_PID_DONE="$BROKER_PID"
[[ $rc -eq 124 ]] || BROKER_PID=""
[[ $rc -eq 0 ]] || fail "broker exit status $rc after SIGTERM (pid $BROKER_PID_DONE)"
if grep -qE "panicked at|RUST_BACKTRACE|FATAL" "$BROKER_LOG"; then
  fail "panic/fatal in the broker log"; tail -n 40 "$BROKER_LOG"
fi
# ---------------------------------------------------------------- a cluster member
# The replication panel: three members on loopback, two replicated topics; the page of
# one member lists both with their leader and three replicas.
CADDR=()
for i in 0 1 2; do CADDR+=("127.0.0.1:$(free_port)"); done
CLUSTER_LOG="$LOGDIR/page-cluster.log"
: >"$CLUSTER_LOG"
CHTTP=""
for i in 0 1 2; do
  peers=()
  for j in 0 1 2; do [[ $j -ne $i ]] && peers+=("--cluster-peer=${CADDR[$j]}"); done
  mkdir -p "$WORK/member$i"
  if ! start_daemon "$CLUSTER_LOG" MPID MTCP MHTTP -- "$NSQD" --node-id=$((i + 1)) \
      --data-path="$WORK/member$i" --cluster-address="${CADDR[$i]}" "${peers[@]}"; then
    fail "cluster member $i did not start"
  fi
  CLUSTER_PIDS+=("$MPID")
  [[ -z "$CHTTP" ]] && CHTTP="$MHTTP"
done
for t in page_replicated_a page_replicated_b; do
  curl -fsS -d x "http://$CHTTP/pub?topic=$t" >/dev/null || fail "publish to $t in the cluster"
done
if ! timeout -k 5 120 "$PY" "$ROOT/scripts/page_check.py" --cluster "$CHTTP" "$SHOT" \
    page_replicated_a page_replicated_b 2>&1 | tee -a "$LOGDIR/page-check.log"; then
  fail "replication panel checks (see above)"
fi
for p in "${CLUSTER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done

echo "screenshot: $SHOT; logs: $LOGDIR/page-*.log"
if [[ $FAILED -eq 0 ]]; then echo "page test: OK"; else echo "page test: $FAILED failure(s)"; fi
[[ $FAILED -eq 0 ]]
