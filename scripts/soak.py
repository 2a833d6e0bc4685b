#!/usr/bin/env python3
"""Soak: N minutes of mixed real use against a broker this script starts, with every
message accounted for and the broker's RSS and open fds sampled (RELIABILITY.md,
"Soak").

usage: soak.py [--minutes 30] [--shards 2] [--nsqd PATH] [--seed N] [--out DIR]
               [--msg-timeout-ms 3000] [--rate 40] [--png PATH]

Run it with the clients' venv (scripts/setup-clients.sh):

    .venv/bin/python scripts/soak.py --minutes 0.75 --nsqd target/debug/nsqd

What runs:
* the broker (--nsqd, default target/debug/nsqd) on free loopback ports with its own
  temporary data path and --msg-timeout; ready once its TCP port accepts and /ping
  answers;
* scripts/soak/pynsq_worker.py and scripts/soak/gnsq_worker.py (see their docs): readers
  that FIN, REQ with delays, hold messages until they time out, TOUCH, and are closed and
  replaced at random; #ephemeral channel readers that come and go; a pynsq Writer and a
  gnsq Producer publishing PUB, MPUB and DPUB;
* here: HTTP /pub, /mpub and /pub?defer= publishing, and an admin loop that pauses and
  unpauses channels and topic soak_b, empties and deletes (then re-creates) channel
  "mix", empties the paused topic soak_b, and deletes and re-creates topic soak_b with
  its channels;
* a sampler writing t, VmRSS and the fd count (sockets and others) every 2 s to
  <out>/resources.csv.

Topics soak_a and soak_b each have channels py (pynsq readers), gn (gnsq readers) and
mix (both). soak_a/py and soak_a/gn are never emptied or deleted: there every published
message must be FINed. After --minutes the publishers stop, the readers FIN everything,
and the script waits until every channel is drained, stops the workers, SIGTERMs the
broker and runs the checker (scripts/soak/checker.py). Checks: no unaccounted message,
no delivery fault, no client error it did not cause, no #ephemeral channel and no client
left in /stats once the clients are gone, broker exit status 0 and no panic in its log;
RSS after the warm-up (the first minute, or the first third of a shorter run) within
+--rss-growth (20%) of its value then; non-socket fds (files, io_uring) during the run
at most 4 per topic above the idle count before the clients came (+ --fd-slack, 4: a
topic's journal, journals rotated out but still open a moment, a re-created topic's old
files), and once the clients left back in the steady band (idle + one open segment per
topic, +- --fd-slack), with the socket fds back to the idle count (the listeners).
Samples above the steady band are listed in <out>/fd-peaks.txt. Exit status 0 only when
all hold. The summary is printed and written to <out>/summary.json, the plot of the
curves to --png (default <out>/soak.png).
"""
import argparse
import csv
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "soak"))
import checker  # noqa: E402
import common  # noqa: E402

TOPICS = ["soak_a", "soak_b"]
CHANNELS = ["py", "gn", "mix"]


def log(text):
    sys.stderr.write("[soak %s] %s\n" % (time.strftime("%H:%M:%S"), text))
    sys.stderr.flush()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(addr, method, path, body=b"", timeout=10):
    req = urllib.request.Request("http://%s%s" % (addr, path), data=body if method == "POST" else None,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError) as e:
        return 0, repr(e).encode()


class Broker:
    def __init__(self, args, datadir, logpath):
        self.tcp = "127.0.0.1:%d" % free_port()
        self.http = "127.0.0.1:%d" % free_port()
        self.logf = open(logpath, "wb")
        self.logpath = logpath
        argv = [args.nsqd, "--tcp-address=" + self.tcp, "--http-address=" + self.http,
                "--shards=%d" % args.shards, "--data-path=" + datadir,
                "--msg-timeout=%dms" % args.msg_timeout_ms]
        log("broker: " + " ".join(argv))
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise SystemExit("broker exited at start with status %s; see %s" % (self.proc.returncode, logpath))
            try:
                socket.create_connection(("127.0.0.1", int(self.tcp.split(":")[1])), timeout=1).close()
                if http(self.http, "GET", "/ping")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise SystemExit("broker did not answer on %s within 30 s" % self.tcp)
            time.sleep(0.05)

    def sample(self):
        """(VmRSS in KiB, open fds, of which sockets), or None once it has exited."""
        pid = self.proc.pid
        try:
            rss = 0
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
            fds = socks = 0
            others = []
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue  # closed since the listing (a client leaving): not counted
                fds += 1
                if target.startswith("socket:"):
                    socks += 1
                else:
                    others.append(target)
            self.last_others = sorted(others)
            return rss, fds, socks
        except (OSError, ValueError):
            return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return "hung after SIGTERM (killed)"
        return self.proc.returncode


class Sampler(threading.Thread):
    def __init__(self, broker, path, t_start):
        super().__init__(daemon=True)
        self.broker, self.t_start = broker, t_start
        self.rows = []
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(["t_s", "rss_kib", "fds", "socket_fds", "other_fds", "phase"])
        self.phase = "run"
        self.stop_ev = threading.Event()
        self.others_band = None  # set once the idle count is known
        self.peaks = []

    def take(self):
        s = self.broker.sample()
        if s is None:
            return None
        row = (round(time.time() - self.t_start, 2), s[0], s[1], s[2], s[1] - s[2], self.phase)
        self.rows.append(row)
        if self.others_band is not None and row[4] > self.others_band:
            # What the broker held open beyond the steady band, for the report.
            self.peaks.append("%.1f s: %d non-socket fds: %s" % (row[0], row[4], " ".join(self.broker.last_others)))
        self.w.writerow(row)
        self.f.flush()
        return row

    def run(self):
        while not self.stop_ev.wait(2.0):
            self.take()


class Admin(threading.Thread):
    """Pauses/unpauses, empties, deletes and re-creates while the clients run. Every
    operation is an "op" event with its [t0, t1] for the checker."""

    def __init__(self, addr, rng, events, until):
        super().__init__(daemon=True)
        self.addr, self.rng, self.ev, self.until = addr, rng, events, until
        self.stop_ev = threading.Event()
        self.last_topic_delete = time.time()

    def call(self, path):
        code, body = http(self.addr, "POST", path)
        return code, body.decode("utf-8", "replace")

    def op(self, name, topic, ch, *paths, gap=(0, 0)):
        t0 = time.time()
        codes = []
        for i, p in enumerate(paths):
            if i == 1 and gap[1]:
                time.sleep(self.rng.uniform(*gap))
            codes.append(self.call(p))
        t1 = time.time()
        bad = [c for c in codes if c[0] != 200]
        self.ev.add("op", t=t0, t0=t0, t1=t1, op=name, topic=topic, ch=ch,
                    code=bad[0][0] if bad else 200, body=bad[0][1] if bad else "")

    def run(self):
        q = urllib.parse.quote
        while not self.stop_ev.wait(self.rng.uniform(1.0, 3.0)):
            if time.time() > self.until:
                break
            topic = self.rng.choice(TOPICS)
            tc = "topic=%s&channel=%s" % (topic, "mix")
            r = self.rng.random()
            if r < 0.25:
                ch = self.rng.choice(CHANNELS)
                self.op("channel_pause", topic, ch, "/channel/pause?topic=%s&channel=%s" % (topic, ch),
                        "/channel/unpause?topic=%s&channel=%s" % (topic, ch), gap=(0.5, 2.5))
            elif r < 0.45:
                self.op("channel_empty", topic, "mix", "/channel/empty?" + tc)
            elif r < 0.65:
                self.op("channel_delete", topic, "mix", "/channel/delete?" + tc,
                        "/channel/create?" + tc, gap=(0.3, 2.0))
            elif r < 0.75:
                self.op("topic_pause", "soak_b", None, "/topic/pause?topic=soak_b",
                        "/topic/unpause?topic=soak_b", gap=(0.5, 2.5))
            elif r < 0.85:
                # /topic/empty drops what the paused topic holds for its channels
                self.op("topic_empty", "soak_b", None, "/topic/pause?topic=soak_b",
                        "/topic/empty?topic=soak_b", "/topic/unpause?topic=soak_b", gap=(0.5, 2.0))
            elif time.time() - self.last_topic_delete > 12:
                self.op("topic_delete", "soak_b", None, "/topic/delete?topic=soak_b",
                        "/topic/create?topic=soak_b",
                        *["/channel/create?topic=soak_b&channel=%s" % q(c) for c in CHANNELS],
                        gap=(0.3, 1.5))
                self.last_topic_delete = time.time()


class HttpPublisher(threading.Thread):
    def __init__(self, addr, rng, events, rate, stop_ev):
        super().__init__(daemon=True)
        self.addr, self.rng, self.ev, self.rate, self.stop_ev = addr, rng, events, rate, stop_ev

    def run(self):
        seq = 0
        next_t = time.time()
        while not self.stop_ev.is_set():
            via, topic, n, defer = common.publish_plan(self.rng, TOPICS)
            bodies = [common.body("http", seq + i) for i in range(n)]
            seq += n
            t0 = time.time()
            if via == "mpub":
                code, resp = http(self.addr, "POST", "/mpub?topic=" + topic, "\n".join(bodies).encode())
            elif via == "dpub":
                code, resp = http(self.addr, "POST", "/pub?topic=%s&defer=%d" % (topic, defer), bodies[0].encode())
            else:
                code, resp = http(self.addr, "POST", "/pub?topic=" + topic, bodies[0].encode())
            ok = code == 200 and resp == b"OK"
            self.ev.add("pub", t0=t0, t1=time.time(), topic=topic, bodies=bodies, via="http-" + via, ok=ok,
                        err=None if ok else "%s %r" % (code, resp[:100]))
            next_t += n / self.rate
            time.sleep(max(0.0, next_t - time.time()))
            next_t = max(next_t, time.time() - 1.0)


def drained(addr):
    code, body = http(addr, "GET", "/stats?format=json")
    if code != 200:
        return False, "stats %s" % code
    data = json.loads(body)
    data = data.get("data", data) if "topics" not in data else data
    busy = []
    seen = set()
    for t in data.get("topics") or []:
        if t["topic_name"] not in TOPICS:
            continue
        if t.get("depth"):
            busy.append("%s depth %s" % (t["topic_name"], t["depth"]))
        for c in t.get("channels") or []:
            seen.add((t["topic_name"], c["channel_name"]))
            if "#ephemeral" in c["channel_name"]:
                continue
            n = (c.get("depth") or 0) + (c.get("in_flight_count") or 0) + (c.get("deferred_count") or 0)
            if n:
                busy.append("%s/%s depth %s in flight %s deferred %s" % (
                    t["topic_name"], c["channel_name"], c.get("depth"), c.get("in_flight_count"),
                    c.get("deferred_count")))
    missing = [(t, c) for t in TOPICS for c in CHANNELS if (t, c) not in seen]
    if missing:
        busy.append("missing channels %s" % missing)
    return not busy, "; ".join(busy)


def channel_counters(addr):
    """The broker's own per-channel counters at the end (channels deleted during the run
    started again from 0 when re-created)."""
    code, body = http(addr, "GET", "/stats?format=json")
    if code != 200:
        return {}
    data = json.loads(body)
    data = data.get("data", data) if "topics" not in data else data
    out = {}
    for t in data.get("topics") or []:
        for c in t.get("channels") or []:
            out["%s/%s" % (t["topic_name"], c["channel_name"])] = {
                k: c.get(k) for k in ("message_count", "requeue_count", "timeout_count")}
    return out


def leftovers(addr):
    """After every client left: no #ephemeral channel may remain (the last client leaving
    deletes one) and no channel may still list a client."""
    code, body = http(addr, "GET", "/stats?format=json")
    if code != 200:
        return ["GET /stats after the clients left: %s" % code]
    data = json.loads(body)
    data = data.get("data", data) if "topics" not in data else data
    p = []
    for t in data.get("topics") or []:
        for c in t.get("channels") or []:
            name = "%s/%s" % (t["topic_name"], c["channel_name"])
            if "#ephemeral" in c["channel_name"]:
                p.append("ephemeral channel %s still exists after its clients left" % name)
            if c.get("clients"):
                p.append("%s still lists %d client(s) after they left" % (name, len(c["clients"])))
    return p


def plot(rows, png, title, warm_s):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log("no matplotlib (%s): no plot" % e)
        return False
    t = [r[0] for r in rows]
    fig, ax1 = plt.subplots(figsize=(9, 4.5), dpi=100)
    ax1.plot(t, [r[1] / 1024.0 for r in rows], color="tab:blue", label="RSS (MiB)")
    ax1.set_xlabel("seconds since start")
    ax1.set_ylabel("RSS (MiB)", color="tab:blue")
    ax1.set_ylim(bottom=0)
    ax2 = ax1.twinx()
    ax2.plot(t, [r[2] for r in rows], color="tab:red", label="open fds")
    ax2.plot(t, [r[4] for r in rows], color="tab:orange", linestyle="--", label="non-socket fds")
    ax2.set_ylabel("open fds", color="tab:red")
    ax2.set_ylim(bottom=0)
    ax1.axvline(warm_s, color="grey", linestyle=":", linewidth=1)
    lines = [ln for ln in ax1.get_lines() + ax2.get_lines() if not ln.get_label().startswith("_")]
    ax1.legend(lines, [ln.get_label() for ln in lines], loc="lower right")
    ax1.set_title(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--nsqd", default=os.path.join(ROOT, "target", "debug", "nsqd"))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--msg-timeout-ms", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=40.0, help="messages/s per publisher (3 publishers)")
    ap.add_argument("--out", default=None, help="run directory (default: a new one under target/soak)")
    ap.add_argument("--png", default=None)
    ap.add_argument("--rss-growth", type=float, default=0.20)
    ap.add_argument("--fd-slack", type=int, default=4)
    ap.add_argument("--drain-timeout", type=float, default=90.0)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    rng = random.Random(seed)
    out = args.out or os.path.join(ROOT, "target", "soak", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    # A reused run directory: the event logs are appended to, so start them afresh.
    for f in os.listdir(out):
        if f in ("drain", "stop") or f.endswith(".events.jsonl"):
            os.remove(os.path.join(out, f))
    png = args.png or os.path.join(out, "soak.png")
    datadir = tempfile.mkdtemp(prefix="nsqd-soak-")
    duration = args.minutes * 60.0
    log("seed %d, %.0f s, --shards %d, msg timeout %d ms, run dir %s" % (
        seed, duration, args.shards, args.msg_timeout_ms, out))
    problems = []
    final_stats = {}
    t_start = time.time()
    broker = Broker(args, datadir, os.path.join(out, "nsqd.log"))
    events = common.EventLog(os.path.join(out, "coordinator.events.jsonl"))
    workers = []
    try:
        for t in TOPICS:
            events.add("op", t0=time.time(), t1=time.time(), op="setup", topic=t, ch=None,
                       code=http(broker.http, "POST", "/topic/create?topic=" + t)[0])
            for c in CHANNELS:
                events.add("op", t0=time.time(), t1=time.time(), op="setup", topic=t, ch=c,
                           code=http(broker.http, "POST", "/channel/create?topic=%s&channel=%s" % (t, c))[0])
        time.sleep(1.0)
        sampler = Sampler(broker, os.path.join(out, "resources.csv"), t_start)
        sampler.phase = "idle"
        idle = sampler.take()
        sampler.phase = "run"
        sampler.others_band = idle[4] + len(TOPICS) + args.fd_slack
        log("idle broker: RSS %d KiB, %d fds (%d sockets)" % (idle[1], idle[2], idle[3]))
        sampler.start()
        until = time.time() + duration
        for name, script, consumers in (
                ("py", "pynsq_worker.py", [("soak_a", "py", 100), ("soak_b", "py", 100),
                                           ("soak_a", "mix", 50), ("soak_b", "mix", 50)]),
                ("gn", "gnsq_worker.py", [("soak_a", "gn", 100), ("soak_b", "gn", 100),
                                          ("soak_a", "mix", 50), ("soak_b", "mix", 50)])):
            cfg = {"name": name, "tcp": broker.tcp, "http": broker.http, "seed": seed,
                   "events": os.path.join(out, name + ".events.jsonl"), "control": out,
                   "msg_timeout_ms": args.msg_timeout_ms, "topics": TOPICS,
                   "consumers": [{"topic": t, "channel": c, "max_in_flight": m} for t, c, m in consumers],
                   "ephemeral_topics": TOPICS if name == "py" else [], "publish_rate": args.rate,
                   "churn_per_s": 0.03}
            cpath = os.path.join(out, name + ".config.json")
            with open(cpath, "w") as f:
                json.dump(cfg, f)
            lf = open(os.path.join(out, name + ".log"), "wb")
            workers.append((name, subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "soak", script), cpath],
                                                   stdout=lf, stderr=subprocess.STDOUT)))
        pub_stop = threading.Event()
        pub = HttpPublisher(broker.http, random.Random(seed + 1), events, args.rate, pub_stop)
        pub.start()
        admin = Admin(broker.http, random.Random(seed + 2), events, until)
        admin.start()
        last = 0
        while time.time() < until:
            time.sleep(1.0)
            events.flush()
            for name, p in workers:
                if p.poll() is not None:
                    raise SystemExit("worker %s exited early with status %s; see %s" % (
                        name, p.returncode, os.path.join(out, name + ".log")))
            if broker.proc.poll() is not None:
                raise SystemExit("the broker exited with status %s during the run" % broker.proc.returncode)
            if time.time() - last >= 30:
                last = time.time()
                row = sampler.rows[-1] if sampler.rows else idle
                log("%.0f s: RSS %d KiB, %d fds (%d sockets)" % (row[0], row[1], row[2], row[3]))
        # ------------------------------------------------------------ drain
        log("drain: publishers stop, readers FIN everything")
        admin.stop_ev.set()
        admin.join(30)
        pub_stop.set()
        pub.join(30)
        open(os.path.join(out, "drain"), "w").close()
        sampler.phase = "drain"
        time.sleep(3.0)
        t_drain = time.time()
        ok_twice = 0
        state = ""
        while time.time() - t_drain < args.drain_timeout:
            ok, state = drained(broker.http)
            ok_twice = ok_twice + 1 if ok else 0
            if ok_twice >= 3:
                break
            time.sleep(1.0)
        if ok_twice < 3:
            problems.append("channels not drained after %.0f s: %s" % (args.drain_timeout, state))
        log("drained in %.1f s" % (time.time() - t_drain))
        final_stats = channel_counters(broker.http)
        open(os.path.join(out, "stop"), "w").close()
        for name, p in workers:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                problems.append("worker %s did not stop within 20 s" % name)
            if p.returncode not in (0, None):
                problems.append("worker %s exited with status %s" % (name, p.returncode))
        workers = []
        sampler.phase = "after"
        time.sleep(3.0)
        sampler.stop_ev.set()
        end = sampler.take()
        problems += leftovers(broker.http)
        events.close()
    finally:
        for name, p in workers:
            p.kill()
        rc = broker.stop()
        shutil.rmtree(datadir, ignore_errors=True)
    if rc != 0:
        problems.append("broker exit status after SIGTERM: %s" % rc)
    with open(broker.logpath, "rb") as f:
        blog = f.read().decode("utf-8", "replace")
    if "panicked at" in blog or "FATAL" in blog:
        problems.append("panic/FATAL in the broker log %s" % broker.logpath)
    # ------------------------------------------------------------ resources
    rows = [r for r in sampler.rows if r[5] != "idle"]
    warm = min(60.0, duration / 3.0)
    after_warm = [r for r in rows if r[0] >= warm + (idle[0])] or rows
    base = after_warm[0]
    rss_max = max(r[1] for r in after_warm)
    res = {
        "idle": {"rss_kib": idle[1], "fds": idle[2], "socket_fds": idle[3]},
        "after_warmup": {"t_s": base[0], "rss_kib": base[1], "fds": base[2]},
        "max": {"rss_kib": max(r[1] for r in rows), "fds": max(r[2] for r in rows),
                "socket_fds": max(r[3] for r in rows), "other_fds": max(r[4] for r in rows)},
        "end": {"rss_kib": end[1], "fds": end[2], "socket_fds": end[3]} if end else None,
        "samples": len(rows),
    }
    if rss_max > base[1] * (1 + args.rss_growth):
        problems.append("RSS grew after the warm-up: %d KiB at %.0f s, max %d KiB (> +%d%%)" % (
            base[1], base[0], rss_max, args.rss_growth * 100))
    # Non-socket fds: the shards' io_uring/eventfd, the data dir, and per topic its
    # directory plus the open segment file (opened at the first publish): idle + one per
    # topic, give or take --fd-slack (a segment rolling over, metadata being written).
    # During the run a topic holds more: its journal, journals already rotated out and
    # deleted but still open for a moment (seen in a 3-minute run: two such on one topic),
    # and while a deleted topic is re-created, the old files next to the new ones. So the
    # bound during the run is 4 fds per topic; once the clients have left the steady band
    # must hold again.
    other = [r[4] for r in rows]
    idle_other = idle[2] - idle[3]
    lo, hi = idle_other - args.fd_slack, idle_other + len(TOPICS) + args.fd_slack
    hi_run = idle_other + 4 * len(TOPICS) + args.fd_slack
    if max(other) > hi_run or min(other) < lo:
        problems.append("non-socket fds left [%d, %d] during the run: %d..%d" % (
            lo, hi_run, min(other), max(other)))
    res["non_socket_fds_outside_steady_band"] = len(sampler.peaks)
    with open(os.path.join(out, "fd-peaks.txt"), "w") as f:
        f.write("".join(p + "\n" for p in sampler.peaks))
    if end is None:
        problems.append("no sample after the clients left")
    else:
        if end[3] > idle[3] + 1:
            problems.append("socket fds after the clients left: %d, idle before them: %d" % (end[3], idle[3]))
        if not lo <= end[4] <= hi:
            problems.append("non-socket fds after the clients left: %d, not in [%d, %d]" % (end[4], lo, hi))
    title = "soak %.2f min, --shards %d, seed %d: broker RSS and open fds" % (args.minutes, args.shards, seed)
    plotted = plot(sampler.rows, png, title, warm + idle[0])
    # ------------------------------------------------------------ accounting
    paths = [os.path.join(out, n) for n in ("coordinator.events.jsonl", "py.events.jsonl", "gn.events.jsonl")]
    evs = checker.load(paths)
    fig, cproblems, unacc, faults, unexpected = checker.check(
        evs, {t: CHANNELS for t in TOPICS}, args.msg_timeout_ms / 1000.0)
    problems += cproblems
    ops = {}
    for e in evs:
        if e["e"] == "op" and e["op"] != "setup":
            ops[e["op"]] = ops.get(e["op"], 0) + 1
    summary = {"seed": seed, "minutes": args.minutes, "shards": args.shards,
               "msg_timeout_ms": args.msg_timeout_ms, "broker_exit": rc, "admin_ops": ops,
               "messages": fig, "broker_channel_counters": final_stats, "resources": res, "png": png if plotted else None,
               "problems": problems}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out, "details.txt"), "w") as f:
        f.write("unaccounted:\n%s\nfaults:\n%s\nunexpected errors:\n%s\n" % (
            "\n".join(repr(u) for u in unacc), "\n".join(faults), "\n".join(unexpected)))
    m = fig
    print("soak: %.2f min, --shards %d, seed %d, run dir %s" % (args.minutes, args.shards, seed, out))
    print("  published %d (%s), publish failures %d" % (
        m["published"], ", ".join("%s %d" % kv for kv in sorted(m["publishes_by_way"].items())),
        m["publish_failed"]))
    print("  deliveries %d on %d message/channel pairs, redelivered %d, requeued (REQ) %d, "
          "held to time out %d, touched %d, FINs %d (failed %d)" % (
              m["deliveries"], m["delivered_message_channel_pairs"], m["redeliveries"], m["requeued"],
              m["held_to_time_out"], m["touched"], m["fin_sent"], m["fin_failed"]))
    print("  removed: %s" % json.dumps(m["removed"]))
    print("  broker /stats at the end: timeout_count %d, requeue_count %d (summed over the channels; "
          "a re-created channel counts from 0)" % (
              sum(c.get("timeout_count") or 0 for c in final_stats.values()),
              sum(c.get("requeue_count") or 0 for c in final_stats.values())))
    print("  per channel: %s" % json.dumps(m["per_channel"]))
    print("  admin ops: %s; reader (re)starts %d" % (json.dumps(ops), m["reader_starts"]))
    print("  expected client errors: %s; unexpected: %d" % (json.dumps(m["errors_expected"]),
                                                           m["errors_unexpected"]))
    print("  unaccounted %d, delivery faults %d" % (m["unaccounted"], m["faults"]))
    print("  RSS KiB idle %d, after warm-up (%.0f s) %d, max %d, end %s; fds idle %d (%d sockets), "
          "max %d, end %s" % (idle[1], base[0], base[1], res["max"]["rss_kib"],
                              end[1] if end else "-", idle[2], idle[3], res["max"]["fds"],
                              end[2] if end else "-"))
    print("  non-socket fds: idle %d, steady band [%d, %d], %d sample(s) above it (fd-peaks.txt), "
          "max %d, end %s" % (idle_other, lo, hi, len(sampler.peaks), max(other),
                              end[4] if end else "-"))
    print("  plot: %s" % (png if plotted else "none (matplotlib missing)"))
    for p in problems:
        print("  FAIL: %s" % p)
    print("soak: %s" % ("PASS" if not problems else "FAIL (%d problems)" % len(problems)))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
