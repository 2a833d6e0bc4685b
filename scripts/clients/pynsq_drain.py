#!/usr/bin/env python3
"""A drain (docs/draining.md) as the official Python client (pynsq, unmodified) sees it.

usage: pynsq_drain.py <nsqd-tcp-host:port> <nsqd-http-host:port>

A backlog of SCENARIO_MESSAGES (default 2,000) distinct messages waits in a topic's
channel with no consumer; `PUT /config/drain` starts the drain. Then an nsq.Writer's
publish must fail with E_PUB_FAILED, while two nsq.Reader consumers of the channel
receive every message of the backlog (each FIN'd by pynsq) and nothing else; the broker
must then go away on its own (its TCP port stops answering), which the caller checks
for exit status 0.

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

NAME = "pynsq-drain"
KEEP = []
N = int(os.environ.get("SCENARIO_MESSAGES", "2000"))


def log(text):
    sc.log(NAME, text)


async def in_thread(fn, *args, **kw):
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kw))


async def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        await asyncio.sleep(0.05)


async def main(tcp, http):
    topic = sc.unique_name("drain")
    await in_thread(sc.create_topic_channels, http, topic, ["c"])
    bodies = [("%s:%06d" % (topic, i)).encode() for i in range(N)]
    for i in range(0, N, 500):
        code, body = await in_thread(sc.http, http, "POST", "/mpub?topic=%s" % topic,
                                     b"\n".join(bodies[i:i + 500]) + b"\n")
        if code != 200:
            raise sc.ScenarioError("/mpub -> %d %r" % (code, body[:200]))
    code, body = await in_thread(sc.http, http, "PUT", "/config/drain")
    if code != 200:
        raise sc.ScenarioError("PUT /config/drain -> %d %r" % (code, body[:200]))
    log("backlog of %d messages in %s/c; draining" % (N, topic))

    # The producer is refused.
    writer = nsq.Writer([tcp], reconnect_interval=1.0)
    KEEP.append(writer)
    await wait_for(lambda: any(c.connected() for c in writer.conns.values()), 10,
                   "nsq.Writer to connect")
    answers = []
    writer.pub(topic, b"late", callback=lambda conn, data: answers.append(data))
    await wait_for(lambda: answers, 10, "the publish's answer")
    if not isinstance(answers[0], nsq.Error) or "E_PUB_FAILED" not in str(answers[0]):
        raise sc.ScenarioError("publish while draining answered %r, not E_PUB_FAILED" % answers[0])
    log("producer refused: %s" % answers[0])

    # The consumers receive the whole backlog.
    got = {}

    def handler(message):
        b = bytes(message.body)
        got[b] = got.get(b, 0) + 1
        return True  # pynsq FINs the message

    for k, mif in enumerate((16, 100)):
        KEEP.append(nsq.Reader(topic=topic, channel="c", name="drain%d" % k,
                               message_handler=handler, nsqd_tcp_addresses=[tcp],
                               max_in_flight=mif, max_tries=0))
    await wait_for(lambda: len(got) == N, sc.OVERALL_TIMEOUT, "every message of the backlog")
    extra = set(got) - set(bodies)
    if extra:
        raise sc.ScenarioError("received messages not in the backlog: %r" % sorted(extra)[:3])
    log("consumers received all %d messages" % N)
    # The broker exits once their FINs are in.
    await wait_for(lambda: not sc.port_answers(tcp), 30, "the broker to exit after the drain")
    log("the broker went away")


if __name__ == "__main__":
    tcp, http = sc.parse_args(sys.argv, NAME)
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
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
