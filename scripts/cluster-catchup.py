#!/usr/bin/env python3
"""A member that lost its disk catching up on a large backlog (docs/replication.md,
"Snapshots of any size").

    scripts/cluster-catchup.py [--mib 1024] [--size 4096] [--shards 1] [NSQD]

Starts three members on loopback (--node-id 1-3, fresh data paths under a temporary
folder), makes topic `backlog` with channel `c`, and publishes MIB MiB of SIZE-byte
bodies to its leader (MPUB batches over protocol V2) with no consumer, so all of it is
unfinished backlog. Once every member holds it and the leader's Raft log has dropped
every entry (so the wiped member gets a snapshot, which carries at most 32 MiB of
bodies), it kills a follower with SIGKILL, deletes its data path and starts it again
at once. It reports how long the wiped member took to hold the whole backlog again
(its channel depth, from `/stats`), its largest resident memory meanwhile (VmRSS,
sampled every 50 ms) and the lines it logged about the catch-up; it fails if the member
restored the snapshot with a hole. Prints the disk's O_DIRECT write speed first.
"""

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

from cluster_lib import Cluster, request, rss_mb








def dd_speed(folder):
    path = os.path.join(folder, "dd-test")
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", "count=256", "oflag=direct"],
        capture_output=True, text=True, check=False)
    try:
        os.remove(path)
    except OSError:
        pass
    lines = out.stderr.strip().splitlines()
    return lines[-1] if lines else "dd failed"


def stats_depth(port, topic, channel):
    try:
        status, body = request(port, "GET", f"/stats?format=json&topic={topic}", timeout=5)
    except OSError:
        return None
    if status != 200:
        return None
    for t in json.loads(body).get("topics") or []:
        if t["topic_name"] == topic:
            for c in t.get("channels") or []:
                if c["channel_name"] == channel:
                    return c["depth"]
    return None


def group(port, topic):
    try:
        status, body = request(port, "GET", "/cluster", timeout=5)
    except OSError:
        return None
    if status != 200:
        return None
    for t in json.loads(body)["topics"]:
        if t["topic"] == topic:
            return t
    return None




def read_frame(s):
    head = b""
    while len(head) < 8:
        chunk = s.recv(8 - len(head))
        if not chunk:
            raise OSError("connection closed")
        head += chunk
    size, kind = struct.unpack(">ii", head)
    data = b""
    while len(data) < size - 4:
        chunk = s.recv(size - 4 - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return kind, data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("nsqd", nargs="?", default="target/release/nsqd")
    a = ap.parse_args()
    # The disk's O_DIRECT write speed, measured before the members start, on the same
    # file system as their data paths.
    probe = tempfile.mkdtemp(prefix="nsqd-cluster-catchup-dd-")
    print(f"disk: {dd_speed(probe)}", flush=True)
    shutil.rmtree(probe, ignore_errors=True)
    c = Cluster(a.nsqd, a.shards, "nsqd-cluster-catchup-")
    members, procs, tmp = c.members, c.procs, c.tmp
    try:
        c.wait_http()
        deadline = time.time() + 60
        while request(members[0]["http"], "POST", "/channel/create?topic=backlog&channel=c")[0] != 200:
            if time.time() > deadline:
                sys.exit("/channel/create never answered 200")
            time.sleep(0.5)
        leader = None
        while leader is None:
            for i, m in enumerate(members):
                g = group(m["http"], "backlog")
                if g and g["is_leader"]:
                    leader = i
            time.sleep(0.1)
        n = a.mib * (1 << 20) // a.size
        batch = 256
        body = b"x" * a.size
        cmd_body = struct.pack(">i", batch) + (struct.pack(">i", a.size) + body) * batch
        cmd = b"MPUB backlog\n" + struct.pack(">i", len(cmd_body)) + cmd_body
        s = socket.create_connection(("127.0.0.1", members[leader]["tcp"]))
        s.sendall(b"  V2")
        started = time.time()
        sent = 0
        while sent < n:
            s.sendall(cmd)
            kind, data = read_frame(s)
            if kind != 0 or data != b"OK":
                sys.exit(f"MPUB answered {kind} {data!r}")
            sent += batch
        s.close()
        took = time.time() - started
        print(f"published {sent} messages of {a.size} B ({sent * a.size >> 20} MiB) to the leader in {took:.1f} s", flush=True)
        for i, m in enumerate(members):
            deadline = time.time() + 300
            while stats_depth(m["http"], "backlog", "c") != sent:
                if time.time() > deadline:
                    sys.exit(f"member {i + 1} does not hold the backlog (logs in {tmp})")
                time.sleep(0.2)
        last = group(members[leader]["http"], "backlog")["last_index"]
        deadline = time.time() + 120
        while (group(members[leader]["http"], "backlog") or {}).get("first_index", 0) < last:
            if time.time() > deadline:
                sys.exit("the leader's Raft log was not compacted within 120 s")
            time.sleep(0.2)
        gone = (leader + 1) % 3
        c.kill(gone)
        shutil.rmtree(c.data(gone))
        open(c.log(gone), "wb").close()
        killed = time.time()
        c.start(gone)
        peak = 0.0
        deadline = killed + 600
        while stats_depth(members[gone]["http"], "backlog", "c") != sent:
            peak = max(peak, rss_mb(procs[gone].pid))
            if time.time() > deadline:
                sys.exit(f"the wiped member did not hold the backlog within 600 s (logs in {tmp})")
            time.sleep(0.05)
        caught = time.time() - killed
        peak = max(peak, rss_mb(procs[gone].pid))
        time.sleep(5)
        settled = rss_mb(procs[gone].pid)
        for i in range(3):
            st = json.loads(request(members[i]["http"], "GET", "/stats?format=json&topic=backlog")[1])
            t = st["topics"][0]
            print(f"  member {i + 1}: topic depth {t['depth']} backend_depth {t['backend_depth']}, channel {[(c['depth'], c['backend_depth']) for c in t['channels']]}")
        with open(c.log(gone), errors="replace") as f:
            lines = [l.rstrip() for l in f if "backlog" in l and ("page" in l or "snapshot" in l)]
        for l in lines:
            print(f"  member {gone + 1}: {l}")
        others = ", ".join(f"member {i + 1} {rss_mb(procs[i].pid):.0f} MiB" for i in range(3) if i != gone)
        print(f"the wiped member held all {sent} messages ({sent * a.size >> 20} MiB) {caught:.1f} s after the restart; its largest RSS meanwhile {peak:.0f} MiB, {settled:.0f} MiB 5 s later (the others now: {others})", flush=True)
        if any("without the messages" in l for l in lines):
            sys.exit("FAIL: the snapshot was restored with a hole")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
