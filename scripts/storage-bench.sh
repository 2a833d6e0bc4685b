#!/usr/bin/env bash
# Storage benchmarks, side by side in one run, on this machine:
#
#   1. publish+consume throughput: a durable topic (segment store, default sync policy)
#      vs an #ephemeral topic (never touches disk: "storage off"), alternating A B A B;
#   2. the same with --sync-every=1 (every publish answered after its fdatasync, group
#      commit) vs the default policy, alternating;
#   3. RSS with a large backlog on disk (BACKLOG_RUNFOR of publishing, no consumer);
#   4. recovery time of that log after kill -9, with the page cache dropped if allowed.
#
# Usage: scripts/storage-bench.sh            (env: RUNFOR=5s ROUNDS=2 BACKLOG_RUNFOR=8s)
#
#        scripts/storage-bench.sh start [GIB...]     (default: 1 10; env: START_SHARDS=1)
#   Start time only: for each backlog size, fill a durable topic with GIB GiB
#   of 200 B messages (channel attached, no consumer), then measure from exec until the
#   TCP port answers AND /stats shows the channel's full depth: after kill -9 (the
#   segment being written is scanned) and after SIGTERM (every segment sealed). Goals:
#   < 1 s after kill -9, < 200 ms after SIGTERM. Needs about GIB GiB free under TMPDIR.
#
#        scripts/storage-bench.sh start-synthetic [GIB...]   (default: 10)
#   The same start measurement on a synthetic backlog that needs only 100 MiB of disk:
#   every segment but the newest is a sparse file with a real side index (start-up never
#   reads a sealed segment's records), the newest holds real records; "kill -9" = the
#   newest segment has no index (it is scanned), "SIGTERM" = it has one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNFOR="${RUNFOR:-5s}"
ROUNDS="${ROUNDS:-2}"
BACKLOG_RUNFOR="${BACKLOG_RUNFOR:-8s}"
SHARDS="${SHARDS:-2}"

MODE="${1:-all}"
cargo build --release -q -p nsqd -p nsq-bench
NSQD="$ROOT/target/release/nsqd"
BENCH="$ROOT/target/release/nsq-bench"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/nsqd-storage-bench.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# timed_start DATA_DIR LOG DEPTH -> prints "MS PID TCP HTTP": starts nsqd on fresh ports
# and measures from exec until the TCP port accepts and /stats shows channel depth DEPTH
# for topic backlog / channel c (DEPTH -1: any answer).
timed_start() {
  python3 - "$NSQD" "$1" "$2" "$3" "${START_SHARDS:-1}" <<'PY'
import http.client, json, socket, subprocess, sys, time
nsqd, data, log, want, shards = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
tcp, http_port = free_port(), free_port()
t0 = time.monotonic()
p = subprocess.Popen([nsqd, f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http_port}",
                      f"--shards={shards}", f"--data-path={data}"],
                     stdout=subprocess.DEVNULL, stderr=open(log, "a"), start_new_session=True)
tcp_ok = False
while True:
    if p.poll() is not None:
        print(f"nsqd exited with {p.returncode}; see {log}", file=sys.stderr); sys.exit(1)
    if time.monotonic() - t0 > 600:
        print("nsqd did not serve the full depth within 600 s", file=sys.stderr); sys.exit(1)
    try:
        if not tcp_ok:
            socket.create_connection(("127.0.0.1", tcp), timeout=0.05).close()
            tcp_ok = True
        c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=1)
        c.request("GET", "/stats?format=json&topic=backlog&channel=c")
        st = json.loads(c.getresponse().read())
        c.close()
        depth = sum(ch["depth"] for t in (st.get("topics") or []) for ch in (t.get("channels") or []))
        if want < 0 or depth == want:
            break
    except (OSError, ValueError, http.client.HTTPException):
        pass
    time.sleep(0.001)
print(f"{(time.monotonic() - t0) * 1000:.0f} {p.pid} {tcp} {http_port}")
PY
}

# stop SIGNAL PID: signals a broker started by timed_start and waits until it is gone.
stop() {
  kill "-$1" "$2" 2>/dev/null || true
  while kill -0 "$2" 2>/dev/null; do sleep 0.01; done
}

channel_depth() {
  curl -s "http://$1/stats?format=json&topic=backlog&channel=c" | python3 -c '
import json, sys
print(sum(c["depth"] for t in (json.load(sys.stdin).get("topics") or []) for c in (t.get("channels") or [])))'
}

# gen_synthetic DATA GIB NO_INDEX_LAST -> prints the message count (see start-synthetic).
gen_synthetic() {
  python3 - "$@" <<'PY'
# Synthetic backlog: GIB GiB of 100 MiB segments of 200 B messages. Every segment but the
# newest is a sparse file (header only, then a hole up to its size) with a real side index;
# the newest segment holds real records. With NO_INDEX_LAST=1 the newest has no index
# (as after kill -9). Prints the message count.
import os, struct, sys, zlib, json
data, gib, no_idx_last = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
d = os.path.join(data, "topics", "t-backlog"); os.makedirs(d, exist_ok=True)
SEG = 100 * 1024 * 1024; BODY = 200; REC = 8 + 39 + BODY; HDR = 32; EVERY = 256; SALT = 0x1234567
per = (SEG - HDR) // REC
nseg = max(1, int(gib * 1024 ** 3 // SEG))
def header(base): return b"NSQRSEG\0" + struct.pack(">IQI", 1, base, SALT) + b"\0" * 8
def index(base, count, end):
    ents = [(base + i, HDR + i * REC) for i in range(0, count, EVERY)]
    b = b"NSQRIDX\0" + struct.pack(">IQIQQQQQI", 1, base, SALT, end, end, count, base, base + count - 1, len(ents))
    b += b"".join(struct.pack(">QQ", s, o) for s, o in ents)
    return b + struct.pack(">I", zlib.crc32(b))
body = b"x" * BODY
for k in range(nseg):
    base = k * per; path = os.path.join(d, f"{base:020}.seg"); end = HDR + per * REC
    last = k == nseg - 1
    with open(path, "wb") as f:
        f.write(header(base))
        if last:
            buf = bytearray()
            for s in range(base, base + per):
                p = struct.pack(">BIQqqQH", 1, SALT, s, 1, 0, s, 0) + body
                buf += struct.pack(">II", len(p), zlib.crc32(p)) + p
            f.write(buf)
        else:
            f.truncate(end)
    if not (last and no_idx_last):
        with open(os.path.join(d, f"{base:020}.idx"), "wb") as f:
            f.write(index(base, per, end))
total = nseg * per
meta = {"version": 1, "name": "backlog", "paused": False, "pumped": total, "holes": [],
        "channels": [{"name": "c", "paused": False, "cursor": 0, "pending": []}], "journal_gen": 0}
open(os.path.join(d, "meta.json"), "w").write(json.dumps(meta))
print(total)
PY
}

if [ "$MODE" = start-synthetic ]; then
  shift
  SIZES=("$@")
  [ ${#SIZES[@]} -gt 0 ] || SIZES=(10)
  echo "== start time on a synthetic backlog (sparse sealed segments, real indexes and newest segment; shards=${START_SHARDS:-1})"
  printf '%-8s %-12s %-14s %10s %s\n' backlog messages after "start_ms" "goal"
  for gib in "${SIZES[@]}"; do
    for case in kill9 term; do
      DATA="$WORK/synth-$gib-$case"; LOG="$WORK/synth-$gib-$case.log"
      depth=$(gen_synthetic "$DATA" "$gib" "$([ $case = kill9 ] && echo 1 || echo 0)")
      sync
      if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then cache="cold"; else cache="warm"; fi
      read -r ms pid _ _ < <(timed_start "$DATA" "$LOG" "$depth")
      PIDS+=("$pid")
      label=$([ $case = kill9 ] && echo "kill -9" || echo "SIGTERM")
      goal=$([ $case = kill9 ] && echo "< 1000" || echo "< 200")
      printf '%-8s %-12s %-14s %10s %s\n' "${gib}GiB" "$depth" "$label ($cache)" "$ms" "$goal"
      stop KILL "$pid"
      grep -o "TOPIC(backlog): recovered .*" "$LOG" | sed 's/^/    /'
      rm -rf "$DATA"
    done
  done
  exit 0
fi

if [ "$MODE" = start ]; then
  shift
  SIZES=("$@")
  [ ${#SIZES[@]} -gt 0 ] || SIZES=(1 10)
  echo "== start time: exec until TCP answers and /stats shows the full depth (shards=${START_SHARDS:-1})"
  printf '%-8s %-12s %-14s %10s %s\n' backlog messages after "start_ms" "goal"
  for gib in "${SIZES[@]}"; do
    DATA="$WORK/start-$gib"; LOG="$WORK/start-$gib.log"
    read -r _ pid tcp http < <(timed_start "$DATA" "$LOG" -1)
    PIDS+=("$pid")
    curl -s -X POST "http://127.0.0.1:$http/topic/create?topic=backlog" >/dev/null
    curl -s -X POST "http://127.0.0.1:$http/channel/create?topic=backlog&channel=c" >/dev/null
    want=$((gib * 1024 * 1024))
    while [ "$(du -sk "$DATA/topics/t-backlog" | cut -f1)" -lt "$want" ]; do
      "$BENCH" pub -q --nsqd-tcp-address "127.0.0.1:$tcp" --topic backlog --runfor 5s \
        --size 200 --batch-size 200 --json >/dev/null 2>&1
    done
    sleep 3 # past --sync-timeout: everything written, a checkpoint taken
    depth=$(channel_depth "127.0.0.1:$http")
    stop KILL "$pid"
    sync
    if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then cache="cold"; else cache="warm"; fi
    read -r ms pid tcp http < <(timed_start "$DATA" "$LOG" "$depth")
    PIDS+=("$pid")
    printf '%-8s %-12s %-14s %10s %s\n' "${gib}GiB" "$depth" "kill -9 ($cache)" "$ms" "< 1000"
    stop TERM "$pid"
    sync
    if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then cache="cold"; else cache="warm"; fi
    read -r ms pid tcp http < <(timed_start "$DATA" "$LOG" "$depth")
    PIDS+=("$pid")
    printf '%-8s %-12s %-14s %10s %s\n' "${gib}GiB" "$depth" "SIGTERM ($cache)" "$ms" "< 200"
    stop TERM "$pid"
    grep -o "TOPIC(backlog): recovered .*" "$LOG" | sed 's/^/    /'
    rm -rf "$DATA"
  done
  exit 0
fi

# start NAME ARGS... -> sets ADDR_<NAME>, HTTP_<NAME>, PID_<NAME>
start() {
  local name="$1"; shift
  local log="$WORK/$name.log"
  "$NSQD" --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 --shards="$SHARDS" \
    --data-path="$WORK/$name" "$@" 2>"$log" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 200); do
    if grep -q "HTTP: listening on" "$log"; then break; fi
    sleep 0.05
  done
  printf -v "ADDR_$name" '%s' "$(grep -o 'TCP: listening on [0-9.:]*' "$log" | awk '{print $4}')"
  printf -v "HTTP_$name" '%s' "$(grep -o 'HTTP: listening on [0-9.:]*' "$log" | awk '{print $4}')"
  printf -v "PID_$name" '%s' "$pid"
}

# run ADDR TOPIC -> prints "pub_msgs_per_sec sub_msgs_per_sec p99_us"
run() {
  "$BENCH" pubsub -q --nsqd-tcp-address "$1" --topic "$2" --runfor "$RUNFOR" --size 200 \
    --batch-size 200 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["pub_msgs_per_sec"], d["sub_msgs_per_sec"], d["latency_us"]["p99"], d["errors"] + d.get("lost", 0))'
}

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.3f}' if b else 'n/a')" "$1" "$2"; }

start def
start sync1 --sync-every=1
echo "== shards=$SHARDS, 200 B messages, MPUB batch 200, pub+sub, $RUNFOR per run, $ROUNDS rounds"
printf '%-6s %-34s %12s %12s %10s %s\n' round case pub/s sub/s p99_us errors
for r in $(seq 1 "$ROUNDS"); do
  read -r dp ds dl de < <(run "$ADDR_def" "durable_$r")
  printf '%-6s %-34s %12.0f %12.0f %10s %s\n' "$r" "durable (default sync)" "$dp" "$ds" "$dl" "$de"
  read -r ep es el ee < <(run "$ADDR_def" "mem_$r#ephemeral")
  printf '%-6s %-34s %12.0f %12.0f %10s %s\n' "$r" "#ephemeral (storage off)" "$ep" "$es" "$el" "$ee"
  read -r sp ss sl se < <(run "$ADDR_sync1" "durable_$r")
  printf '%-6s %-34s %12.0f %12.0f %10s %s\n' "$r" "durable --sync-every=1" "$sp" "$ss" "$sl" "$se"
  echo "       ratios: durable/ephemeral pub $(ratio "$dp" "$ep") sub $(ratio "$ds" "$es");" \
    "sync-every=1/default pub $(ratio "$sp" "$dp") sub $(ratio "$ss" "$ds")"
done
kill -TERM "$PID_def" "$PID_sync1"; wait "$PID_def" "$PID_sync1" 2>/dev/null || true

echo
echo "== backlog: publish for $BACKLOG_RUNFOR with no consumer, then RSS and recovery after kill -9"
SHARDS=1 start backlog
curl -s -X POST "http://$HTTP_backlog/topic/create?topic=backlog" >/dev/null
curl -s -X POST "http://$HTTP_backlog/channel/create?topic=backlog&channel=c" >/dev/null
"$BENCH" pub -q --nsqd-tcp-address "$ADDR_backlog" --topic backlog --runfor "$BACKLOG_RUNFOR" \
  --size 200 --batch-size 200 --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print("published %d messages at %.0f/s" % (d["sent"], d["pub_msgs_per_sec"]))'
sleep 3
echo "RSS with the backlog: $(awk '/VmRSS/ {print $2, $3}' "/proc/$PID_backlog/status")"
curl -s "http://$HTTP_backlog/stats?format=json&topic=backlog" | python3 -c '
import json, sys
c = json.load(sys.stdin)["topics"][0]["channels"][0]
print("channel depth %d, of which on disk only %d" % (c["depth"], c["backend_depth"]))'
echo "on disk: $(du -sh "$WORK/backlog" | cut -f1)"
kill -KILL "$PID_backlog"; wait "$PID_backlog" 2>/dev/null || true
sync
if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then echo "(page cache dropped)"; fi
SHARDS=1 start backlog
grep -o "recovered .*" "$WORK/backlog.log" || true
kill -TERM "$PID_backlog"; wait "$PID_backlog" 2>/dev/null || true
