#!/usr/bin/env python3
"""A tiny, single-threaded stand-in for nsqd, used only to check the client scenario
programs themselves (scripts/test.sh --mock). It is NOT the broker under test.

It implements just enough of NSQ protocol V2 (IDENTIFY with feature negotiation, SUB,
RDY, FIN, REQ, TOUCH, PUB, MPUB, DPUB, NOP, CLS, heartbeats, msg timeouts) and HTTP
(/ping, /pub, /mpub, /topic/create, /channel/create, /stats?format=json) for the
scenarios, with the same command line and readiness log lines as the real binary:

    mock_nsqd.py --tcp-address=127.0.0.1:0 --http-address=127.0.0.1:0 [--msg-timeout=60s]
"""
import argparse
import asyncio
import collections
import json
import os
import re
import signal
import struct
import sys
import time
import urllib.parse

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
# MOCK_FAULT=drop|dup|no_timeout|attempts|fin_count|no_defer|timestamp makes the mock misbehave on purpose,
# to check that the scenarios notice.
FAULT = os.environ.get("MOCK_FAULT", "")


def parse_duration_ms(s):
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)(ms|s|m|h)", s):
        total += float(num) * {"ms": 1, "s": 1000, "m": 60000, "h": 3600000}[unit]
    return int(total)


def frame(ft, data):
    return struct.pack(">ii", len(data) + 4, ft) + data


class Message:
    __slots__ = ("id", "body", "ts", "attempts", "deadline", "client")

    def __init__(self, mid, body):
        self.id, self.body, self.attempts = mid, body, 0
        self.ts = 0 if FAULT == "timestamp" else time.time_ns()
        self.deadline, self.client = 0.0, None


class Channel:
    def __init__(self, broker, topic, name):
        self.broker, self.topic, self.name = broker, topic, name
        self.queue = collections.deque()
        self.in_flight = {}
        self.deferred = 0
        self.clients = []
        self.message_count = self.requeue_count = self.timeout_count = 0

    def put(self, msg, front=False):
        (self.queue.appendleft if front else self.queue.append)(msg)
        self.pump()

    def pump(self):
        while self.queue:
            ready = [c for c in self.clients if c.can_send()]
            if not ready:
                return
            c = min(ready, key=lambda c: c.in_flight)
            msg = self.queue.popleft()
            if FAULT == "drop" and msg.attempts == 0 and int(msg.id, 16) % 1000 == 999:
                continue
            if not (FAULT == "attempts" and msg.attempts > 0):
                msg.attempts += 1
            if FAULT == "dup" and msg.attempts == 1 and int(msg.id, 16) % 1000 == 998:
                c.send(FRAME_MESSAGE, struct.pack(">qH", msg.ts, msg.attempts) + msg.id + msg.body)
            msg.client = c
            msg.deadline = time.time() + c.msg_timeout / 1000.0
            self.in_flight[msg.id] = msg
            c.in_flight += 1
            c.send(FRAME_MESSAGE, struct.pack(">qH", msg.ts, msg.attempts) + msg.id + msg.body)

    def scan(self):
        now = time.time()
        for mid, msg in list(self.in_flight.items()):
            if msg.deadline <= now and FAULT != "no_timeout":
                del self.in_flight[mid]
                msg.client.in_flight -= 1
                self.timeout_count += 1
                self.put(msg, front=True)

    def stats(self):
        return {
            "channel_name": self.name, "depth": len(self.queue), "backend_depth": 0,
            "in_flight_count": len(self.in_flight), "deferred_count": self.deferred,
            "message_count": self.message_count, "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count, "paused": False,
            "clients": [{"client_id": c.client_id, "finish_count": c.finish_count,
                         "requeue_count": c.requeue_count, "ready_count": c.rdy,
                         "in_flight_count": c.in_flight} for c in self.clients],
        }


class Topic:
    def __init__(self, broker, name):
        self.broker, self.name = broker, name
        self.channels = {}
        self.backlog = []
        self.message_count = 0
        self.seq = 0

    def channel(self, name):
        if name not in self.channels:
            self.channels[name] = Channel(self.broker, self, name)
            for mid, body in self.backlog:
                self.channels[name].message_count += 1
                self.channels[name].put(Message(mid, body))
            self.backlog = []
        return self.channels[name]

    def publish(self, body, defer_ms=0):
        self.message_count += 1
        self.seq += 1
        mid = ("%016x" % self.seq).encode()
        if not self.channels:
            self.backlog.append((mid, body))
            return
        for ch in self.channels.values():
            ch.message_count += 1
            if defer_ms and FAULT != "no_defer":
                ch.deferred += 1
                asyncio.get_running_loop().call_later(
                    defer_ms / 1000.0, self._undefer, ch, Message(mid, body))
            else:
                ch.put(Message(mid, body))

    @staticmethod
    def _undefer(ch, msg):
        ch.deferred -= 1
        ch.put(msg)


class Broker:
    def __init__(self, msg_timeout):
        self.topics = {}
        self.msg_timeout = msg_timeout

    def topic(self, name):
        if name not in self.topics:
            self.topics[name] = Topic(self, name)
        return self.topics[name]

    async def scanner(self):
        while True:
            await asyncio.sleep(0.1)
            for t in self.topics.values():
                for ch in t.channels.values():
                    ch.scan()


class Client:
    def __init__(self, broker, reader, writer):
        self.broker, self.r, self.w = broker, reader, writer
        self.rdy = self.in_flight = self.finish_count = self.requeue_count = 0
        self.msg_timeout = broker.msg_timeout
        self.channel = None
        self.client_id = ""
        self.closing = False

    def can_send(self):
        return not self.closing and self.in_flight < self.rdy

    def send(self, ft, data):
        self.w.write(frame(ft, data))

    def ok(self):
        self.send(FRAME_RESPONSE, b"OK")

    def err(self, text):
        self.send(FRAME_ERROR, text.encode())

    async def read_sized(self):
        (n,) = struct.unpack(">i", await self.r.readexactly(4))
        return await self.r.readexactly(n)

    async def heartbeat(self):
        while True:
            await asyncio.sleep(30)
            self.send(FRAME_RESPONSE, b"_heartbeat_")

    async def run(self):
        hb = asyncio.ensure_future(self.heartbeat())
        try:
            if await self.r.readexactly(4) != b"  V2":
                return
            while True:
                line = (await self.r.readuntil(b"\n")).rstrip(b"\r\n").split(b" ")
                cmd, args = line[0], [a.decode() for a in line[1:]]
                await self.handle(cmd, args)
                await self.w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            hb.cancel()
            if self.channel:
                self.channel.clients.remove(self)
                for mid, msg in list(self.channel.in_flight.items()):
                    if msg.client is self:
                        del self.channel.in_flight[mid]
                        self.channel.put(msg, front=True)
                self.channel.pump()
            self.w.close()

    async def handle(self, cmd, args):
        b = self.broker
        if cmd == b"IDENTIFY":
            data = json.loads(await self.read_sized())
            self.client_id = data.get("client_id", "")
            if data.get("msg_timeout"):
                self.msg_timeout = int(data["msg_timeout"])
            if data.get("feature_negotiation"):
                self.send(FRAME_RESPONSE, json.dumps({
                    "max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000,
                    "msg_timeout": self.msg_timeout, "tls_v1": False, "deflate": False,
                    "deflate_level": 6, "max_deflate_level": 6, "snappy": False,
                    "sample_rate": 0, "auth_required": False, "output_buffer_size": 16384,
                    "output_buffer_timeout": 250}).encode())
            else:
                self.ok()
        elif cmd == b"SUB":
            self.channel = b.topic(args[0]).channel(args[1])
            self.channel.clients.append(self)
            self.ok()
        elif cmd == b"RDY":
            self.rdy = int(args[0])
            if self.channel:
                self.channel.pump()
        elif cmd in (b"FIN", b"REQ", b"TOUCH"):
            ch = self.channel
            mid = args[0].encode()
            msg = ch.in_flight.get(mid) if ch else None
            if msg is None or msg.client is not self:
                self.err("E_%s_FAILED %s %s failed" % (cmd.decode(), cmd.decode(), args[0]))
                return
            if cmd == b"TOUCH":
                msg.deadline = time.time() + self.msg_timeout / 1000.0
                return
            del ch.in_flight[mid]
            self.in_flight -= 1
            if cmd == b"FIN":
                self.finish_count += 0 if FAULT == "fin_count" else 1
            else:
                self.requeue_count += 1
                ch.requeue_count += 1
                delay = int(args[1])
                if delay > 0:
                    ch.deferred += 1
                    asyncio.get_running_loop().call_later(delay / 1000.0, Topic._undefer, ch, msg)
                else:
                    ch.put(msg)
            ch.pump()
        elif cmd == b"PUB":
            body = await self.read_sized()
            b.topic(args[0]).publish(body)
            self.ok()
        elif cmd == b"DPUB":
            body = await self.read_sized()
            b.topic(args[0]).publish(body, int(args[1]))
            self.ok()
        elif cmd == b"MPUB":
            data = await self.read_sized()
            (n,) = struct.unpack(">i", data[:4])
            off, t = 4, b.topic(args[0])
            for _ in range(n):
                (sz,) = struct.unpack(">i", data[off:off + 4])
                t.publish(data[off + 4:off + 4 + sz])
                off += 4 + sz
            self.ok()
        elif cmd == b"NOP":
            pass
        elif cmd == b"CLS":
            self.closing = True
            self.send(FRAME_RESPONSE, b"CLOSE_WAIT")
        else:
            self.err("E_INVALID invalid command %s" % cmd.decode())


async def http_handler(broker, reader, writer):
    try:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        u = urllib.parse.urlparse(target)
        q = dict(urllib.parse.parse_qsl(u.query))
        code, out = 200, b"OK"
        if u.path == "/ping":
            pass
        elif u.path == "/topic/create":
            broker.topic(q["topic"])
            out = b""
        elif u.path == "/channel/create":
            broker.topic(q["topic"]).channel(q["channel"])
            out = b""
        elif u.path == "/pub":
            broker.topic(q["topic"]).publish(body)
        elif u.path == "/mpub":
            for m in body.split(b"\n"):
                if m:
                    broker.topic(q["topic"]).publish(m)
        elif u.path == "/stats":
            out = json.dumps({"version": "1.3.0", "health": "OK", "start_time": 0, "topics": [
                {"topic_name": t.name, "message_count": t.message_count, "depth": len(t.backlog),
                 "channels": [c.stats() for c in t.channels.values()]}
                for t in broker.topics.values()], "producers": []}).encode()
        else:
            code, out = 404, b'{"message":"NOT_FOUND"}'
        writer.write(("HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                      % (code, len(out))).encode() + out)
        await writer.drain()
    except Exception as e:  # noqa: BLE001
        print("[mock_nsqd] http error %r" % e, file=sys.stderr)
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tcp-address", default="127.0.0.1:4150")
    ap.add_argument("--http-address", default="127.0.0.1:4151")
    ap.add_argument("--msg-timeout", default="60s")
    ap.add_argument("--shards", default="1")
    ap.add_argument("--data-path", default="")
    a = ap.parse_args()
    broker = Broker(parse_duration_ms(a.msg_timeout))

    async def tcp(r, w):
        await Client(broker, r, w).run()

    th, tp = a.tcp_address.rsplit(":", 1)
    hh, hp = a.http_address.rsplit(":", 1)
    ts = await asyncio.start_server(tcp, th, int(tp))
    hs = await asyncio.start_server(lambda r, w: http_handler(broker, r, w), hh, int(hp))
    stamp = time.strftime("%Y/%m/%d %H:%M:%S")
    print("[nsqd] %s INFO: TCP: listening on %s:%d" % ((stamp, th) + (ts.sockets[0].getsockname()[1],)),
          file=sys.stderr, flush=True)
    print("[nsqd] %s INFO: HTTP: listening on %s:%d" % ((stamp, hh) + (hs.sockets[0].getsockname()[1],)),
          file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    scan = asyncio.ensure_future(broker.scanner())
    await stop.wait()
    scan.cancel()
    ts.close()
    hs.close()
    print("[nsqd] INFO: exiting", file=sys.stderr, flush=True)
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())
