#!/usr/bin/env python3
"""Runs the gevent based Python client gnsq (unmodified) against an nsqd.

usage: gnsq_scenario.py <nsqd-tcp-host:port> <nsqd-http-host:port>

1. fan-out: 10,000 distinct messages (PUB, DPUB and MPUB through gnsq.Producer) to a
   new topic with two channels (created first over HTTP) and two gnsq.Consumer per
   channel (max_in_flight 16 and 200). Every message must reach every channel and be
   FIN'd; a message may arrive twice only if it was redelivered (attempts > 1). /stats
   must then show each channel drained, message_count 10,000 and 10,000 FINs.
2. redelivery: 50 messages to a new topic with channel "requeue", whose gnsq.Consumer
   REQs (delay 0) each first delivery, and channel "timeout", read through a
   gnsq.NsqdTCPClient that sends IDENTIFY with msg_timeout 1000 ms (gnsq.Consumer has
   no such option) and never answers a first delivery. Both must get every message
   again with the same id and attempts > 1, and FIN it.

Exit status 0 on success, 1 with a reason on stderr otherwise; gives up after
SCENARIO_TIMEOUT seconds (default 120).
"""
from gevent import monkey

monkey.patch_all()

import logging  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import json  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

import gnsq  # noqa: E402
from gnsq import protocol as nsq_protocol  # noqa: E402
from gnsq.httpclient import USERAGENT  # noqa: E402

NAME = "gnsq"
KEEP = []
WATCH = sc.ClientLogWatch("gnsq")


def log(text):
    sc.log(NAME, text)


def watch_errors(obj, label):
    """gnsq reports error frames (E_FIN_FAILED, ...) only through on_error signals."""
    def on_error(sender, error=None, **kw):
        WATCH.problems.append("%s got error %r" % (label, error))
    obj.on_error.connect(on_error, weak=False)


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        gevent.sleep(0.05)


class Publisher:
    """Pipelines PUB/DPUB/MPUB through one gnsq.Producer, at most `window` unanswered."""

    def __init__(self, producer, topic, window=256):
        self.p, self.topic, self.window = producer, topic, window
        self.pending = []

    def _push(self, result):
        self.pending.append(result)
        if len(self.pending) >= self.window:
            self._settle(self.window // 2)

    def _settle(self, keep):
        while len(self.pending) > keep:
            r = self.pending.pop(0)
            try:
                resp = r.get(timeout=30)
            except gevent.Timeout:
                raise sc.ScenarioError("no response to a publish within 30s")
            except Exception as e:  # gnsq raises the NSQ error it got back
                raise sc.ScenarioError("publish failed: %r" % (e,))
            if resp != b"OK":
                raise sc.ScenarioError("publish: unexpected response %r" % (resp,))

    def pub(self, body, defer=None):
        self._push(self.p.publish(self.topic, body, defer=defer, raise_error=False))

    def mpub(self, bodies):
        self._push(self.p.multipublish(self.topic, bodies, raise_error=False))

    def drain(self):
        self._settle(0)


def start_producer(tcp):
    p = gnsq.Producer(nsqd_tcp_addresses=[tcp])
    watch_errors(p, "producer")
    p.start()
    return p


def publish_mixed(pub, bodies):
    """First 1,000 by PUB, next 100 by DPUB (50 ms), the rest by MPUB of 100."""
    n = len(bodies)
    i = 0
    while i < min(n, 1000):
        pub.pub(bodies[i])
        i += 1
    while i < min(n, 1100):
        pub.pub(bodies[i], defer=sc.DPUB_DELAY_MS)
        i += 1
    while i < n:
        pub.mpub(bodies[i:i + 100])
        i += 100
    pub.drain()


def progress_until(event, trackers, timeout, what):
    deadline = time.time() + timeout
    while not event.is_set():
        WATCH.check()
        left = deadline - time.time()
        if left <= 0:
            raise sc.ScenarioError("timed out waiting for %s; %s" % (
                what, "; ".join(t.progress() for t in trackers)))
        if not event.wait(min(5.0, left)):
            log("progress: " + "; ".join(t.progress() for t in trackers))


def fanout(tcp, http, timeout):
    n = sc.FANOUT_MESSAGES
    topic = sc.unique_name("gnsq_fanout")
    channels = ["ch_a", "ch_b"]
    log("fan-out: topic %s, channels %s, %d messages, 2 consumers per channel" % (topic, channels, n))
    sc.create_topic_channels(http, topic, channels)
    bodies = sc.make_bodies(topic, n)
    trackers = {ch: sc.ChannelTracker(ch, bodies) for ch in channels}
    done = gevent.event.Event()
    consumers = []

    def make_handler(tr, cname):
        def handler(consumer, message):
            tr.record(bytes(message.body), message.attempts, message.id, cname, message.timestamp)
            tr.fins_sent += 1  # gnsq.Consumer FINs when the handler returns
            if all(t.complete() for t in trackers.values()):
                done.set()
        return handler

    for ch in channels:
        for k, mif in enumerate((16, 200)):
            cname = "%s/%d" % (ch, k)
            c = gnsq.Consumer(topic, ch, nsqd_tcp_addresses=[tcp], name="gnsq.%s.%s" % (topic, cname),
                              message_handler=make_handler(trackers[ch], cname),
                              max_in_flight=mif, max_tries=0)
            watch_errors(c, "consumer " + cname)
            c.start(block=False)
            consumers.append(c)
    wait_for(lambda: all(len(c._connections) == 1 for c in consumers), 10, "4 consumers to connect")
    producer = start_producer(tcp)
    t0 = time.time()
    publish_mixed(Publisher(producer, topic), bodies)
    log("fan-out: published %d messages in %.1fs" % (n, time.time() - t0))
    progress_until(done, list(trackers.values()), timeout, "every message on every channel")
    log("fan-out: all delivered in %.1fs" % (time.time() - t0))
    WATCH.check()
    problems = []
    for ch, tr in trackers.items():
        problems += ["%s: %s" % (ch, p) for p in tr.problems_fanout()]
    if problems:
        raise sc.ScenarioError("fan-out: " + "; ".join(problems))
    for ch, tr in trackers.items():
        c = sc.wait_channel_drained(http, topic, ch, sc.fanout_checks(tr, n), sleep=gevent.sleep)
        log("fan-out: %s ok: %d deliveries (%d redelivered), attempts %s, stats requeue=%s timeout=%s" % (
            ch, n + tr.duplicates(), tr.duplicates(), tr.attempts_histogram(),
            c.get("requeue_count"), c.get("timeout_count")))
    KEEP.extend(consumers + [producer])


def timeout_reader(tcp, topic, channel, rdy, on_message):
    """A gnsq.NsqdTCPClient reading `topic/channel` with IDENTIFY msg_timeout 1000 ms."""
    host, port = tcp.rsplit(":", 1)
    conn = gnsq.NsqdTCPClient(host, int(port))
    conn.connect()
    conn.send(nsq_protocol.identify({
        "client_id": "gnsq-timeout", "hostname": socket.gethostname(),
        "feature_negotiation": True, "heartbeat_interval": 30000, "msg_timeout": 1000,
        "tls_v1": False, "snappy": False, "deflate": False, "user_agent": USERAGENT,
    }))
    frame, data = conn.read_response()
    if frame != nsq_protocol.FRAME_TYPE_RESPONSE:
        raise sc.ScenarioError("IDENTIFY msg_timeout=1000 failed: %r" % (data,))
    try:
        ident = json.loads(data.decode())
    except ValueError:
        raise sc.ScenarioError("IDENTIFY with feature_negotiation answered %r, not JSON" % (data,))
    if ident.get("msg_timeout") != 1000:
        raise sc.ScenarioError("IDENTIFY msg_timeout=1000 answered msg_timeout=%r" % ident.get("msg_timeout"))
    watch_errors(conn, "timeout reader")
    conn.on_message.connect(on_message, weak=False)
    conn.subscribe(topic, channel)
    frame, data = conn.read_response()
    if frame != nsq_protocol.FRAME_TYPE_RESPONSE or data != b"OK":
        raise sc.ScenarioError("SUB %s %s answered %r" % (topic, channel, data))
    conn.ready(rdy)
    gevent.spawn(conn.listen)
    return conn


def redelivery(tcp, http, timeout):
    n = sc.RETRY_MESSAGES
    topic = sc.unique_name("gnsq_retry")
    log("redelivery: topic %s, %d messages, channels requeue (REQ 0) and timeout (msg_timeout 1000ms)"
        % (topic, n))
    sc.create_topic_channels(http, topic, ["requeue", "timeout"])
    bodies = sc.make_bodies(topic, n)
    req_tr = sc.ChannelTracker("requeue", bodies)
    to_tr = sc.ChannelTracker("timeout", bodies)
    done = gevent.event.Event()

    def check_done():
        if all(len(ds) >= 2 for ds in req_tr.deliveries.values()) and req_tr.complete() and \
           all(len(ds) >= 2 for ds in to_tr.deliveries.values()) and to_tr.complete():
            done.set()

    def requeue_handler(consumer, message):
        req_tr.record(bytes(message.body), message.attempts, message.id, "requeue", message.timestamp)
        if len(req_tr.deliveries.get(bytes(message.body), [])) == 1:
            req_tr.reqs_sent += 1
            message.requeue(time_ms=0, backoff=False)
        else:
            req_tr.fins_sent += 1
            message.finish()
        check_done()

    def timeout_handler(conn, message):
        to_tr.record(bytes(message.body), message.attempts, message.id, "timeout", message.timestamp)
        if len(to_tr.deliveries.get(bytes(message.body), [])) > 1:
            to_tr.fins_sent += 1
            message.finish()
        # else: never answered, so nsqd must time it out
        check_done()

    consumer = gnsq.Consumer(topic, "requeue", nsqd_tcp_addresses=[tcp], name="gnsq.%s.requeue" % topic,
                             message_handler=requeue_handler, max_in_flight=10, max_tries=0,
                             backoff_on_requeue=False)
    watch_errors(consumer, "consumer requeue")
    consumer.start(block=False)
    conn = timeout_reader(tcp, topic, "timeout", 4 * n, timeout_handler)
    wait_for(lambda: len(consumer._connections) == 1, 10, "consumer to connect")
    producer = start_producer(tcp)
    pub = Publisher(producer, topic)
    for b in bodies:
        pub.pub(b)
    pub.drain()
    t0 = time.time()
    progress_until(done, [req_tr, to_tr], timeout, "every message redelivered on both channels")
    log("redelivery: all redelivered in %.1fs" % (time.time() - t0))
    WATCH.check()
    problems = ["requeue: " + p for p in req_tr.problems_redelivery("REQ")]
    problems += ["timeout: " + p for p in to_tr.problems_redelivery("msg_timeout")]
    if problems:
        raise sc.ScenarioError("redelivery: " + "; ".join(problems))
    sc.wait_channel_drained(http, topic, "requeue", sc.retry_checks(n, "requeue"), sleep=gevent.sleep)
    sc.wait_channel_drained(http, topic, "timeout", sc.retry_checks(n, "timeout"), sleep=gevent.sleep)
    log("redelivery: ok; requeue attempts %s, timeout attempts %s" % (
        req_tr.attempts_histogram(), to_tr.attempts_histogram()))
    KEEP.extend([consumer, conn, producer])


def main(tcp, http):
    deadline = time.time() + sc.OVERALL_TIMEOUT
    fanout(tcp, http, max(1.0, deadline - time.time()))
    redelivery(tcp, http, max(1.0, deadline - time.time()))
    WATCH.check()


if __name__ == "__main__":
    tcp, http = sc.parse_args(sys.argv, NAME)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[gnsq %(asctime)s] %(levelname)s %(name)s: %(message)s")
    log("gnsq %s, gevent %s, python %s" % (gnsq.__version__, gevent.__version__, sys.version.split()[0]))
    t0 = time.time()
    try:
        with gevent.Timeout(sc.OVERALL_TIMEOUT + 30, sc.ScenarioError("overall timeout (%ss)"
                                                                       % (sc.OVERALL_TIMEOUT + 30))):
            main(tcp, http)
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
        sys.stderr.flush()
        os._exit(1)
    log("PASS (%.1fs)" % (time.time() - t0))
    sys.stderr.flush()
    os._exit(0)  # do not wait for the consumers' greenlets
