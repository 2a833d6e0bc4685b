"""Client-independent parts of the Python client scenarios (pynsq_scenario.py,
gnsq_scenario.py): message bodies, delivery bookkeeping, and checks of nsqd's
HTTP /stats. Only the standard library is used here, so the NSQ traffic itself is
produced and consumed entirely by the real client library under test.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

FANOUT_MESSAGES = int(os.environ.get("SCENARIO_MESSAGES", "10000"))
RETRY_MESSAGES = int(os.environ.get("SCENARIO_RETRY_MESSAGES", "50"))
OVERALL_TIMEOUT = float(os.environ.get("SCENARIO_TIMEOUT", "120"))


class ScenarioError(Exception):
    pass


def free_port():
    """A loopback port the kernel just handed out (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_answers(addr):
    host, port = addr.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


class Daemon:
    """nsqd or nsqlookupd started on loopback ports picked beforehand (one
    `--<kind>-address=127.0.0.1:P` flag per kind in `ports`), stderr in `logpath`.
    Returns once every port answers a TCP connect, the way a user waits (not a log
    line); 60 s at most. A port someone else took meanwhile ("address already in use")
    is retried on fresh ones, up to 3 times. `addr[kind]`, `tcp`, `http`: the addresses."""

    def __init__(self, name, argv, logpath, ports=("tcp", "http")):
        self.name, self.logpath, self.proc = name, logpath, None
        for _ in range(3):
            self.addr = {k: "127.0.0.1:%d" % free_port() for k in ports}
            flags = ["--%s-address=%s" % (k, a) for k, a in self.addr.items()]
            with open(logpath, "a") as logf:
                mark = logf.tell()
                self.proc = subprocess.Popen(list(argv) + flags, stdout=subprocess.DEVNULL,
                                             stderr=logf)
            deadline = time.time() + 60
            while time.time() < deadline:
                if all(port_answers(a) for a in self.addr.values()):
                    self.tcp, self.http = self.addr.get("tcp"), self.addr.get("http")
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            self.stop()
            with open(logpath, errors="replace") as f:
                f.seek(mark)
                text = f.read()
            if "address already in use" not in text.lower():
                raise ScenarioError("%s did not start; log:\n%s" % (name, text[-2000:]))
        raise ScenarioError("%s: ports kept being taken" % name)

    def log_text(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM, then SIGKILL after 10 s; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def log(name, text):
    sys.stderr.write("[%s %s] %s\n" % (name, time.strftime("%H:%M:%S"), text))
    sys.stderr.flush()


def parse_args(argv, name):
    if len(argv) != 3 or ":" not in argv[1] or ":" not in argv[2]:
        sys.stderr.write("usage: %s <nsqd-tcp-host:port> <nsqd-http-host:port>\n" % name)
        sys.exit(2)
    return argv[1], argv[2]


def unique_name(prefix):
    """A topic name nobody used yet: [.a-zA-Z0-9_-], at most 64 characters."""
    return ("%s_%d_%d" % (prefix, os.getpid(), int(time.time() * 1000) % 10**9))[:64]


def make_bodies(topic, n):
    """n distinct bodies; every 997th is 64 KiB and some contain bytes 0x00..0xff, so
    framing of large and binary bodies is exercised too."""
    out = []
    for i in range(n):
        b = ("%s:%06d:" % (topic, i)).encode()
        if i % 997 == 5:
            b += bytes(range(256)) * 256
        elif i % 101 == 7:
            b += b"\n\x00\r\n binary \xff\xfe"
        out.append(b)
    assert len(set(out)) == n
    return out


# --------------------------------------------------------------------------- HTTP
def http(addr, method, path, body=b"", timeout=10):
    req = urllib.request.Request("http://%s%s" % (addr, path), data=body if method == "POST" else None,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def create_topic_channels(addr, topic, channels):
    q = urllib.parse.quote
    code, body = http(addr, "POST", "/topic/create?topic=%s" % q(topic))
    if code != 200:
        raise ScenarioError("POST /topic/create?topic=%s -> %d %r" % (topic, code, body[:200]))
    for ch in channels:
        code, body = http(addr, "POST", "/channel/create?topic=%s&channel=%s" % (q(topic), q(ch)))
        if code != 200:
            raise ScenarioError("POST /channel/create?topic=%s&channel=%s -> %d %r"
                                % (topic, ch, code, body[:200]))


def get_stats(addr):
    code, body = http(addr, "GET", "/stats?format=json")
    if code != 200:
        raise ScenarioError("GET /stats?format=json -> %d %r" % (code, body[:200]))
    data = json.loads(body)
    if isinstance(data, dict) and "data" in data and "topics" not in data:
        data = data["data"]  # pre-1.0 envelope
    return data


def topic_stats(addr, topic):
    for t in get_stats(addr).get("topics") or []:
        if t.get("topic_name") == topic:
            return t
    raise ScenarioError("topic %s missing from /stats" % topic)


def channel_stats(addr, topic, channel):
    for c in topic_stats(addr, topic).get("channels") or []:
        if c.get("channel_name") == channel:
            return c
    raise ScenarioError("channel %s/%s missing from /stats" % (topic, channel))


def summarize_channel(c):
    keys = ("depth", "backend_depth", "in_flight_count", "deferred_count", "message_count",
            "requeue_count", "timeout_count")
    s = {k: c.get(k) for k in keys}
    s["clients"] = [{k: cl.get(k) for k in ("client_id", "ready_count", "in_flight_count",
                                            "message_count", "finish_count", "requeue_count")}
                    for cl in c.get("clients") or []]
    return s


def wait_channel_drained(addr, topic, channel, checks, timeout=15.0, sleep=time.sleep):
    """Polls /stats until the channel has nothing queued, in flight or deferred, then
    applies `checks` (a function of the channel stats returning a list of problems).
    Raises ScenarioError with the stats when it does not settle."""
    deadline = time.time() + timeout
    last = None
    while True:
        c = channel_stats(addr, topic, channel)
        last = c
        drained = (c.get("depth") == 0 and c.get("in_flight_count") == 0
                   and c.get("deferred_count") == 0)
        if drained:
            problems = checks(c)
            if not problems:
                return c
        if time.time() > deadline:
            problems = ["not drained (depth/in_flight/deferred not all 0)"] if not drained else checks(c)
            raise ScenarioError("/stats for %s/%s: %s; stats=%s" % (
                topic, channel, "; ".join(problems), json.dumps(summarize_channel(last))))
        sleep(0.2)


def sum_clients(c, key):
    return sum(int(cl.get(key) or 0) for cl in c.get("clients") or [])


# ------------------------------------------------------------- client log watch
class ClientLogWatch:
    """A logging handler on the client library's logger that remembers every ERROR
    record (protocol error frames such as E_FIN_FAILED, socket errors) and every
    WARNING about a lost/closed connection: the scenarios never close a connection
    themselves, so either means the broker misbehaved."""

    def __init__(self, logger_name):
        import logging

        class H(logging.Handler):
            def emit(h, record):
                text = record.getMessage()
                if record.levelno >= logging.ERROR or (
                        record.levelno >= logging.WARNING
                        and ("connection closed" in text or "connection lost" in text
                             or "connection failed" in text)):
                    self.problems.append("%s: %s" % (record.levelname, text))

        self.problems = []
        logging.getLogger(logger_name).addHandler(H(level=logging.WARNING))

    def check(self):
        if self.problems:
            raise ScenarioError("the client library reported %d problem(s): %s" % (
                len(self.problems), " | ".join(self.problems[:5])))


# ------------------------------------------------------------------ bookkeeping
DPUB_DELAY_MS = 50
DPUB_RANGE = range(1000, 1100)  # indices of the bodies published with DPUB


class Delivery:
    __slots__ = ("attempts", "msg_id", "consumer", "age_ms")

    def __init__(self, attempts, msg_id, consumer, age_ms):
        self.attempts, self.msg_id, self.consumer = attempts, msg_id, consumer
        self.age_ms = age_ms  # receipt time minus the message's timestamp


class ChannelTracker:
    """Records every delivery on one channel: body -> [Delivery]."""

    def __init__(self, channel, bodies):
        self.channel = channel
        self.expected = set(bodies)
        self.deferred = set(bodies[i] for i in DPUB_RANGE if i < len(bodies))
        self.deliveries = {}
        self.unknown = []
        self.fins_sent = 0
        self.reqs_sent = 0

    def record(self, body, attempts, msg_id, consumer, timestamp_ns):
        if body not in self.expected:
            self.unknown.append((body[:80], attempts, msg_id))
            return False
        age_ms = (time.time_ns() - timestamp_ns) / 1e6
        self.deliveries.setdefault(body, []).append(Delivery(attempts, msg_id, consumer, age_ms))
        return True

    def complete(self):
        return len(self.deliveries) == len(self.expected)

    def progress(self):
        n = sum(len(v) for v in self.deliveries.values())
        return "%s: %d/%d distinct, %d deliveries" % (
            self.channel, len(self.deliveries), len(self.expected), n)

    def problems_fanout(self):
        """Every message delivered; duplicates only where a redelivery (attempts > 1)
        explains them; same message id on every delivery of one body."""
        p = []
        if self.unknown:
            p.append("%d deliveries with unknown bodies, e.g. %r" % (len(self.unknown), self.unknown[:3]))
        missing = self.expected - set(self.deliveries)
        if missing:
            p.append("%d of %d messages never delivered, e.g. %r" % (
                len(missing), len(self.expected), sorted(missing)[:3]))
        bad_dup = [b for b, ds in self.deliveries.items()
                   if len(ds) > 1 and sum(1 for d in ds if d.attempts <= 1) > 1]
        if bad_dup:
            ex = bad_dup[0]
            p.append("%d messages delivered more than once with attempts=1 (not a requeue), "
                     "e.g. %r -> %r" % (len(bad_dup), ex[:40], [(d.attempts, d.msg_id, d.consumer)
                                                             for d in self.deliveries[ex]]))
        first_att = [b for b, ds in self.deliveries.items() if ds[0].attempts != 1]
        if first_att:
            ex = first_att[0]
            p.append("%d messages whose first delivery had attempts != 1, e.g. %r" % (
                len(first_att), [(d.attempts, d.msg_id) for d in self.deliveries[ex]]))
        id_change = [b for b, ds in self.deliveries.items() if len({d.msg_id for d in ds}) > 1]
        if id_change:
            p.append("%d messages changed id between deliveries" % len(id_change))
        p += self.timestamp_problems()
        early = [(b[:40], ds[0].age_ms) for b, ds in self.deliveries.items()
                 if b in self.deferred and ds[0].age_ms < DPUB_DELAY_MS - 5]
        if early:
            p.append("%d DPUB (defer %d ms) messages delivered too early, e.g. %r ms after their timestamp"
                     % (len(early), DPUB_DELAY_MS, early[:3]))
        return p

    def timestamp_problems(self):
        """The message timestamp is nsqd's publish time in ns: it must be recent."""
        bad = [(b[:40], d.age_ms) for b, ds in self.deliveries.items() for d in ds
               if not -1000 <= d.age_ms <= 300000]
        if bad:
            return ["%d deliveries whose timestamp is not within [-1 s, 300 s] of now, e.g. "
                    "%r (age in ms)" % (len(bad), bad[:3])]
        return []

    def duplicates(self):
        return sum(len(ds) - 1 for ds in self.deliveries.values())

    def problems_redelivery(self, what):
        """Every message delivered at least twice: first with attempts=1, then again
        with the same id and attempts > 1."""
        p = []
        if self.unknown:
            p.append("%d deliveries with unknown bodies, e.g. %r" % (len(self.unknown), self.unknown[:3]))
        never = self.expected - set(self.deliveries)
        if never:
            p.append("%d of %d messages never delivered" % (len(never), len(self.expected)))
        once = [b for b, ds in self.deliveries.items() if len(ds) < 2]
        if once:
            p.append("%d of %d messages not redelivered after %s, e.g. %r" % (
                len(once), len(self.expected), what, once[0][:40]))
        for b, ds in self.deliveries.items():
            if len(ds) >= 2:
                if ds[0].attempts != 1:
                    p.append("first delivery of %r had attempts=%d (want 1)" % (b[:40], ds[0].attempts))
                    break
                if not all(d.attempts > 1 for d in ds[1:]):
                    p.append("redelivery of %r after %s had attempts %r (want > 1)" % (
                        b[:40], what, [d.attempts for d in ds]))
                    break
                if len({d.msg_id for d in ds}) != 1:
                    p.append("redelivery of %r after %s changed the message id: %r" % (
                        b[:40], what, [d.msg_id for d in ds]))
                    break
        p += self.timestamp_problems()
        return p

    def attempts_histogram(self):
        h = {}
        for ds in self.deliveries.values():
            for d in ds:
                h[d.attempts] = h.get(d.attempts, 0) + 1
        return dict(sorted(h.items()))


def fanout_checks(tracker, n):
    """Stats checks for one fan-out channel once every message was delivered."""
    def checks(c):
        p = []
        if c.get("message_count") != n:
            p.append("message_count=%r, want %d" % (c.get("message_count"), n))
        fin = sum_clients(c, "finish_count")
        if fin != n:
            p.append("sum of clients' finish_count=%d, want %d (FINs sent: %d)" % (fin, n, tracker.fins_sent))
        if tracker.duplicates() == 0 and (c.get("requeue_count") or c.get("timeout_count")):
            p.append("requeue_count=%r timeout_count=%r but no message was redelivered" % (
                c.get("requeue_count"), c.get("timeout_count")))
        return p
    return checks


def retry_checks(n, kind):
    def checks(c):
        p = []
        if c.get("message_count") != n:
            p.append("message_count=%r, want %d" % (c.get("message_count"), n))
        if kind == "requeue":
            if c.get("requeue_count") != n:
                p.append("requeue_count=%r, want %d" % (c.get("requeue_count"), n))
        else:
            if (c.get("timeout_count") or 0) < n:
                p.append("timeout_count=%r, want >= %d" % (c.get("timeout_count"), n))
        if sum_clients(c, "finish_count") != n:
            p.append("sum of clients' finish_count=%d, want %d" % (sum_clients(c, "finish_count"), n))
        return p
    return checks
