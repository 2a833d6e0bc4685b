"""Parts shared by the soak workers (pynsq_worker.py, gnsq_worker.py): the event log,
the consumer's random behaviour, control files and message bodies. Standard library only.

A worker is started by scripts/soak.py with one argument, the path of a JSON config:

    {"name": "py", "tcp": "127.0.0.1:p", "http": "127.0.0.1:p", "seed": 1,
     "events": "<run dir>/py.events.jsonl", "control": "<run dir>",
     "msg_timeout_ms": 3000, "topics": ["soak_a", "soak_b"],
     "consumers": [{"topic": "soak_a", "channel": "py", "max_in_flight": 20}, ...],
     "ephemeral_topics": ["soak_a"], "publish_rate": 40}

It appends one JSON object per line to `events` (see EventLog) and watches the files
`<control>/drain` (stop publishing and churning, answer every message with FIN at once)
and `<control>/stop` (close everything and exit 0).
"""
import json
import os
import random
import re
import threading
import time

ID_RE = re.compile(r"(?:FIN|REQ|TOUCH) ([0-9a-fA-F]{16})")


class EventLog:
    """JSON lines, one per event, flushed every 0.2 s by the caller's loop (flush()).

    Events (all with "e" and "t", the wall-clock time in s):
      pub    t0, t1 (sent, answered), topic, bodies, via, ok, err
      dlv    topic, ch, r (reader), body, id, att
      fin / req / touch   topic, ch, r, body, id  (+ delay_ms for req)
      hold   topic, ch, r, body, id  (deliberately never answered: it must time out)
      err    r, topic, ch, text, id, held (s since the message was delivered or touched)
      close  r, topic, ch, ours (True when this worker closed the connection itself)
      reader r, topic, ch, what ("start" or "stop")
    """

    def __init__(self, path):
        self.f = open(path, "a", buffering=1 << 16)
        self.lock = threading.Lock()

    def add(self, e, **kw):
        kw["e"] = e
        kw.setdefault("t", time.time())
        line = json.dumps(kw, separators=(",", ":"))
        with self.lock:
            self.f.write(line + "\n")

    def flush(self):
        with self.lock:
            self.f.flush()

    def close(self):
        with self.lock:
            self.f.flush()
            self.f.close()


class Control:
    def __init__(self, directory):
        self.dir = directory

    def draining(self):
        return os.path.exists(os.path.join(self.dir, "drain"))

    def stopping(self):
        return os.path.exists(os.path.join(self.dir, "stop"))


class Behaviour:
    """What a consumer does with one delivery. msg_timeout_s is the broker's
    --msg-timeout; the touch path FINs only after it, so the TOUCH is what keeps the
    message in flight (with a margin of msg_timeout / 3)."""

    def __init__(self, rng, msg_timeout_s):
        self.rng = rng
        self.to = msg_timeout_s

    def choose(self, attempts, draining):
        if draining or attempts >= 4:
            return ("fin",)
        r = self.rng.random()
        if r < 0.60:
            return ("fin",)
        if r < 0.72:
            return ("req", self.rng.choice((0, 0, 100, 500, 1500)))
        if r < 0.78:
            return ("hold",)
        if r < 0.86:
            # TOUCH at to/2, FIN at to*7/6: after the original deadline, before the
            # touched one (to/2 + to) with to/3 to spare.
            return ("touch", self.to / 2, self.to * 7 / 6)
        return ("fin_later", self.rng.uniform(0.01, 0.3))


def prune(inflight, now, keep_s=60.0):
    """Drops what a reader remembers of messages delivered over keep_s ago (an error frame
    naming one comes back within msg_timeout), so long runs stay small."""
    if len(inflight) > 5000:
        for mid in [m for m, v in inflight.items() if now - v[0] > keep_s]:
            del inflight[mid]


def body(src, seq):
    return "soak.%s.%d" % (src, seq)


def publish_plan(rng, topics):
    """One publish action: (via, topic, n, defer_ms)."""
    topic = rng.choice(topics)
    r = rng.random()
    if r < 0.5:
        return ("pub", topic, 1, 0)
    if r < 0.8:
        return ("mpub", topic, rng.randint(2, 20), 0)
    return ("dpub", topic, 1, rng.choice((100, 500, 1500)))


def parse_id(text):
    m = ID_RE.search(text or "")
    return m.group(1) if m else None


def load_config(argv):
    with open(argv[1]) as f:
        cfg = json.load(f)
    cfg["rng"] = random.Random("%s-%s" % (cfg["seed"], cfg["name"]))
    return cfg
