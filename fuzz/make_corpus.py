#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/ (a few files each), built from the
sessions of the conformance tests (tests/it/conformance_*.rs, tests/lookupd.rs,
tests/it/import_nsqd.rs). Run once; the files are kept in the repository."""
import json, os, struct, zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def sized(b):
    return struct.pack(">i", len(b)) + b

def pub(t, b):
    return b"PUB " + t + b"\n" + sized(b)

ident = json.dumps({"client_id": "c", "hostname": "h", "feature_negotiation": True,
                    "heartbeat_interval": 30000, "output_buffer_size": 16384,
                    "output_buffer_timeout": 250, "snappy": True, "deflate": False,
                    "deflate_level": 6, "sample_rate": 0, "msg_timeout": 60000,
                    "user_agent": "pynsq/0.9.1"}).encode()
mid = b"0a1b2c3d4e5f6071"
mpub = b"MPUB t\n" + sized(struct.pack(">i", 2) + sized(b"one") + sized(b"two"))
# v2_decode: [flags][limits][split seed] + stream (flags: 0 Init, 1 Subscribed, 2 Closing)
put("v2_decode", "pub", b"\x00\x80\x07" + pub(b"t", b"hello") + b"NOP\n")
put("v2_decode", "identify_sub", b"\x00\x80\x03IDENTIFY\n" + sized(ident) + b"SUB t c\n")
put("v2_decode", "mpub_dpub", b"\x00\x80\x05" + mpub + b"DPUB t 1000\n" + sized(b"later"))
put("v2_decode", "subscribed", b"\x01\x80\x09RDY 100\nFIN " + mid + b"\nREQ " + mid +
    b" 5000\nTOUCH " + mid + b"\nCLS\n")
put("v2_decode", "small_limits", b"\x00\x05\x02PUB crlf_topic\r\n" + sized(b"body") +
    b"AUTH\n" + sized(b"secret") + b"SUB  t c\n")
put("v2_decode", "closing", b"\x02\x80\x01RDY 1\nFIN " + mid + b"\nbogus\n")

def frame(t, d):
    return struct.pack(">ii", len(d) + 4, t) + d
msg = struct.pack(">qH", 1700000000000000000, 1) + mid + b"body"
put("v2_client_frame", "ok_hb_msg", b"\xff" + frame(0, b"OK") + frame(0, b"_heartbeat_") + frame(2, msg))
put("v2_client_frame", "error", b"\x10" + frame(1, b"E_INVALID invalid command BOGUS"))

put("identify", "negotiate", b"\x03" + ident)
put("identify", "plain", b"\x00" + b'{"client_id":"x","heartbeat_interval":-1,"output_buffer_size":-1}')
put("identify", "deflate", b"\xf2" + b'{"feature_negotiation":true,"deflate":true,"deflate_level":9,"msg_timeout":1000}')
put("identify", "bad", b"\x00" + b'{"heartbeat_interval":"x"}')

def crc32c(data):
    c = 0xffffffff
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82f63b78 if c & 1 else c >> 1
    return c ^ 0xffffffff
def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff
def schunk(kind, data):
    return bytes([kind]) + len(data).to_bytes(3, "little") + data
stream = schunk(0xff, b"sNaPpY")
body = b"IDENTIFY\n" + sized(b"{}") + pub(b"t", b"x" * 40)
stream += schunk(0x01, struct.pack("<I", masked(body)) + body)
stream += schunk(0xfe, b"\0\0\0") + schunk(0x01, struct.pack("<I", masked(b"NOP\n")) + b"NOP\n")
put("snappy", "uncompressed_chunks", b"\x05" + stream)
put("snappy", "bad_crc", b"\x02" + schunk(0xff, b"sNaPpY") + schunk(0x01, b"\0\0\0\0NOP\n"))

co = zlib.compressobj(6, zlib.DEFLATED, -15)
d = co.compress(body) + co.flush(zlib.Z_SYNC_FLUSH) + co.compress(b"NOP\n") + co.flush(zlib.Z_SYNC_FLUSH)
put("deflate", "sync_flushed", b"\x07\x06" + d)
put("deflate", "final_block", b"\x01\x01" + zlib.compress(b"hello hello hello", 9)[2:-4])

put("http_head", "pub", b"POST /pub?topic=t&defer=10 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
put("http_head", "chunked", b"POST /mpub?topic=t&binary=true HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
put("http_head", "http10", b"GET /stats?format=json&topic=t&channel=c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
put("http_query", "pub", b"topic=t&defer=10")
put("http_query", "escapes", b"topic=a%2Bb+c&channel=%E2%82%AC&&x")
put("http_query", "bad", b"topic=%zz;x=1")
put("http_mpub", "text", b"\x00\x80one\ntwo\n\nthree")
put("http_mpub", "binary", b"\x01\x80" + struct.pack(">i", 2) + sized(b"one") + sized(b"two"))
put("http_mpub", "binary_small", b"\x01\x03" + struct.pack(">i", 3) + sized(b"a") + sized(b"bb") + sized(b"ccccccccc"))

lid = json.dumps({"broadcast_address": "127.0.0.1", "hostname": "h", "http_port": 4151,
                  "tcp_port": 4150, "version": "1.3.0"}).encode()
put("lookupd_v1", "session", b"  V1PING\nIDENTIFY\n" + sized(lid) + b"REGISTER t c\nREGISTER t\nUNREGISTER t c\nPING\n")
put("lookupd_v1", "errors", b"  V1REGISTER t c\nIDENTIFY\n" + sized(b"{bad") + b"BOGUS\n")
put("lookupd_v1", "bad_magic", b"  V2PING\n")
put("lookupd_identify", "peer", lid)
put("lookupd_identify", "types", b'{"TCP_PORT":4150,"http_port":null,"hostname":"x","remote_address":"1.2.3.4:5"}')

salt = 0x5a11
def record(seq, body, salt=salt, ts=1, defer=0, mid=7, attempts=1):
    p = bytes([1]) + struct.pack(">IQqqQH", salt, seq, ts, defer, mid, attempts) + body
    return struct.pack(">II", len(p), zlib.crc32(p)) + p
seg = record(1, b"first") + record(2, b"second") + record(4, b"x" * 30)
# segment_scan: [mode][salt low byte][after] + bytes (mode 0 raw, 1 CRC fixed, 2/3 built + flips)
put("segment_scan", "raw_valid", b"\x00\x11\x00" + seg)
put("segment_scan", "raw_torn", b"\x00\x11\x01" + seg[:-3])
put("segment_scan", "bad_crc_then_valid", b"\x00\x11\x00" + record(1, b"a")[:8] + b"\xff" + record(1, b"a")[9:] + record(2, b"b"))
put("segment_scan", "crc_fixed", b"\x01\x11\x00" + seg[:20] + b"\x02" + seg[21:])
put("segment_scan", "built_flipped", b"\x26\x11\x00" + bytes(range(70)) + b"\x00\x05\x03\x00\x30\x07")

def index(base, salt, entries):
    b = b"NSQRIDX\0" + struct.pack(">IQIQQQQQI", 1, base, salt, 4096, 200, 3, 1, 4, len(entries))
    for s, o in entries:
        b += struct.pack(">QQ", s, o)
    return b + struct.pack(">I", zlib.crc32(b))
put("index_decode", "valid", b"\x00" + index(1, salt, [(1, 32)]))
put("index_decode", "fixup", b"\x03" + index(1, salt, [(1, 32), (257, 9000)])[:-6])

def event(kind, ch, seq, attempts=2, due=0):
    p = bytes([kind]) + struct.pack(">QHqB", seq, attempts, due, len(ch)) + ch
    return struct.pack(">II", len(p), zlib.crc32(p)) + p
j = event(1, b"c", 5) + event(2, b"c", 5, due=123) + event(3, b"c", 5) + event(4, b"d", 9)
put("journal_decode", "events", b"\x00" + j)
put("journal_decode", "torn", b"\x00" + j[:-5])
put("journal_decode", "fixup", b"\x01" + j[:30] + b"\x07" + j[31:])

put("meta_json", "meta", json.dumps({"version": 1, "name": "t", "paused": True, "pumped": 10,
    "holes": [[3, 5]], "channels": [{"name": "c", "paused": False, "cursor": 7,
    "pending": [{"seq": 2, "attempts": 3, "due_unix_ns": 0}]}], "next_seq": 11,
    "journal_gen": 4}).encode())
put("meta_json", "old", b'{"version":1,"name":"t","paused":false,"pumped":0,"channels":[]}')

def dq(body, ts=1, attempts=1):
    m = struct.pack(">qH", ts, attempts) + mid + body
    return sized(m)
dqf = dq(b"one") + dq(b"two") + dq(b"three")
meta = b"3\n0,0\n0,%d\n" % len(dqf)
put("import_diskqueue", "three", bytes([len(meta), 100]) + meta + dqf)
meta2 = b"2\n0,%d\n0,%d\n" % (len(dq(b"one")), len(dqf) - 3)
put("import_diskqueue", "mid_read", bytes([len(meta2), 4]) + meta2 + dqf)
