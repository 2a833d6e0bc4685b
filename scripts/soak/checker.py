"""The soak's accounting: reads the event logs of every worker and of the coordinator
(common.EventLog lines plus the coordinator's "op" events) and decides, per channel,
what became of every acknowledged message.

Rules (RELIABILITY.md, "Soak"):
* A message counts as published when its PUB/MPUB/DPUB or HTTP /pub, /mpub got OK;
  [t0, t1] is the time from sending it to the answer.
* Each non-ephemeral channel has "gone" windows: from the start of a /channel/delete
  (or /topic/delete of its topic) to the end of the /channel/create (and /topic/create)
  that brings it back. A message whose [t0, t1] overlaps one may or may not have reached
  the channel: it is "in a delete window" and needs no delivery.
* Every other published message must be delivered on the channel and FINed (a FIN
  counts unless an E_FIN_FAILED naming its id came back to the same reader), or have been
  removed: a /channel/empty, /channel/delete, /topic/empty or /topic/delete that ended
  after the message was sent and began at most REMOVAL_HORIZON_S after its answer
  accounts for it. Anything else is unaccounted.
* Faults in any case: a delivery of a body never sent, on a channel of another topic, a
  delivery after a successful FIN of the same message on the same channel, two first
  deliveries (attempts 1) of one message on one channel.
* #ephemeral channels: deliveries are checked for the faults above; messages not FINed
  there are counted as removed with the ephemeral channel.
* Errors: E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED are expected when the client held
  the message (since delivery or its last TOUCH) for at least msg_timeout - 0.5 s, or when
  an empty/delete of that channel happened while it was held; a connection the broker
  closed is expected within a delete window of its channel or topic; a failed publish is
  expected near a /topic/delete. Everything else is unexpected.
"""
import collections
import json

NEAR_S = 2.0
# An empty/delete accounts for a message only if it began at most this long after the
# message was published: the readers keep up, so a message older than that which was
# never FINed was lost, not removed.
REMOVAL_HORIZON_S = 60.0


def load(paths):
    events = []
    for p in paths:
        try:
            with open(p) as f:
                for line in f:
                    line = line.strip()
                    if line:
                        try:
                            events.append(json.loads(line))
                        except ValueError:
                            pass  # a worker killed mid-line: its last line only
        except FileNotFoundError:
            pass
    events.sort(key=lambda e: e.get("t", 0))
    return events


class Window:
    __slots__ = ("kind", "t0", "t1")

    def __init__(self, kind, t0, t1):
        self.kind, self.t0, self.t1 = kind, t0, t1


def check(events, channels, msg_timeout_s):
    """channels: {topic: [non-ephemeral channel names]}. Returns (figures, problems)."""
    P = []
    fig = collections.OrderedDict()
    # ------------------------------------------------------------- admin windows
    windows = collections.defaultdict(list)  # (topic, ch) -> [Window]
    topic_deletes = []
    topic_deletes_of = collections.defaultdict(list)
    for e in events:
        if e["e"] != "op":
            continue
        if e.get("code") not in (200, None):
            P.append("admin %s %s/%s answered %s %s" % (e["op"], e.get("topic"), e.get("ch"),
                                                     e.get("code"), e.get("body", "")[:100]))
        if e["op"] == "channel_empty":
            windows[(e["topic"], e["ch"])].append(Window("empty", e["t0"], e["t1"]))
        elif e["op"] == "channel_delete":  # t1: the end of the /channel/create after it
            windows[(e["topic"], e["ch"])].append(Window("channel_delete", e["t0"], e["t1"]))
        elif e["op"] == "topic_empty":  # [t0, t1]: pause, /topic/empty, unpause
            for ch in channels.get(e["topic"], []):
                windows[(e["topic"], ch)].append(Window("topic_empty", e["t0"], e["t1"]))
        elif e["op"] == "topic_delete":
            topic_deletes.append(Window("topic_delete", e["t0"], e["t1"]))
            topic_deletes_of[e["topic"]].append(topic_deletes[-1])
            for ch in channels.get(e["topic"], []):
                windows[(e["topic"], ch)].append(Window("topic_delete", e["t0"], e["t1"]))
    # ------------------------------------------------------------- publishes
    acked = {}  # body -> (topic, t0, t1)
    unacked = {}
    pub_fail_unexpected = []
    for e in events:
        if e["e"] != "pub":
            continue
        for b in e["bodies"]:
            if e["ok"]:
                acked[b] = (e["topic"], e["t0"], e["t1"])
            else:
                unacked[b] = (e["topic"], e["t0"], e["t1"])
        if not e["ok"]:
            if not any(w.t0 - 3 <= e["t1"] and e["t0"] <= w.t1 + 3 for w in topic_deletes):
                pub_fail_unexpected.append("%s to %s failed: %s" % (e["via"], e["topic"], e.get("err")))
    fig["published"] = len(acked)
    fig["publish_failed"] = len(unacked)
    fig["publishes_by_way"] = dict(collections.Counter(
        e["via"] for e in events if e["e"] == "pub" and e["ok"]))
    # ------------------------------------------------------------- deliveries
    dlv = collections.defaultdict(list)   # (topic, ch, body) -> [(t, att, id, r)]
    fins = collections.defaultdict(list)  # (topic, ch, body) -> [[t, id, r, failed]]
    fin_by_rid = collections.defaultdict(list)
    held_by_rid = {}
    counts = collections.Counter()
    for e in events:
        k = e["e"]
        if k == "dlv":
            dlv[(e["topic"], e["ch"], e["body"])].append((e["t"], e["att"], e["id"], e["r"]))
            counts["deliveries"] += 1
        elif k == "fin":
            rec = [e["t"], e["id"], e["r"], False]
            fins[(e["topic"], e["ch"], e["body"])].append(rec)
            fin_by_rid[(e["r"], e["id"])].append(rec)
            counts["fin_sent"] += 1
        elif k == "req":
            counts["requeued"] += 1
        elif k == "touch":
            counts["touched"] += 1
        elif k == "hold":
            counts["held_to_time_out"] += 1
            held_by_rid[(e["r"], e["id"])] = e["t"]
        elif k == "reader" and e["what"] == "start":
            counts["reader_starts"] += 1
    # ------------------------------------------------------------- errors
    expected = collections.Counter()
    unexpected = list(pub_fail_unexpected)

    def op_near(topic, ch, a, b):
        """An empty/delete of topic/ch (or a delete of the topic) overlapping [a, b]."""
        ws = windows.get((topic, ch), []) + topic_deletes_of.get(topic, [])
        return any(w.t0 - 0.5 <= b and a <= w.t1 + NEAR_S for w in ws)

    for e in events:
        if e["e"] == "err":
            text = e.get("text") or ""
            if e.get("ours"):
                expected["error on a connection the client was closing"] += 1
                continue
            code = text.split(" ", 1)[0]
            if code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
                if code == "E_FIN_FAILED" and e.get("id"):
                    for rec in reversed(fin_by_rid.get((e["r"], e["id"]), [])):
                        if rec[0] <= e["t"] and not rec[3]:
                            rec[3] = True
                            break
                held = e.get("held")
                if held is not None and held >= msg_timeout_s - 0.5:
                    expected[code + " after the message timed out"] += 1
                    continue
                if e.get("topic") and op_near(e["topic"], e["ch"], e["t"] - msg_timeout_s - 2, e["t"]):
                    expected[code + " after an empty/delete"] += 1
                    continue
            elif e.get("topic") and not text.startswith("E_") and not text.startswith("log: ") \
                    and op_near(e["topic"], e["ch"], e["t"] - 1, e["t"]):
                # SendError / IntegrityError / socket errors: the connection the broker
                # closed when it deleted the channel
                expected["socket error after a channel/topic delete"] += 1
                continue
            if e.get("topic") is None and any(w.t0 - 3 <= e["t"] <= w.t1 + 3 for w in topic_deletes):
                expected["producer error near /topic/delete"] += 1
                continue
            unexpected.append("%s (%s/%s): %s (held %s s)" % (e["r"], e.get("topic"), e.get("ch"), text,
                                                             None if e.get("held") is None else round(e["held"], 2)))
        elif e["e"] == "close" and not e.get("ours"):
            if e.get("topic") is not None and op_near(e["topic"], e["ch"], e["t"], e["t"]):
                expected["connection closed by a channel/topic delete"] += 1
            elif e.get("topic") is None and any(w.t0 - 3 <= e["t"] <= w.t1 + 3 for w in topic_deletes):
                expected["producer connection closed near /topic/delete"] += 1
            else:
                unexpected.append("%s (%s/%s): connection closed by the broker at %.3f %s" % (
                    e["r"], e.get("topic"), e.get("ch"), e["t"], e.get("text", "")))
    fig["errors_expected"] = dict(expected)
    fig["errors_unexpected"] = len(unexpected)
    # ------------------------------------------------------------- per channel
    faults = []
    removed = collections.Counter()
    per_channel = {}
    delivered_pairs = 0
    redeliveries = 0
    for (topic, ch, body), ds in dlv.items():
        if body not in acked and body not in unacked:
            faults.append("%s/%s: delivery of a body never published: %r" % (topic, ch, body[:60]))
            continue
        src_topic = (acked.get(body) or unacked.get(body))[0]
        if src_topic != topic:
            faults.append("%s/%s: delivery of %r published to %s" % (topic, ch, body, src_topic))
        firsts = [d for d in ds if d[1] == 1]
        if len(firsts) > 1:
            faults.append("%s/%s: %r delivered %d times with attempts 1: %r" % (
                topic, ch, body, len(firsts), [(round(d[0], 3), d[2], d[3]) for d in firsts]))
        ok_fins = [f for f in fins.get((topic, ch, body), []) if not f[3]]
        if ok_fins:
            first_ok = min(f[0] for f in ok_fins)
            late = [d for d in ds if d[0] > first_ok + 0.001]
            if late:
                faults.append("%s/%s: %r delivered again after a successful FIN at %.3f: %r" % (
                    topic, ch, body, first_ok, [(round(d[0], 3), d[1], d[3]) for d in late]))
            if len(ok_fins) > 1:
                faults.append("%s/%s: %r FINed successfully %d times" % (topic, ch, body, len(ok_fins)))
        redeliveries += len(ds) - 1
        delivered_pairs += 1
    eph_not_fin = 0
    for (topic, ch, body), ds in dlv.items():
        if "#ephemeral" in ch and not any(not f[3] for f in fins.get((topic, ch, body), [])):
            eph_not_fin += 1
    removed["ephemeral channel deleted (delivered, not FINed)"] = eph_not_fin
    unaccounted = []
    by_topic = collections.defaultdict(list)
    for b, (topic, t0, t1) in acked.items():
        by_topic[topic].append((b, t0, t1))
    for topic, chs in channels.items():
        for ch in chs:
            ws = windows.get((topic, ch), [])
            c = collections.Counter()
            for b, t0, t1 in by_topic.get(topic, []):
                ok_fins = [f for f in fins.get((topic, ch, b), []) if not f[3]]
                if ok_fins:
                    c["fin"] += 1
                    continue
                if any(w.kind not in ("empty", "topic_empty") and t0 <= w.t1 and t1 >= w.t0 for w in ws):
                    c["in_delete_window"] += 1
                    continue
                fin_t = None
                rm = [w for w in ws if w.t1 >= t0 and w.t0 <= t1 + REMOVAL_HORIZON_S]
                if rm:
                    c["removed_" + rm[0].kind] += 1
                    continue
                c["unaccounted"] += 1
                unaccounted.append((topic, ch, b, t0, len(dlv.get((topic, ch, b), [])), fin_t))
            per_channel["%s/%s" % (topic, ch)] = dict(c)
            for k, v in c.items():
                if k.startswith("removed_"):
                    removed[k[len("removed_"):]] += v
                if k == "in_delete_window":
                    removed["published during a delete window (not delivered)"] += v
    fig["deliveries"] = counts["deliveries"]
    fig["delivered_message_channel_pairs"] = delivered_pairs
    fig["redeliveries"] = redeliveries
    fig["requeued"] = counts["requeued"]
    fig["touched"] = counts["touched"]
    fig["held_to_time_out"] = counts["held_to_time_out"]
    fig["fin_sent"] = counts["fin_sent"]
    fig["fin_failed"] = sum(1 for fs in fins.values() for f in fs if f[3])
    fig["reader_starts"] = counts["reader_starts"]
    fig["removed"] = dict(removed)
    fig["per_channel"] = per_channel
    fig["unaccounted"] = len(unaccounted)
    fig["faults"] = len(faults)
    if unaccounted:
        P.append("%d unaccounted messages, e.g. %s" % (len(unaccounted), [
            "%s/%s %s published %.3f, %d deliveries" % u[:5] for u in unaccounted[:5]]))
    if faults:
        P.append("%d delivery faults: %s" % (len(faults), " | ".join(faults[:5])))
    if unexpected:
        P.append("%d unexpected client errors: %s" % (len(unexpected), " | ".join(unexpected[:8])))
    return fig, P, unaccounted, faults, unexpected
