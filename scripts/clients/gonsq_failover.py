#!/usr/bin/env python3
"""A replicated topic's leader killed under the Go NSQ clients (docs/replication.md):
go-nsq (scripts/clients/gonsq_client.go), and the upstream tools nsq_tail, nsq_to_file
and nsqadmin from github.com/nsqio/nsq (apps/), all unmodified.

usage: gonsq_failover.py [<nsqd> <nsqlookupd>]   (default: target/debug/nsqd, target/debug/nsqlookupd)

The Go binaries are looked for in $GO_NSQ_BIN (default target/gobin): gonsq_client,
nsq_tail, nsq_to_file, nsqadmin. If one is missing the script says so and exits 0
(skipped). To build them without the module proxy (Go 1.19, GOPATH mode):

    GOPATH=<a directory>, sources under $GOPATH/src: github.com/nsqio/{nsq,go-nsq,go-diskqueue},
    github.com/golang/snappy, github.com/BurntSushi/toml (tag v1.3.2),
    github.com/bitly/{go-hostpool,timer_metrics}, github.com/blang/semver,
    github.com/bmizerany/perks, github.com/julienschmidt/httprouter,
    github.com/mreiferson/go-options, github.com/judwhite/go-svc (= mreiferson/go-svc)
    cd $GOPATH/src/github.com/nsqio/nsq && for a in nsq_tail nsq_to_file nsqadmin; do
        GO111MODULE=off go build -o $ROOT/target/gobin/$a ./apps/$a; done
    GO111MODULE=off go build -o $ROOT/target/gobin/gonsq_client scripts/clients/gonsq_client.go

Scenario: nsqlookupd, three members (--node-id 1/2/3, own --data-path, each with
--lookupd-tcp-address), nsqadmin on the lookupd. Topic T is created on member 1; the
go-nsq consumer (channel gonsq), nsq_tail (--channel=tail) and nsq_to_file (channel
nsq_to_file, --sync-interval=1s) find it through nsqlookupd. SCENARIO_MESSAGES (default
200) bodies are published with HTTP /pub through member 1 (PUB_VIA=follower: through a
follower); once every client has them all, nsqadmin's API is read, the leader (GET
/cluster, "is_leader") is killed with SIGKILL, and as many bodies again are published
through a surviving member (HTTP /pub, retried on either survivor until OK;
PRODUCER=gonsq: with `gonsq_client pub` connected to all three members instead). Each
client must then receive every body (duplicates counted, not failures). nsqadmin's API
is read again. CLIENT_POLL (e.g. 1s) sets go-nsq's lookupd_poll_interval for all three
consumers (default: go-nsq's own default, 60 s). SETTLE=S waits S seconds between the
first round and the kill (past go-nsq's initial lookupd poll jitter, up to 0.3 x the
poll interval, during which a connection loss does not re-poll at once). Gives up after SCENARIO_TIMEOUT
(default 240) seconds per wait. Exit status 0 if every client got every body.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

NAME = "gonsq-failover"
N = int(os.environ.get("SCENARIO_MESSAGES", "200"))
TIMEOUT = float(os.environ.get("SCENARIO_TIMEOUT", "240"))
POLL = os.environ.get("CLIENT_POLL", "")
PRODUCER = os.environ.get("PRODUCER", "http")
PUB_VIA = os.environ.get("PUB_VIA", "member1")
TAIL_CHANNEL = os.environ.get("TAIL_CHANNEL", "tail")
SETTLE = float(os.environ.get("SETTLE", "0"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOBIN = os.environ.get("GO_NSQ_BIN", os.path.join(ROOT, "target", "gobin"))


def log(text):
    sc.log(NAME, text)


def q(s):
    return urllib.parse.quote(s)


def get_json(addr, path, timeout=5):
    try:
        code, body = sc.http(addr, "GET", path, timeout=timeout)
    except Exception as e:  # refused, timed out
        return None, repr(e)
    try:
        return code, json.loads(body)
    except ValueError:
        return code, body[:300]


class Lines:
    """Collects a child's stdout lines (message bodies) in a thread."""

    def __init__(self, proc):
        self.got = {}
        self.lock = threading.Lock()
        self.proc = proc
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        for line in self.proc.stdout:
            b = line.rstrip(b"\n").decode(errors="replace")
            if b:
                with self.lock:
                    self.got[b] = self.got.get(b, 0) + 1

    def counts(self):
        with self.lock:
            return dict(self.got)


class FileLines:
    """nsq_to_file's output: every line of every file under a directory."""

    def __init__(self, d):
        self.d = d

    def counts(self):
        got = {}
        for root, _, files in os.walk(self.d):
            for f in files:
                try:
                    with open(os.path.join(root, f), "rb") as fh:
                        for line in fh.read().split(b"\n"):
                            if line:
                                b = line.decode(errors="replace")
                                got[b] = got.get(b, 0) + 1
                except OSError:
                    pass
        return got


def admin_summary(tmp, label, admin_http, topic):
    """nsqadmin's /api/topics, /api/topics/T and /api/nodes, saved in full under tmp and
    summarized: the topic list, each producer of T (node, message_count, channels with
    client_count/depth/in_flight) and each node with its topics."""
    full = {p: get_json(admin_http, p)[1] for p in
            ("/api/topics", "/api/topics/%s" % q(topic), "/api/nodes")}
    with open(os.path.join(tmp, "nsqadmin-%s.json" % label), "w") as f:
        json.dump(full, f, indent=1)
    out = {"topics": (full["/api/topics"] or {}).get("topics") if isinstance(full["/api/topics"], dict)
           else full["/api/topics"]}
    t = full["/api/topics/%s" % q(topic)]
    if isinstance(t, dict):
        out["topic_producers"] = [
            {"node": n.get("node"), "message_count": n.get("message_count"), "depth": n.get("depth"),
             "channels": {c["channel_name"]: "clients=%s depth=%s in_flight=%s" % (
                 c.get("client_count"), c.get("depth"), c.get("in_flight_count"))
                 for c in n.get("channels") or []}}
            for n in t.get("nodes") or []]
        out["topic_message"] = t.get("message")
    else:
        out["topic"] = t
    nd = full["/api/nodes"]
    if isinstance(nd, dict):
        out["nodes"] = ["%s:%s http %s topics=%s" % (n.get("broadcast_address"), n.get("tcp_port"),
                        n.get("http_port"), [x.get("topic") for x in n.get("topics") or []])
                        for n in nd.get("nodes") or []]
        out["nodes_message"] = nd.get("message")
    else:
        out["nodes"] = nd
    return out


def main():
    nsqd = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/debug/nsqd")
    lookupd_bin = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/debug/nsqlookupd")
    bins = {n: os.path.join(GOBIN, n) for n in ("gonsq_client", "nsq_tail", "nsq_to_file", "nsqadmin")}
    missing = [p for p in bins.values() if not os.access(p, os.X_OK)]
    if missing:
        log("SKIP: Go client binaries not built (missing %s); see this script's docstring"
            % ", ".join(missing))
        return 0
    for b in (nsqd, lookupd_bin):
        if not os.access(b, os.X_OK):
            log("SKIP: no %s (cargo build)" % b)
            return 0
    tmp = tempfile.mkdtemp(prefix="gonsq-failover-")
    log("work dir %s" % tmp)
    procs, daemons = [], []
    try:
        return scenario(tmp, nsqd, lookupd_bin, bins, procs, daemons)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for d in daemons:
            d.stop()
        if os.environ.get("KEEP_TMP"):
            log("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def scenario(tmp, nsqd, lookupd_bin, bins, procs, daemons):
    lookupd = sc.Daemon("nsqlookupd", [lookupd_bin], os.path.join(tmp, "nsqlookupd.log"))
    daemons.append(lookupd)
    log("nsqlookupd tcp %s http %s" % (lookupd.tcp, lookupd.http))
    cluster = ["127.0.0.1:%d" % sc.free_port() for _ in range(3)]
    members = []
    for i in range(3):
        d = os.path.join(tmp, "data%d" % (i + 1))
        os.makedirs(d)
        argv = [nsqd, "--node-id=%d" % (i + 1), "--data-path=%s" % d,
                "--broadcast-address=127.0.0.1",
                "--lookupd-tcp-address=%s" % lookupd.tcp, "--cluster-address=%s" % cluster[i]]
        argv += ["--cluster-peer=%s" % a for j, a in enumerate(cluster) if j != i]
        m = sc.Daemon("nsqd%d" % (i + 1), argv, os.path.join(tmp, "nsqd%d.log" % (i + 1)))
        daemons.append(m)
        members.append(m)
        log("member %d: tcp %s http %s cluster %s" % (i + 1, m.tcp, m.http, cluster[i]))
    alive = [True, True, True]

    admin_http = "127.0.0.1:%d" % sc.free_port()
    adminlog = open(os.path.join(tmp, "nsqadmin.log"), "wb")
    procs.append(subprocess.Popen([bins["nsqadmin"], "--http-address=%s" % admin_http,
                                   "--lookupd-http-address=%s" % lookupd.http],
                                  stdout=adminlog, stderr=adminlog))

    topic = sc.unique_name("gofailover")
    code, body = sc.http(members[0].http, "POST", "/topic/create?topic=%s" % q(topic))
    log("POST /topic/create on member 1 -> %d %r" % (code, body[:100]))

    def leader_index():
        """The member every live member names as leader, once one says it leads."""
        for i, m in enumerate(members):
            if not alive[i]:
                continue
            code, st = get_json(m.http, "/cluster")
            if code != 200 or not isinstance(st, dict):
                continue
            for t in st.get("topics", []):
                if t.get("topic") == topic and t.get("is_leader"):
                    return i, t
        return None, None

    def wait(cond, what, timeout=TIMEOUT):
        deadline = time.time() + timeout
        while True:
            r = cond()
            if r:
                return r
            if time.time() > deadline:
                raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
            time.sleep(0.1)

    lead, entry = wait(lambda: leader_index()[0] is not None and leader_index(), "a leader", 30)
    log("leader of %s: member %d (%s)" % (topic, lead + 1, json.dumps(entry)))
    def listed():
        st = get_json(lookupd.http, "/lookup?topic=%s" % q(topic))[1]
        return isinstance(st, dict) and st.get("producers")

    wait(listed, "nsqlookupd to list the topic", 30)
    log("lookupd /lookup before: %s" % json.dumps(get_json(lookupd.http, "/lookup?topic=%s" % q(topic))[1]))

    copt = ["--consumer-opt=lookupd_poll_interval,%s" % POLL] if POLL else []
    gonsq = subprocess.Popen([bins["gonsq_client"], "sub", "-lookupd", lookupd.http, "-topic", topic,
                              "-channel", "gonsq"] + (["-poll", POLL] if POLL else []),
                             stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "gonsq.log"), "wb"))
    procs.append(gonsq)
    tail = subprocess.Popen([bins["nsq_tail"], "--lookupd-http-address=%s" % lookupd.http,
                             "--topic=%s" % topic] + (["--channel=%s" % TAIL_CHANNEL] if TAIL_CHANNEL else []) + copt,
                            stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "nsq_tail.log"), "wb"))
    procs.append(tail)
    outdir = os.path.join(tmp, "nsq_to_file.out")
    os.makedirs(outdir)
    tofile = subprocess.Popen([bins["nsq_to_file"], "--lookupd-http-address=%s" % lookupd.http,
                               "--topic=%s" % topic, "--output-dir=%s" % outdir,
                               "--sync-interval=1s"] + copt,
                              stdout=subprocess.DEVNULL,
                              stderr=open(os.path.join(tmp, "nsq_to_file.log"), "wb"))
    procs.append(tofile)
    clients = {"go-nsq": Lines(gonsq), "nsq_tail": Lines(tail), "nsq_to_file": FileLines(outdir)}

    def channels_ready():
        code, st = get_json(members[lead].http, "/stats?format=json&topic=%s" % q(topic))
        if code != 200 or not isinstance(st, dict):
            return None
        chans = {}
        for t in st.get("topics", []):
            if t.get("topic_name") == topic:
                chans = {c["channel_name"]: len(c.get("clients", [])) for c in t.get("channels", [])}
        tails = [n for n in chans if n.startswith("tail")]
        return (all(chans.get(c, 0) >= 1 for c in ("gonsq", "nsq_to_file")) and tails
                and chans[tails[0]] >= 1 and chans)

    log("channels on the leader: %s" % wait(channels_ready, "the three consumers to subscribe", 60))

    first = ["%s:a:%05d" % (topic, i) for i in range(N)]
    second = ["%s:b:%05d" % (topic, i) for i in range(N)]
    via = members[0] if PUB_VIA == "member1" else members[(lead + 1) % 3]
    t = time.time()
    for b in first:
        code, body = sc.http(via.http, "POST", "/pub?topic=%s" % q(topic), b.encode())
        if code != 200:
            raise sc.ScenarioError("first round /pub via %s -> %d %r" % (via.http, code, body[:200]))
    log("first round: %d published via %s in %.2fs" % (N, via.http, time.time() - t))
    t = time.time()
    for name, c in clients.items():
        wait(lambda: set(first) <= set(c.counts()), "%s to receive the first round" % name, 60)
        log("%s has the first round (%.2fs)" % (name, time.time() - t))

    log("nsqadmin before the kill: %s" % json.dumps(admin_summary(tmp, "before", admin_http, topic)))

    if SETTLE:
        log("waiting %ss before the kill (SETTLE)" % SETTLE)
        time.sleep(SETTLE)
    lead, entry = leader_index()
    log("killing member %d (leader; /cluster entry %s)" % (lead + 1, json.dumps(entry)))
    t0 = time.time()
    members[lead].proc.kill()
    members[lead].proc.wait()
    alive[lead] = False
    survivors = [i for i in range(3) if alive[i]]

    failures = []
    first_ok = None
    if PRODUCER == "gonsq":
        p = subprocess.run([bins["gonsq_client"], "pub", "-nsqd", ",".join(m.tcp for m in members),
                            "-topic", topic], input="\n".join(second).encode() + b"\n",
                           capture_output=True, timeout=TIMEOUT)
        acks = p.stdout.decode().splitlines()
        errs = p.stderr.decode().splitlines()
        failures = [e for e in errs if e.startswith("publish ")]
        per = {}
        for e in failures:
            a = e.split(" via ", 1)[1].split(":", 2)
            per[a[0] + ":" + a[1]] = per.get(a[0] + ":" + a[1], 0) + 1
        log("failed publish attempts per member: %s (killed member: %s)" % (per, members[lead].tcp))
        log("go-nsq producer: rc %d, %d ACK, %d failed attempts; first errors: %s"
            % (p.returncode, len(acks), len(failures), errs[:5]))
        log("ACK members: %s" % sorted({a.split()[-1] for a in acks}))
    else:
        k = 0
        for b in second:
            deadline = time.time() + 60
            while True:
                m = members[survivors[k % len(survivors)]]
                try:
                    code, body = sc.http(m.http, "POST", "/pub?topic=%s" % q(topic), b.encode(), timeout=5)
                except Exception as e:
                    code, body = None, repr(e).encode()
                if code == 200:
                    if first_ok is None:
                        first_ok = time.time() - t0
                    break
                failures.append((round(time.time() - t0, 2), m.http, code, body[:120]))
                k += 1
                if time.time() > deadline:
                    raise sc.ScenarioError("no survivor acknowledged %s: %r" % (b, failures[-3:]))
                time.sleep(0.1)
        log("second round: %d published through survivors in %.2fs after the kill; first OK at "
            "%.2fs; %d failed attempts, first few: %r" % (N, time.time() - t0, first_ok or -1,
                                                          len(failures), failures[:5]))
    new_lead, entry = wait(lambda: leader_index()[0] is not None and leader_index(), "a new leader", 60)
    log("new leader: member %d (%s) at %.2fs" % (new_lead + 1, json.dumps(entry), time.time() - t0))

    log("nsqadmin right after the new leader: %s"
        % json.dumps(admin_summary(tmp, "new-leader", admin_http, topic)))
    want = set(first) | set(second)
    done, ok = {}, True
    deadline = time.time() + TIMEOUT
    while len(done) < len(clients) and time.time() < deadline:
        for name, c in clients.items():
            if name not in done and want <= set(c.counts()):
                done[name] = time.time() - t0
                log("%s has all %d bodies, %.2fs after the kill" % (name, len(want), done[name]))
        time.sleep(0.1)
    results = {}
    for name, c in clients.items():
        got = c.counts()
        extra = set(got) - want
        results[name] = {
            "all_received": want <= set(got),
            "missing": len(want - set(got)),
            "missing_sample": sorted(want - set(got))[:5],
            "seconds_after_kill": round(done[name], 2) if name in done else None,
            "redelivered": sum(n - 1 for n in got.values()),
            "unexpected": sorted(extra)[:5],
        }
        ok = ok and results[name]["all_received"] and not extra

    admin_after = admin_summary(tmp, "after", admin_http, topic)
    log("nsqadmin after the failover: %s" % json.dumps(admin_after))
    log("lookupd /lookup after: %s" % json.dumps(get_json(lookupd.http, "/lookup?topic=%s" % q(topic))[1]))
    log("lookupd /nodes after: %s" % json.dumps(get_json(lookupd.http, "/nodes")[1])[:2000])
    for i in survivors:
        log("member %d /cluster after: %s" % (i + 1, json.dumps(get_json(members[i].http, "/cluster")[1])[:1500]))
    summary = {"topic": topic, "nsqadmin_after": admin_after, "killed": "member %d" % (lead + 1), "new_leader": "member %d" % (new_lead + 1),
               "second_round_failed_attempts": len(failures), "first_ok_after_kill_s": first_ok,
               "clients": results}
    print(json.dumps(summary, indent=1), flush=True)
    for name in ("gonsq.log", "nsq_tail.log", "nsq_to_file.log", "nsqadmin.log"):
        with open(os.path.join(tmp, name), errors="replace") as f:
            lines = f.read().splitlines()
        log("--- %s (last 25 of %d lines)\n%s" % (name, len(lines), "\n".join(lines[-25:])))
    for i, m in enumerate(members):
        lines = m.log_text().splitlines()
        bad = [ln for ln in lines if any(w in ln for w in ("ERROR", "WARN", "panic", "error"))]
        log("--- nsqd%d.log: %d lines, %d ERROR/WARN; last 15 of those:\n%s"
            % (i + 1, len(lines), len(bad), "\n".join(bad[-15:])))
    log("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
        sys.exit(1)
