#!/usr/bin/env python3
"""Replicated publishing side by side with standalone, and failover time
(BENCHMARKS.md, "Replication"). Standard library only.

  scripts/bench-replication.py [--broker target/release/nsqd]
                               [--bench target/release/nsq-bench]
                               [--runfor 10s] [--sizes 200,4096] [--failovers 5]
                               [--node-cpus 0,1,2 --bench-cpus 3-6]
                               [--sync-every N] [--topics N] [--bench-args ARGS]

For each message size: `nsq-bench pubsub` (one producer, one consumer, MPUB batches, the
bench's defaults otherwise) against one standalone broker, then against the leader of a
topic replicated on a 3-node cluster on this host (factor 3, `--replication-ack=quorum`,
each node `--shards 1`). Prints msgs/s and p99 of both and their ratio. Then, on the
cluster, `--failovers` times: kill -9 the topic's leader and time (a) until a publish
through a surviving node is answered 200 and (b) until GET /cluster names a new leader;
the killed node is restarted at once on its data path before the next round.

Without --node-cpus every process runs on every CPU. With it (three taskset CPU lists,
comma-separated, e.g. `0,1,2` or `0-1,2-3,4-5` with `--shards 2`), node i runs under
`taskset -c` its list, and the standalone broker under node 1's; `--bench-cpus` does the
same for nsq-bench. On a host with enough cores this gives each broker its own CPUs, so
the ratio shows what replication costs rather than three brokers sharing cores.

Every broker runs on a fresh data path under $TMPDIR with the default sync policy, or
with `--sync-every N` when given (`--sync-every 1`: each publish synced before its
answer; replicated, each replica also syncs its Raft log's journal). With `--topics N`
(N > 1) nsq-bench publishes to and consumes from N topics, and in the cluster it is given
every member's address (producers round-robin over them, consumers connect to each: the
topics' leaders are spread over the members, and a member forwards a publish or relays
a consumer it does not lead).
The disk's O_DIRECT write speed (dd) is printed first: durable figures depend on it.
"""

import argparse
import http.client as httpclient
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Ports below the ephemeral range: a killed node is started again on its own.
from cluster_lib import free_port  # noqa: E402


def answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def http(port, method, path, body=b""):
    c = httpclient.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body)
        r = c.getresponse()
        return r.status, r.read()
    except OSError as e:
        return 0, str(e).encode()
    finally:
        c.close()


# Every broker started, stopped when the script ends however it ends (a failed bench
# exits through sys.exit).
NODES = []


class Node:
    def __init__(self, binary, data, extra, cpus=None, shards=1):
        self.binary, self.data, self.extra = binary, data, list(extra)
        self.cpus, self.shards = cpus, shards
        self.tcp, self.http = free_port(), free_port()
        self.proc = None
        NODES.append(self)

    def start(self):
        os.makedirs(self.data, exist_ok=True)
        log = open(os.path.join(self.data, "..", os.path.basename(self.data) + ".log"), "ab")
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        self.proc = subprocess.Popen(
            pin + [self.binary, "--shards=%d" % self.shards, "--data-path=" + self.data,
             "--tcp-address=127.0.0.1:%d" % self.tcp,
             "--http-address=127.0.0.1:%d" % self.http] + self.extra,
            stdout=log, stderr=log)
        deadline = time.time() + 60
        while not (answers(self.tcp) and answers(self.http)):
            if self.proc.poll() is not None or time.time() > deadline:
                sys.exit("broker %s did not start" % self.data)
            time.sleep(0.01)

    def kill9(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def cluster(binary, root, cpus, shards, extra):
    addrs = ["127.0.0.1:%d" % free_port() for _ in range(3)]
    nodes = []
    for i, a in enumerate(addrs):
        peers = ["--cluster-peer=" + p for p in addrs if p != a]
        nodes.append(Node(binary, os.path.join(root, "node%d" % i),
                          ["--node-id=%d" % (i + 1), "--cluster-address=" + a] + peers + extra,
                          cpus[i], shards))
    for n in nodes:
        n.start()
    return nodes, addrs


def leader_of(nodes, addrs, topic):
    for n in nodes:
        if n.proc is None:
            continue
        code, body = http(n.http, "GET", "/cluster")
        if code != 200:
            continue
        for t in json.loads(body).get("topics", []):
            if t["topic"] == topic and t.get("leader"):
                i = addrs.index(t["leader"])
                if nodes[i].proc is not None:
                    return i
    return None


def wait_leader(nodes, addrs, topic, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        i = leader_of(nodes, addrs, topic)
        if i is not None:
            return i
        time.sleep(0.02)
    sys.exit("no leader for %s" % topic)


def bench(binary, ports, topic, size, runfor, cpus, topics=1, extra=()):
    pin = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run(
        pin + [binary, "pubsub"] + ["--nsqd-tcp-address=127.0.0.1:%d" % p for p in ports]
        + ["--topic", topic, "--topics", str(topics),
           "--size", str(size), "--runfor", runfor, "--json"] + list(extra),
        capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit("nsq-bench failed:\n" + out.stdout[-2000:] + out.stderr[-2000:])
    # The JSON report is the first line; the human-readable one follows.
    return json.loads(out.stdout.splitlines()[0])


def figures(r):
    """(msgs/s consumed, p99 publish-to-delivery latency in ms) of an nsq-bench report."""
    return r["sub_msgs_per_sec"], r["latency_us"]["p99"] / 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default=os.path.join(ROOT, "target/release/nsqd"))
    ap.add_argument("--bench", default=os.path.join(ROOT, "target/release/nsq-bench"))
    ap.add_argument("--runfor", default="10s")
    ap.add_argument("--sizes", default="200,4096")
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--shards", type=int, default=1, help="--shards of every broker")
    ap.add_argument("--node-cpus", default="",
                    help="taskset CPU lists of nodes 1, 2 and 3, separated by '|' or ','")
    ap.add_argument("--bench-cpus", default="", help="taskset CPU list of nsq-bench")
    ap.add_argument("--topics", type=int, default=1, help="topics nsq-bench uses")
    ap.add_argument("--bench-args", default="",
                    help="more nsq-bench arguments for both runs, e.g. '--pipeline 16'")
    ap.add_argument("--sync-every", type=int, default=0,
                    help="--sync-every of every broker (0: the broker's default)")
    a = ap.parse_args()
    cpus = [None, None, None]
    if a.node_cpus:
        parts = a.node_cpus.split("|") if "|" in a.node_cpus else a.node_cpus.split(",")
        if len(parts) != 3:
            sys.exit("--node-cpus wants three CPU lists")
        cpus = parts
    bcpus = a.bench_cpus or None
    extra = ["--sync-every=%d" % a.sync_every] if a.sync_every else []
    root = tempfile.mkdtemp(prefix="bench-replication-")
    try:
        dd = subprocess.run(["dd", "if=/dev/zero", "of=" + os.path.join(root, "dd.bin"),
                             "bs=1M", "count=1024", "oflag=direct"],
                            capture_output=True, text=True, check=False)
        print("disk: " + (dd.stderr.strip().splitlines() or ["?"])[-1])
        os.remove(os.path.join(root, "dd.bin"))
        print("cpus: %d; nodes on %s, nsq-bench on %s; --shards %d; %s" % (
            os.cpu_count(), "|".join(c or "all" for c in cpus), bcpus or "all", a.shards,
            " ".join(extra) or "default sync policy"))
        for size in [int(s) for s in a.sizes.split(",")]:
            one = Node(a.broker, os.path.join(root, "standalone-%d" % size), extra, cpus[0],
                       a.shards)
            one.start()
            r1 = bench(a.bench, [one.tcp], "bench_%d" % size, size, a.runfor, bcpus, a.topics,
                       shlex.split(a.bench_args))
            one.kill9()
            nodes, addrs = cluster(a.broker, os.path.join(root, "cluster-%d" % size), cpus,
                                   a.shards, extra)
            topic = "bench_%d" % size
            if a.topics > 1:
                names = ["%s-%d" % (topic, k) for k in range(a.topics)]
                for k, name in enumerate(names):
                    http(nodes[k % 3].http, "POST", "/topic/create?topic=" + name)
                for name in names:
                    wait_leader(nodes, addrs, name)
                ports = [n.tcp for n in nodes]
            else:
                http(nodes[0].http, "POST", "/topic/create?topic=" + topic)
                ports = [nodes[wait_leader(nodes, addrs, topic)].tcp]
            r3 = bench(a.bench, ports, topic, size, a.runfor, bcpus, a.topics,
                       shlex.split(a.bench_args))
            for n in nodes:
                n.kill9()
            (s_rate, s_p99), (c_rate, c_p99) = figures(r1), figures(r3)
            print("size=%d standalone: %.0f msgs/s p99 %.2f ms | replicated x3 quorum: %.0f msgs/s "
                  "p99 %.2f ms | throughput ratio %.2f" % (size, s_rate, s_p99, c_rate, c_p99,
                                                            c_rate / s_rate))
        if a.failovers < 1:
            return
        nodes, addrs = cluster(a.broker, os.path.join(root, "failover"), cpus, a.shards, extra)
        topic = "failover"
        http(nodes[0].http, "POST", "/pub?topic=" + topic, b"x")
        accept, elect = [], []
        for k in range(a.failovers):
            lead = wait_leader(nodes, addrs, topic)
            other = nodes[(lead + 1) % 3]
            t0 = time.time()
            nodes[lead].kill9()
            while http(other.http, "POST", "/pub?topic=" + topic, b"y")[0] != 200:
                time.sleep(0.005)
            accept.append(time.time() - t0)
            while leader_of(nodes, addrs, topic) is None:
                time.sleep(0.005)
            elect.append(time.time() - t0)
            nodes[lead].start()
            time.sleep(1)
        for n in nodes:
            n.kill9()
        print("failover (kill -9 of the leader, %d rounds): publishes accepted again after "
              "%.2f s median (max %.2f); new leader named after %.2f s median (max %.2f)"
              % (len(accept), sorted(accept)[len(accept) // 2], max(accept),
                 sorted(elect)[len(elect) // 2], max(elect)))
    finally:
        for n in NODES:
            n.kill9()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
