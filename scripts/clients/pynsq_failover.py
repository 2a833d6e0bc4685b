#!/usr/bin/env python3
"""A replicated topic's leader lost, as the official Python client (pynsq, unmodified)
sees it (docs/replication.md).

usage: pynsq_failover.py <nsqlookupd-http-host:port> <nsqd-tcp-host:port>...

An nsq.Writer connected to every member publishes SCENARIO_MESSAGES (default 200)
distinct messages, retrying a publish that fails on another member, and an nsq.Reader
that finds the topic through nsqlookupd (the leader alone is registered) receives and
FINs them. Once it has every acknowledged one, the script prints `KILL` on stdout and
waits for a line on stdin: the caller kills the leader with SIGKILL meanwhile. Then the
writer publishes as many again through the surviving members, and the reader, its
connection to the old leader gone, must find the new leader on its next nsqlookupd poll
and receive every acknowledged message of both rounds not yet received (messages
redelivered after the failover are counted, not failures).

With SCENARIO_DEFERRED=N (N > 0): before the first round the writer publishes N
messages with DPUB and an hour's delay to the reader's channel, more unfinished
messages than a leader replicates whole each round, so the channel's state goes to the
replicas as its changes (docs/replication.md, "Channel state"). The script then waits
1 s after the first round (ten rounds of channel state) before `KILL`, and fails if any
message of the first round is delivered again after the failover, or any deferred one
at all: the new leader must know what was finished and what is deferred.

With SCENARIO_MOVES=1 the leader is moved instead of killed: after the first round the
writer publishes the second round while the script prints `MOVE` and waits for a line
on stdin (the caller moves the leadership round the members meanwhile, with
`POST /topic/move-leader`). Then no publish may have been refused, and every
connection the reader had before the moves must still be up (a member that stops
leading relays its consumers to the new leader instead of closing them), and no message
may come twice (a leader hands over once its consumers finished what they held).

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

NAME = "pynsq-failover"
KEEP = []
N = int(os.environ.get("SCENARIO_MESSAGES", "200"))
DEFERRED = int(os.environ.get("SCENARIO_DEFERRED", "0"))
MOVES = os.environ.get("SCENARIO_MOVES", "") == "1"
# Publishes answered with an error or not at all, and tried again.
REFUSED = []


def log(text):
    sc.log(NAME, text)


async def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        await asyncio.sleep(0.05)


async def publish_all(writer, topic, bodies, acked):
    """Publishes each body until some member answers OK."""
    for b in bodies:
        deadline = time.time() + 30
        while True:
            answer = []
            try:
                writer.pub(topic, b, callback=lambda conn, data: answer.append(data))
            except Exception as e:  # no connection at the moment
                answer.append(e)
            start = time.time()
            while not answer and time.time() - start < 10:
                await asyncio.sleep(0.005)
            if answer and not isinstance(answer[0], Exception):
                acked.add(b)
                break
            REFUSED.append(answer[0] if answer else "no answer in 10 s")
            if time.time() > deadline:
                raise sc.ScenarioError("no member acknowledged %r: %r" % (b, answer))
            await asyncio.sleep(0.1)


async def main(lookupd, members):
    topic = sc.unique_name("failover")
    writer = nsq.Writer(members, reconnect_interval=0.5)
    KEEP.append(writer)
    await wait_for(lambda: sum(c.connected() for c in writer.conns.values()) == len(members),
                   20, "nsq.Writer to connect to every member")
    acked = set()
    first = [("%s:a:%05d" % (topic, i)).encode() for i in range(N)]
    got = {}

    # Each body's deliveries as (message ID, attempts): what a failure names.
    deliveries = {}

    def handler(message):
        b = bytes(message.body)
        got[b] = got.get(b, 0) + 1
        deliveries.setdefault(b, []).append((bytes(message.id).decode(), message.attempts))
        return True  # pynsq FINs the message

    readers = []

    def start_reader():
        readers.append(nsq.Reader(topic=topic, channel="c", name="failover",
                               message_handler=handler, lookupd_http_addresses=[lookupd],
                               lookupd_poll_interval=1, lookupd_poll_jitter=0.1,
                               max_in_flight=50, max_tries=0))
        KEEP.append(readers[-1])

    if DEFERRED:
        # The channel first (the warm-up message makes the topic; the reader makes the
        # channel once nsqlookupd lists the topic), then the deferred messages.
        warm = ("%s:warm" % topic).encode()
        await publish_all(writer, topic, [warm], acked)
        start_reader()
        await wait_for(lambda: warm in got, sc.OVERALL_TIMEOUT, "the warm-up message")
        done = []
        for i in range(DEFERRED):
            writer.dpub(topic, 3600 * 1000, ("%s:d:%06d" % (topic, i)).encode(),
                        callback=lambda conn, data: done.append(data))
            if i % 500 == 499:
                await wait_for(lambda: len(done) >= i + 1, 60, "DPUBs answered")
        await wait_for(lambda: len(done) >= DEFERRED, 60, "DPUBs answered")
        failed = [d for d in done if isinstance(d, Exception)]
        if failed:
            raise sc.ScenarioError("a DPUB failed: %r" % failed[0])
        log("%d messages deferred for an hour" % DEFERRED)
    await publish_all(writer, topic, first, acked)
    if not DEFERRED:
        start_reader()
    await wait_for(lambda: acked <= set(got), sc.OVERALL_TIMEOUT, "the first round")
    if DEFERRED:
        await asyncio.sleep(1)
    before_kill = dict(got)
    second = [("%s:b:%05d" % (topic, i)).encode() for i in range(N)]
    if MOVES:
        conns = dict(readers[0].conns)
        refused_before = len(REFUSED)
        log("first round: %d acknowledged, all received; the reader has %d connection(s); "
            "move the leadership now" % (len(acked), len(conns)))
        t0 = time.time()
        publishing = asyncio.ensure_future(publish_all(writer, topic, second, acked))
        print("MOVE", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await publishing
        log("second round published across the moves in %.2fs" % (time.time() - t0))
        if len(REFUSED) > refused_before:
            raise sc.ScenarioError("%d publishes refused or unanswered during the moves, "
                                   "e.g. %r" % (len(REFUSED) - refused_before,
                                                REFUSED[refused_before]))
    else:
        log("first round: %d acknowledged, all received; kill the leader now" % len(acked))
        print("KILL", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        t0 = time.time()
        await publish_all(writer, topic, second, acked)
        log("second round published through the survivors in %.2fs" % (time.time() - t0))
    await wait_for(lambda: acked <= set(got), sc.OVERALL_TIMEOUT, "every acknowledged message")
    extra = set(got) - set(first) - set(second) - {("%s:warm" % topic).encode()}
    if extra:
        raise sc.ScenarioError("received messages never published: %r" % sorted(extra)[:3])
    dups = sum(n - 1 for n in got.values())
    if MOVES:
        gone = [a for a, c in conns.items()
                if readers[0].conns.get(a) is not c or not c.connected()]
        if gone:
            raise sc.ScenarioError("the reader's connection(s) to %s closed across the moves"
                                   % gone)
        if dups:
            raise sc.ScenarioError("%d messages delivered again across the moves (a leader "
                                   "hands over once its consumers finished what they "
                                   "held), e.g. %r"
                                   % (dups, [(b, deliveries[b]) for b, n in got.items()
                                             if n > 1][:3]))
    if DEFERRED:
        again = [b for b in first if got.get(b, 0) > before_kill.get(b, 0)]
        if again:
            raise sc.ScenarioError("%d finished messages of the first round delivered again "
                                   "after the failover, e.g. %r" % (len(again), again[0]))
        early = [b for b in got if b"%s:d:" % topic.encode() in b]
        if early:
            raise sc.ScenarioError("%d deferred messages delivered, e.g. %r"
                                   % (len(early), early[0]))
    log("all %d acknowledged messages received after the %s (%.2fs), %d redelivered"
        % (len(acked), "moves" if MOVES else "failover", time.time() - t0, dups))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
    t0 = time.time()
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2:]), sc.OVERALL_TIMEOUT + 30))
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
        sys.exit(1)
    except asyncio.TimeoutError:
        log("FAIL: overall timeout (%ss)" % (sc.OVERALL_TIMEOUT + 30))
        sys.exit(1)
    log("PASS (%.1fs)" % (time.time() - t0))
