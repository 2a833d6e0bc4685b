#!/usr/bin/env python3
"""The longest a producer waits for an acknowledgement across failovers of a topic with
a consumer, on a 3-member cluster.

    scripts/cluster-failover-gaps.py [--kills 5] [--rate 150] [--shards 2] NSQD [NSQD...]

For each broker binary in turn: starts three members on loopback (fresh data paths),
makes topic `fo` with channel `c`, and runs
- a consumer with RDY 50 on the topic's leader (found with `GET /cluster`; after its
  connection ends it subscribes to the new leader), finishing each message 2 ms after
  it arrives, so that messages are in flight when the leader goes;
- a producer publishing RATE messages/s with PUB, one at a time, through a member that
  does not lead (its publishes forwarded to the leader), reconnecting after an error.

Every 7 s it kills the leader with SIGKILL and starts it again at once on its data path
(as a supervisor does), KILLS times (when the producer's member leads, leadership is
first moved away with `POST /topic/move-leader`). Prints, per kill, the longest time
between two acknowledgements within 3 s after it, and the median and max over the kills.
"""
import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time

from cluster_lib import Cluster, request








def read_frame(s):
    def exact(n):
        b = bytearray()
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise EOFError
            b += c
        return bytes(b)

    size, kind = struct.unpack(">ii", exact(8))
    return kind, exact(size - 4)


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"  V2")
    return s


class FailoverCluster(Cluster):
    """The three members, and which of them leads topic `fo`."""

    def __init__(self, nsqd, shards):
        super().__init__(nsqd, shards, "nsqd-failover-gaps-")

    def kill_and_restart(self, i):
        self.kill(i)
        self.start(i)

    def leader(self):
        for m in self.members:
            try:
                status, body = request(m["http"], "GET", "/cluster", timeout=1)
            except OSError:
                continue
            if status != 200:
                continue
            for t in json.loads(body)["topics"]:
                if t["topic"] == "fo" and t["is_leader"]:
                    return self.members.index(m)
        return None


def consumer(c, stop):
    while not stop.is_set():
        lead = c.leader()
        if lead is None:
            time.sleep(0.05)
            continue
        try:
            s = connect(c.members[lead]["tcp"])
            s.sendall(b"SUB fo c\n")
            read_frame(s)
            s.sendall(b"RDY 50\n")
            while not stop.is_set():
                kind, data = read_frame(s)
                if kind == 0 and data == b"_heartbeat_":
                    s.sendall(b"NOP\n")
                elif kind == 2:
                    time.sleep(0.002)
                    s.sendall(b"FIN " + data[10:26] + b"\n")
        except (OSError, EOFError):
            time.sleep(0.05)


def producer(c, via, rate, acks, stop):
    body = b"x" * 100
    while not stop.is_set():
        try:
            s = connect(c.members[via]["tcp"])
            while not stop.is_set():
                s.sendall(b"PUB fo\n" + struct.pack(">i", len(body)) + body)
                kind, data = read_frame(s)
                if kind == 0 and data == b"OK":
                    acks.append(time.time())
                time.sleep(1.0 / rate)
        except (OSError, EOFError):
            time.sleep(0.02)


def run(nsqd, kills, rate, shards):
    c = FailoverCluster(nsqd, shards)
    stop = threading.Event()
    try:
        c.wait_http()
        deadline = time.time() + 30
        while request(c.members[0]["http"], "POST", "/topic/create?topic=fo")[0] != 200:
            if time.time() > deadline:
                sys.exit(f"{nsqd}: /topic/create never answered 200")
            time.sleep(0.1)
        while c.leader() is None:
            time.sleep(0.05)
        request(c.members[c.leader()]["http"], "POST", "/channel/create?topic=fo&channel=c")
        via = (c.leader() + 1) % 3
        acks = []
        threads = [
            threading.Thread(target=consumer, args=(c, stop), daemon=True),
            threading.Thread(target=producer, args=(c, via, rate, acks, stop), daemon=True),
        ]
        for t in threads:
            t.start()
        gaps = []
        for _ in range(kills):
            time.sleep(7)
            lead = c.leader()
            if lead == via:
                to = c.members[(via + 1) % 3]["cluster"]
                request(c.members[via]["http"], "POST",
                        f"/topic/move-leader?topic=fo&to=127.0.0.1:{to}")
                time.sleep(1)
                lead = c.leader()
            if lead is None:
                continue
            at = time.time()
            c.kill_and_restart(lead)
            time.sleep(3)
            window = [t for t in list(acks) if at - 1 <= t <= at + 3]
            before = [t for t in window if t < at]
            points = ([before[-1]] if before else [at]) + [t for t in window if t >= at]
            gaps.append(max(b - a for a, b in zip(points, points[1:])) if len(points) > 1 else 3.0)
        return gaps
    finally:
        stop.set()
        c.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("nsqd", nargs="+")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--rate", type=float, default=150)
    ap.add_argument("--shards", type=int, default=2)
    a = ap.parse_args()
    for nsqd in a.nsqd:
        gaps = run(nsqd, a.kills, a.rate, a.shards)
        print(
            f"{nsqd}: longest wait for an acknowledgement after each of {len(gaps)} kills of "
            f"the leader: {', '.join(f'{g:.2f}' for g in gaps)} s; median "
            f"{statistics.median(gaps):.2f} s, max {max(gaps):.2f} s"
        )


if __name__ == "__main__":
    main()
