"""What the cluster scripts (cluster-cpu.py, cluster-catchup.py, cluster-topic-churn.py,
cluster-failover-gaps.py) share: loopback ports, HTTP requests, waiting for a port,
a process's resident memory, and a 3-member cluster on loopback (`Cluster`).
Standard library only."""
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


_next_port = [None]


def free_port():
    """A TCP port on 127.0.0.1 free a moment ago, below the kernel's ephemeral range
    (ip_local_port_range): members are restarted on their ports, and an ephemeral one
    could meanwhile become the local end of an outgoing connection."""
    low = 10000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    if high <= low + 1000:
        high = 32768
    span = high - low
    if _next_port[0] is None:
        _next_port[0] = (os.getpid() * 7919 + time.time_ns()) % span
    for _ in range(span):
        port = low + _next_port[0] % span
        _next_port[0] += 7
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=b"", timeout=10, host="127.0.0.1"):
    """(status, body) of an HTTP request to `host`:`port`."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request(method, path, body=body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_port(port, deadline):
    """True once 127.0.0.1:`port` accepts a connection, False at `deadline` (time.time())."""
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def rss_mb(pid):
    """Process `pid`'s resident memory in MiB (VmRSS)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # the process is gone
        pass
    return 0.0


def member_args(nsqd, i, data, shards, members):
    """The command line of member `i` of `members` (dicts with "tcp", "http" and
    "cluster" ports): --node-id i+1, its data path, and the others as --cluster-peer."""
    m = members[i]
    return [
        nsqd,
        f"--node-id={i + 1}",
        f"--data-path={data}",
        f"--shards={shards}",
        f"--tcp-address=127.0.0.1:{m['tcp']}",
        f"--http-address=127.0.0.1:{m['http']}",
        f"--cluster-address=127.0.0.1:{m['cluster']}",
    ] + [f"--cluster-peer=127.0.0.1:{o['cluster']}" for o in members if o is not m]


class Cluster:
    """Three members of one cluster on free loopback ports, started at once, each with
    its data path `m<i>` and log `m<i>.log` in a temporary directory (`tmp`).
    `members[i]` holds member i's "tcp", "http" and "cluster" ports; `procs[i]` its
    process."""

    def __init__(self, nsqd, shards, prefix):
        self.nsqd = nsqd
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.members = [
            {"tcp": free_port(), "http": free_port(), "cluster": free_port()} for _ in range(3)
        ]
        self.args = [member_args(nsqd, i, self.data(i), shards, self.members) for i in range(3)]
        self.procs = [None] * 3
        for i in range(3):
            self.start(i)

    def data(self, i):
        return os.path.join(self.tmp, f"m{i}")

    def log(self, i):
        return os.path.join(self.tmp, f"m{i}.log")

    def start(self, i):
        """Starts member `i` on its data path (made if missing), its log appended to."""
        os.makedirs(self.data(i), exist_ok=True)
        log = open(self.log(i), "ab")
        self.procs[i] = subprocess.Popen(self.args[i], stdout=log, stderr=log)

    def kill(self, i):
        """kill -9 of member `i`, reaped."""
        p = self.procs[i]
        if p and p.poll() is None:
            p.kill()
            p.wait()

    def wait_http(self, within=30):
        """Exits the script unless every member's HTTP port answers within `within` s."""
        for m in self.members:
            if not wait_port(m["http"], time.time() + within):
                sys.exit(f"{self.nsqd}: a member's HTTP port did not answer (logs in {self.tmp})")

    def stop(self):
        """SIGTERM to every member (kill -9 after 10 s), then the directory goes."""
        for p in self.procs:
            if p and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
