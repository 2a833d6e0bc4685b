#!/usr/bin/env python3
"""Production-size checks of a broker (this one or upstream nsqd), one row each of the
scale table in BENCHMARKS.md ("Scale"). Standard library only; run as root for the
full-disk row (it loop-mounts an ext4 image).

  scripts/scale.py topics   [--count 20000] [--channels 3]  # topics x channels over HTTP
  scripts/scale.py fds      [--count 2000] [--nofile 1024:4096]
  scripts/scale.py fulldisk [--size-mb 300]
  scripts/scale.py deferred [--count 1000000]
  scripts/scale.py deferred-memory [--count 1000000] [--defer-s 20]
  scripts/scale.py lagging  [--backlog-mb 1280]     # needs target/release/nsq-bench
  scripts/scale.py lookup   [--count 1000000]      # GET /message latency on a backlog;
                                                   # needs nsq-bench beside --broker
  scripts/scale.py all                              # every row above at the table's sizes
                                                    # (topics 20,000; fds 1024:1024; full disk
                                                    # with both policies; 1 M and 10 M deferred)

Common options: --broker PATH (default target/release/nsqd), --upstream (the broker is
upstream nsqd: no --shards flag), --shards N (default 2), --keep (leave the data path).

Each row starts the broker on a fresh data path under $TMPDIR on loopback ports, waits
for its ports to answer (as a user does), drives it, prints one line of figures per
measurement ("row: key=value ..."), and stops it. Restart figures restart at once after
SIGTERM, as a supervisor does, and time the first moment /ping answers 200 and the
moment the broker lists everything again.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Broker:
    """A broker process on loopback ports, with its data path and log."""

    def __init__(self, args, data, extra=(), nofile=None):
        self.args, self.data, self.extra, self.nofile = args, data, list(extra), nofile
        self.tcp, self.http = free_port(), free_port()
        self.log = open(os.path.join(os.path.dirname(data), "broker.log"), "ab")
        self.proc = None

    def start(self):
        cmd = [
            self.args.broker,
            f"--tcp-address=127.0.0.1:{self.tcp}",
            f"--http-address=127.0.0.1:{self.http}",
            f"--data-path={self.data}",
        ]
        if not self.args.upstream:
            cmd.append(f"--shards={self.args.shards}")
        cmd += self.extra
        if self.nofile:
            soft, hard = self.nofile
            cmd = ["prlimit", f"--nofile={soft}:{hard}", "--"] + cmd
        started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = started + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"broker exited with {self.proc.returncode}; see {self.log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.http), timeout=1).close()
                return time.monotonic() - started
            except OSError:
                time.sleep(0.005)
        raise SystemExit("broker ports never answered")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.http, timeout=120)

    def request(self, method, path, body=b"", conn=None):
        c = conn or self.conn()
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            if conn is None:
                c.close()

    def pid(self):
        """The broker's pid (prlimit execs it, so it is the child's)."""
        return self.proc.pid

    def fds(self):
        try:
            return len(os.listdir(f"/proc/{self.pid()}/fd"))
        except OSError:
            return -1

    def rss_mib(self):
        try:
            with open(f"/proc/{self.pid()}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return -1

    def stats(self):
        t0 = time.monotonic()
        st, body = self.request("GET", "/stats?format=json")
        took = time.monotonic() - t0
        if st != 200:
            raise SystemExit(f"/stats answered {st}: {body[:200]!r}")
        s = json.loads(body)
        return s.get("data", s), took

    def wait_ping_ok(self, within=300):
        t0 = time.monotonic()
        while time.monotonic() - t0 < within:
            try:
                st, _ = self.request("GET", "/ping")
                if st == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.005)
        return None


def fresh_data(args, name):
    base = tempfile.mkdtemp(prefix=f"nsqd-scale-{name}-")
    data = os.path.join(base, "data")
    os.makedirs(data)
    return base, data


def cleanup(args, base):
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


def disk_speed(path):
    """The O_DIRECT write speed of the disk under `path` (dd), for the figures."""
    f = os.path.join(path, "dd-probe")
    try:
        out = subprocess.run(
            ["dd", "if=/dev/zero", f"of={f}", "bs=1M", "count=256", "oflag=direct"],
            capture_output=True, text=True, timeout=120,
        ).stderr.strip().splitlines()
        return out[-1] if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    finally:
        try:
            os.remove(f)
        except OSError:
            pass


def row_topics(args):
    """Creates N topics with C channels each over HTTP (one keep-alive connection):
    requests/s overall and per tenth, /stats time, fds, RSS; then a restart."""
    base, data = fresh_data(args, "topics")
    b = Broker(args, data)
    b.start()
    c = b.conn()
    n, ch = args.count, args.channels
    tenth = max(1, n // 10)
    rates = []
    t0 = time.monotonic()
    tw = t0
    for i in range(n):
        st, body = b.request("POST", f"/topic/create?topic=scale-{i}", conn=c)
        if st != 200:
            raise SystemExit(f"/topic/create {i}: {st} {body[:200]!r}")
        for j in range(ch):
            st, body = b.request("POST", f"/channel/create?topic=scale-{i}&channel=c{j}", conn=c)
            if st != 200:
                raise SystemExit(f"/channel/create {i}/{j}: {st} {body[:200]!r}")
        if (i + 1) % tenth == 0:
            now = time.monotonic()
            rates.append(tenth * (1 + ch) / (now - tw))
            tw = now
    took = time.monotonic() - t0
    reqs = n * (1 + ch)
    stats, stats_s = b.stats()
    topics = len(stats.get("topics", []))
    print(
        f"topics: created={n}x{ch} requests={reqs} took_s={took:.1f} req_per_s={reqs / took:.0f} "
        f"first_tenth_req_per_s={rates[0]:.0f} last_tenth_req_per_s={rates[-1]:.0f} "
        f"stats_s={stats_s:.2f} topics_listed={topics} fds={b.fds()} rss_mib={b.rss_mib():.0f}",
        flush=True,
    )
    c.close()
    t1 = time.monotonic()
    b.stop()
    stop_s = time.monotonic() - t1
    port_s = b.start()
    ping_s = b.wait_ping_ok()
    t2 = time.monotonic()
    while True:
        stats, _ = b.stats()
        if len(stats.get("topics", [])) >= n:
            break
        if time.monotonic() - t2 > 600:
            break
        time.sleep(0.05)
    listed_s = port_s + (time.monotonic() - t2)
    print(
        f"topics-restart: stop_s={stop_s:.2f} port_s={port_s:.2f} ping_ok_s={ping_s} "
        f"all_listed_s={listed_s:.2f} topics_listed={len(stats.get('topics', []))} "
        f"fds={b.fds()} rss_mib={b.rss_mib():.0f}",
        flush=True,
    )
    b.stop()
    cleanup(args, base)


def row_fds(args):
    """With a low descriptor limit (soft:hard), publishes one message to each of N
    topics over HTTP; counts answers, checks /ping, restarts and counts the topics that
    came back with their message."""
    soft, hard = (int(x) for x in args.nofile.split(":"))
    base, data = fresh_data(args, "fds")
    b = Broker(args, data, nofile=(soft, hard))
    b.start()
    c = b.conn()
    codes = {}
    for i in range(args.count):
        try:
            st, _ = b.request("POST", f"/pub?topic=fd-{i}", body=b"m", conn=c)
        except OSError:
            st = "conn-error"
            c = b.conn()
        codes[st] = codes.get(st, 0) + 1
    try:
        ping = b.request("GET", "/ping")
    except OSError as e:
        ping = (f"no answer: {e}", b"")
    print(
        f"fds: nofile={soft}:{hard} topics={args.count} answers={codes} ping={ping[0]} "
        f"fds={b.fds()} rss_mib={b.rss_mib():.0f}",
        flush=True,
    )
    b.stop()
    try:
        port_s = b.start()
        ping_s = b.wait_ping_ok(within=60)
        stats, _ = b.stats()
    except (OSError, SystemExit) as e:
        time.sleep(1)
        print(f"fds-restart: failed ({e}; exit status {b.proc.poll()}; see {b.log.name})", flush=True)
        b.stop()
        cleanup(args, base)
        return
    kept = sum(1 for t in stats.get("topics", []) if t.get("depth", 0) + sum(
        ch.get("depth", 0) for ch in t.get("channels", [])) >= 1 or t.get("message_count", 0) >= 1)
    print(
        f"fds-restart: port_s={port_s:.2f} ping_ok_s={ping_s} topics_listed={len(stats.get('topics', []))} "
        f"topics_with_their_message={kept} fds={b.fds()}",
        flush=True,
    )
    b.stop()
    cleanup(args, base)


def mpub_frame(topic, bodies):
    payload = struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(x)) + x for x in bodies)
    return b"MPUB " + topic.encode() + b"\n" + struct.pack(">I", len(payload)) + payload


def read_frame(s):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf
    size = struct.unpack(">I", exact(4))[0]
    data = exact(size)
    return struct.unpack(">i", data[:4])[0], data[4:]


def v2(b):
    s = socket.create_connection(("127.0.0.1", b.tcp), timeout=60)
    s.sendall(b"  V2")
    return s


def row_fulldisk(args):
    """A retrying MPUB producer (64 x 4 KiB) on a small loop-mounted ext4 until the
    disk has been full for a while; then space is freed and a consumer counts every
    acknowledged message."""
    if os.geteuid() != 0:
        print("fulldisk: SKIP (needs root to loop-mount a filesystem)")
        return
    base = tempfile.mkdtemp(prefix="nsqd-scale-fulldisk-")
    img, mnt = os.path.join(base, "fs.img"), os.path.join(base, "mnt")
    os.makedirs(mnt)
    with open(img, "wb") as f:
        f.truncate(args.size_mb << 20)
    subprocess.run(["mkfs.ext4", "-q", img], check=True)
    subprocess.run(["mount", "-o", "loop", img, mnt], check=True)
    try:
        data = os.path.join(mnt, "data")
        os.makedirs(data)
        b = Broker(args, data, extra=list(args.policy))
        b.log = open(os.path.join(base, "broker.log"), "ab")
        b.start()
        b.request("POST", "/topic/create?topic=t-main")
        b.request("POST", "/channel/create?topic=t-main&channel=c")
        acked, refused, k = [], 0, 0
        s = v2(b)
        refused_since = None
        t0 = time.monotonic()
        # Until publishes have been refused for --full-seconds in a row.
        while True:
            bodies = [b"%08d-%02d-" % (k, j) + b"x" * 4084 for j in range(64)]
            try:
                s.sendall(mpub_frame("t-main", bodies))
                ft, data_ = read_frame(s)
            except (OSError, ConnectionError):
                ft, data_ = 1, b"closed"
            if ft == 0 and data_ == b"OK":
                acked.append(k)
                k += 1
                refused_since = None
            else:
                refused += 1
                refused_since = refused_since or time.monotonic()
                s.close()
                s = v2(b)
                if time.monotonic() - refused_since > args.full_seconds:
                    break
            if time.monotonic() - t0 > 900:
                break
        ping = b.request("GET", "/ping")
        print(
            f"fulldisk: fs_mb={args.size_mb} policy={' '.join(args.policy) or 'default'} "
            f"acked_batches={len(acked)} acked_msgs={len(acked) * 64} refusals={refused} "
            f"ping_while_full={ping[0]} rss_mib={b.rss_mib():.0f}",
            flush=True,
        )
        # Free the space: nothing else is on the filesystem, so empty it by consuming.
        # (The broker's own backlog filled it: consumers are what frees it.)
        want = {(a, j) for a in acked for j in range(64)}
        got = set()
        c = v2(b)
        c.sendall(b"SUB t-main c\nRDY 500\n")
        c.settimeout(30)
        last = time.monotonic()
        missing = len(want)
        while missing > 0 and time.monotonic() - last < 30:
            try:
                ft, d = read_frame(c)
            except (OSError, ConnectionError):
                break
            if ft == 0 and d == b"_heartbeat_":
                c.sendall(b"NOP\n")
                continue
            if ft != 2:
                continue
            mid, body = d[10:26], d[26:]
            key = (int(body[:8]), int(body[9:11]))
            if key in want and key not in got:
                missing -= 1
            got.add(key)
            c.sendall(b"FIN " + mid + b"\n")
            last = time.monotonic()
        lost = len(want - got)
        ping_after = b.wait_ping_ok(within=60)
        print(
            f"fulldisk-after: delivered={len(got & want)} lost={lost} ping_ok_after_s={ping_after}",
            flush=True,
        )
        b.stop()
    finally:
        subprocess.run(["umount", mnt])
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def dpub_many(b, topic, defer_ms, count):
    """DPUBs `count` (rounded down to a thousand) 100-byte messages to `topic`, due in
    `defer_ms`, pipelined a thousand at a time on one connection; every answer read."""
    s = v2(b)
    body = b"d" * 100
    cmd = b"DPUB %s %d\n" % (topic.encode(), defer_ms) + struct.pack(">I", len(body)) + body
    batch = 1000
    for _ in range(count // batch):
        s.sendall(cmd * batch)
        for _ in range(batch):
            ft, d = read_frame(s)
            if ft != 0:
                raise SystemExit(f"DPUB failed: {d[:200]!r}")
    s.close()


def row_deferred(args):
    """Holds N deferred messages (DPUB over TCP, 100 B, 1 h): RSS per message, then a
    kill -9 and a restart timed to /ping and to the count coming back."""
    base, data = fresh_data(args, "deferred")
    b = Broker(args, data)
    b.start()
    b.request("POST", "/topic/create?topic=dq")
    b.request("POST", "/channel/create?topic=dq&channel=c")
    time.sleep(0.5)
    rss0 = b.rss_mib()
    t0 = time.monotonic()
    dpub_many(b, "dq", 3600000, args.count)
    took = time.monotonic() - t0
    time.sleep(2)
    rss = b.rss_mib()
    stats, _ = b.stats()
    deferred = sum(ch.get("deferred_count", 0) for t in stats["topics"] for ch in t["channels"])
    print(
        f"deferred: count={args.count} took_s={took:.1f} deferred_count={deferred} "
        f"rss_mib={rss:.0f} idle_rss_mib={rss0:.0f} bytes_each={(rss - rss0) * 1048576 / max(1, args.count):.0f}",
        flush=True,
    )
    b.kill9()
    port_s = b.start()
    ping_s = b.wait_ping_ok()
    stats, _ = b.stats()
    chans = [ch for t in stats["topics"] for ch in t["channels"]]
    deferred = sum(ch.get("deferred_count", 0) for ch in chans)
    depth = sum(ch.get("depth", 0) for ch in chans)
    print(
        f"deferred-restart: after=kill-9 port_s={port_s:.2f} ping_ok_s={ping_s} "
        f"deferred_count={deferred} channel_depth={depth} rss_mib={b.rss_mib():.0f}",
        flush=True,
    )
    b.stop()
    cleanup(args, base)


def row_deferred_memory(args):
    """Memory comes back: N deferred messages (100 B, due in --defer-s seconds) held,
    then delivered to one consumer and finished; RSS idle, held, and 10 s and 45 s after
    the last FIN (an idle store keeps its cached blocks for 30 s)."""
    base, data = fresh_data(args, "defmem")
    b = Broker(args, data)
    b.start()
    b.request("POST", "/topic/create?topic=dm")
    b.request("POST", "/channel/create?topic=dm&channel=c")
    time.sleep(0.5)
    rss0 = b.rss_mib()
    dpub_many(b, "dm", args.defer_s * 1000, args.count)
    held = b.rss_mib()
    c = v2(b)
    c.sendall(b"SUB dm c\nRDY 2500\n")
    c.settimeout(args.defer_s + 120)
    got = 0
    pending = []
    while got < args.count // 1000 * 1000:
        ft, d = read_frame(c)
        if ft == 0 and d == b"_heartbeat_":
            c.sendall(b"NOP\n")
            continue
        if ft != 2:
            continue
        pending.append(b"FIN " + d[10:26] + b"\n")
        got += 1
        if len(pending) >= 500:
            c.sendall(b"".join(pending))
            pending = []
    c.sendall(b"".join(pending))
    time.sleep(10)
    after = b.rss_mib()
    # An idle store lets go of its descriptors and its cached blocks after 30 s without
    # a record, journal event or sync (the last checkpoint follows the last FIN).
    time.sleep(35)
    idle_after = b.rss_mib()
    print(
        f"deferred-memory: count={got} idle_rss_mib={rss0:.0f} held_rss_mib={held:.0f} "
        f"after_delivery_rss_mib={after:.0f} above_idle_pct={(after - rss0) * 100 / max(rss0, 1):.0f} "
        f"after_45s_rss_mib={idle_after:.0f} above_idle_pct_45s={(idle_after - rss0) * 100 / max(rss0, 1):.0f}",
        flush=True,
    )
    b.stop()
    cleanup(args, base)


def read_bytes(pid):
    """Bytes the process made the disk read (/proc/PID/io read_bytes)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def row_lagging(args):
    """A backlog of --backlog-mb of 4 KiB messages in a topic with 10 channels and no
    consumers (nsq-bench pub, 20 s at an open-loop rate), then one nsq-bench consumer per channel drains it:
    drain time, and bytes read from the disk against the backlog's size."""
    bench = os.path.join(ROOT, "target", "release", "nsq-bench")
    base, data = fresh_data(args, "lagging")
    b = Broker(args, data)
    b.start()
    b.request("POST", "/topic/create?topic=lag")
    for i in range(10):
        b.request("POST", f"/channel/create?topic=lag&channel=bench-{i}")
    size = 4096
    n = (args.backlog_mb << 20) // size
    # nsq-bench's own bodies (its consumers count them by producer and sequence), at an
    # open-loop rate for 20 s (a rate nsqd's ten disk queues keep up with): about n.
    rate = max(1, n // 20)
    t0 = time.monotonic()
    pub = subprocess.run(
        [bench, "pub", f"--nsqd-tcp-address=127.0.0.1:{b.tcp}", "--topic=lag", f"--size={size}",
         "--runfor=20s", f"--rate={rate}", "-q", "--json"],
        capture_output=True, text=True,
    )
    pub_s = time.monotonic() - t0
    try:
        sent = int(json.loads(pub.stdout.strip().splitlines()[-1])["sent"])
    except (ValueError, IndexError, KeyError):
        raise SystemExit(f"nsq-bench pub failed: {pub.stdout[-300:]} {pub.stderr[-300:]}")
    time.sleep(3)
    r0 = read_bytes(b.pid())
    t1 = time.monotonic()
    sub = subprocess.run(
        [bench, "sub", f"--nsqd-tcp-address=127.0.0.1:{b.tcp}", "--topic=lag", "--channels=10",
         f"--expect={sent}", "--size=4096", "--runfor=600s", "-q", "--json"],
        capture_output=True, text=True,
    )
    drain_s = time.monotonic() - t1
    r1 = read_bytes(b.pid())
    try:
        rep = json.loads(sub.stdout.strip().splitlines()[-1])
        lost = rep.get("lost")
    except (ValueError, IndexError):
        lost = f"? ({sub.stderr[-300:]})"
    backlog = sent * size
    try:
        stats, _ = b.stats()
        left = sum(ch.get("depth", 0) + ch.get("in_flight_count", 0) + ch.get("deferred_count", 0)
                   for t in stats["topics"] for ch in t["channels"])
    except (OSError, SystemExit, KeyError):
        left = "?"
    if lost not in (0, None):
        print(f"# nsq-bench sub: {sub.stderr[-1500:]}", flush=True)
    print(
        f"lagging: channels=10 backlog_msgs={sent} backlog_mib={backlog >> 20} pub_s={pub_s:.1f} "
        f"drain_s={drain_s:.1f} read_mib={(r1 - r0) >> 20} reads_per_backlog={(r1 - r0) / backlog:.2f} "
        f"lost={lost} left_in_channels={left} rss_mib={b.rss_mib():.0f}",
        flush=True,
    )
    b.stop()
    cleanup(args, base)


def row_lookup(args):
    """A backlog of --count 200-byte messages (nsq-bench pub, open-loop over 10 s) in a
    topic with one channel and no consumer, then 1,000 GET /message lookups of random
    IDs of that backlog over one keep-alive connection: p50, p99 and max in ms. The IDs
    are picked (untimed) with GET /messages?count=1&from=<a random publish time>."""
    import random
    bench = os.path.join(os.path.dirname(os.path.abspath(args.broker)), "nsq-bench")
    base, data = fresh_data(args, "lookup")
    b = Broker(args, data)
    b.start()
    b.request("POST", "/topic/create?topic=look")
    b.request("POST", "/channel/create?topic=look&channel=c")
    t0 = time.monotonic()
    pub = subprocess.run(
        [bench, "pub", f"--nsqd-tcp-address=127.0.0.1:{b.tcp}", "--topic=look", "--size=200",
         "--runfor=10s", f"--rate={max(1, args.count // 10)}", "-q", "--json"],
        capture_output=True, text=True,
    )
    pub_s = time.monotonic() - t0
    try:
        sent = int(json.loads(pub.stdout.strip().splitlines()[-1])["sent"])
    except (ValueError, IndexError, KeyError):
        raise SystemExit(f"nsq-bench pub failed: {pub.stdout[-300:]} {pub.stderr[-300:]}")
    end_ns = time.time_ns()
    conn = b.conn()

    def get(path):
        st, body = b.request("GET", path, conn=conn)
        if st != 200:
            raise SystemExit(f"{path}: {st} {body[:200]!r}")
        return json.loads(body)

    # Wait until memory holds only the newest records (the rest is read from disk).
    deadline = time.monotonic() + 120
    while True:
        stats, _ = b.stats()
        ch = stats["topics"][0]["channels"][0]
        if ch["backend_depth"] >= sent - 20000 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    first = get("/messages?topic=look&channel=c&count=1")["messages"][0]
    rng = random.Random(1)
    ids = []
    for _ in range(1000):
        ts = rng.randrange(first["timestamp"], end_ns)
        ms = get(f"/messages?topic=look&channel=c&count=1&from={ts}")["messages"]
        ids.append((ms or [first])[0]["id"])
    took = []
    for mid in ids:
        t = time.perf_counter()
        v = get(f"/message?topic=look&id={mid}")
        took.append((time.perf_counter() - t) * 1000)
        if v["id"] != mid:
            raise SystemExit(f"asked {mid}, got {v['id']}")
    took.sort()
    print(
        f"lookup: backlog_msgs={sent} on_disk={ch['backend_depth']} pub_s={pub_s:.1f} "
        f"lookups={len(took)} p50_ms={took[len(took) // 2]:.3f} "
        f"p99_ms={took[len(took) * 99 // 100]:.3f} max_ms={took[-1]:.3f} rss_mib={b.rss_mib():.0f}",
        flush=True,
    )
    conn.close()
    b.stop()
    cleanup(args, base)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("row", choices=["topics", "fds", "fulldisk", "deferred", "deferred-memory",
                                    "lagging", "lookup", "all"])
    p.add_argument("--broker", default=os.path.join(ROOT, "target", "release", "nsqd"))
    p.add_argument("--upstream", action="store_true", help="the broker is upstream nsqd")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--count", type=int)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--nofile", default="1024:4096", help="soft:hard RLIMIT_NOFILE (fds row)")
    p.add_argument("--size-mb", type=int, default=300, help="filesystem size (fulldisk row)")
    p.add_argument("--full-seconds", type=float, default=20,
                   help="how long publishes must have been refused before space is freed")
    p.add_argument("--policy", action="append", default=[],
                   help="extra broker flag for the fulldisk row, e.g. --policy=--sync-every=1")
    p.add_argument("--defer-s", type=int, default=20, help="defer time (deferred-memory row)")
    p.add_argument("--backlog-mb", type=int, default=1280, help="backlog size (lagging row)")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    defaults = {"topics": 20000, "fds": 2000, "fulldisk": 0, "deferred": 1000000,
                "deferred-memory": 1000000, "lagging": 0, "lookup": 1000000}
    rows = {"topics": row_topics, "fds": row_fds, "fulldisk": row_fulldisk,
            "deferred": row_deferred, "deferred-memory": row_deferred_memory,
            "lagging": row_lagging, "lookup": row_lookup}
    if args.row == "all":
        # (row, count, changes to the options): the table's rows, one after the other.
        plan = [("topics", 20000, {}), ("fds", 2000, {"nofile": "1024:1024"}),
                ("fulldisk", 0, {}), ("fulldisk", 0, {"policy": ["--sync-every=1"]}),
                ("deferred", 1000000, {}), ("deferred", 10000000, {}),
                ("deferred-memory", 1000000, {}), ("lagging", 0, {})]
    else:
        plan = [(args.row, args.count if args.count is not None else defaults[args.row], {})]
    base_args = vars(args).copy()
    for row, count, changes in plan:
        run = argparse.Namespace(**{**base_args, **changes, "row": row, "count": count})
        print(f"# {row} (count {count}{', ' if changes else ''}"
              f"{', '.join(f'{k}={v}' for k, v in changes.items())}): broker={run.broker} "
              f"disk O_DIRECT write: {disk_speed(tempfile.gettempdir())}", flush=True)
        t0 = time.monotonic()
        rows[row](run)
        print(f"# {row}: {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
