"""deploy/bench.py --suite hostile: well-behaved clients alone, then beside
deploy/hostile_load.py's idle, non-reading, slowloris and vanishing clients, in each round:
their p99, its ratio, and the peak RSS; against a durable walrus, and against Valkey alone
under the same load for reference (its output limit for normal clients set to walrus's,
16 MiB: by default it has none)."""
import os
import statistics
import sys

from ..procs import ROOT, Proc, peak_rss_mib, reset_peak_rss
from ..runs import median_of, median_ratio, redis_benchmark, rounds, scaled
from ..servers import WALRUS_VALKEY_SETTINGS, start_valkey, start_walrus

HOSTILE_WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 50000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 50000),
]


def run(opts, tmp):
    room = opts.idle + 2000  # the idle connections, the hostile ones and the benchmark's
    _, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
    w, wport = start_walrus(tmp, vport, durable=True,
                            config="[proxy]\nmax_output_bytes = 16777216\nmax_clients = %d\n" % room)
    ref, rport = start_valkey(tmp, ["--maxclients", str(room), "--client-output-buffer-limit", "normal 16mb 0 0"])
    targets = [("walrus durable", wport, w), ("Valkey alone", rport, ref)]
    hostile_args = ["--idle", str(opts.idle), "--nonreaders", "20", "--slowloris", "200", "--vanishing", "20"]
    rows = {(t, wl, load): [] for t, _, _ in targets for wl, _, _ in HOSTILE_WORKLOADS for load in ("alone", "hostile")}
    rss = {t: [] for t, _, _ in targets}
    for _ in rounds(opts.rounds):
        for target, port, proc in targets:
            for wname, wargs, n in HOSTILE_WORKLOADS:
                rows[(target, wname, "alone")].append(redis_benchmark(port, wargs, scaled(n, opts.scale)))
            reset_peak_rss(proc)
            h = Proc([sys.executable, os.path.join(ROOT, "deploy", "hostile_load.py"), "--port", str(port),
                      *hostile_args], "ready", timeout=300)
            try:
                for wname, wargs, n in HOSTILE_WORKLOADS:
                    rows[(target, wname, "hostile")].append(redis_benchmark(port, wargs, scaled(n, opts.scale)))
                rss[target].append(peak_rss_mib(proc))
            finally:
                h.stop()
    print("\nhostile suite, %d rounds, medians; hostile: %s (deploy/hostile_load.py); peak RSS beside them "
          "(median): %s\n" % (opts.rounds, " ".join(hostile_args),
                               ", ".join("%s %.0f MiB" % (t, statistics.median(rss[t])) for t, _, _ in targets)))
    print("| target | workload | load | ops/s | p50 ms | p99 ms | p99 ratio |")
    print("|---|---|---|---|---|---|---|")
    for target, _, _ in targets:
        for wname, _, _ in HOSTILE_WORKLOADS:
            alone = rows[(target, wname, "alone")]
            for load in ("alone", "hostile"):
                xs = rows[(target, wname, load)]
                print("| %s | %s | %s | %.0f | %.3f | %.3f | %.2fx |"
                      % (target, wname, load, median_of(xs, 0), median_of(xs, 1), median_of(xs, 2),
                         median_ratio(xs, alone, 2)))
