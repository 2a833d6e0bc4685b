#!/usr/bin/env python3
"""pynsq on the leader of a replicated topic that is cut off from the other members
while it runs (docs/replication.md, guarantees: the delivery lease).

usage: .venv/bin/python scripts/clients/pynsq_cut.py [<nsqd>]   (default: target/debug/nsqd)

The broker must be built with the `fault-injection` feature (`cargo build -p nsqd --bin
nsqd --features fault-injection`): each member gets an NSQD_CLUSTER_CUT_FILE, and the
leader is cut off by creating its file (its cluster connections stay open and carry
nothing) for 3 s. A pynsq Reader on the leader (max_in_flight 1, 20 ms per message) takes
a backlog of 1,500 messages. Prints when pynsq got its last message during the cut (the
lease ends it about 0.2-0.25 s after the cut, before the others elect a new leader), when
it got the first after the heal (the old leader relays it to the new one on the same
connection), and the messages lost (must be 0) and received twice. Exit status 1 if any
message was lost or pynsq got one 450 ms or more after the cut while it lasted."""
import json, os, sys, time, threading, subprocess
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cluster_lib  # noqa: E402
import nsq  # noqa: E402
import tornado.ioloop  # noqa: E402

NSQD = sys.argv[1] if len(sys.argv) > 1 else "target/debug/nsqd"
TOTAL = 1500

class Cut(cluster_lib.Cluster):
    def cut_file(self, i):
        return os.path.join(self.tmp, f"m{i}.cut")
    def start(self, i):
        os.makedirs(self.data(i), exist_ok=True)
        log = open(self.log(i), "ab")
        self.procs[i] = subprocess.Popen(self.args[i], stdout=log, stderr=log,
            env={**os.environ, "NSQD_CLUSTER_CUT_FILE": self.cut_file(i)})

c = Cut(NSQD, 1, "pynsq-cut-")
c.wait_http()
h = [m["http"] for m in c.members]
cluster_lib.request(h[0], "POST", "/topic/create?topic=t")
leader = None
for _ in range(200):
    try:
        st = json.loads(cluster_lib.request(h[0], "GET", "/cluster")[1])
        t = [x for x in st["topics"] if x["topic"] == "t"]
        if t and t[0].get("leader"):
            addr = t[0]["leader"]
            leader = [i for i, m in enumerate(c.members) if addr.endswith(":%d" % m["cluster"])][0]
            break
    except Exception:
        pass
    time.sleep(0.05)
assert leader is not None, "no leader"
cluster_lib.request(h[leader], "POST", "/channel/create?topic=t&channel=c")
for k in range(0, TOTAL, 100):
    body = "\n".join("m%04d" % j for j in range(k, k + 100)).encode()
    s, b = cluster_lib.request(h[leader], "POST", "/mpub?topic=t", body)
    assert s == 200, b
got = []  # (monotonic, body, attempts)
def handler(msg):
    got.append((time.monotonic(), msg.body.decode(), msg.attempts))
    time.sleep(0.02)
    return True
r = nsq.Reader(topic="t", channel="c", message_handler=handler,
               nsqd_tcp_addresses=["127.0.0.1:%d" % c.members[leader]["tcp"]], max_in_flight=1)
marks = {}
def driver():
    time.sleep(1.5)
    marks["cut"] = time.monotonic()
    open(c.cut_file(leader), "w").close()
    time.sleep(3)
    os.remove(c.cut_file(leader))
    marks["heal"] = time.monotonic()
    deadline = time.time() + 60
    while time.time() < deadline and len({b for _, b, _ in got}) < TOTAL:
        time.sleep(0.2)
    tornado.ioloop.IOLoop.current().add_callback(tornado.ioloop.IOLoop.current().stop)
loop = tornado.ioloop.IOLoop.current()
threading.Thread(target=driver, daemon=True).start()
nsq.run()
cut, heal = marks["cut"], marks["heal"]
during = [(round((t - cut) * 1000), b, a) for t, b, a in got if cut <= t < heal]
after = [(round((t - heal) * 1000), b, a) for t, b, a in got if t >= heal]
bodies = {b for _, b, _ in got}
print("leader member", leader + 1)
print("messages during the cut:", len(during), "last at", during[-1][0] if during else None, "ms after the cut")
print("first after the heal at", after[0][0] if after else None, "ms; received", len(got), "distinct", len(bodies), "of", TOTAL, "; lost", TOTAL - len(bodies))
print("repeats:", len(got) - len(bodies), "attempts>1:", sum(1 for _, _, a in got if a > 1))
for i in range(3):
    print("member", i + 1, [l.strip()[:160] for l in open(c.log(i)) if "no answer from" in l or "led by" in l or "relayed" in l or "cut this" in l][:6])
c.stop()
late = [ms for ms, _, _ in during if ms >= 450]
if late or len(bodies) < TOTAL:
    sys.exit(f"FAIL: {len(late)} message(s) 450 ms or more after the cut; {TOTAL - len(bodies)} lost")
print("PASS")
