#!/usr/bin/env python3
"""Replay with pynsq (beyond nsqd): POST /channel/seek moves a channel back in time.

Usage: pynsq_seek_scenario.py <tcp host:port> <http host:port>
The broker must run with --retention-time (or --retention-bytes), as scripts/test.sh
starts it. A pynsq Writer publishes 1,000 messages in two halves of 500 (MPUBs of 100),
about a second apart; a pynsq Reader consumes and FINs all of them. Once /stats shows
nothing in flight, the channel is sought to a time between the halves (RFC 3339 with
fractional seconds, taken from this host's clock in the gap), and the same Reader must get
exactly the second half again: each body once, with its first id and attempts 1, nothing
of the first half. Exit 0 on success, 1 with a reason on failure.
"""
import datetime
import os
import sys
import time
import urllib.parse

import nsq
import tornado.ioloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

TCP, HTTP = sc.parse_args(sys.argv, "pynsq_seek_scenario.py")
N = 1000
HALF = N // 2
TIMEOUT = sc.OVERALL_TIMEOUT
topic = sc.unique_name("seek")
channel = "replay"
bodies = [("%s:%04d" % (topic, i)).encode() for i in range(N)]
first_ids = {}
first_pass = []
second_pass = []
state = {"phase": 1, "seek_time": None}
errors = []
loop = tornado.ioloop.IOLoop.current()


def fail(text):
    errors.append(text)
    loop.stop()


def rfc3339(t):
    d = datetime.datetime.fromtimestamp(t, tz=datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def seek(deadline=None):
    """Phase 1 is complete: once every FIN is processed (polled without blocking the
    loop, so pynsq keeps sending), seek."""
    deadline = deadline or time.time() + 15
    c = sc.channel_stats(HTTP, topic, channel)
    if c.get("in_flight_count") != 0 or c.get("depth") != 0:
        if time.time() > deadline:
            return fail("before the seek: channel not drained: %s" % sc.summarize_channel(c))
        loop.call_later(0.1, lambda: seek(deadline))
        return
    t = sc.topic_stats(HTTP, topic)
    if "retained_messages" not in t:
        return fail("/stats has no retained_messages: start the broker with --retention-time")
    state["phase"] = 2
    q = urllib.parse.quote
    path = "/channel/seek?topic=%s&channel=%s&timestamp=%s" % (
        q(topic), q(channel), q(rfc3339(state["seek_time"])))
    code, body = sc.http(HTTP, "POST", path)
    sc.log("pynsq-seek", "POST %s -> %d %r" % (path, code, body))
    if code != 200:
        return fail("POST %s -> %d %r" % (path, code, body[:200]))
    loop.call_later(TIMEOUT, lambda: fail("timed out waiting for the replay"))


def finish_phase2():
    c = sc.channel_stats(HTTP, topic, channel)
    if c.get("depth") != 0:
        errors.append("after the replay: depth %r (want 0)" % c.get("depth"))
    loop.stop()


def handler(m):
    body = bytes(m.body)
    if state["phase"] == 1:
        first_pass.append(body)
        first_ids[body] = m.id
        if len(first_pass) == N:
            loop.add_callback(seek)
        return True
    second_pass.append((body, m.id, m.attempts))
    if len(second_pass) == HALF:
        # Anything more that arrives in the next second is an error.
        loop.call_later(1.0, finish_phase2)
    return True


def published(conn, data):
    if isinstance(data, nsq.Error):
        fail("publish error: %r" % data)


writer = nsq.Writer([TCP])
reader = nsq.Reader(message_handler=handler, nsqd_tcp_addresses=[TCP], topic=topic,
                    channel=channel, max_in_flight=100)


def publish(half):
    lo = half * HALF
    for i in range(lo, lo + HALF, 100):
        writer.mpub(topic, bodies[i:i + 100], callback=published)


def mark_and_publish_second():
    state["seek_time"] = time.time()
    sc.log("pynsq-seek", "seek time %s" % rfc3339(state["seek_time"]))
    loop.call_later(0.5, lambda: publish(1))


def start():
    try:
        sc.create_topic_channels(HTTP, topic, [channel])
    except sc.ScenarioError as e:
        return fail(str(e))
    publish(0)
    loop.call_later(0.5, mark_and_publish_second)


loop.call_later(1.0, start)
loop.call_later(TIMEOUT * 2, lambda: fail("timed out"))
nsq.run()

problems = list(errors[:5])
if sorted(first_pass) != sorted(bodies):
    problems.append("first pass: %d messages, %d distinct of %d" % (
        len(first_pass), len(set(first_pass) & set(bodies)), N))
got = [b for b, _, _ in second_pass]
want = bodies[HALF:]
if sorted(got) != sorted(want):
    early = [b for b in got if b in set(bodies[:HALF])]
    problems.append("replay: %d messages, %d distinct of the %d wanted, %d of the first half" % (
        len(got), len(set(got) & set(want)), len(want), len(early)))
bad_attempts = [(b, a) for b, _, a in second_pass if a != 1]
if bad_attempts:
    problems.append("replay attempts != 1: %r" % bad_attempts[:3])
bad_ids = [b for b, i, _ in second_pass if first_ids.get(b) != i]
if bad_ids:
    problems.append("replay ids differ from the first delivery: %r" % bad_ids[:3])
if problems:
    print("FAIL pynsq-seek: %s" % " | ".join(problems))
    sys.exit(1)
print("PASS pynsq-seek: %d consumed and FIN'd, seek to %s replayed exactly the %d after it"
      % (N, rfc3339(state["seek_time"]), HALF))
