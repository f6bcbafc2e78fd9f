"""N shards of a Valkey Cluster on one machine (seed 002's layout: a primaries-only cluster,
every shard on one node, so that all cores work): one walrus per shard (managed Valkey in
cluster mode, durable) against one Valkey per shard with `appendfsync always`, for 1 and 2
shards, with redis-benchmark in cluster mode. Every setup runs in each round, in turn, so a
drift in machine speed hits all sides alike; reported are medians over the rounds and the
median of per-round ratios.

    deploy/bench_shards.py                 # 1 and 2 shards, 3 rounds, local disk and 1 ms disk
    deploy/bench_shards.py --shards 1,2,3 --rounds 5 --scale 0.5 --disks 5ms

Needs what deploy/bench.py needs (deploy/setup.sh): valkey-server and redis-benchmark.
"""
import argparse
import os
import sys
import tempfile
import time

from ..disks import LATENCY_US, SlowDisk
from ..procs import (LIVE, WALRUS, Proc, cargo_build, free_port, run_dir, stop_all, unwind_on_signals,
                     valkey_binary, wait_serving)
from ..resp import call
from ..runs import median_of, median_ratio, redis_benchmark, run_rounds, scaled

SLOTS = 16384

# name, redis-benchmark arguments (cluster mode added), requests at --scale 1.
WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
    ("SET 1 KiB, 1 client", ["-t", "set", "-d", "1024", "-c", "1", "-r", "100000"], 5000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
]


def always_node(tmp):
    """A cluster-mode Valkey that fsyncs its AOF on every write."""
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp, prefix="always-")
    args = [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes", "--appendfsync", "always", "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-port", str(free_port()),
            "--dir", d, "--logfile", ""]
    return Proc(args, "Ready to accept connections"), port


def walrus_node(tmp, local):
    """walrus, durable, in front of its own cluster-mode Valkey (managed mode); its data under
    `tmp`, its Valkey's socket under `local`, on a local disk (a FUSE mount, the slow disk,
    cannot hold a Unix socket)."""
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp, prefix="walrus-")
    conf = os.path.join(d, "walrus.toml")
    with open(conf, "w") as f:
        f.write('[upstream]\nmode = "managed"\nvalkey_server = "%s"\nsocket_dir = "%s"\n'
                '[cluster]\nenabled = true\n' % (valkey_binary(), tempfile.mkdtemp(dir=local, prefix="sock-")))
    args = [WALRUS, "serve", "--config", conf,
            "--listen", "127.0.0.1:%d" % port, "--metrics-listen", "", "--data-dir", os.path.join(d, "data")]
    env = dict(os.environ, RUST_LOG="warn")
    return Proc(args, None, env=env), port


def form_cluster(ports):
    """Gives each node an equal share of the slots and makes them one cluster (CLUSTER MEET
    with each node's bus port, read from its own CLUSTER NODES); returns once every node
    says cluster_state:ok. redis-cli --cluster create wants 3 primaries at least."""
    n = len(ports)
    for i, port in enumerate(ports):
        lo, hi = i * SLOTS // n, (i + 1) * SLOTS // n - 1
        call(port, "CLUSTER", "ADDSLOTSRANGE", str(lo), str(hi))
    for port in ports[1:]:
        me = next(line for line in call(port, "CLUSTER", "NODES").splitlines() if "myself" in line)
        bus = me.split()[1].split("@")[1].split(",")[0]
        call(ports[0], "CLUSTER", "MEET", "127.0.0.1", str(port), bus)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all("cluster_state:ok" in call(p, "CLUSTER", "INFO") for p in ports):
            return
        time.sleep(0.2)  # gossip pacing
    sys.exit("the cluster of %s did not become ok" % ports)


def start(kind, n, tmp, local):
    """n nodes of `kind` formed into one cluster, their files under `tmp` (sockets under
    `local`): (name, a port to start from)."""
    nodes = [walrus_node(tmp, local) if kind == "walrus" else always_node(tmp) for _ in range(n)]
    ports = [port for _, port in nodes]
    for proc, port in nodes:
        wait_serving(proc, port, timeout=120)
    form_cluster(ports)
    name = "walrus durable" if kind == "walrus" else "Valkey appendfsync always"
    return name, ports[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", default="1,2", help="the shard counts, comma-separated (default 1,2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's request count")
    ap.add_argument("--disks", default="local,1ms",
                    help="the disk regimes, in order: local (the temp dir's disk), 1ms and 5ms (faultfs in "
                         "latency mode on it, as deploy/bench.py's compare suite); default local,1ms")
    ap.add_argument("--no-build", action="store_true")
    opts = ap.parse_args()
    unwind_on_signals()
    regimes = opts.disks.split(",")
    if any(r not in LATENCY_US for r in regimes):
        sys.exit("--disks: local, 1ms or 5ms, not %s" % opts.disks)
    if not opts.no_build:
        cargo_build("--bin", "walrus", "--example", "faultfs")
    counts = [int(n) for n in opts.shards.split(",")]
    with run_dir("walrus-bench-shards-") as tmp:
        for regime in regimes:
            latency = LATENCY_US[regime]
            disk = SlowDisk(tmp, latency) if latency is not None else None
            where = disk.root if disk else tmp
            running = len(LIVE)
            setups = [(n, *start(kind, n, where, tmp)) for n in counts for kind in ("walrus", "always")]

            def one(w, setup):
                _, wargs, requests = w
                n, _, port = setup
                # One node owns every slot: no redirects, and redis-benchmark's cluster mode
                # wants two nodes at least.
                mode = ["--cluster"] if n > 1 else []
                return redis_benchmark(port, [*mode, *wargs], scaled(requests, opts.scale))

            results = run_rounds(opts.rounds, WORKLOADS, setups, one, key=lambda s: s[:2], label="%s: " % regime)
            report(regime, results, counts, opts.rounds)
            stop_all(running)


def report(regime, results, counts, rounds):
    walrus, always = "walrus durable", "Valkey appendfsync always"
    print("\nshards, %s disk, %d rounds, medians; ratios: median of per-round ratios\n" % (regime, rounds))
    print("| workload | shards | setup | ops/s | p50 ms | p99 ms | ops/s vs always | p99 vs always | ops/s vs 1 shard |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wname, _, _ in WORKLOADS:
        for n in counts:
            for sname in (walrus, always):
                rows = results[(wname, (n, sname))]
                base = results[(wname, (n, always))]
                one = results[(wname, (counts[0], sname))]
                print("| %s | %d | %s | %.0f | %.3f | %.3f | %.2fx | %.2fx | %.2fx |" % (
                    wname, n, sname, median_of(rows, 0), median_of(rows, 1), median_of(rows, 2),
                    median_ratio(rows, base, 0), median_ratio(rows, base, 2), median_ratio(rows, one, 0)))
