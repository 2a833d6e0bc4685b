"""What the cluster scripts (cluster-cpu.py, cluster-catchup.py, cluster-topic-churn.py,
cluster-failover-gaps.py) share: loopback ports, HTTP requests, waiting for a port,
a process's resident memory, and the flags of a 3-member cluster's members.
Standard library only."""
import http.client
import socket
import time


def free_port():
    """A TCP port on 127.0.0.1 free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=b"", timeout=10):
    """(status, body) of an HTTP request to 127.0.0.1:`port`."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
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
