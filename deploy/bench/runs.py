"""Runs and their figures: one redis-benchmark run parsed, the rounds (every workload against
every setup in turn, so a drift in machine speed hits all sides alike), and the medians and
median ratios the reports print."""
import math
import re
import statistics
import subprocess
import sys


def redis_benchmark(port, args, requests):
    """(ops/s, p50, p99, p99.9 ms) of one run. Its plain output, not --csv (which stops at
    p99): p99.9 is the smallest latency its percentile or cumulative distribution lists as
    covering at least 99.9% of the requests, so an upper bound, at most one listed step above
    the exact value."""
    run = subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), *args], capture_output=True, text=True)
    if run.returncode != 0:  # it exits at the first error reply
        raise RuntimeError("redis-benchmark failed on port %d: %s" % (port, run.stderr.strip()[-2000:]))
    out = run.stdout
    summary = re.search(r"throughput summary: ([\d.]+) requests per second.*?"
                        r"avg\s+min\s+p50\s+p95\s+p99\s+max\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",
                        out, re.S)
    if not summary:
        raise RuntimeError("redis-benchmark printed no summary:\n" + out[-2000:])
    listed = [(float(ms), int(count)) for ms, count in
              re.findall(r"<= ([\d.]+) milliseconds \(cumulative count (\d+)\)", out)]
    total = max(count for _, count in listed)
    p999 = min(ms for ms, count in listed if count >= 0.999 * total)
    return float(summary.group(1)), float(summary.group(4)), float(summary.group(6)), p999


def scaled(requests, scale):
    """A workload's requests per run at --scale: at least one."""
    return max(1, int(requests * scale))


def rounds(n, label=""):
    """range(n), saying on stderr when each round is done."""
    for r in range(n):
        yield r
        print("%sround %d/%d done" % (label, r + 1, n), file=sys.stderr)


def run_rounds(n, workloads, setups, run, key=lambda setup: setup[0], label=""):
    """`n` rounds of every workload against every setup in turn: {(workload name, key(setup)):
    [run(workload, setup) of each round]}. Workloads and setups are tuples, a workload's name
    first."""
    results = {(w[0], key(s)): [] for w in workloads for s in setups}
    for _ in rounds(n, label):
        for w in workloads:
            for s in setups:
                results[(w[0], key(s))].append(run(w, s))
    return results


def median_of(rows, i):
    """The median over the rounds of figure i."""
    return statistics.median(row[i] for row in rows)


def ratios(rows, base, i, base_i=None):
    """Figure i of each round's row over figure base_i (default i) of the same round's base
    row; rounds where the base's is 0 (a CPU time below one clock tick) left out."""
    base_i = i if base_i is None else base_i
    return [row[i] / b[base_i] for row, b in zip(rows, base) if b[base_i]]


def median_ratio(rows, base, i):
    """The median over the rounds of the per-round ratio of figure i (nan if there is none)."""
    xs = ratios(rows, base, i)
    return statistics.median(xs) if xs else math.nan


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]
