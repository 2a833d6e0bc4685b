"""A replicated topic's leader lost, as the gevent based Python client gnsq (unmodified)
sees it (docs/replication.md).

usage: gnsq_failover.py <nsqlookupd-http-host:port> <nsqd-tcp-host:port>...

As scripts/clients/pynsq_failover.py, with gnsq: a gnsq.Producer connected to every
member publishes SCENARIO_MESSAGES (default 200) distinct messages, retrying a publish
that fails; a gnsq.Consumer finds the topic through nsqlookupd and FINs what it gets.
Once it has every acknowledged message, the script prints `KILL` on stdout and waits
for a line on stdin (the caller kills the leader meanwhile); then as many again are
published through the survivors, and the consumer must receive every acknowledged
message (redeliveries are counted, not failures).

Exit status 0 on success, 1 with a reason on stderr otherwise; gives up after
SCENARIO_TIMEOUT seconds (default 120).
"""
from gevent import monkey

monkey.patch_all()

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

import gnsq  # noqa: E402

NAME = "gnsq-failover"
N = int(os.environ.get("SCENARIO_MESSAGES", "200"))


def log(text):
    sc.log(NAME, text)


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        gevent.sleep(0.05)


def publish_all(producer, topic, bodies, acked):
    for b in bodies:
        deadline = time.time() + 30
        while True:
            try:
                producer.publish(topic, b, block=True, timeout=10, raise_error=True)
                acked.add(b)
                break
            except Exception as e:  # an error frame, no connection, a timeout
                if time.time() > deadline:
                    raise sc.ScenarioError("no member acknowledged %r: %r" % (b, e))
                gevent.sleep(0.1)


def main(lookupd, members):
    topic = sc.unique_name("gfailover")
    producer = gnsq.Producer(nsqd_tcp_addresses=members)
    producer.start()
    acked = set()
    first = [("%s:a:%05d" % (topic, i)).encode() for i in range(N)]
    publish_all(producer, topic, first, acked)
    got = {}

    def handler(consumer, message):
        b = bytes(message.body)
        got[b] = got.get(b, 0) + 1  # gnsq.Consumer FINs when the handler returns

    consumer = gnsq.Consumer(topic, "c", lookupd_http_addresses=[lookupd],
                             lookupd_poll_interval=1, lookupd_poll_jitter=0.1,
                             max_in_flight=50, max_tries=0, name="gnsq.failover")
    consumer.on_message.connect(handler, weak=False)
    consumer.start(block=False)
    wait_for(lambda: acked <= set(got), sc.OVERALL_TIMEOUT, "the first round")
    log("first round: %d acknowledged, all received; kill the leader now" % len(acked))
    sys.stdout.write("KILL\n")
    sys.stdout.flush()
    gevent.get_hub().threadpool.spawn(sys.stdin.readline).get()
    t0 = time.time()
    second = [("%s:b:%05d" % (topic, i)).encode() for i in range(N)]
    publish_all(producer, topic, second, acked)
    log("second round published through the survivors in %.2fs" % (time.time() - t0))
    wait_for(lambda: acked <= set(got), sc.OVERALL_TIMEOUT, "every acknowledged message")
    extra = set(got) - set(first) - set(second)
    if extra:
        raise sc.ScenarioError("received messages never published: %r" % sorted(extra)[:3])
    dups = sum(n - 1 for n in got.values())
    log("all %d acknowledged messages received after the failover (%.2fs), %d redelivered"
        % (len(acked), time.time() - t0, dups))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        sys.exit(2)
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
    t0 = time.time()
    try:
        with gevent.Timeout(sc.OVERALL_TIMEOUT + 30, sc.ScenarioError("overall timeout (%ss)"
                                                                       % (sc.OVERALL_TIMEOUT + 30))):
            main(sys.argv[1], sys.argv[2:])
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
        sys.stderr.flush()
        os._exit(1)
    log("PASS (%.1fs)" % (time.time() - t0))
    sys.stderr.flush()
    os._exit(0)  # do not wait for the consumer's greenlets
