"""Benchmarks walrus against Valkey with redis-benchmark, every setup in the same run.

For each round, every workload runs against each setup in turn, so a drift in machine speed
hits all sides alike. Reported: the median over the rounds of ops/s, p50 and p99 latency,
and the median of the per-round ratios against the first setup.

    deploy/bench.py --suite proxy        # Valkey direct vs walrus as a plain proxy (journal off)
    deploy/bench.py --suite durability   # no persistence, appendfsync everysec/always, walrus durable
    deploy/bench.py --suite durability --rounds 3
    deploy/bench.py --suite scripts      # what scripts (treated as touching every key) cost readers
    deploy/bench.py --suite restore      # restart of ~1 GB: walrus restore vs Valkey AOF/RDB load; p99 in a checkpoint
    deploy/bench.py --suite restore --dataset-mb 128 --rounds 1   # a quick run
    deploy/bench.py --suite compare --out report.md --plot docs/benchmark-report.png
                                         # everything at once: Valkey's persistence modes, walrus
                                         # durable on both journal backends and as a plain proxy,
                                         # twemproxy, HAProxy; CPU per request, RSS, journal bytes,
                                         # write amplification; on the local disk and on slow disks
                                         # (faultfs: 1 ms and 5 ms per synchronous write)
    deploy/bench.py --suite compare --rounds 1 --scale 0.05 --out /tmp/r.md --plot /tmp/r.png   # quick
    deploy/bench.py --suite compare --disks 5ms --rounds 1 --scale 0.2   # one regime
    deploy/bench.py --suite compare --disks local --workload "SET 180 KiB" --setup always --setup "walrus durable"
                                         # one workload against some setups (names containing the texts)
    deploy/bench.py --suite role --baseline OLD_BINARY
                                         # what walrus's ROLE calls cost inside Valkey (its
                                         # commandstats) under durable SETs, this build and another
    deploy/bench.py --suite hostile      # p99 of well-behaved clients alone vs beside hostile ones (deploy/hostile_load.py)
    deploy/bench.py --suite tls          # TLS to redis-server through walrus vs directly (deploy/bench/suites/tls.py)
    deploy/bench.py --suite connect --baseline OLD_BINARY
                                         # a new connection per request (PING; MULTI, which opens a
                                         # pinned upstream connection): Valkey, walrus, another build
    deploy/bench.py --suite socket       # walrus to Valkey over loopback TCP vs a Unix socket: one Valkey
                                         # listening on both; ops/s, latency, CPU per request of each side
    deploy/bench.py --suite notifications --baseline OLD_BINARY
                                         # SET writers beside keyspace subscribers and tracking clients:
                                         # the writers' ops/s, and the delay from a write's acknowledgement
                                         # to its notification and invalidation; Valkey, walrus, another build
    deploy/bench.py --suite archive      # durable SETs without an archive, with one, with ack = "archive"
                                         # (SeaweedFS on this machine); bytes and requests per stream
                                         # byte; a restart vs a bootstrap from the archive (deploy/bench/suites/archive.py)

Needs: valkey-server (deploy/setup.sh installs it) and redis-benchmark (redis-tools); compare
also nutcracker, haproxy and matplotlib (deploy/setup.sh --bench).
"""
import argparse

from . import servers
from .procs import cargo_build, run_dir, unwind_on_signals
from .suites import archive, compare, hostile, notifications, plain, restore, role, scripts, tls, unix_socket

# --suite: the module that runs it (run(opts, tmp)).
SUITES = {"proxy": plain, "durability": plain, "connect": plain, "restore": restore, "scripts": scripts,
          "compare": compare, "role": role, "hostile": hostile, "tls": tls, "socket": unix_socket,
          "notifications": notifications, "archive": archive}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=list(SUITES), default="proxy")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (restore, compare: 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's request count")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--baseline", metavar="BINARY",
                    help="proxy, durability, connect, compare, role, notifications, archive: also run this walrus binary (e.g. a build of an "
                         "older commit) as a setup")
    ap.add_argument("--dataset-mb", type=int, default=1024,
                    help="restore, archive: MiB of SETs (200-byte values, 240 bytes each) written into each setup")
    ap.add_argument("--segment-mb", type=int, default=0,
                    help="restore: journal segment size (16 segments); 0: large enough that walrus never checkpoints by itself")
    ap.add_argument("--checkpoint-at", type=float, default=0.5,
                    help="restore: fraction of the keys written before `walrus checkpoint` (the rest goes to the journal)")
    ap.add_argument("--aof-layout", choices=["matched", "natural"], default="matched",
                    help="restore: BGREWRITEAOF at --checkpoint-at too, or Valkey's automatic rewrites")
    ap.add_argument("--requests", type=int, default=100000, help="restore: redis-benchmark requests per checkpoint run")
    ap.add_argument("--show-log", action="store_true", help="restore: print walrus's log of the last restart")
    ap.add_argument("--idle", type=int, default=10000, help="hostile: idle connections beside the load")
    ap.add_argument("--out", metavar="FILE", help="compare: write the markdown report there instead of stdout")
    ap.add_argument("--plot", metavar="PNG", help="compare: also draw the results (matplotlib), e.g. docs/benchmark-report.png")
    ap.add_argument("--disks", default="local,1ms,5ms",
                    help="compare: the disk regimes, in order: local (the temp dir's disk), 1ms and 5ms (faultfs "
                         "in latency mode on it); default all three")
    ap.add_argument("--walrus-config", metavar="TOML", default="",
                    help="more TOML for every walrus (both builds), e.g. '[disk]\\nhigh_watermark = 0.97\\n"
                         "low_watermark = 0.96' on a shared disk fuller than the default marks allow")
    ap.add_argument("--workload", action="append", metavar="TEXT",
                    help="compare: only the workloads whose name contains TEXT (repeatable)")
    ap.add_argument("--setup", action="append", metavar="TEXT",
                    help="compare: only the setups whose name contains TEXT (repeatable; a --baseline's follow its own)")
    opts = ap.parse_args()
    servers.WALRUS_CONFIG = opts.walrus_config.replace("\\n", "\n")
    if opts.rounds is None:
        opts.rounds = 3 if opts.suite in ("restore", "compare", "archive") else 5
    unwind_on_signals()
    if not opts.no_build:
        # compare: also examples/loadgen.rs, its load generator for the SET:GET mix and the
        # timed workloads, and examples/faultfs, the slow disks.
        cargo_build(*(["--bin", "walrus", "--example", "loadgen", "--example", "faultfs"]
                      if opts.suite == "compare" else []))
    with run_dir("walrus-bench-") as tmp:
        SUITES[opts.suite].run(opts, tmp)


if __name__ == "__main__":
    main()
