#!/usr/bin/env python3
"""The CPU a 3-member cluster spends on replicated topics, idle or under a steady load.

    scripts/cluster-cpu.py [--topics 3000] [--seconds 10] [--shards 1]
                           [--load SIZE@RATE --bench target/release/nsq-bench]
                           [--via leader|follower] [--deferred N]
                           [--rounds 1] NSQD [NSQD...]

For each broker binary in turn: starts three members on loopback (--node-id 1-3,
--cluster-address and the two others as --cluster-peer, fresh data paths), creates
TOPICS topics through `/topic/create` (spread over the members), waits until every
member lists them in `GET /cluster` with a leader, lets them settle for 2 s, then reads
each member's CPU time (user + system, /proc/PID/stat) over SECONDS seconds.

Idle (no --load): prints each member's share of one core and their sum. Idle groups
go quiet (docs/replication.md, "Quiet groups"): what remains grows with the number of
topics only through the leaders' periodic look at their channels.

With --load SIZE@RATE (e.g. `4096@20000`; RATE 0: as fast as the cluster takes them, in
MPUB batches of 200): for those SECONDS `nsq-bench pubsub` publishes
RATE messages/s of SIZE bytes (open loop, MPUB batches) to the leader of the first
topic and consumes them there, and the figure is CPU per message: the leader's and the
followers' CPU microseconds for each message consumed. With --via follower nsq-bench
publishes and consumes through a follower instead (its publishes forwarded to the
leader, its consumer relayed from there: docs/replication.md), listed first among the
followers. Unlike saturated throughput,
this hardly moves with what else the host runs, so two builds compare on a busy or
noisy machine. With --rounds N the binaries take turns N times.

With --deferred N (with --load): before the load, N messages are published to the
first topic's leader with DPUB and an hour's delay, after its channel `bench` (the one
nsq-bench consumes) is made, so that channel holds N deferred messages throughout: the
CPU a leader spends replicating the state of a channel that holds many unfinished
messages (docs/replication.md, "Channel state"). The members' resident memory is printed
after the load.

With two binaries it prints the ratio of the second's figure to the first's (the sum
of the shares, or the CPU per message of all three members; medians over the rounds).
"""
import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import time

from cluster_lib import Cluster, request, rss_mb








def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def dpub_deferred(port, topic, count):
    """Publishes `count` messages to `topic` over TCP with DPUB and an hour's delay,
    pipelined 1,000 at a time, each answered OK."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"  V2")
    sent = 0
    while sent < count:
        n = min(1000, count - sent)
        out = bytearray()
        for k in range(sent, sent + n):
            body = b"deferred-%d" % k
            out += b"DPUB %s 3600000\n" % topic.encode() + struct.pack(">i", len(body)) + body
        s.sendall(out)
        answered = 0
        while answered < n:
            size = struct.unpack(">i", recv_exact(s, 4))[0]
            frame = recv_exact(s, size)
            if frame == struct.pack(">i", 0) + b"_heartbeat_":
                s.sendall(b"NOP\n")
            elif frame == struct.pack(">i", 0) + b"OK":
                answered += 1
            else:
                sys.exit(f"DPUB {sent + answered} not answered OK: {frame[:80]!r}")
        sent += n
    s.close()


def recv_exact(s, n):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            sys.exit("the leader closed the DPUB connection")
        out += chunk
    return bytes(out)




def run(nsqd, topics, seconds, shards, load, via="leader", deferred=0):
    c = Cluster(nsqd, shards, "nsqd-cluster-cpu-")
    members, procs = c.members, c.procs
    try:
        c.wait_http()
        for k in range(topics):
            port = members[k % 3]["http"]
            status, body = request(port, "POST", f"/topic/create?topic=idle{k}")
            if status != 200:
                sys.exit(f"{nsqd}: /topic/create answered {status} {body!r}")
        deadline = time.time() + 120
        while time.time() < deadline:
            led = 0
            for m in members:
                status, body = request(m["http"], "GET", "/cluster", timeout=10)
                if status == 200:
                    led += sum(1 for t in json.loads(body)["topics"] if t["leader"])
            if led >= 3 * topics:
                break
            time.sleep(0.5)
        else:
            sys.exit(f"{nsqd}: the {topics} topics did not all get a leader within 120 s")
        time.sleep(2)
        hz = os.sysconf("SC_CLK_TCK")
        if load is None:
            before = [cpu_ticks(p.pid) for p in procs]
            time.sleep(seconds)
            after = [cpu_ticks(p.pid) for p in procs]
            return [(a - b) / hz / seconds for a, b in zip(after, before)], None
        size, rate, bench = load
        lead = leader_of(members, "idle0")
        entry = lead if via == "leader" else next(i for i in range(3) if i != lead)
        if deferred:
            status, body = request(members[lead]["http"], "POST",
                                   "/channel/create?topic=idle0&channel=bench")
            if status != 200:
                sys.exit(f"{nsqd}: /channel/create answered {status} {body!r}")
            dpub_deferred(members[lead]["tcp"], "idle0", deferred)
            time.sleep(2)
        before = [cpu_ticks(p.pid) for p in procs]
        out = subprocess.run(
            [bench, "pubsub", f"--nsqd-tcp-address=127.0.0.1:{members[entry]['tcp']}",
             "--topic", "idle0", "--size", str(size), "--rate", str(rate),
             "--runfor", f"{seconds:g}s", "--json"],
            capture_output=True, text=True, check=False)
        after = [cpu_ticks(p.pid) for p in procs]
        if out.returncode != 0:
            sys.exit("nsq-bench failed:\n" + out.stdout[-2000:] + out.stderr[-2000:])
        # The JSON report is the first line; the human-readable one follows.
        consumed = json.loads(out.stdout.splitlines()[0])["received"]
        if consumed <= 0:
            sys.exit(f"{nsqd}: nothing was consumed")
        if deferred:
            print(f"{nsqd}: resident memory, leader first: "
                  + ", ".join(f"{rss_mb(procs[i].pid):.0f} MB"
                              for i in [lead] + [i for i in range(3) if i != lead]))
        us = [(a - b) / hz * 1e6 / consumed for a, b in zip(after, before)]
        # Leader first, then the followers (the clients' entry first among them).
        order = sorted((i for i in range(3) if i != lead), key=lambda i: i != entry)
        return [us[lead]] + [us[i] for i in order], consumed
    finally:
        c.stop()


def leader_of(members, topic):
    """Index in `members` of `topic`'s leader, as the members' `GET /cluster` names it."""
    addrs = [f"127.0.0.1:{m['cluster']}" for m in members]
    for m in members:
        status, body = request(m["http"], "GET", "/cluster", timeout=10)
        if status != 200:
            continue
        for t in json.loads(body)["topics"]:
            if t["topic"] == topic and t["leader"] in addrs:
                return addrs.index(t["leader"])
    sys.exit(f"no member names a leader of {topic}")


def parse_load(text):
    size, _, rate = text.partition("@")
    try:
        return int(size), int(rate)
    except ValueError:
        sys.exit(f"--load wants SIZE@RATE, e.g. 4096@20000, not {text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("nsqd", nargs="+", help="broker binaries to compare")
    ap.add_argument("--topics", type=int, default=None,
                    help="replicated topics (default 3000 idle, 1 with --load)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--load", default=None, help="SIZE@RATE: bytes per message, msgs/s")
    ap.add_argument("--bench", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "nsq-bench"))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--via", choices=["leader", "follower"], default="leader",
                    help="the member nsq-bench publishes to and consumes from")
    ap.add_argument("--deferred", type=int, default=0,
                    help="messages deferred for an hour in the consumed channel (with --load)")
    a = ap.parse_args()
    load = None
    if a.load:
        size, rate = parse_load(a.load)
        load = (size, rate, a.bench)
    topics = a.topics if a.topics is not None else (1 if load else 3000)
    figures = {n: [] for n in a.nsqd}
    for _ in range(a.rounds):
        for nsqd in a.nsqd:
            each, consumed = run(nsqd, topics, a.seconds, a.shards, load, a.via, a.deferred)
            figures[nsqd].append(sum(each))
            if load is None:
                print(
                    f"{nsqd}: {topics} idle replicated topics, members use "
                    + ", ".join(f"{s * 100:.1f}%" for s in each)
                    + f" of one core (sum {sum(each) * 100:.1f}%) over {a.seconds:g} s"
                )
            else:
                print(
                    f"{nsqd}: {consumed} messages of {load[0]} B at {load[1]}/s, CPU per "
                    f"message: leader {each[0]:.2f} us, followers"
                    + (" (the clients' entry first) " if a.via == "follower" else " ")
                    + ", ".join(f"{u:.2f}" for u in each[1:])
                    + f" us (sum {sum(each):.2f} us)"
                )
    if len(a.nsqd) == 2:
        first, second = (sorted(figures[n])[len(figures[n]) // 2] for n in a.nsqd)
        if first > 0:
            print(f"second / first: {second / first:.2f}x the CPU (medians of {a.rounds})")


if __name__ == "__main__":
    main()
