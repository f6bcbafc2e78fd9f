"""deploy/bench.py --suite compare: the whole comparison in one run.

Valkey with each of its persistence modes, walrus durable on each journal backend, walrus as
a plain proxy, and the proxies it is compared with (twemproxy, HAProxy in TCP mode), every
setup with its own Valkey (setups.py). Each round runs every workload against every setup in
turn (workloads.py), each run once no setup is saving (walrus's checkpoint, Valkey's RDB or
AOF rewrite), so that none pays for what the one before it left running. Besides ops/s and
latency: the CPU time each proxy (or, for Valkey alone, valkey-server) spends per request,
the proxies' peak RSS, and for walrus durable the journal bytes per entry and the write
amplification from its /metrics (report.py).

Disk regimes (--disks): the local disk of the temp dir, and slow disks emulated by faultfs
(examples/faultfs) in latency mode, which delays every synchronous write and sync by a fixed
time and lets concurrent ones overlap, as a network volume does. A slow regime starts only
the setups that sync (and the references without a disk), on the mount."""
import os
import subprocess
import sys
import time

from ...disks import FAULTFS, LATENCY_US, SlowDisk, sync_write_floor
from ...servers import await_idle, scrape
from .report import compare_plot, compare_report, regime_report
from .setups import SLOW_DISK_SETUPS, compare_setups, machine_description
from .workloads import COMPARE_WORKLOADS, LOADGEN, PRELOAD_KEYS, REGIME_SCALE, measure, runs


def compare_regime(opts, tmp, regime, workloads):
    """Starts the regime's setups (on a faultfs mount for a slow disk), preloads them and runs
    every round: (started, results, the device's floor)."""
    latency, regime_scale = LATENCY_US[regime], REGIME_SCALE[regime]
    disk = SlowDisk(tmp, latency) if latency is not None else None
    root = disk.root if disk else tmp
    started = []
    try:
        floor = sync_write_floor(root)
        started = compare_setups(root, opts.baseline, SLOW_DISK_SETUPS if disk else None, opts.setup)
        for s in started:
            if s.metrics:  # which journal backend walrus really runs
                info_ = [k for k in scrape(s.metrics) if k.startswith("walrus_journal_info{")]
                s.about += "; /metrics: " + (info_[0].split("{", 1)[1].rstrip("}") if info_ else "no journal")
            subprocess.run([LOADGEN, "--port", str(s.port), "--preload", "--keys", str(PRELOAD_KEYS),
                            "--data-size", "1024", "--key-prefix", "data:", "--clients", "4", "--pipeline", "64"],
                           check=True, stdout=subprocess.DEVNULL)
        results = {(w, s.name): [] for w, _, _, _ in workloads for s in started}
        began = time.monotonic()
        for r in range(opts.rounds):
            for wname, tool, args, n in workloads:
                for s in started:
                    await_idle([port for other in started for port in other.saving_ports()])
                    results[(wname, s.name)].append(measure(s, tool, args, runs(n, opts.scale, regime_scale, tool)))
                print("%s, round %d/%d: %s done (%.0fs so far)" % (regime, r + 1, opts.rounds, wname,
                                                                   time.monotonic() - began), file=sys.stderr)
        return started, results, floor
    finally:
        for s in started:
            s.stop()
        if disk:
            disk.stop()


def run(opts, tmp):
    began = time.monotonic()
    workloads = COMPARE_WORKLOADS
    if opts.workload:
        workloads = [w for w in workloads if any(text in w[0] for text in opts.workload)]
        if not workloads:
            sys.exit("--workload: no compare workload's name contains %s" % " or ".join(opts.workload))
    for path, build in ((LOADGEN, "loadgen"), (FAULTFS, "faultfs")):
        if not os.path.exists(path):
            sys.exit("%s missing: cargo build --release --example %s" % (path, build))
    regimes = opts.disks.split(",")
    unknown = [r for r in regimes if r not in REGIME_SCALE]
    if unknown:
        sys.exit("--disks: unknown regime %s (known: %s)" % (", ".join(unknown), ", ".join(REGIME_SCALE)))
    header = machine_description(tmp)
    sections = []
    for regime in regimes:
        started, results, floor = compare_regime(opts, tmp, regime, workloads)
        sections.append((regime, started, results, regime_report(opts, regime, workloads, started, results, floor)))
    report = compare_report(opts, header, sections, time.monotonic() - began)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(report)
        print("report: %s" % opts.out, file=sys.stderr)
    else:
        print(report)
    if opts.plot:
        compare_plot(opts.plot, workloads, sections,
                     "deploy/bench.py --suite compare: %d round(s), --scale %g, walrus %s\n%s"
                     % (opts.rounds, opts.scale, header["commit"], header["machine"]))
