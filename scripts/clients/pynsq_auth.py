#!/usr/bin/env python3
"""pynsq (unmodified) with auth_secret against the broker with --auth-http-address.

usage: pynsq_auth.py <nsqd-binary> [shards]

Starts a tiny auth server (http.server on loopback) and nsqd (--shards, default 2,
--auth-http-address pointing at it) on loopback ports chosen by the kernel, with a
temporary data path, and then:

1. an nsq.Writer and an nsq.Reader with auth_secret: IDENTIFY says auth_required, pynsq
   sends AUTH, the auth server is asked (GET /auth?...&secret=...), and every message
   published (MPUB and PUB) on an allowed topic is received on the allowed channel.
2. TTL expiry: the grant's ttl is 2 s; after it, the next PUB makes the broker ask the
   auth server again, and the messages still flow.
3. denials, each with nsqd's exact error frame: PUB to a topic outside the grant
   (E_UNAUTHORIZED AUTH failed for PUB on "<t>" ""), SUB to a channel outside it
   (E_UNAUTHORIZED ... SUB ...), a wrong secret (E_AUTH_FAILED AUTH failed), and a PUB
   without AUTH (E_AUTH_FIRST AUTH required before PUB).
4. /stats shows the reader's connection as authed with the auth server's identity.

Exit status 0 on success, 1 with the reason on stderr; the broker is stopped at exit.
Gives up after SCENARIO_TIMEOUT seconds (default 120).
"""
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario_common as sc  # noqa: E402

import nsq  # noqa: E402
import tornado  # noqa: E402

NAME = "pynsq-auth"
SECRET = "pynsq s3cret&"
TTL = 2
MESSAGES = 300
KEEP = []


def log(text):
    sc.log(NAME, text)


class AuthServer:
    """Answers GET /auth: SECRET gets publish on ^pynsq_auth_ topics and subscribe to
    channel `ok` on them; any other secret gets 403."""

    def __init__(self):
        self.queries = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(url.query, keep_blank_values=True)
                secret = q.get("secret", [""])[0]
                server.queries.append((url.path, secret, q.get("remote_ip", [""])[0]))
                if url.path == "/auth" and secret == SECRET:
                    status, body = 200, {
                        "ttl": TTL,
                        "identity": "pynsq",
                        "identity_url": "http://auth.example/pynsq",
                        "authorizations": [
                            {"topic": "^pynsq_auth_", "channels": [".*"],
                             "permissions": ["publish"]},
                            {"topic": "^pynsq_auth_", "channels": ["^ok$"],
                             "permissions": ["subscribe"]},
                        ],
                    }
                else:
                    status, body = 403, {"message": "FORBIDDEN"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = "127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def count(self):
        return sum(1 for q in self.queries if q[1] == SECRET)

    def stop(self):
        self.httpd.shutdown()


async def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise sc.ScenarioError("timed out after %ss waiting for %s" % (timeout, what))
        await asyncio.sleep(0.05)


async def publish(w, topic, bodies, how):
    pending = {"n": 0, "err": []}

    def cb(conn, data):
        pending["n"] -= 1
        if isinstance(data, Exception) or data != b"OK":
            pending["err"].append(repr(data))

    if how == "mpub":
        for i in range(0, len(bodies), 50):
            pending["n"] += 1
            w.mpub(topic, bodies[i:i + 50], callback=cb)
    else:
        for b in bodies:
            pending["n"] += 1
            w.pub(topic, b, callback=cb)
    await wait_for(lambda: pending["n"] == 0 or pending["err"], 30, "%s responses" % how.upper())
    if pending["err"]:
        raise sc.ScenarioError("%s failed: %s" % (how.upper(), pending["err"][:3]))


async def expect_error(host, port, secret, after_ready, want):
    """A bare nsq.AsyncConn (auth_secret as given) that sends `after_ready` once ready;
    the broker must answer exactly `want` as an error frame."""
    errors, ready = [], []
    kwargs = {"auth_secret": secret} if secret else {}
    c = nsq.AsyncConn(host, int(port), **kwargs)
    c.on("error", lambda conn, error, **kw: errors.append(error))
    c.on("ready", lambda conn, **kw: ready.append(conn))
    c.connect()
    try:
        await wait_for(lambda: ready or errors, 10, "AsyncConn ready or error")
        if ready and after_ready is not None:
            c.send(after_ready)
        await wait_for(lambda: errors, 10, "error frame %r" % want)
    finally:
        c.close()
    got = [e.args[0] if e.args else repr(e) for e in errors][0]
    if got != want.encode():
        raise sc.ScenarioError("got error %r, want %r" % (got, want))


async def scenario(nsqd, auth, timeout):
    topic = sc.unique_name("pynsq_auth")
    host, port = nsqd.tcp.rsplit(":", 1)
    log("topic %s; nsqd tcp %s http %s; auth server %s" % (topic, nsqd.tcp, nsqd.http, auth.addr))

    # 1. authorized writer and reader
    received = {}

    def handler(message):
        received[bytes(message.body)] = received.get(bytes(message.body), 0) + 1
        return True

    r = nsq.Reader(topic=topic, channel="ok", name=topic + ":ok", message_handler=handler,
                   nsqd_tcp_addresses=[nsqd.tcp], max_in_flight=50, auth_secret=SECRET)
    KEEP.append(r)
    w = nsq.Writer([nsqd.tcp], reconnect_interval=1.0, auth_secret=SECRET)
    KEEP.append(w)
    await wait_for(lambda: any(c.connected() for c in w.conns.values()), 10,
                   "nsq.Writer to connect and AUTH")
    await wait_for(lambda: any(c.connected() for c in r.conns.values()), 10,
                   "nsq.Reader to connect, AUTH and SUB")
    bodies = sc.make_bodies(topic, MESSAGES)
    await publish(w, topic, bodies[:MESSAGES - 20], "mpub")
    await publish(w, topic, bodies[MESSAGES - 20:], "pub")
    await wait_for(lambda: all(b in received for b in bodies), timeout, "every message")
    if not auth.queries or auth.queries[0][0] != "/auth" or auth.queries[0][2] != "127.0.0.1":
        raise sc.ScenarioError("unexpected auth queries %r" % auth.queries[:3])
    log("1. AUTH'd writer and reader: %d messages, %d auth queries" % (len(bodies), auth.count()))

    # 2. TTL expiry: the next PUB queries the auth server again
    before = auth.count()
    await asyncio.sleep(TTL + 0.5)
    more = [b + b":after-ttl" for b in bodies[:20]]
    await publish(w, topic, more, "pub")
    if auth.count() <= before:
        raise sc.ScenarioError("no auth query after the TTL expired (%d queries)" % auth.count())
    await wait_for(lambda: all(b in received for b in more), timeout, "messages after the TTL")
    log("2. after the %ds TTL the broker asked again (%d -> %d queries)" % (
        TTL, before, auth.count()))

    # 3. denials
    denied = "denied_" + topic
    await expect_error(host, port, SECRET, nsq.protocol.pub(denied, b"x"),
                       'E_UNAUTHORIZED AUTH failed for PUB on "%s" ""' % denied)
    await expect_error(host, port, SECRET, nsq.protocol.subscribe(topic, "nope"),
                       'E_UNAUTHORIZED AUTH failed for SUB on "%s" "nope"' % topic)
    await expect_error(host, port, "wrong secret", None, "E_AUTH_FAILED AUTH failed")
    await expect_error(host, port, None, nsq.protocol.pub(topic, b"x"),
                       "E_AUTH_FIRST AUTH required before PUB")
    log("3. denied topic, denied channel, wrong secret and no AUTH answered as nsqd does")

    # 4. /stats
    c = sc.channel_stats(nsqd.http, topic, "ok") or {}
    clients = c.get("clients") or []
    if not any(cl.get("authed") and cl.get("auth_identity") == "pynsq"
               and cl.get("auth_identity_url") == "http://auth.example/pynsq" for cl in clients):
        raise sc.ScenarioError("/stats does not show the authed reader: %r" % clients)
    log("4. /stats shows the reader authed as 'pynsq'")
    names = [ch.get("channel_name") for ch in (sc.topic_stats(nsqd.http, topic) or {}).get("channels") or []]
    if names != ["ok"]:
        raise sc.ScenarioError("channels %r, want ['ok'] (a denied SUB creates nothing)" % names)


def main():
    if len(sys.argv) not in (2, 3):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        sys.exit(2)
    nsqd_bin = sys.argv[1]
    shards = sys.argv[2] if len(sys.argv) == 3 else "2"
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr,
                        format="[pynsq %(asctime)s] %(levelname)s %(name)s: %(message)s")
    log("pynsq %s, tornado %s, python %s, shards %s" % (
        nsq.__version__, tornado.version, sys.version.split()[0], shards))
    work = tempfile.mkdtemp(prefix="pynsq-auth-")
    auth = AuthServer()
    nsqd = None
    t0 = time.time()
    ok = False
    try:
        nsqd = sc.Daemon("nsqd", [nsqd_bin,
                       "--shards=%s" % shards, "--auth-http-address=%s" % auth.addr,
                       "--data-path=%s" % os.path.join(work, "data")],
                         os.path.join(work, "nsqd.log"))
        asyncio.run(asyncio.wait_for(scenario(nsqd, auth, sc.OVERALL_TIMEOUT),
                                     sc.OVERALL_TIMEOUT + 30))
        ok = True
    except sc.ScenarioError as e:
        log("FAIL: %s" % e)
    except asyncio.TimeoutError:
        log("FAIL: overall timeout (%ss)" % (sc.OVERALL_TIMEOUT + 30))
    finally:
        if nsqd is not None:
            rc = nsqd.stop()
            if ok and rc != 0:
                log("FAIL: nsqd exited with status %s" % rc)
                ok = False
            if not ok:
                log("nsqd log (last lines):")
                with open(nsqd.logpath) as f:
                    for line in f.readlines()[-15:]:
                        sys.stderr.write("    " + line)
        auth.stop()
        shutil.rmtree(work, ignore_errors=True)
    if not ok:
        sys.exit(1)
    log("PASS (%.1fs)" % (time.time() - t0))


if __name__ == "__main__":
    main()
