#!/usr/bin/env python3
"""The CPU a 3-member cluster spends on replicated topics that take no traffic.

    scripts/cluster-idle.py [--topics 3000] [--seconds 10] [--shards 1] NSQD [NSQD...]

For each broker binary in turn: starts three members on loopback (--node-id 1-3,
--cluster-address and the two others as --cluster-peer, fresh data paths), creates
TOPICS topics through `/topic/create` (spread over the members), waits until every
member lists them in `GET /cluster` with a leader, lets them settle for 2 s, then reads
each member's CPU time (user + system, /proc/PID/stat) over SECONDS seconds. Prints,
per binary, each member's share of one core and their sum, and with two binaries the
ratio of the sums (second / first). Every group ticks and its leader heartbeats on its
own (docs/replication.md, "Not built yet"), so this grows with the number of topics.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_port(port, deadline):
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def run(nsqd, topics, seconds, shards):
    tmp = tempfile.mkdtemp(prefix="nsqd-cluster-idle-")
    members = [
        {"tcp": free_port(), "http": free_port(), "cluster": free_port()} for _ in range(3)
    ]
    procs = []
    try:
        for i, m in enumerate(members):
            d = os.path.join(tmp, f"m{i}")
            os.makedirs(d)
            args = [
                nsqd,
                f"--node-id={i + 1}",
                f"--data-path={d}",
                f"--shards={shards}",
                f"--tcp-address=127.0.0.1:{m['tcp']}",
                f"--http-address=127.0.0.1:{m['http']}",
                f"--cluster-address=127.0.0.1:{m['cluster']}",
            ] + [
                f"--cluster-peer=127.0.0.1:{o['cluster']}" for o in members if o is not m
            ]
            log = open(os.path.join(tmp, f"m{i}.log"), "wb")
            procs.append(subprocess.Popen(args, stdout=log, stderr=log))
        for m in members:
            if not wait_port(m["http"], time.time() + 30):
                sys.exit(f"{nsqd}: a member's HTTP port did not answer (logs in {tmp})")
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
        before = [cpu_ticks(p.pid) for p in procs]
        time.sleep(seconds)
        after = [cpu_ticks(p.pid) for p in procs]
        hz = os.sysconf("SC_CLK_TCK")
        shares = [(a - b) / hz / seconds for a, b in zip(after, before)]
        return shares
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("nsqd", nargs="+", help="broker binaries to compare")
    ap.add_argument("--topics", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    sums = []
    for nsqd in a.nsqd:
        shares = run(nsqd, a.topics, a.seconds, a.shards)
        sums.append(sum(shares))
        each = ", ".join(f"{s * 100:.1f}%" for s in shares)
        print(
            f"{nsqd}: {a.topics} idle replicated topics, members use {each} of one core "
            f"(sum {sum(shares) * 100:.1f}%) over {a.seconds:g} s"
        )
    if len(sums) == 2 and sums[0] > 0:
        print(f"second / first: {sums[1] / sums[0]:.2f}x the CPU")


if __name__ == "__main__":
    main()
