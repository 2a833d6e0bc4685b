#!/usr/bin/env python3
"""Soak worker driving gnsq (unmodified; gevent): gnsq.Consumer consumers that FIN, REQ
with delays, let messages time out, TOUCH, and are closed and replaced at random, and
one gnsq.Producer publishing with PUB, MPUB and DPUB. Every action is written to the
event log (common.EventLog) for the checker in scripts/soak.py.
usage: gnsq_worker.py <config.json> (see common.py)
"""
from gevent import monkey

monkey.patch_all()

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import gnsq  # noqa: E402

CFG = common.load_config(sys.argv)
RNG = CFG["rng"]
LOG = common.EventLog(CFG["events"])
CTL = common.Control(CFG["control"])
TO_S = CFG["msg_timeout_ms"] / 1000.0
BEHAVIOUR = common.Behaviour(RNG, TO_S)
BY_NAME = {}  # consumer name -> Slot


def mid_of(message):
    m = message.id
    return m.decode() if isinstance(m, bytes) else str(m)


class LostWatch(logging.Handler):
    """gnsq reports a connection the broker closed only as a log warning."""

    def emit(self, record):
        text = record.getMessage()
        if record.levelno >= logging.ERROR:
            slot = BY_NAME.get(record.name)
            LOG.add("err", r=record.name, topic=slot.topic if slot else None,
                    ch=slot.channel if slot else None, text="log: " + text, id=None, held=None,
                    ours=bool(slot and slot.closed_names.get(record.name)))
            return
        if "connection lost" not in text and "connection failed" not in text:
            return
        slot = BY_NAME.get(record.name)
        if slot is not None:
            LOG.add("close", r=record.name, topic=slot.topic, ch=slot.channel,
                    ours=slot.closed_names.get(record.name, False), text=text)
            slot.last_close = time.time()
        else:
            LOG.add("close", r=record.name, topic=None, ch=None, ours=False, text=text)


class Slot:
    def __init__(self, topic, channel, mif):
        self.topic, self.channel, self.mif = topic, channel, mif
        self.gen = 0
        self.consumer = None
        self.closed_names = {}
        self.inflight = {}
        self.last_close = 0.0
        self.started = 0.0

    def start(self):
        self.gen += 1
        name = "%s.%s.%s.%d" % (CFG["name"], self.topic, self.channel, self.gen)
        c = gnsq.Consumer(self.topic, self.channel, nsqd_tcp_addresses=[CFG["tcp"]], name=name,
                          message_handler=lambda consumer, message: on_message(self, consumer, message),
                          max_in_flight=self.mif, max_tries=0, backoff_on_requeue=False)

        def on_error(sender, error=None, **kw):
            text = str(error)
            if text[:2] in ("b'", 'b"'):
                text = text[2:-1]
            # gnsq's exception keeps the frame without its code: put it back
            text = {"NSQFinishFailed": "E_FIN_FAILED ", "NSQRequeueFailed": "E_REQ_FAILED ",
                    "NSQTouchFailed": "E_TOUCH_FAILED "}.get(type(error).__name__, type(error).__name__ + " ") + text
            mid = common.parse_id(text)
            held = time.time() - self.inflight[mid][0] if mid in self.inflight else None
            if mid in self.inflight and "TOUCH" in text:
                held = time.time() - self.inflight[mid][2]
            LOG.add("err", r=name, topic=self.topic, ch=self.channel, text=text, id=mid, held=held,
                    ours=self.closed_names.get(name, False))
        c.on_error.connect(on_error, weak=False)
        BY_NAME[name] = self
        self.closed_names[name] = False
        self.consumer = c
        self.started = time.time()
        LOG.add("reader", r=name, topic=self.topic, ch=self.channel, what="start")
        c.start(block=False)

    def stop(self):
        c = self.consumer
        if c is None:
            return
        self.consumer = None
        self.closed_names[c.name] = True
        LOG.add("reader", r=c.name, topic=self.topic, ch=self.channel, what="stop")
        c.close()


def respond(slot, consumer, message, kind, delay_ms=0):
    if slot.closed_names.get(consumer.name) or message.has_responded():
        return
    mid = mid_of(message)
    entry = slot.inflight.get(mid)
    held = time.time() - entry[0] if entry else None
    body = entry[1] if entry else None
    kw = dict(r=consumer.name, topic=slot.topic, ch=slot.channel, body=body, id=mid, held=held)
    try:
        if kind == "fin":
            LOG.add("fin", **kw)
            message.finish()
        elif kind == "req":
            LOG.add("req", delay_ms=delay_ms, **kw)
            message.requeue(time_ms=delay_ms, backoff=False)
        elif kind == "touch":
            LOG.add("touch", **kw)
            message.touch()
            slot.inflight[mid] = (time.time(), body, entry[0] if entry else time.time())
    except Exception as e:  # the connection went away under us
        LOG.add("note", r=consumer.name, text="%s on a closed connection: %r" % (kind, e))


def on_message(slot, consumer, message):
    message.enable_async()
    now = time.time()
    body = bytes(message.body).decode("ascii", "replace")
    mid = mid_of(message)
    slot.inflight[mid] = (now, body, now)
    LOG.add("dlv", t=now, r=consumer.name, topic=slot.topic, ch=slot.channel, body=body, id=mid,
            att=message.attempts)
    act = BEHAVIOUR.choose(message.attempts, CTL.draining())
    if act[0] == "fin":
        respond(slot, consumer, message, "fin")
    elif act[0] == "req":
        respond(slot, consumer, message, "req", act[1])
    elif act[0] == "hold":
        LOG.add("hold", r=consumer.name, topic=slot.topic, ch=slot.channel, body=body, id=mid)
    elif act[0] == "touch":
        gevent.spawn_later(act[1], respond, slot, consumer, message, "touch")
        gevent.spawn_later(act[2], respond, slot, consumer, message, "fin")
    else:
        gevent.spawn_later(act[1], respond, slot, consumer, message, "fin")


def wait_result(res, t0, topic, bodies, via):
    try:
        data = res.get(timeout=30)
        ok = data == b"OK"
        err = None if ok else repr(data)
    except Exception as e:
        ok, err = False, repr(e)
    LOG.add("pub", t0=t0, t1=time.time(), topic=topic, bodies=bodies, via="gnsq-" + via, ok=ok, err=err)


def producer():
    p = gnsq.Producer(nsqd_tcp_addresses=[CFG["tcp"]])

    def on_error(sender, error=None, **kw):
        LOG.add("err", r=CFG["name"] + ".producer", topic=None, ch=None, text=str(error), id=None, held=None)
    p.on_error.connect(on_error, weak=False)
    p.start()
    seq = 0
    interval = 1.0 / max(1e-3, CFG["publish_rate"])
    next_t = time.time()
    pending = []
    while not CTL.draining():
        via, topic, n, defer = common.publish_plan(RNG, CFG["topics"])
        bodies = [common.body(CFG["name"], seq + i) for i in range(n)]
        seq += n
        raw = [b.encode() for b in bodies]
        t0 = time.time()
        try:
            if via == "mpub":
                res = p.multipublish(topic, raw, raise_error=False, timeout=10)
            else:
                res = p.publish(topic, raw[0], defer=defer or None, raise_error=False, timeout=10)
            pending.append(gevent.spawn(wait_result, res, t0, topic, bodies, via))
        except Exception as e:
            LOG.add("pub", t0=t0, t1=time.time(), topic=topic, bodies=bodies, via="gnsq-" + via,
                    ok=False, err=repr(e))
        if len(pending) > 200:
            pending = [g for g in pending if not g.ready()]
        next_t += interval * n
        gevent.sleep(max(0.0, next_t - time.time()))
        next_t = max(next_t, time.time() - 1.0)
    gevent.joinall(pending, timeout=15)
    LOG.add("producer_done", outstanding=sum(1 for g in pending if not g.ready()))


def main():
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[soak-gnsq %(asctime)s] %(levelname)s %(name)s: %(message)s")
    logging.getLogger().addHandler(LostWatch(level=logging.WARNING))
    slots = [Slot(c["topic"], c["channel"], c["max_in_flight"]) for c in CFG["consumers"]]
    for s in slots:
        s.start()
    gevent.spawn(producer)
    while not CTL.stopping():
        gevent.sleep(0.2)
        LOG.flush()
        draining = CTL.draining()
        for s in slots:
            common.prune(s.inflight, time.time())
            if not draining and RNG.random() < 0.2 * CFG.get("churn_per_s", 0.03):
                s.stop()
                s.start()
    for s in slots:
        s.stop()
    gevent.sleep(0.3)
    LOG.add("exit")
    LOG.close()
    os._exit(0)


if __name__ == "__main__":
    main()
