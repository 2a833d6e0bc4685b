#!/usr/bin/env python3
"""Dead letters with pynsq (beyond nsqd): a handler that always fails.

Usage: pynsq_dead_letter_scenario.py <tcp host:port> <http host:port>
The broker must run with --max-attempts=3 (tests/it/dead_letters.rs starts it so). A
pynsq Writer publishes 50 distinct messages (MPUBs of 10); a pynsq Reader whose handler
always returns False (pynsq then REQs; requeue_delay 0 and a 10 ms backoff, so it is quick,
and max_tries 0 so pynsq itself never gives up) must see each message exactly 3 times,
with attempts 1, 2, 3. /stats must then show dead_count 50 on the channel, nothing in
flight or ready, and a second Reader on <topic>.dead must get the same 50 bodies.
Exit 0 on success, 1 with a reason on failure.
"""
import collections
import os
import sys
import time

import nsq
import tornado.ioloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

TCP, HTTP = sc.parse_args(sys.argv, "pynsq_dead_letter_scenario.py")
N = 50
MAX = 3
topic = sc.unique_name("dlq")
channel = "always_fails"
bodies = sc.make_bodies(topic, N)
deliveries = collections.defaultdict(list)  # body -> attempts of each delivery
dead = []
errors = []
loop = tornado.ioloop.IOLoop.current()


def fail(text):
    errors.append(text)
    loop.stop()


def failing_handler(m):
    deliveries[bytes(m.body)].append(m.attempts)
    return False


def dead_handler(m):
    dead.append(bytes(m.body))
    if len(dead) == N:
        # Anything more within half a second is a duplicate.
        loop.call_later(0.5, loop.stop)
    return True


def published(conn, data):
    if isinstance(data, nsq.Error):
        fail("publish error: %r" % data)


def wait_dead_count(deadline):
    try:
        c = sc.channel_stats(HTTP, topic, channel)
    except sc.ScenarioError as e:
        return fail(str(e))
    if c.get("dead_count") == N:
        if c.get("depth") != 0 or c.get("in_flight_count") != 0:
            return fail("dead-lettered but still held: %s" % sc.summarize_channel(c))
        sc.log("pynsq-dead-letter", "dead_count %d; reading %s.dead" % (N, topic))
        nsq.Reader(message_handler=dead_handler, nsqd_tcp_addresses=[TCP],
                   topic=topic + ".dead", channel="audit", max_in_flight=100)
        return
    if time.time() > deadline:
        return fail("dead_count %r after %ds (want %d): %s" % (
            c.get("dead_count"), sc.OVERALL_TIMEOUT, N, sc.summarize_channel(c)))
    loop.call_later(0.1, lambda: wait_dead_count(deadline))


writer = nsq.Writer([TCP])
reader = nsq.Reader(message_handler=failing_handler, nsqd_tcp_addresses=[TCP], topic=topic,
                    channel=channel, max_in_flight=20, max_tries=0, requeue_delay=0,
                    max_backoff_duration=0.01)


def start():
    try:
        sc.create_topic_channels(HTTP, topic, [channel])
    except sc.ScenarioError as e:
        return fail(str(e))
    for i in range(0, N, 10):
        writer.mpub(topic, bodies[i:i + 10], callback=published)
    wait_dead_count(time.time() + sc.OVERALL_TIMEOUT)


loop.call_later(1.0, start)
loop.call_later(sc.OVERALL_TIMEOUT * 2, lambda: fail("timed out"))
nsq.run()

problems = list(errors[:5])
wrong = [(b[:40], a) for b, a in deliveries.items() if a != list(range(1, MAX + 1))]
if wrong or len(deliveries) != N:
    problems.append("%d bodies delivered, %d not exactly attempts 1..%d: %r" % (
        len(deliveries), len(wrong), MAX, wrong[:3]))
if sorted(dead) != sorted(bodies):
    problems.append("%s.dead: %d messages, %d distinct of %d" % (
        topic, len(dead), len(set(dead) & set(bodies)), N))
if problems:
    print("FAIL pynsq-dead-letter: %s" % " | ".join(problems))
    sys.exit(1)
print("PASS pynsq-dead-letter: %d messages failed %d times each and all reached %s.dead"
      % (N, MAX, topic))
