"""The proxy, durability and connect suites: redis-benchmark workloads against Valkey alone and
walrus, one table of ops/s, p50, p99 and the ratio against the first setup.

- proxy: Valkey directly against walrus as a plain proxy (journal off);
- durability: Valkey without persistence, with appendfsync everysec and always, walrus durable;
- connect: a new connection per request, against Valkey and walrus durable.

With --baseline, another walrus build runs as one more setup beside this tree's."""
from ..runs import median_of, median_ratio, redis_benchmark, run_rounds, scaled
from ..servers import durable_walruses, start_valkey, start_walrus

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
# Connections opened and closed per request (redis-benchmark -k 0): what opening a client's
# connection costs, and with MULTI, opening the pinned upstream connection a transaction
# gets (walrus asks CLIENT ID on it first, as its own user).
CONNECT_WORKLOADS = [
    ("PING, a new connection per request, 10 clients", ["-k", "0", "-c", "10", "PING"], 5000),
    ("MULTI, a new connection (and a pinned one upstream) per request, 10 clients",
     ["-k", "0", "-c", "10", "MULTI"], 5000),
]
WORKLOADS = {"proxy": PROXY_WORKLOADS, "durability": DURABILITY_WORKLOADS, "connect": CONNECT_WORKLOADS}


def setups(suite, tmp, baseline=None):
    """Starts every setup of the suite: [(name, port)]. `baseline`: another walrus binary, run
    as one more setup next to this tree's (an A/B of two builds in one run)."""
    out = []
    if suite == "proxy":
        _, vport = start_valkey(tmp)
        _, wport = start_walrus(tmp, vport, durable=False)
        out = [("direct", vport), ("walrus (proxy, journal off)", wport)]
        if baseline:
            _, vp = start_valkey(tmp)
            _, wp = start_walrus(tmp, vp, durable=False, binary=baseline)
            out.append(("baseline walrus (proxy, journal off)", wp))
        return out
    _, port = start_valkey(tmp)
    out.append(("Valkey, no persistence", port))
    for policy in ("everysec", "always") if suite != "connect" else ():
        _, port = start_valkey(tmp, ["--appendonly", "yes", "--appendfsync", policy])
        out.append(("Valkey appendfsync %s" % policy, port))
    return out + [(name, port) for name, port, _ in durable_walruses(tmp, baseline)]


def run(opts, tmp):
    workloads = WORKLOADS[opts.suite]
    started = setups(opts.suite, tmp, opts.baseline)
    results = run_rounds(opts.rounds, workloads, started,
                         lambda w, s: redis_benchmark(s[1], w[1], scaled(w[2], opts.scale)))
    base = started[0][0]
    print("\n%s suite, %d rounds, medians; ratio: median of per-round ops/s against %s\n"
          % (opts.suite, opts.rounds, base))
    print("| workload | setup | ops/s | ratio | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for wname, _, _ in workloads:
        for sname, _ in started:
            rows = results[(wname, sname)]
            print("| %s | %s | %.0f | %.2fx | %.3f | %.3f |" % (
                wname, sname, median_of(rows, 0), median_ratio(rows, results[(wname, base)], 0),
                median_of(rows, 1), median_of(rows, 2)))
