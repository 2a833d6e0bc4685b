#!/usr/bin/env python3
"""Soak worker driving pynsq (unmodified; tornado/asyncio): nsq.Reader consumers that
FIN, REQ with delays, let messages time out, TOUCH, and are closed and replaced at
random; #ephemeral channel readers that come and go; one nsq.Writer publishing with
PUB, MPUB and DPUB. Every action is written to the event log (common.EventLog) for the
checker in scripts/soak.py. usage: pynsq_worker.py <config.json> (see common.py)
"""
import asyncio
import logging
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import nsq  # noqa: E402

CFG = common.load_config(sys.argv)
RNG = CFG["rng"]
LOG = common.EventLog(CFG["events"])
CTL = common.Control(CFG["control"])
TO_S = CFG["msg_timeout_ms"] / 1000.0
BEHAVIOUR = common.Behaviour(RNG, TO_S)


def mid_of(message):
    m = message.id
    return m.decode() if isinstance(m, bytes) else str(m)


class SoakReader(nsq.Reader):
    """nsq.Reader that reports error frames and closes, and never reconnects once this
    worker closed it (pynsq's own close would reconnect 15 s later)."""

    def __init__(self, slot, **kw):
        self.slot = slot
        self.soak_closed = False
        self.inflight = {}  # message id -> (delivered or last touched at, body, the time before)
        self.timers = []
        super().__init__(**kw)

    def connect_to_nsqd(self, host, port):
        if self.soak_closed:
            return None
        return super().connect_to_nsqd(host, port)

    def _on_connection_error(self, conn, error, **kw):
        text = str(error)
        if text[:2] in ("b'", 'b"'):
            text = text[2:-1]  # pynsq's Error prints the frame as bytes
        mid = common.parse_id(text)
        held = None
        if mid in self.inflight:
            # For a failed TOUCH: how long the message was held before that TOUCH.
            held = time.time() - self.inflight[mid][2 if "TOUCH" in text else 0]
        LOG.add("err", r=self.name, topic=self.topic, ch=self.channel, text=text, id=mid, held=held,
                ours=self.soak_closed)
        return super()._on_connection_error(conn, error, **kw)

    def _on_connection_close(self, conn, **kw):
        LOG.add("close", r=self.name, topic=self.topic, ch=self.channel, ours=self.soak_closed)
        self.slot.last_close = time.time()
        return super()._on_connection_close(conn, **kw)


class Slot:
    """One consumer position on topic/channel; its Reader is replaced on churn."""

    def __init__(self, topic, channel, mif):
        self.topic, self.channel, self.mif = topic, channel, mif
        self.gen = 0
        self.reader = None
        self.last_close = 0.0
        self.started = 0.0

    def start(self):
        self.gen += 1
        name = "%s.%s.%s.%d" % (CFG["name"], self.topic, self.channel, self.gen)
        r = SoakReader(self, topic=self.topic, channel=self.channel, name=name,
                       message_handler=None, nsqd_tcp_addresses=[CFG["tcp"]],
                       max_in_flight=self.mif, max_tries=0)
        r.set_message_handler(lambda m, r=r: on_message(r, m))
        self.reader = r
        self.started = time.time()
        LOG.add("reader", r=name, topic=self.topic, ch=self.channel, what="start")

    def stop(self):
        r = self.reader
        if r is None:
            return
        self.reader = None
        r.soak_closed = True
        for h in r.timers:
            h.cancel()
        LOG.add("reader", r=r.name, topic=self.topic, ch=self.channel, what="stop")
        r.close()


def respond(r, message, kind, delay_ms=0):
    if r.soak_closed or message.has_responded():
        return
    mid = mid_of(message)
    entry = r.inflight.get(mid)
    held = time.time() - entry[0] if entry else None
    body = entry[1] if entry else None
    kw = dict(r=r.name, topic=r.topic, ch=r.channel, body=body, id=mid, held=held)
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
            r.inflight[mid] = (time.time(), body, entry[0] if entry else time.time())
    except Exception as e:  # the connection went away under us
        LOG.add("note", r=r.name, text="%s on a closed connection: %r" % (kind, e))


def later(r, delay, fn):
    loop = asyncio.get_running_loop()
    r.timers.append(loop.call_later(delay, fn))
    if len(r.timers) > 2000:
        r.timers = [h for h in r.timers if not h.cancelled()][-1000:]


def on_message(r, message):
    message.enable_async()
    now = time.time()
    body = bytes(message.body).decode("ascii", "replace")
    mid = mid_of(message)
    r.inflight[mid] = (now, body, now)
    LOG.add("dlv", t=now, r=r.name, topic=r.topic, ch=r.channel, body=body, id=mid, att=message.attempts)
    act = BEHAVIOUR.choose(message.attempts, CTL.draining())
    if act[0] == "fin":
        respond(r, message, "fin")
    elif act[0] == "req":
        respond(r, message, "req", act[1])
    elif act[0] == "hold":
        LOG.add("hold", r=r.name, topic=r.topic, ch=r.channel, body=body, id=mid)
    elif act[0] == "touch":
        later(r, act[1], lambda: respond(r, message, "touch"))
        later(r, act[2], lambda: respond(r, message, "fin"))
    else:
        later(r, act[1], lambda: respond(r, message, "fin"))


class ErrorLog(logging.Handler):
    """ERROR records pynsq logs other than the error frames SoakReader reports itself
    (e.g. an exception in a callback)."""

    def emit(self, record):
        text = record.getMessage()
        if "] ERROR: " in text or "ERROR: {" in text or "] failed to " in text:
            return
        LOG.add("err", r="pynsq-log", topic=None, ch=None, text="log: " + text, id=None, held=None, ours=False)


class SoakWriter(nsq.Writer):
    def _on_connection_close(self, conn, **kw):
        LOG.add("close", r=CFG["name"] + ".writer", topic=None, ch=None, ours=False)
        return super()._on_connection_close(conn, **kw)


async def producer():
    w = SoakWriter([CFG["tcp"]], reconnect_interval=1.0)
    while not any(c.connected() for c in w.conns.values()):
        await asyncio.sleep(0.05)
    seq = 0
    outstanding = [0]
    interval = 1.0 / max(1e-3, CFG["publish_rate"])
    next_t = time.time()
    while not CTL.draining():
        via, topic, n, defer = common.publish_plan(RNG, CFG["topics"])
        bodies = [common.body(CFG["name"], seq + i) for i in range(n)]
        seq += n
        t0 = time.time()

        def cb(conn, data, bodies=bodies, topic=topic, t0=t0, via=via):
            outstanding[0] -= 1
            ok = data == b"OK"
            LOG.add("pub", t0=t0, t1=time.time(), topic=topic, bodies=bodies, via="pynsq-" + via,
                    ok=ok, err=None if ok else str(data))
        outstanding[0] += 1
        raw = [b.encode() for b in bodies]
        if via == "pub":
            w.pub(topic, raw[0], callback=cb)
        elif via == "mpub":
            w.mpub(topic, raw, callback=cb)
        else:
            w.dpub(topic, defer, raw[0], callback=cb)
        next_t += interval * n
        while outstanding[0] > 100:
            await asyncio.sleep(0.01)
        await asyncio.sleep(max(0.0, next_t - time.time()))
        next_t = max(next_t, time.time() - 1.0)
    deadline = time.time() + 15
    while outstanding[0] > 0 and time.time() < deadline:
        await asyncio.sleep(0.05)
    LOG.add("producer_done", outstanding=outstanding[0])


async def main():
    slots = [Slot(c["topic"], c["channel"], c["max_in_flight"]) for c in CFG["consumers"]]
    for s in slots:
        s.start()
    eph = {t: {"slot": None, "k": 0, "until": time.time() + RNG.uniform(0.5, 2)}
           for t in CFG.get("ephemeral_topics", [])}
    asyncio.get_running_loop().create_task(producer())
    while not CTL.stopping():
        await asyncio.sleep(0.2)
        LOG.flush()
        now = time.time()
        draining = CTL.draining()
        for s in slots:
            r = s.reader
            if r is not None:
                common.prune(r.inflight, now)
            # Replace a reader that lost its connection (e.g. its channel was deleted)
            # instead of waiting for pynsq's 15 s reconnect.
            if r is not None and not r.conns and now - max(s.started, s.last_close) > 3:
                s.stop()
                s.start()
            elif not draining and RNG.random() < 0.2 * CFG.get("churn_per_s", 0.03):
                s.stop()
                s.start()
        for t, st in eph.items():
            if now < st["until"]:
                continue
            if st["slot"] is not None:
                st["slot"].stop()
                st["slot"] = None
                st["until"] = now + RNG.uniform(0.5, 2)
            elif not draining:
                st["k"] = (st["k"] + 1) % 3
                st["slot"] = Slot(t, "eph%d#ephemeral" % st["k"], 10)
                st["slot"].start()
                st["until"] = now + RNG.uniform(2, 6)
        if draining:
            for st in eph.values():
                if st["slot"] is not None:
                    st["slot"].stop()
                    st["slot"] = None
    for s in slots:
        s.stop()
    await asyncio.sleep(0.3)
    LOG.add("exit")
    LOG.close()
    os._exit(0)


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr,
                        format="[soak-pynsq %(asctime)s] %(levelname)s %(name)s: %(message)s")
    logging.getLogger().addHandler(ErrorLog(level=logging.ERROR))
    asyncio.run(main())
