#!/usr/bin/env python3
"""Hostile clients for `deploy/bench.py --suite hostile`: runs until SIGTERM against a RESP
server on 127.0.0.1:PORT, and prints `ready` once all of them are in place.

  --idle N        connections that connect, PING once, and then say nothing
  --nonreaders N  connections that pipeline GETs of a 1 MiB value and never read a reply
                  (reconnecting when the server drops them)
  --slowloris N   connections that trickle SETs one byte every 10 ms
  --vanishing N   connections that send half a pipeline of INCRs and reset, in a loop
"""
import argparse
import os
import resource
import signal
import socket
import struct
import threading

from bench.resp import resp

STOP = threading.Event()


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def nonreader(port):
    get = resp("GET", "hostile:big") * 64
    while not STOP.is_set():
        try:
            s = connect(port)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(1.0)
            while not STOP.is_set():
                try:
                    s.sendall(get)
                except socket.timeout:
                    continue  # the server stopped reading us: keep the pressure on
        except OSError:
            STOP.wait(0.05)  # dropped by the server; come back


def slowloris(port, i):
    req = resp("SET", "hostile:slow:%d" % i, "v" * 32)
    while not STOP.is_set():
        try:
            s = connect(port)
            for b in req:
                if STOP.wait(0.01):
                    return
                s.sendall(bytes([b]))
            s.recv(64)
            s.close()
        except OSError:
            STOP.wait(0.05)


def vanishing(port, i):
    pipeline = resp("INCR", "hostile:vanish:%d" % i) * 500
    while not STOP.is_set():
        try:
            s = connect(port)
            s.sendall(pipeline[: len(pipeline) // 2 + 7])
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        except OSError:
            pass
        STOP.wait(0.02)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    for k in ("idle", "nonreaders", "slowloris", "vanishing"):
        ap.add_argument("--" + k, type=int, default=0)
    o = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, o.idle + 1024)), hard))
    setup = connect(o.port)
    setup.sendall(resp("SET", "hostile:big", "x" * (1 << 20)))
    setup.recv(64)
    idle = []
    for _ in range(o.idle):
        s = connect(o.port)
        s.sendall(b"PING\r\n")
        idle.append(s)
    for s in idle:
        s.recv(16)
    threads = [threading.Thread(target=nonreader, args=(o.port,)) for _ in range(o.nonreaders)]
    threads += [threading.Thread(target=slowloris, args=(o.port, i)) for i in range(o.slowloris)]
    threads += [threading.Thread(target=vanishing, args=(o.port, i)) for i in range(o.vanishing)]
    for t in threads:
        t.daemon = True
        t.start()
    print("ready", flush=True)
    while not STOP.wait(0.5):
        pass
    os._exit(0)  # daemon threads blocked in sendall need not be joined


if __name__ == "__main__":
    main()
