"""deploy/bench.py --suite socket: what the Unix socket saves per request against loopback TCP
on the walrus-to-Valkey hop.

One valkey-server listens on both a TCP port and a Unix socket; walrus runs in external mode
in front of it over one or the other, the clients reach walrus over TCP as always. Journal
off: both walruses run all along (neither touches Valkey while the other is measured).
Durable: each round starts the walrus it measures and stops it after, so that only one
replica link (and journal) follows Valkey's stream at a time."""
import os
import shutil
import tempfile

from ..procs import cpu_ticks, cpu_us_per_request
from ..runs import median_of, median_ratio, redis_benchmark, rounds, scaled
from ..servers import WALRUS_VALKEY_SETTINGS, start_valkey, start_walrus

SOCKET_WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("GET 1 KiB, 1 client", ["-t", "get", "-d", "1024", "-c", "1", "-r", "100000"], 20000),
    ("GET 1 KiB, 50 clients, -P 16", ["-t", "get", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 800000),
]
SOCKET_DURABLE_WORKLOADS = [
    ("durable SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
    ("durable SET 1 KiB, 1 client", ["-t", "set", "-d", "1024", "-c", "1", "-r", "100000"], 10000),
]


def run(opts, tmp):
    sock_dir = tempfile.mkdtemp(dir=tmp)
    os.chmod(sock_dir, 0o700)
    sock = os.path.join(sock_dir, "valkey.sock")
    v, vport = start_valkey(tmp, [*WALRUS_VALKEY_SETTINGS, "--unixsocket", sock, "--unixsocketperm", "700"])
    upstreams = [("TCP 127.0.0.1", vport), ("Unix socket", "unix:" + sock)]
    proxies = [(name, start_walrus(tmp, up, durable=False)) for name, up in upstreams]
    rows = {}  # (workload, transport) -> [(ops, p50, p99, walrus µs/req, Valkey µs/req)]

    def measure(wname, wargs, n, transport, w, wport):
        ticks = (cpu_ticks(w), cpu_ticks(v))
        req = scaled(n, opts.scale)
        ops, p50, p99, _ = redis_benchmark(wport, wargs, req)
        cpu = [cpu_us_per_request(p, t, req) for p, t in zip((w, v), ticks)]
        rows.setdefault((wname, transport), []).append((ops, p50, p99, *cpu))

    for _ in rounds(opts.rounds):
        for wname, wargs, n in SOCKET_WORKLOADS:
            for transport, (w, wport) in proxies:
                measure(wname, wargs, n, transport, w, wport)
        for transport, up in upstreams:
            # A small ring, removed after, and watermarks up: what is measured is the hop to
            # Valkey, on whatever disk is at hand (a shared machine's may be nearly full).
            w, wport = start_walrus(tmp, up, durable=True,
                                    config="[disk]\nhigh_watermark = 0.99\nlow_watermark = 0.98\n"
                                           "[journal]\nsegment_size = 16777216\nsegments = 16\n")
            try:
                for wname, wargs, n in SOCKET_DURABLE_WORKLOADS:
                    measure(wname, wargs, n, transport, w, wport)
            finally:
                w.stop()
                data = w.p.args[w.p.args.index("--data-dir") + 1]
                shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    print("\nsocket suite: walrus in external mode, to one Valkey over loopback TCP or its Unix socket "
          "(clients to walrus over TCP); %d rounds, medians; ratio: median of per-round figures, Unix socket "
          "over TCP; CPU: user + system time per request (µs), all threads\n" % opts.rounds)
    print("| workload | walrus to Valkey | ops/s | ops/s ratio | p50 ms | p99 ms | walrus CPU µs/req | CPU ratio "
          "| Valkey CPU µs/req |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wname, _, _ in SOCKET_WORKLOADS + SOCKET_DURABLE_WORKLOADS:
        tcp = rows[(wname, upstreams[0][0])]
        for transport, _ in upstreams:
            xs = rows[(wname, transport)]
            print("| %s | %s | %.0f | %.3f | %.3f | %.3f | %.1f | %.3f | %.1f |" % (
                wname, transport, median_of(xs, 0), median_ratio(xs, tcp, 0), median_of(xs, 1), median_of(xs, 2),
                median_of(xs, 3), median_ratio(xs, tcp, 3), median_of(xs, 4)))
