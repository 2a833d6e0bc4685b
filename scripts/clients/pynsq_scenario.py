#!/usr/bin/env python3
"""Runs the official Python client (pynsq, unmodified) against an nsqd.

usage: pynsq_scenario.py <nsqd-tcp-host:port> <nsqd-http-host:port>

1. fan-out: 10,000 distinct messages (PUB, DPUB and MPUB through nsq.Writer) to a new
   topic with two channels (created first over HTTP) and two nsq.Reader consumers per
   channel (max_in_flight 16 and 200). Every message must reach every channel and be
   FIN'd; a message may arrive twice only if it was redelivered (attempts > 1). /stats
   must then show each channel drained, message_count 10,000 and 10,000 FINs.
2. redelivery: 50 messages to a new topic with channel "requeue", whose consumer REQs
   (delay 0) each first delivery, and channel "timeout", whose consumer (IDENTIFY
   msg_timeout 1000 ms) never answers a first delivery. Both must get every message
   again with the same id and attempts > 1, and FIN it.

Exit status 0 on success, 1 with a reason on stderr otherwise; gives up after
SCENARIO_TIMEOUT seconds (default 120).
"""
import asyncio
import logging
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

import nsq  # noqa: E402
import tornado  # noqa: E402

NAME = "pynsq"
KEEP = []
WATCH = sc.ClientLogWatch("nsq")


def log(text):
    sc.log(NAME, text)


async def in_thread(fn, *args, **kw):
    """Blocking HTTP/stats helpers run off the IOLoop so client I/O keeps flowing."""
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kw))


async def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        await asyncio.sleep(0.05)


async def start_writer(tcp):
    w = nsq.Writer([tcp], reconnect_interval=1.0)
    await wait_for(lambda: any(c.connected() for c in w.conns.values()), 10,
                   "nsq.Writer to connect to %s" % tcp)
    return w


class Publisher:
    """Pipelines PUB/DPUB/MPUB through one nsq.Writer, at most `window` unanswered."""

    def __init__(self, writer, topic, window=256):
        self.w, self.topic, self.window = writer, topic, window
        self.outstanding = 0
        self.errors = []
        self.space = asyncio.Event()
        self.space.set()

    def _cb(self, conn, data):
        self.outstanding -= 1
        if isinstance(data, nsq.Error) or isinstance(data, Exception):
            self.errors.append(repr(data))
        elif data != b"OK":
            self.errors.append("unexpected response %r" % (data,))
        if self.outstanding < self.window:
            self.space.set()

    async def _slot(self):
        if self.errors:
            raise sc.ScenarioError("publish failed: %s" % self.errors[:3])
        while self.outstanding >= self.window:
            self.space.clear()
            await self.space.wait()
        self.outstanding += 1

    async def pub(self, body):
        await self._slot()
        self.w.pub(self.topic, body, callback=self._cb)

    async def dpub(self, delay_ms, body):
        await self._slot()
        self.w.dpub(self.topic, delay_ms, body, callback=self._cb)

    async def mpub(self, bodies):
        await self._slot()
        self.w.mpub(self.topic, bodies, callback=self._cb)

    async def drain(self):
        await wait_for(lambda: self.outstanding == 0 or self.errors, 30, "publish responses")
        if self.errors:
            raise sc.ScenarioError("publish failed: %s" % self.errors[:3])


async def publish_mixed(pub, bodies):
    """First 1,000 by PUB, next 100 by DPUB (50 ms), the rest by MPUB of 100."""
    n = len(bodies)
    i = 0
    while i < min(n, 1000):
        await pub.pub(bodies[i])
        i += 1
    while i < min(n, 1100):
        await pub.dpub(sc.DPUB_DELAY_MS, bodies[i])
        i += 1
    while i < n:
        await pub.mpub(bodies[i:i + 100])
        i += 100
    await pub.drain()


async def progress_until(event, trackers, timeout, what):
    deadline = time.time() + timeout
    while not event.is_set():
        WATCH.check()
        left = deadline - time.time()
        if left <= 0:
            raise sc.ScenarioError("timed out waiting for %s; %s" % (
                what, "; ".join(t.progress() for t in trackers)))
        try:
            await asyncio.wait_for(event.wait(), min(5.0, left))
        except asyncio.TimeoutError:
            log("progress: " + "; ".join(t.progress() for t in trackers))


async def fanout(tcp, http, timeout):
    n = sc.FANOUT_MESSAGES
    topic = sc.unique_name("pynsq_fanout")
    channels = ["ch_a", "ch_b"]
    log("fan-out: topic %s, channels %s, %d messages, 2 consumers per channel" % (topic, channels, n))
    await in_thread(sc.create_topic_channels, http, topic, channels)
    bodies = sc.make_bodies(topic, n)
    trackers = {ch: sc.ChannelTracker(ch, bodies) for ch in channels}
    done = asyncio.Event()
    readers = []

    def make_handler(tr, cname):
        def handler(message):
            tr.record(bytes(message.body), message.attempts, message.id, cname, message.timestamp)
            tr.fins_sent += 1
            if all(t.complete() for t in trackers.values()):
                done.set()
            return True  # pynsq FINs the message
        return handler

    for ch in channels:
        for k, mif in enumerate((16, 200)):
            cname = "%s/%d" % (ch, k)
            readers.append(nsq.Reader(
                topic=topic, channel=ch, name="%s:%s" % (topic, cname),
                message_handler=make_handler(trackers[ch], cname),
                nsqd_tcp_addresses=[tcp], max_in_flight=mif, max_tries=0))
    await wait_for(lambda: all(len(r.conns) == 1 for r in readers), 10, "4 readers to connect")
    writer = await start_writer(tcp)
    t0 = time.time()
    await publish_mixed(Publisher(writer, topic), bodies)
    log("fan-out: published %d messages in %.1fs" % (n, time.time() - t0))
    await progress_until(done, list(trackers.values()), timeout, "every message on every channel")
    log("fan-out: all delivered in %.1fs" % (time.time() - t0))
    WATCH.check()
    problems = []
    for ch, tr in trackers.items():
        problems += ["%s: %s" % (ch, p) for p in tr.problems_fanout()]
    if problems:
        raise sc.ScenarioError("fan-out: " + "; ".join(problems))
    for ch, tr in trackers.items():
        c = await in_thread(sc.wait_channel_drained, http, topic, ch, sc.fanout_checks(tr, n))
        log("fan-out: %s ok: %d deliveries (%d redelivered), attempts %s, stats requeue=%s timeout=%s" % (
            ch, n + tr.duplicates(), tr.duplicates(), tr.attempts_histogram(),
            c.get("requeue_count"), c.get("timeout_count")))
    # Readers and writers stay connected until the process exits (closing them here
    # would only make pynsq log errors and reconnect 15 s later).
    KEEP.extend(readers + [writer])


async def redelivery(tcp, http, timeout):
    n = sc.RETRY_MESSAGES
    topic = sc.unique_name("pynsq_retry")
    log("redelivery: topic %s, %d messages, channels requeue (REQ 0) and timeout (msg_timeout 1000ms)"
        % (topic, n))
    await in_thread(sc.create_topic_channels, http, topic, ["requeue", "timeout"])
    bodies = sc.make_bodies(topic, n)
    req_tr = sc.ChannelTracker("requeue", bodies)
    to_tr = sc.ChannelTracker("timeout", bodies)
    done = asyncio.Event()

    def check_done():
        if all(len(ds) >= 2 for ds in req_tr.deliveries.values()) and req_tr.complete() and \
           all(len(ds) >= 2 for ds in to_tr.deliveries.values()) and to_tr.complete():
            done.set()

    def requeue_handler(message):
        message.enable_async()
        req_tr.record(bytes(message.body), message.attempts, message.id, "requeue", message.timestamp)
        if len(req_tr.deliveries.get(bytes(message.body), [])) == 1:
            req_tr.reqs_sent += 1
            message.requeue(delay=0, backoff=False)
        else:
            req_tr.fins_sent += 1
            message.finish()
        check_done()

    def timeout_handler(message):
        message.enable_async()  # first delivery: never answered, so nsqd must time it out
        to_tr.record(bytes(message.body), message.attempts, message.id, "timeout", message.timestamp)
        if len(to_tr.deliveries.get(bytes(message.body), [])) > 1:
            to_tr.fins_sent += 1
            message.finish()
        check_done()

    readers = [
        nsq.Reader(topic=topic, channel="requeue", name=topic + ":requeue", message_handler=requeue_handler,
                   nsqd_tcp_addresses=[tcp], max_in_flight=10, max_tries=0),
        nsq.Reader(topic=topic, channel="timeout", name=topic + ":timeout", message_handler=timeout_handler,
                   nsqd_tcp_addresses=[tcp], max_in_flight=4 * n, max_tries=0, msg_timeout=1),
    ]
    await wait_for(lambda: all(len(r.conns) == 1 for r in readers), 10, "2 readers to connect")
    writer = await start_writer(tcp)
    pub = Publisher(writer, topic)
    for b in bodies:
        await pub.pub(b)
    await pub.drain()
    t0 = time.time()
    await progress_until(done, [req_tr, to_tr], timeout, "every message redelivered on both channels")
    log("redelivery: all redelivered in %.1fs" % (time.time() - t0))
    WATCH.check()
    problems = ["requeue: " + p for p in req_tr.problems_redelivery("REQ")]
    problems += ["timeout: " + p for p in to_tr.problems_redelivery("msg_timeout")]
    if problems:
        raise sc.ScenarioError("redelivery: " + "; ".join(problems))
    await in_thread(sc.wait_channel_drained, http, topic, "requeue", sc.retry_checks(n, "requeue"))
    await in_thread(sc.wait_channel_drained, http, topic, "timeout", sc.retry_checks(n, "timeout"))
    log("redelivery: ok; requeue attempts %s, timeout attempts %s" % (
        req_tr.attempts_histogram(), to_tr.attempts_histogram()))
    KEEP.extend(readers + [writer])


async def main(tcp, http):
    deadline = time.time() + sc.OVERALL_TIMEOUT
    await fanout(tcp, http, max(1.0, deadline - time.time()))
    await redelivery(tcp, http, max(1.0, deadline - time.time()))
    WATCH.check()


if __name__ == "__main__":
    tcp, http = sc.parse_args(sys.argv, NAME)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[pynsq %(asctime)s] %(levelname)s %(name)s: %(message)s")
    log("pynsq %s, tornado %s, python %s" % (nsq.__version__, tornado.version, sys.version.split()[0]))
    t0 = time.time()
    try:
        asyncio.run(asyncio.wait_for(main(tcp, http), sc.OVERALL_TIMEOUT + 30))
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
        sys.exit(1)
    except asyncio.TimeoutError:
        log("FAIL: overall timeout (%ss)" % (sc.OVERALL_TIMEOUT + 30))
        sys.exit(1)
    log("PASS (%.1fs)" % (time.time() - t0))
