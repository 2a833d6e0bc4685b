#!/usr/bin/env python3
"""pynsq with snappy=True (or deflate=True) on both sides: IDENTIFY negotiates the
compression, then every byte in both directions is compressed, also after the broker
hands the connections to the shard that owns the topic.

Usage: pynsq_snappy_scenario.py <tcp host:port> <http host:port> [snappy|deflate]
Publishes 2,000 messages (small, incompressible and large compressible bodies) with a
snappy Writer via MPUB and PUB; a snappy Reader must receive every one, and /stats must
show the consumer with snappy true. Exit 0 on success, 1 with a reason on failure.
"""
import json
import os
import random
import sys
import time
import urllib.request

import nsq
import tornado.ioloop

TCP, HTTP = sys.argv[1], sys.argv[2]
MODE = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("PYNSQ_COMPRESSION", "snappy")
OPTS = {"snappy": True} if MODE == "snappy" else {"deflate": True, "deflate_level": 6}
N = 2000
TIMEOUT = float(os.environ.get("SCENARIO_TIMEOUT", "120"))
topic = "%s_%d" % (MODE, int(time.time() * 1000) % 10_000_000)
rnd = random.Random(7)
bodies = []
for i in range(N):
    b = b"snappy-%05d-" % i
    if i % 3 == 1:
        b += bytes(rnd.getrandbits(8) for _ in range(500))
    elif i % 3 == 2:
        b += b"all work and no play " * 400
    bodies.append(b)
want = set(bodies)
got = set()
errors = []
loop = tornado.ioloop.IOLoop.current()
snappy_seen = []


def check_stats():
    try:
        d = json.load(urllib.request.urlopen("http://%s/stats?format=json&topic=%s" % (HTTP, topic)))
        for t in d["topics"] or []:
            for ch in t["channels"]:
                for c in ch["clients"] or []:
                    snappy_seen.append(c[MODE])
    except Exception as e:  # noqa: BLE001
        errors.append("stats: %r" % e)


def handler(m):
    got.add(m.body)
    if len(got) == len(want):
        check_stats()
        loop.stop()
    return True


def done(conn, data):
    if isinstance(data, nsq.Error):
        errors.append("publish error: %r" % data)


writer = nsq.Writer([TCP], **OPTS)
nsq.Reader(message_handler=handler, nsqd_tcp_addresses=[TCP], topic=topic, channel="c",
           max_in_flight=200, **OPTS)


def publish():
    writer.mpub(topic, bodies[: N // 2], callback=done)
    for b in bodies[N // 2:]:
        writer.pub(topic, b, callback=done)


loop.call_later(1.0, publish)
loop.call_later(TIMEOUT, loop.stop)
nsq.run()
fail = []
if errors:
    fail.append("; ".join(errors[:5]))
if got != want:
    fail.append("received %d of %d distinct messages" % (len(got & want), len(want)))
if snappy_seen != [True]:
    fail.append("/stats clients %s: %r (want [True])" % (MODE, snappy_seen))
if fail:
    print("FAIL pynsq %s: %s" % (MODE, " | ".join(fail)))
    sys.exit(1)
print("PASS pynsq %s: %d messages over %s connections" % (MODE, N, MODE))
