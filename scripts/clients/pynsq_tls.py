#!/usr/bin/env python3
"""pynsq (unmodified) with tls_v1=True against a broker started with a certificate.

usage: pynsq_tls.py <nsqd-binary> [shards]

Makes a self-signed certificate for 127.0.0.1 with `openssl req` in a temporary
directory, starts nsqd (--shards, default 2) with --tls-cert/--tls-key and
--tls-required=tcp-https (so a plain TCP client could do nothing but IDENTIFY, while
/stats stays reachable over plain HTTP) on loopback ports chosen by the kernel, then:

1. an nsq.Writer and an nsq.Reader with tls_v1=True (tls_options trusting the
   certificate; pynsq asks for TLS 1.2) on topic A: MPUB and PUB of SCENARIO_TLS_MESSAGES
   (default 1000) messages, every one received and FINed;
2. the same with tls_v1=True and snappy=True on topic B (TLS, then snappy, as nsqd
   orders them);
3. /stats must show every consumer with tls true and a TLS version.

With more than one shard the SUB and the first PUB move the TLS connections to the
topic's shard. Exit status 0 on success, 1 with the reason; the broker is stopped with
SIGTERM at exit and must exit 0. Gives up after SCENARIO_TIMEOUT seconds (default 120).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

import nsq  # noqa: E402
import tornado.ioloop  # noqa: E402

N = int(os.environ.get("SCENARIO_TLS_MESSAGES", "1000"))
TIMEOUT = float(os.environ.get("SCENARIO_TIMEOUT", "120"))


def fail(why):
    print("pynsq-tls: FAIL: %s" % why, file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) < 2:
        fail("usage: pynsq_tls.py <nsqd-binary> [shards]")
    nsqd = sys.argv[1]
    shards = sys.argv[2] if len(sys.argv) > 2 else "2"
    tmp = tempfile.mkdtemp(prefix="pynsq-tls-")
    proc = None
    try:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        data = os.path.join(tmp, "data")
        os.mkdir(data)
        logpath = os.path.join(tmp, "nsqd.log")
        try:
            daemon = sc.Daemon("nsqd", [nsqd, "--shards=%s" % shards, "--data-path=%s" % data,
                                        "--tls-cert=%s" % cert, "--tls-key=%s" % key,
                                        "--tls-required=tcp-https"],
                               logpath, ports=("tcp", "http", "https"))
        except sc.ScenarioError as e:
            fail(str(e))
        proc = daemon.proc
        tcp, http = daemon.tcp, daemon.http
        run_scenario(tcp, http, cert)
        proc.terminate()
        rc = proc.wait(15)
        proc = None
        if rc != 0:
            fail("nsqd exited with status %d after SIGTERM" % rc)
        log = open(logpath).read()
        if "panicked at" in log or "FATAL" in log:
            fail("panic/fatal in the broker log:\n" + log[-3000:])
        print("pynsq-tls: OK (%d messages on 2 topics over TLS, shards=%s)" % (2 * N, shards))
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def run_scenario(tcp, http, cert):
    tls = {"tls_v1": True, "tls_options": {"ca_certs": cert}}
    stamp = int(time.time() * 1000) % 10_000_000
    topics = {"tls_%d" % stamp: dict(tls), "tls_snappy_%d" % stamp: dict(tls, snappy=True)}
    want = {t: {b"%s-%05d-" % (t.encode(), i) + b"x" * (i % 700) for i in range(N)} for t in topics}
    got = {t: set() for t in topics}
    errors = []
    seen = []
    loop = tornado.ioloop.IOLoop.current()

    def check_stats():
        d = json.load(urllib.request.urlopen("http://%s/stats?format=json" % http))
        for t in d["topics"] or []:
            for ch in t["channels"]:
                for c in ch["clients"] or []:
                    seen.append((c.get("tls"), c.get("tls_version"), c.get("snappy")))

    def make_handler(topic):
        def handler(m):
            got[topic].add(bytes(m.body))
            if all(len(got[t]) == len(want[t]) for t in topics):
                try:
                    check_stats()
                except Exception as e:  # noqa: BLE001
                    errors.append("stats: %r" % e)
                loop.stop()
            return True
        return handler

    def done(conn, data):
        if isinstance(data, nsq.Error) or isinstance(data, Exception):
            errors.append("publish error: %r" % data)

    writers = {}
    for t, opts in topics.items():
        nsq.Reader(message_handler=make_handler(t), nsqd_tcp_addresses=[tcp], topic=t,
                   channel="c", max_in_flight=200, **opts)
        writers[t] = nsq.Writer([tcp], **opts)

    def publish():
        for t, w in writers.items():
            bodies = sorted(want[t])
            w.mpub(t, bodies[: N // 2], callback=done)
            for b in bodies[N // 2:]:
                w.pub(t, b, callback=done)

    loop.call_later(1.5, publish)
    loop.call_later(TIMEOUT, loop.stop)
    nsq.run()
    if errors:
        fail("; ".join(errors[:5]))
    for t in topics:
        if got[t] != want[t]:
            fail("%s: received %d of %d messages" % (t, len(got[t]), len(want[t])))
    if len(seen) != 2 or not all(s[0] is True and str(s[1]).startswith("TLS1.") for s in seen):
        fail("stats do not show the TLS consumers: %r" % seen)
    if sorted(bool(s[2]) for s in seen) != [False, True]:
        fail("stats do not show one snappy consumer: %r" % seen)


if __name__ == "__main__":
    main()
