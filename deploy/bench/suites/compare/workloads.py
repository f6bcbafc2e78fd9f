"""The compare suite's workloads and one run of one: redis-benchmark for single commands,
examples/loadgen.rs for the SET:GET mix and the timed ones, each run with the CPU time, peak
RSS and journal counters of the setup it ran against."""
import os
import subprocess

from ...procs import TARGET, cpu_ticks, cpu_us_per_request, peak_rss_mib, reset_peak_rss
from ...runs import redis_benchmark
from ...servers import scrape

PRELOAD_KEYS = 100000
# name, tool, its arguments, requests per run (scaled by --scale and the disk regime's scale;
# for the timed workloads, seconds). The GET and SET:GET workloads read the keyspace preloaded
# under "data:" (1 KiB each); the SET workloads write under redis-benchmark's own "key:" (the
# writers beside readers under "w:"), so that the 180 KiB values never land in what is read.
# redis-benchmark runs one command per workload; examples/loadgen.rs the mix and the timed ones
# ("loadgen-timed": one loadgen for that many seconds; "pair": readers and writers together,
# two loadgens over the same seconds, the readers' figures first).
GET_READERS = ["--clients", "50", "--set-ratio", "0", "--get-ratio", "1", "--data-size", "1024",
               "--keys", str(PRELOAD_KEYS), "--key-prefix", "data:"]
SET_WRITERS = ["--clients", "8", "--set-ratio", "1", "--get-ratio", "0", "--data-size", "1024",
               "--keys", "100000", "--key-prefix", "w:"]
GET_ALONE, GET_BESIDE = "GET 1 KiB, 50 readers alone", "GET 1 KiB, 50 readers beside 8 SET writers"
COMPARE_WORKLOADS = [
    ("SET 1 KiB, 50 clients", "redis-benchmark", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("SET 1 KiB, 50 clients, -P 16", "redis-benchmark",
     ["-t", "set", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 800000),
    ("SET:GET 1:3, 1 KiB, 50 clients", "loadgen",
     ["--clients", "50", "--set-ratio", "1", "--get-ratio", "3", "--data-size", "1024",
      "--keys", str(PRELOAD_KEYS), "--key-prefix", "data:"], 200000),
    # 2.2 GB a run locally: several checkpoints of walrus's default 1 GiB ring (four to six
    # on this machine), so that how many fall inside one run does not decide its figure.
    ("SET 180 KiB, 20 clients", "redis-benchmark", ["-t", "set", "-d", "184320", "-c", "20", "-r", "1000"], 12000),
    ("SET 1 KiB, 1 client", "redis-benchmark", ["-t", "set", "-d", "1024", "-c", "1", "-r", "100000"], 10000),
    ("GET 1 KiB, 50 clients", "redis-benchmark", ["-c", "50", "-r", str(PRELOAD_KEYS), "GET", "data:__rand_int__"], 200000),
    ("GET 1 KiB, 50 clients, -P 16", "redis-benchmark",
     ["-c", "50", "-P", "16", "-r", str(PRELOAD_KEYS), "GET", "data:__rand_int__"], 800000),
    (GET_ALONE, "loadgen-timed", GET_READERS, 6),
    (GET_BESIDE, "pair", (GET_READERS, SET_WRITERS), 6),
]
# A disk regime's request scale, so that a round at 200 synchronous writes a second still takes
# minutes, not an hour.
REGIME_SCALE = {"local": 1.0, "1ms": 0.25, "5ms": 0.1}
# walrus's counters: their deltas over a run give bytes per entry and the write amplification.
# A build without one reports n/a.
JOURNAL_COUNTERS = {"written": "walrus_journal_written_bytes_total", "entries": "walrus_journal_entries_total",
                    "ring": "walrus_journal_ring_bytes_total", "payload": "walrus_journal_entry_bytes_total",
                    "checkpoint": "walrus_checkpoint_written_bytes_total"}
LOADGEN = os.path.join(TARGET, "release", "examples", "loadgen")


def loadgen_args(port, args, requests=None, seconds=None):
    limit = ["--requests", str(requests)] if requests else ["--requests", str(10 ** 12), "--seconds", str(seconds)]
    return [LOADGEN, "--port", str(port), *limit, *args]


def loadgen_result(out, port):
    """(ops/s, p50, p99, p99.9 ms, requests) of one examples/loadgen.rs run (exact, from its
    HdrHistogram)."""
    if out.returncode != 0:
        raise RuntimeError("loadgen failed on port %d: %s" % (port, (out.stdout + out.stderr).strip()[-2000:]))
    got = dict(kv.split("=") for kv in out.stdout.split()[1:])
    return tuple(float(got[k]) for k in ("ops_per_sec", "p50_ms", "p99_ms", "p999_ms", "requests"))


def run_workload(port, tool, args, n):
    """One run: {ops, p50, p99, p999, requests}, and for a pair the writers' figures as w_*."""
    if tool == "redis-benchmark":
        ops, p50, p99, p999 = redis_benchmark(port, args, n)
        return dict(ops=ops, p50=p50, p99=p99, p999=p999, requests=n)
    if tool == "pair":  # readers and writers started together, over the same seconds
        procs = [subprocess.Popen(loadgen_args(port, a, seconds=n), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for a in args]
        outs = [subprocess.CompletedProcess(p.args, p.wait(), *p.communicate()) for p in procs]
        (ops, p50, p99, p999, reqs), (w_ops, w_p50, w_p99, w_p999, w_reqs) = (loadgen_result(o, port) for o in outs)
        return dict(ops=ops, p50=p50, p99=p99, p999=p999, requests=reqs + w_reqs,
                    w_ops=w_ops, w_p50=w_p50, w_p99=w_p99, w_p999=w_p999)
    timed = tool == "loadgen-timed"
    out = subprocess.run(loadgen_args(port, args, None if timed else n, n if timed else None),
                         capture_output=True, text=True)
    ops, p50, p99, p999, reqs = loadgen_result(out, port)
    return dict(ops=ops, p50=p50, p99=p99, p999=p999, requests=reqs)


def measure(setup, tool, args, n):
    """One run against one setup: the tool's figures, plus CPU per request of the proxy and of
    Valkey (µs), the proxy's peak RSS and walrus's counter deltas."""
    procs = {"proxy": setup.proxy, "valkey": setup.valkey}
    if setup.proxy:
        reset_peak_rss(setup.proxy)
    before = scrape(setup.metrics) if setup.durable else {}
    ticks = {k: cpu_ticks(p) for k, p in procs.items() if p}
    row = run_workload(setup.port, tool, args, n)
    for k, p in procs.items():
        if p:
            row[k + "_cpu"] = cpu_us_per_request(p, ticks[k], max(1, row["requests"]))
    if setup.proxy:
        row["rss"] = peak_rss_mib(setup.proxy)
    if setup.durable:
        after = scrape(setup.metrics)
        row["journal"] = {k: after[m] - before[m] if m in after and m in before else None
                          for k, m in JOURNAL_COUNTERS.items()}
    return row


def runs(n, scale, regime_scale, tool):
    """A workload's requests per run (or seconds, for the timed ones) at these scales: the
    timed ones shrink with --scale only, never below 3 s."""
    if tool in ("loadgen-timed", "pair"):
        return max(3, int(round(n * min(1.0, scale * 4))))
    return max(1, int(n * scale * regime_scale))
