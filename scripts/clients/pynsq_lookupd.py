#!/usr/bin/env python3
"""pynsq (unmodified) discovering the broker through this repository's nsqlookupd.

usage: pynsq_lookupd.py <nsqd-binary> <nsqlookupd-binary> [shards]

Starts nsqlookupd and then nsqd (--shards, default 2; --broadcast-address=127.0.0.1,
--lookupd-tcp-address pointing at that nsqlookupd) on loopback ports chosen by the kernel,
with a temporary data path, and then:

1. discovery before the topic exists: an nsq.Reader with only lookupd_http_addresses
   (lookupd_poll_interval 1 s) polls /lookup while the topic does not exist yet (404);
   SCENARIO_LOOKUPD_MESSAGES (default 500) messages are then published with nsq.Writer
   to the nsqd TCP address. The Reader must find the producer through nsqlookupd,
   connect to nsqd's broadcast address and TCP port, and receive and FIN every
   message (the first channel gets the topic's backlog).
2. discovery of an existing topic: a second Reader on another channel finds the broker
   and gets every message published after it connected.
3. nsqlookupd must list the topic, both channels and the producer with nsqd's ports.

Exit status 0 on success, 1 with the reason on stderr; both daemons are stopped at exit.
Gives up after SCENARIO_TIMEOUT seconds (default 120).
"""
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

import nsq  # noqa: E402
import tornado  # noqa: E402

NAME = "pynsq-lookupd"
MESSAGES = int(os.environ.get("SCENARIO_LOOKUPD_MESSAGES", "500"))
WATCH = sc.ClientLogWatch("nsq")
KEEP = []


def log(text):
    sc.log(NAME, text)


async def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        WATCH.check()
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        await asyncio.sleep(0.05)


async def in_thread(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args))


def lookup(lookupd_http, topic):
    """(status, JSON) of nsqlookupd GET /lookup?topic=."""
    status, body = sc.http(lookupd_http, "GET", "/lookup?topic=" + topic)
    try:
        return status, json.loads(body or b"null")
    except ValueError:
        return status, None


class Sink:
    def __init__(self, name):
        self.name = name
        self.bodies = {}
        self.conns = set()

    def handler(self, message):
        self.bodies[bytes(message.body)] = self.bodies.get(bytes(message.body), 0) + 1
        return True  # pynsq FINs the message


async def publish(tcp, topic, bodies):
    w = nsq.Writer([tcp], reconnect_interval=1.0)
    KEEP.append(w)
    await wait_for(lambda: any(c.connected() for c in w.conns.values()), 10, "nsq.Writer to connect")
    pending = {"n": 0, "err": []}

    def cb(conn, data):
        pending["n"] -= 1
        if isinstance(data, Exception) or data != b"OK":
            pending["err"].append(repr(data))

    for i in range(0, len(bodies), 50):
        pending["n"] += 1
        w.mpub(topic, bodies[i:i + 50], callback=cb)
    await wait_for(lambda: pending["n"] == 0 or pending["err"], 30, "MPUB responses")
    if pending["err"]:
        raise sc.ScenarioError("publish failed: %s" % pending["err"][:3])


async def scenario(nsqd, lookupd, timeout):
    topic = sc.unique_name("pynsq_lookupd")
    lk = "http://%s" % lookupd.http
    log("topic %s; nsqd tcp %s http %s; nsqlookupd tcp %s http %s" % (
        topic, nsqd.tcp, nsqd.http, lookupd.tcp, lookupd.http))
    status, _ = await in_thread(lookup, lookupd.http, topic)
    if status != 404:
        raise sc.ScenarioError("lookupd /lookup of a new topic: %s, want 404" % status)

    # 1. the Reader polls lookupd before the topic exists
    first = Sink("first")
    r1 = nsq.Reader(topic=topic, channel="first", name=topic + ":first",
                    message_handler=first.handler, lookupd_http_addresses=[lk],
                    lookupd_poll_interval=1, lookupd_poll_jitter=0.1, max_in_flight=100)
    KEEP.append(r1)
    await asyncio.sleep(1.5)
    if r1.conns:
        raise sc.ScenarioError("Reader connected before the topic existed: %s" % list(r1.conns))
    bodies = sc.make_bodies(topic, MESSAGES)
    await publish(nsqd.tcp, topic, bodies)
    log("published %d messages; waiting for the Reader to find nsqd through nsqlookupd" % MESSAGES)
    await wait_for(lambda: len(r1.conns) == 1, min(timeout, 15), "the Reader to find nsqd via lookupd")
    want = "127.0.0.1:%s" % nsqd.tcp.rsplit(":", 1)[1]
    if list(r1.conns) != [want]:
        raise sc.ScenarioError("Reader connected to %s, want [%s]" % (list(r1.conns), want))
    await wait_for(lambda: len(first.bodies) == len(bodies), timeout, "every message on channel first")
    missing = [b for b in bodies if b not in first.bodies]
    if missing:
        raise sc.ScenarioError("%d messages missing" % len(missing))
    log("1. discovered and consumed %d messages (%d redelivered)" % (
        len(bodies), sum(first.bodies.values()) - len(bodies)))

    # 2. a second Reader on an existing topic
    second = Sink("second")
    r2 = nsq.Reader(topic=topic, channel="second", name=topic + ":second",
                    message_handler=second.handler, lookupd_http_addresses=[lk],
                    lookupd_poll_interval=1, lookupd_poll_jitter=0.1, max_in_flight=100)
    KEEP.append(r2)
    await wait_for(lambda: len(r2.conns) == 1, 15, "the second Reader to find nsqd")
    # its SUB has created the channel once nsqd lists it
    await wait_for(lambda: any(c.get("channel_name") == "second"
                               for c in (sc.topic_stats(nsqd.http, topic) or {}).get("channels") or []),
                   10, "channel second in nsqd /stats")
    more = [b + b":again" for b in bodies[:100]]
    await publish(nsqd.tcp, topic, more)
    await wait_for(lambda: all(b in second.bodies for b in more), timeout, "every message on channel second")
    log("2. second Reader discovered nsqd and consumed %d messages" % len(more))

    # 3. what nsqlookupd holds
    def registered():
        status, data = lookup(lookupd.http, topic)
        if status != 200 or not data:
            return False
        ports = [(p.get("broadcast_address"), p.get("tcp_port"), p.get("http_port"))
                 for p in data.get("producers") or []]
        return (sorted(data.get("channels") or []) == ["first", "second"]
                and ports == [("127.0.0.1", int(nsqd.tcp.rsplit(":", 1)[1]),
                               int(nsqd.http.rsplit(":", 1)[1]))])
    await wait_for(registered, 10, "nsqlookupd to list the topic, both channels and nsqd")
    log("3. nsqlookupd lists topic, channels first and second, and the producer")
    WATCH.check()


def main():
    if len(sys.argv) not in (3, 4):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        sys.exit(2)
    nsqd_bin, lookupd_bin = sys.argv[1], sys.argv[2]
    shards = sys.argv[3] if len(sys.argv) == 4 else "2"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[pynsq %(asctime)s] %(levelname)s %(name)s: %(message)s")
    log("pynsq %s, tornado %s, python %s, shards %s" % (
        nsq.__version__, tornado.version, sys.version.split()[0], shards))
    work = tempfile.mkdtemp(prefix="pynsq-lookupd-")
    daemons = []
    t0 = time.time()
    ok = False
    try:
        lookupd = sc.Daemon("nsqlookupd", [lookupd_bin], os.path.join(work, "nsqlookupd.log"))
        daemons.append(lookupd)
        nsqd = sc.Daemon("nsqd", [nsqd_bin,
                               "--shards=%s" % shards, "--broadcast-address=127.0.0.1",
                               "--lookupd-tcp-address=%s" % lookupd.tcp,
                               "--data-path=%s" % os.path.join(work, "data")],
                         os.path.join(work, "nsqd.log"))
        daemons.append(nsqd)
        asyncio.run(asyncio.wait_for(scenario(nsqd, lookupd, sc.OVERALL_TIMEOUT),
                                     sc.OVERALL_TIMEOUT + 30))
        ok = True
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
    except asyncio.TimeoutError:
        log("FAIL: overall timeout (%ss)" % (sc.OVERALL_TIMEOUT + 30))
    finally:
        for d in reversed(daemons):
            d.stop()
        if not ok:
            for d in daemons:
                log("%s log (last lines):" % d.name)
                with open(d.logpath) as f:
                    for line in f.readlines()[-15:]:
                        sys.stderr.write("    " + line)
        shutil.rmtree(work, ignore_errors=True)
    if not ok:
        sys.exit(1)
    log("PASS (%.1fs)" % (time.time() - t0))


if __name__ == "__main__":
    main()
