#!/usr/bin/env python3
"""A 3-member cluster under a real network partition: how long a cut-off leader goes on
delivering (the delivery lease), when the others elect a new leader, what is delivered
twice or lost, and how soon the cut-off member's consumer is served again after the heal.
Standard library only; needs root (network namespaces).

    sudo python3 scripts/cluster-partition.py [--broker target/release/nsqd]
                 [--baseline OTHER_NSQD] [--cuts 3] [--cut-seconds 4]
                 [--mode leader|follower|both] [--backlog 3000]
                 [--subnet 10.147.0.0/24] [--keep]

The network: three namespaces (ncp<PID>-1..3), each with an `eth0` at the subnet's first
three addresses, whose peers (ncpv<PID>-1..3) are ports of a bridge (ncpbr<PID>) that
holds the subnet's last address in the root namespace. Cutting a member is
`ip link set <its veth> down`: its packets go nowhere and its TCP connections stall, as
in a real partition, until the link is set up again.

Each trial (`--cuts` of them per broker; with --baseline the two brokers take turns) runs
on a fresh cluster: member i runs in namespace i with --node-id=i, --cluster-address
(port 4153) and the two others as --cluster-peer, TCP 4150 and HTTP 4151 on its address,
a fresh data path. It is taken as up when its TCP and HTTP ports answer. Topic `t` and
channel `c` are created (on member 1, 2 or 3 in turn, so the leader changes), and once
all three members' GET /cluster name one leader of `t`, the leader is sent a backlog of
--backlog bodies (`b0`, `b1`, ...). Then, for the whole trial:
- consumer A, inside the leader's namespace, subscribes to the leader: RDY 1, each
  message FINished 20 ms after it arrives;
- consumer B, in the root namespace, does the same on one follower (F1);
- a publisher, in the root namespace, POSTs /pub to the other follower (F2) every 50 ms
  (bodies `s0`, `s1`, ...);
- a poller inside each member's namespace reads that member's GET /cluster every 20 ms.
After 2 s of steady delivery, the cut: `--mode leader` cuts the leader, `follower` cuts
F2, `both` cuts F1 and F2 (the leader is left alone, without a quorum). The links come
back up after --cut-seconds. 3 s later the publisher stops; 1 s after that both consumers
drain (RDY 200, FIN at once) until every acknowledged body has been received and every
member's channel shows depth, in flight and deferred 0 (at most 90 s).

Every time is taken with the monotonic clock (shared by all namespaces) and is given in
ms from the cut, which is read right before `ip link set ... down` runs. The members'
log stamps (UTC wall clock) are placed with the wall clock read next to it.

One row per trial (with --mode follower, A and B are not interrupted: A last is then just
before the link came up, and A gap is the figure to look at):
- A last: A's last message between the cut and the link coming up; `A n` how many there
  were. With the lease, the cut-off leader stops delivering ~120-250 ms after the cut.
- elected: when a member first became leader of `t` in a later term, from the members'
  logs ("this node leads it") / from the polls; margin: the earlier of the two minus A
  last (minus the cut when A got nothing after it).
- B first: B's first message at least 100 ms after the cut (those before were already on
  their way from the old leader; their number is added as +N).
- overlap: bodies A received after the cut (before the link came up) that B received too:
  delivered to two consumers at once.
- lost: acknowledged bodies (the backlog and each publish answered 200) that neither
  consumer received, of all acknowledged.
- depths: each member's channel depth/in flight/deferred at the end ("0": all zero).
- A resumed: A's first message after the link came up, in ms after the link came up
  ("-": none before the trial ended, ~4 s after the heal plus the drain).
- A gap: A's longest time without a message between 0.5 s before the cut and 1 s after
  the link came up, these two ends included (with a follower cut, the leader's consumer
  should not notice it: about the 20 ms of its FIN delay).
- exited: members that exited by themselves during the trial.

Then one summary line per broker: medians of A last, elected (the earlier of log and
poll), A resumed and A gap, the smallest margin, overlap and lost summed, and the
number of trials where A received a message after the new leader was elected (the
lease violated: a margin of 0 or less) or a member exited.

Exit status: 1 if any acknowledged body was lost or a member exited by itself, or if
(for --broker, with --mode leader or both) the lease was violated; 2 if not root, if
`ip netns` does not work or if the subnet is in use; 0 otherwise. The namespaces, bridge,
veths, brokers, helper processes and data directories are removed however the script
ends (--keep leaves the data directories and logs, and prints where). The names carry
the script's PID; after a kill -9 of the script, remove them with `ip netns del` and
`ip link del`.

A default run (3 trials of 4 s cuts, one broker) takes under a minute, twice that with
--baseline; a 15 s cut adds 11 s to each trial.
"""
import argparse
import datetime
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(SCRIPT))
import cluster_lib  # noqa: E402  (beside this script)

TOPIC, CHANNEL = "t", "c"
TCP_PORT, HTTP_PORT, CLUSTER_PORT = 4150, 4151, 4153
FIN_AFTER_S = 0.02        # a consumer's FIN comes this long after its message
PUBLISH_EVERY_S = 0.05
POLL_EVERY_S = 0.02
STEADY_S = 2.0            # steady delivery before the cut
AFTER_HEAL_S = 3.0        # publishing goes on this long after the link comes up
IN_TRANSIT_S = 0.1        # B's messages this soon after the cut were already on their way
DRAIN_TIMEOUT_S = 90.0

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


# Helpers: the script run again with a hidden subcommand, inside a namespace or not.

def recv_exact(sock, n, may_idle):
    """`n` bytes from `sock`. With `may_idle`, a socket timeout before any byte has
    arrived is raised (socket.timeout); a frame already begun is read to its end."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except socket.timeout:
            if may_idle and not buf:
                raise
            continue
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def read_frame(sock):
    """(frame type, data) of the next protocol V2 frame; socket.timeout if none has
    begun within the socket's timeout."""
    size = struct.unpack(">i", recv_exact(sock, 4, True))[0]
    frame = recv_exact(sock, size, False)
    return struct.unpack(">i", frame[:4])[0], frame[4:]


def subscribe(host, port):
    """A protocol V2 connection subscribed to topic/channel with RDY 1, reads timing
    out after 50 ms (so that the consumer looks at its flags)."""
    sock = socket.create_connection((host, port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2" + f"SUB {TOPIC} {CHANNEL}\n".encode())
    kind, data = read_frame(sock)
    if kind != FRAME_RESPONSE or data != b"OK":
        sock.close()
        raise ConnectionError(f"SUB answered {data!r}")
    sock.sendall(b"RDY 1\n")
    sock.settimeout(0.05)
    return sock


def stop_flags(*names):
    """A dict of flags, each set by a signal: {"SIGTERM": False, ...}."""
    flags = {name: False for name in names}
    for name in names:
        signal.signal(getattr(signal, name), lambda *_, n=name: flags.__setitem__(n, True))
    return flags


def consume(addr, log_path):
    """Hidden subcommand `consume HOST:PORT LOG`: a consumer of topic t / channel c.
    RDY 1, each message FINished FIN_AFTER_S after it arrives; after SIGUSR1 (the drain)
    RDY 200 and FIN at once; on SIGTERM CLS and exit. Reconnects when its connection
    ends. Logs `MSG <monotonic> <body> <attempts>` per message and
    `EVT <monotonic> <what>` per event."""
    host, port = addr.rsplit(":", 1)
    log = open(log_path, "a", buffering=1)
    flags = stop_flags("SIGTERM", "SIGUSR1")

    def event(what):
        log.write(f"EVT {time.monotonic():.6f} {what}\n")

    sock, draining = None, False
    while not flags["SIGTERM"]:
        if sock is None:
            try:
                sock, draining = subscribe(host, int(port)), False
                event(f"connected to {addr}")
            except (OSError, EOFError) as e:
                event(f"connect failed: {e}")
                time.sleep(0.2)
                continue
        try:
            if flags["SIGUSR1"] and not draining:
                draining = True
                sock.sendall(b"RDY 200\n")
                event("drain")
            try:
                kind, data = read_frame(sock)
            except socket.timeout:
                continue
            now = time.monotonic()
            if kind == FRAME_MESSAGE:
                attempts = struct.unpack(">H", data[8:10])[0]
                msg_id, body = data[10:26], data[26:]
                log.write(f"MSG {now:.6f} {body.decode(errors='replace')} {attempts}\n")
                if not draining:
                    time.sleep(FIN_AFTER_S)
                sock.sendall(b"FIN " + msg_id + b"\n")
            elif kind == FRAME_RESPONSE and data == b"_heartbeat_":
                sock.sendall(b"NOP\n")
            else:
                event(f"{'error' if kind == FRAME_ERROR else 'response'} {data!r}")
                if data == b"CLOSE_WAIT":
                    raise EOFError("CLOSE_WAIT")
        except (OSError, EOFError) as e:
            event(f"disconnected: {e}")
            sock.close()
            sock = None
    if sock is not None:
        try:
            sock.sendall(b"CLS\n")
        except OSError:
            pass
    event("stopped")


def publish(addr, log_path):
    """Hidden subcommand `publish HOST:PORT LOG`: POST /pub?topic=t every
    PUBLISH_EVERY_S with bodies s0, s1, ..., one connection each (8 s timeout), until
    SIGTERM. Logs `<sent> <answered> <body> <status>` (status 0: no answer)."""
    host, port = addr.rsplit(":", 1)
    log = open(log_path, "a", buffering=1)
    flags = stop_flags("SIGTERM")
    k = 0
    while not flags["SIGTERM"]:
        body = f"s{k}"
        k += 1
        sent = time.monotonic()
        try:
            status = request(host, "POST", f"/pub?topic={TOPIC}", body.encode(), timeout=8,
                             port=int(port))[0]
        except OSError:
            status = 0
        log.write(f"{sent:.6f} {time.monotonic():.6f} {body} {status}\n")
        time.sleep(max(0.0, PUBLISH_EVERY_S - (time.monotonic() - sent)))


def poll(addr, log_path):
    """Hidden subcommand `poll HOST:PORT LOG`: GET /cluster every POLL_EVERY_S until
    SIGTERM. Logs each change of the member's view of topic t:
    `<monotonic answered> <leader> <role> <term> <is_leader>`, or `<monotonic> ERR <what>`."""
    host, port = addr.rsplit(":", 1)
    log = open(log_path, "a", buffering=1)
    flags = stop_flags("SIGTERM")
    conn, last = None, None
    while not flags["SIGTERM"]:
        asked = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, int(port), timeout=0.3)
            conn.request("GET", "/cluster")
            view = topic_view(json.loads(conn.getresponse().read()))
            now = (f"{view['leader']} {view['role']} {view['term']} {view['is_leader']}"
                   if view else "none")
        except (OSError, ValueError, http.client.HTTPException) as e:
            conn = None
            now = f"ERR {type(e).__name__}"
        if now != last:
            log.write(f"{time.monotonic():.6f} {now}\n")
            last = now
        time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - asked)))


HELPERS = {"consume": consume, "publish": publish, "poll": poll}


# The cluster, seen from the root namespace.

def request(host, method, path, body=None, timeout=5, port=HTTP_PORT):
    """(status, body) of an HTTP request to a member at `host`."""
    return cluster_lib.request(port, method, path, body, timeout, host=host)


def topic_view(cluster):
    """Topic t's entry in a GET /cluster answer, or None."""
    return next((e for e in cluster.get("topics", []) if e.get("topic") == TOPIC), None)


def answers(host, port):
    """True if host:port accepts a TCP connection."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def wait_for(what, check, timeout, every=0.05):
    """The first true value of `check()` (exceptions count as false); exits the script
    if there is none within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException):
            pass
        time.sleep(every)
    sys.exit(f"{what}: not within {timeout:g} s")


# Everything started, removed however the script ends (cleanup()).
PROCESSES = []
NETWORK = []
WORKDIRS = []


def spawn(namespace, argv, out_path):
    """Starts `argv` in its own session (inside `namespace` unless None), its output
    appended to `out_path`."""
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    with open(out_path, "ab") as out:
        p = subprocess.Popen(prefix + argv, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    PROCESSES.append(p)
    return p


def stop(p, grace):
    """SIGTERM to `p`'s process group, SIGKILL after `grace` s; reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    p.wait()
    if p in PROCESSES:
        PROCESSES.remove(p)


def ip(*args, check=True):
    """Runs `ip ARGS`; raises CalledProcessError (with its stderr) if `check` and it fails."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Network:
    """Three namespaces on one bridge. Member i (1-3) lives in namespace `ns[i]` at
    `addr[i]` on its `eth0`, whose peer `veth[i]` is a port of the bridge; the bridge
    holds the subnet's last address, so the root namespace reaches every member."""

    def __init__(self, subnet):
        tag = os.getpid()
        hosts = [subnet[1], subnet[2], subnet[3], subnet[-2]]
        self.bridge = f"ncpbr{tag}"
        self.ns = {i: f"ncp{tag}-{i}" for i in (1, 2, 3)}
        self.veth = {i: f"ncpv{tag}-{i}" for i in (1, 2, 3)}
        self.addr = {i: str(hosts[i - 1]) for i in (1, 2, 3)}
        self.bridge_addr = f"{hosts[-1]}/{subnet.prefixlen}"
        self.prefixlen = subnet.prefixlen

    def create(self):
        """Creates the bridge, the namespaces and the veths, all up."""
        NETWORK.append(self)
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", self.bridge_addr, "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in (1, 2, 3):
            ip("netns", "add", self.ns[i])
            ip("link", "add", self.veth[i], "type", "veth", "peer", "name", "eth0",
               "netns", self.ns[i])
            ip("link", "set", self.veth[i], "master", self.bridge)
            ip("link", "set", self.veth[i], "up")
            ip("-n", self.ns[i], "addr", "add", f"{self.addr[i]}/{self.prefixlen}", "dev", "eth0")
            ip("-n", self.ns[i], "link", "set", "eth0", "up")
            ip("-n", self.ns[i], "link", "set", "lo", "up")

    def link(self, i, up):
        """Sets member i's link up or down (down: the member is cut off)."""
        ip("link", "set", self.veth[i], "up" if up else "down")

    def remove(self):
        """Deletes whatever of the namespaces, veths and bridge exists."""
        for i in (1, 2, 3):
            ip("netns", "del", self.ns[i], check=False)
            ip("link", "del", self.veth[i], check=False)
        ip("link", "del", self.bridge, check=False)
        if self in NETWORK:
            NETWORK.remove(self)


def cleanup():
    """Stops every process started, removes the network and the data directories
    (--keep: prints where they are instead). Safe to call twice."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for p in list(PROCESSES):
        stop(p, 10)
    for net in list(NETWORK):
        net.remove()
    for path, keep in WORKDIRS:
        if keep:
            print(f"logs and data directories kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)
    WORKDIRS.clear()


# One trial.

class Trial:
    """One cut on a fresh cluster of `broker` in `net`; its files in `workdir`."""

    def __init__(self, broker, net, workdir, mode, cut_s, backlog, create_on):
        self.broker, self.net, self.dir = broker, net, workdir
        self.mode, self.cut_s, self.backlog, self.create_on = mode, cut_s, backlog, create_on
        self.members = {}
        self.helpers = []

    def path(self, name):
        """A file of this trial."""
        return os.path.join(self.dir, name)

    def start_members(self):
        """Starts the three members and waits until their TCP and HTTP ports answer."""
        net = self.net
        for i in (1, 2, 3):
            data = self.path(f"m{i}")
            os.makedirs(data)
            a = net.addr[i]
            peers = [f"--cluster-peer={net.addr[j]}:{CLUSTER_PORT}" for j in (1, 2, 3) if j != i]
            self.members[i] = spawn(net.ns[i], [
                self.broker, f"--node-id={i}", f"--data-path={data}",
                f"--cluster-address={a}:{CLUSTER_PORT}", *peers,
                f"--tcp-address={a}:{TCP_PORT}", f"--http-address={a}:{HTTP_PORT}",
                f"--broadcast-address={a}"], self.path(f"m{i}.log"))
        for i in (1, 2, 3):
            def up(i=i):
                if self.members[i].poll() is not None:
                    with open(self.path(f"m{i}.log"), errors="replace") as f:
                        tail = "".join(f.readlines()[-10:])
                    sys.exit(f"{self.broker}: member {i} exited at start; its log ends:\n{tail}")
                return answers(net.addr[i], TCP_PORT) and answers(net.addr[i], HTTP_PORT)
            wait_for(f"member {i}'s TCP and HTTP ports", up, 30)

    def agreed_leader(self):
        """(member, term) of topic t's leader if all three members name the same one."""
        views = [topic_view(json.loads(request(self.net.addr[i], "GET", "/cluster",
                                               timeout=2)[1])) for i in (1, 2, 3)]
        leaders = {v and v["leader"] for v in views}
        if len(leaders) != 1 or None in leaders:
            return None
        leader = self.member_of(leaders.pop())
        return leader, views[leader - 1]["term"]

    def member_of(self, cluster_address):
        """The member (1-3) at a cluster address, None for another or none."""
        host = (cluster_address or "").rsplit(":", 1)[0]
        return next((i for i, a in self.net.addr.items() if a == host), None)

    def prepare(self):
        """Creates topic and channel, waits for one leader, publishes the backlog."""
        creator = self.net.addr[self.create_on]
        for path in (f"/topic/create?topic={TOPIC}",
                     f"/channel/create?topic={TOPIC}&channel={CHANNEL}"):
            wait_for(f"POST {path}",
                     lambda p=path: request(creator, "POST", p, timeout=10)[0] == 200, 20, 0.2)
        self.leader, self.term = wait_for("one leader of t named by all members",
                                          self.agreed_leader, 20)
        self.f1, self.f2 = [i for i in (1, 2, 3) if i != self.leader]
        self.bodies = [f"b{k}" for k in range(self.backlog)]
        for k in range(0, self.backlog, 500):
            status, body = request(self.net.addr[self.leader], "POST", f"/mpub?topic={TOPIC}",
                                   "\n".join(self.bodies[k:k + 500]).encode(), timeout=10)
            if status != 200:
                sys.exit(f"{self.broker}: MPUB answered {status} {body!r}")

    def start_helpers(self):
        """Pollers in each member's namespace, consumer A in the leader's namespace,
        consumer B and the publisher in the root namespace."""
        net, me = self.net, [sys.executable, SCRIPT]

        def helper(namespace, name, member, port):
            self.helpers.append(spawn(namespace, me + [
                name.split("-")[0], f"{net.addr[member]}:{port}", self.path(f"{name}.log")],
                self.path("helpers.out")))
            return self.helpers[-1]

        for i in (1, 2, 3):
            helper(net.ns[i], f"poll-{i}", i, HTTP_PORT)
        self.consumers = [helper(net.ns[self.leader], "consume-A", self.leader, TCP_PORT),
                          helper(None, "consume-B", self.f1, TCP_PORT)]
        self.publisher = helper(None, "publish", self.f2, HTTP_PORT)

    def victims(self):
        """The members cut off in this mode."""
        return {"leader": [self.leader], "follower": [self.f2],
                "both": [self.f1, self.f2]}[self.mode]

    def cut(self):
        """Cuts the victims off for cut_s s; records the cut and heal times."""
        if self.mode == "leader" and wait_for("one leader of t", self.agreed_leader, 5) != \
                (self.leader, self.term):
            sys.exit(f"{self.broker}: leadership of t moved before the cut")
        self.cut_wall = time.time()
        self.cut_at = time.monotonic()
        for v in self.victims():
            self.net.link(v, False)
        time.sleep(self.cut_s)
        self.up_at = time.monotonic()
        for v in self.victims():
            self.net.link(v, True)

    def acknowledged(self):
        """The bodies the cluster acknowledged: the backlog and each publish answered 200."""
        acked = set(self.bodies)
        for line in lines(self.path("publish.log")):
            if len(line) == 4 and line[3] == "200":
                acked.add(line[2])
        return acked

    def received(self):
        """The bodies either consumer received."""
        return {b for c in "AB" for _, b in messages(self.path(f"consume-{c}.log"))}

    def depths(self):
        """{member: (depth, in flight, deferred)} of channel c; None for a member that
        does not answer."""
        out = {}
        for i in (1, 2, 3):
            try:
                stats = json.loads(request(self.net.addr[i], "GET",
                                           f"/stats?format=json&topic={TOPIC}&channel={CHANNEL}",
                                           timeout=2)[1])
                ch = stats["topics"][0]["channels"][0]
                out[i] = (ch["depth"], ch["in_flight_count"], ch["deferred_count"])
            except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException):
                out[i] = None
        return out

    def drain(self):
        """Stops the publisher, drains the consumers until everything acknowledged has
        been received and every channel is empty, and records the end state."""
        time.sleep(AFTER_HEAL_S)
        stop(self.publisher, 10)
        time.sleep(1)
        for c in self.consumers:
            os.kill(c.pid, signal.SIGUSR1)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.acknowledged() - self.received() and \
                    all(d == (0, 0, 0) for d in self.depths().values()):
                break
            time.sleep(0.5)
        time.sleep(1)  # late redeliveries still count
        self.end_depths = self.depths()
        self.exited = [i for i, p in self.members.items() if p.poll() is not None]

    def stop_all(self):
        """Stops the helpers, then the members (the links are up again by now)."""
        for p in self.helpers + list(self.members.values()):
            if p in PROCESSES:
                stop(p, 10)

    def run(self):
        """The whole trial; returns its measures (see measure())."""
        try:
            self.start_members()
            self.prepare()
            self.start_helpers()
            time.sleep(STEADY_S)
            try:
                self.cut()
            finally:
                for i in (1, 2, 3):
                    self.net.link(i, True)
            self.drain()
        finally:
            self.stop_all()
        return self.measure()

    def measure(self):
        """The trial's measures, in ms from the cut (see the module docstring)."""
        cut, up = self.cut_at, self.up_at

        def ms(t):
            return round((t - cut) * 1000)

        a = messages(self.path("consume-A.log"))
        b = messages(self.path("consume-B.log"))
        a_cut = [(t, body) for t, body in a if cut < t < up]
        a_after = [t for t, _ in a if t >= up]
        b_after = [t for t, _ in b if t > cut]
        b_late = [t for t in b_after if t - cut >= IN_TRANSIT_S]
        window = [cut - 0.5] + [t for t, _ in a if cut - 0.5 < t < up + 1] + [up + 1]
        b_bodies = {body for _, body in b}
        acked = self.acknowledged()
        m = {
            "leader": self.leader,
            "a_n": len(a_cut),
            "a_last": ms(a_cut[-1][0]) if a_cut else None,
            "elected_log": self.elected_from_logs(),
            "elected_poll": self.elected_from_polls(),
            "b_first": ms(b_late[0]) if b_late else None,
            "b_in_transit": len(b_after) - len(b_late),
            "overlap": sum(1 for _, body in a_cut if body in b_bodies),
            "lost": len(acked - self.received()),
            "acked": len(acked),
            "depths": self.end_depths,
            "a_resumed": round((a_after[0] - up) * 1000) if a_after else None,
            "a_gap": max(round((y - x) * 1000) for x, y in zip(window, window[1:])),
            "exited": self.exited,
        }
        known = [e for e in (m["elected_log"], m["elected_poll"]) if e is not None]
        m["elected"] = min(known) if known else None
        m["margin"] = (m["elected"] - (m["a_last"] or 0)
                       if m["elected"] is not None and self.mode != "follower" else None)
        m["violated"] = m["margin"] is not None and m["a_last"] is not None and m["margin"] <= 0
        return m

    def elected_from_logs(self):
        """ms from the cut to the first log line of a member that leads t in a later term."""
        pattern = re.compile(r"^\[nsqd\] (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) \w+: "
                             rf"TOPIC\({TOPIC}\): this node leads it \(term (\d+)\)")
        times = []
        for i in (1, 2, 3):
            with open(self.path(f"m{i}.log"), errors="replace") as f:
                for line in f:
                    hit = pattern.match(line)
                    if hit and int(hit.group(2)) > self.term:
                        stamp = datetime.datetime.strptime(hit.group(1), "%Y/%m/%d %H:%M:%S.%f")
                        at = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
                        times.append(round((at - self.cut_wall) * 1000))
        return min(times, default=None)

    def elected_from_polls(self):
        """ms from the cut to the first poll in which a member names a leader of t in a
        later term."""
        times = []
        for i in (1, 2, 3):
            for line in lines(self.path(f"poll-{i}.log")):
                if len(line) == 5 and line[1] != "None" and int(line[3]) > self.term:
                    times.append(round((float(line[0]) - self.cut_at) * 1000))
                    break
        return min(times, default=None)


def lines(path):
    """The whitespace-split lines of a log file (none if it does not exist yet)."""
    try:
        with open(path, errors="replace") as f:
            return [line.split() for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def messages(path):
    """[(monotonic time, body)] of a consumer's log."""
    return [(float(p[1]), p[2]) for p in lines(path) if p[0] == "MSG" and len(p) == 4]


# Output.

COLUMNS = ("broker   #  leader  A last  A n  elected log/poll  margin  B first  overlap"
           "  lost/acked  depths  A resumed  A gap  exited")


def show(value, suffix=""):
    """A measure as printed: "-" when there is none."""
    return "-" if value is None else f"{value}{suffix}"


def row(label, n, m):
    """One table line of a trial's measures."""
    b_first = show(m["b_first"]) + (f"(+{m['b_in_transit']})" if m["b_in_transit"] else "")
    depths = ("0" if all(d == (0, 0, 0) for d in m["depths"].values())
              else " ".join(f"m{i}:{'/'.join(map(str, d)) if d else '?'}"
                            for i, d in m["depths"].items()))
    elected = f"{show(m['elected_log'])}/{show(m['elected_poll'])}"
    return (f"{label:<8} {n:>2}  m{m['leader']:<5} {show(m['a_last']):>6}  {m['a_n']:>3}"
            f"  {elected:>16}  {show(m['margin']):>6}  {b_first:>7}  {m['overlap']:>7}"
            f"  {m['lost']:>4}/{m['acked']:<5}  {depths:>6}  {show(m['a_resumed']):>9}"
            f"  {show(m['a_gap']):>5}  {','.join(f'm{i}' for i in m['exited']) or '-'}")


def median(values):
    """The rounded median of the values that are not None; None if there are none."""
    values = [v for v in values if v is not None]
    return round(statistics.median(values)) if values else None


def summary(label, broker, mode, cut_s, trials):
    """The one-line summary of a broker's trials."""
    margins = [m["margin"] for m in trials if m["margin"] is not None]
    violated = sum(m["violated"] for m in trials)
    exited = sum(bool(m["exited"]) for m in trials)
    return (f"{label} {broker}: mode {mode}, {len(trials)} cuts of {cut_s:g} s: "
            f"A last after cut median {show(median(m['a_last'] for m in trials), ' ms')}, "
            f"elected median {show(median(m['elected'] for m in trials), ' ms')}, "
            f"min margin {show(min(margins, default=None), ' ms')}, "
            f"overlap {sum(m['overlap'] for m in trials)}, "
            f"lost {sum(m['lost'] for m in trials)} of {sum(m['acked'] for m in trials)}, "
            f"A resumed median {show(median(m['a_resumed'] for m in trials), ' ms')} after "
            f"link up, A gap median {show(median(m['a_gap'] for m in trials), ' ms')}; "
            f"lease violated in {violated}, member exited in {exited}")


def check_host(subnet):
    """Exits with 2 unless this runs as root with a working `ip netns`, and the subnet
    is free in the root namespace."""
    if os.geteuid() != 0:
        print("cluster-partition.py needs root (it creates network namespaces): "
              "run it with sudo", file=sys.stderr)
        sys.exit(2)
    try:
        ip("netns", "list")
        routes = ip("-4", "route", "show").stdout.split("\n")
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"`ip netns` does not work here: {e}", file=sys.stderr)
        sys.exit(2)
    for route in routes:
        for word in route.split()[:2]:  # "10.0.0.0/8 dev ..." or "blackhole 10.0.0.0/8"
            try:
                dst = ipaddress.ip_network(word, strict=False)
            except ValueError:
                continue
            if dst.overlaps(subnet):
                print(f"the subnet {subnet} is in use here ({route.strip()}): pick another "
                      "with --subnet", file=sys.stderr)
                sys.exit(2)


def main():
    if len(sys.argv) == 4 and sys.argv[1] in HELPERS:
        HELPERS[sys.argv[1]](sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default=os.path.join(ROOT, "target/release/nsqd"),
                    help="the nsqd under test")
    ap.add_argument("--baseline", help="another nsqd, run in turn with --broker")
    ap.add_argument("--cuts", type=int, default=3, help="trials per broker")
    ap.add_argument("--cut-seconds", type=float, default=4.0, help="how long a cut lasts")
    ap.add_argument("--mode", choices=["leader", "follower", "both"], default="leader",
                    help="cut the leader, one follower, or both followers")
    ap.add_argument("--backlog", type=int, default=3000, help="bodies published before the cut")
    ap.add_argument("--subnet", type=ipaddress.ip_network, default="10.147.0.0/24",
                    help="the members' subnet (a /29 or larger)")
    ap.add_argument("--keep", action="store_true", help="keep the logs and data directories")
    a = ap.parse_args()
    brokers = [("broker", os.path.abspath(a.broker))]
    if a.baseline:
        brokers.append(("baseline", os.path.abspath(a.baseline)))
    for _, path in brokers:
        if not os.access(path, os.X_OK):
            sys.exit(f"{path}: not an executable")
    check_host(a.subnet)

    def interrupted(signum, _frame):
        print(f"{signal.Signals(signum).name}: stopping and cleaning up", file=sys.stderr)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    workdir = tempfile.mkdtemp(prefix="cluster-partition-")
    WORKDIRS.append((workdir, a.keep))
    try:
        net = Network(a.subnet)
        try:
            net.create()
        except subprocess.CalledProcessError as e:
            print(f"`ip netns` does not work here: {' '.join(e.cmd)}: {e.stderr.strip()}",
                  file=sys.stderr)
            return 2
        for label, path in brokers:
            print(f"{label}: {path}")
        print(f"mode {a.mode}, cuts of {a.cut_seconds:g} s, backlog {a.backlog}; "
              f"times in ms from the cut; members at {net.addr[1]}-3 in {net.ns[1]}-3")
        print(COLUMNS, flush=True)
        results = {label: [] for label, _ in brokers}
        for n in range(1, a.cuts + 1):
            for label, path in brokers:
                trial_dir = os.path.join(workdir, f"{label}-{n}")
                os.makedirs(trial_dir)
                m = Trial(path, net, trial_dir, a.mode, a.cut_seconds, a.backlog,
                          (n - 1) % 3 + 1).run()
                results[label].append(m)
                print(row(label, n, m), flush=True)
        failed = False
        for label, path in brokers:
            trials = results[label]
            print(summary(label, path, a.mode, a.cut_seconds, trials))
            failed |= any(m["lost"] or m["exited"] for m in trials)
            failed |= label == "broker" and a.mode != "follower" and \
                any(m["violated"] for m in trials)
        return 1 if failed else 0
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
