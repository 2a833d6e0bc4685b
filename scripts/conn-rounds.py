#!/usr/bin/env python3
"""Broker RSS over rounds of N concurrent TCP connections opened and closed (RELIABILITY.md, "Resource exhaustion").

  scripts/conn-rounds.py NSQD SHARDS N ROUNDS {none|v2|nop}

Starts NSQD on loopback ports with a temporary data path; each round opens N connections
(sending nothing, the V2 magic, or the magic and a NOP), waits until the broker holds
them, closes them, and prints the RSS (kB) while open and after closing."""
import socket, sys, time, os, subprocess, tempfile, re

nsqd, shards, n, rounds, magic = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
d = tempfile.mkdtemp()
log = open(d + "/log", "w")
p = subprocess.Popen([nsqd, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--shards={shards}", f"--data-path={d}"], stderr=log, stdout=subprocess.DEVNULL)
time.sleep(1.5)
txt = open(d + "/log").read()
tcp = re.search(r"TCP: listening on ([\d.]+):(\d+)", txt)
addr = (tcp.group(1), int(tcp.group(2)))
def rss():
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])
def fds(): return len(os.listdir(f"/proc/{p.pid}/fd"))
print("start", rss())
for r in range(rounds):
    cs = []
    for i in range(n):
        s = socket.create_connection(addr)
        if magic == "v2": s.sendall(b"  V2")
        elif magic == "nop": s.sendall(b"  V2NOP\n")
        cs.append(s)
    while fds() < n: time.sleep(0.1)
    a = rss()
    for s in cs: s.close()
    while fds() > 100: time.sleep(0.1)
    time.sleep(3)  # a shard hands freed heap back within about 2 s (src/memory.rs)
    print("round", r, "open", a, "closed", rss(), flush=True)
p.kill(); p.wait()
