#!/usr/bin/env python3
"""Topics made and deleted one after another on a 3-member cluster: the time each
takes, and what the members keep of the deleted ones.

    scripts/cluster-topic-churn.py [--topics 1000] [--shards 1] NSQD [NSQD...]

For each broker binary in turn: starts three members on loopback (--node-id 1-3,
--cluster-address and the two others as --cluster-peer, fresh data paths), then for
each of TOPICS topics in turn makes it with `POST /topic/create` on one member and
deletes it with `POST /topic/delete` through the next, retried while that member
answers 404 (it holds the topic only once the group has elected a leader, whose
messages make the group there). Prints the time per topic (from the creation to the
deletion's 200), the members' resident memory before and after, and, 15 s later, how
many groups each member still lists in `GET /cluster` (a deleted topic's group leaves
memory once it has been quiet for 10 s: docs/replication.md, "How it works").

Before the churn it makes 40 topics, each published to at once (`POST /pub`) on the
member that made it, and prints how long that first publish took (median and max).

A new topic's first leader is the member that made it, a round trip after
`/topic/create` (docs/replication.md, "Running a cluster"); what a topic costs here is
mostly that election and the requests' round trips. (A first publish has campaigned
at once for longer; `/topic/create` waited for an election timeout.)
"""
import argparse
import json
import sys
import time

from cluster_lib import Cluster, request, rss_mb










def until_200(port, method, path, body=b"", within=10.0):
    """Sends the request until it is answered 200 (a member that has not applied the
    topic's creation yet answers 404); exits on anything else or after `within` s."""
    deadline = time.time() + within
    while True:
        try:
            status, out = request(port, method, path, body)
        except OSError as e:  # a member still starting
            status, out = None, repr(e)
        if status == 200:
            return
        if status not in (404, None) or time.time() > deadline:
            sys.exit(f"{method} {path} answered {status} {out!r}")
        time.sleep(0.005)


def run(nsqd, topics, shards):
    c = Cluster(nsqd, shards, "nsqd-topic-churn-")
    members, procs = c.members, c.procs
    try:
        c.wait_http()
        # Past the first seconds after a start, when members elect no empty log.
        until_200(members[0]["http"], "POST", "/topic/create?topic=warmup", within=30)
        until_200(members[1]["http"], "POST", "/pub?topic=warmup", b"w", within=30)
        # The first publish to a new topic, on the member that made it.
        first = []
        for k in range(40):
            port = members[k % 3]["http"]
            until_200(port, "POST", f"/topic/create?topic=first{k}")
            t0 = time.time()
            until_200(port, "POST", f"/pub?topic=first{k}", b"m")
            first.append(time.time() - t0)
        for k in range(40):
            until_200(members[(k + 1) % 3]["http"], "POST", f"/topic/delete?topic=first{k}")
        before = [rss_mb(p.pid) for p in procs]
        start = time.time()
        for k in range(topics):
            t = f"churn{k}"
            a, b = (members[(k + j) % 3]["http"] for j in range(2))
            until_200(a, "POST", f"/topic/create?topic={t}")
            until_200(b, "POST", f"/topic/delete?topic={t}")
        took = time.time() - start
        after = [rss_mb(p.pid) for p in procs]
        time.sleep(15)
        later = [rss_mb(p.pid) for p in procs]
        groups = []
        for m in members:
            status, body = request(m["http"], "GET", "/cluster")
            groups.append(len(json.loads(body)["topics"]) if status == 200 else None)
        return took / topics, before, after, later, groups, first
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("nsqd", nargs="+")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    for nsqd in a.nsqd:
        per, before, after, later, groups, first = run(nsqd, a.topics, a.shards)
        first.sort()
        fmt = lambda xs: "/".join(f"{x:.0f}" for x in xs)
        print(
            f"{nsqd}: {a.topics} topics made and deleted in turn: "
            f"{per * 1000:.1f} ms per topic; members' RSS {fmt(before)} MB before, "
            f"{fmt(after)} MB after, {fmt(later)} MB 15 s later; groups listed in "
            f"GET /cluster then: {'/'.join(str(g) for g in groups)}; the first /pub "
            f"after /topic/create on the same member: median "
            f"{first[len(first) // 2] * 1000:.1f} ms, max {first[-1] * 1000:.1f} ms (40 topics)"
        )


if __name__ == "__main__":
    main()
