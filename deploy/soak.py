#!/usr/bin/env python3
"""The soak: walrus in managed mode (the default) under a mixed load at a fraction of its
measured maximum for an hour, with the ring sized to take a checkpoint every few minutes,
Valkey killed (SIGKILL) a third of the way in and walrus restarted (SIGTERM) at two thirds.
Every reply and, at the end, every key is checked by examples/soak.rs; walrus's and
Valkey's RSS, walrus's file descriptors and its metrics are sampled every window.

    deploy/soak.py                      # one hour; report to stdout
    deploy/soak.py --seconds 3600 --out docs/soak.md --plot docs/soak.png --csv docs/soak.csv

Steps: build (release); measure the maximum (closed loop, --clients, 30 s) on a walrus of
its own; size the ring so that the offered writes fill checkpoint.ring_fill_trigger (half
the ring) every --checkpoint-every seconds; run the load at --load of the maximum on a fresh
walrus. Exits 1 if the client found a violation, walrus or Valkey did not come back, or
walrus logged an error.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench.procs import LIVE, ROOT, TARGET, WALRUS, Proc, free_port, valkey_binary
from bench.servers import scrape

SOAK = os.path.join(TARGET, "release", "examples", "soak")
SEGMENTS = 16
RING = "journal_ring_bytes_total"


def rss_mib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return float("nan")


def fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def valkey_pid(walrus_pid):
    """The managed valkey-server: walrus's child."""
    out = subprocess.run(["pgrep", "-P", str(walrus_pid), "valkey-server"], capture_output=True, text=True)
    pids = out.stdout.split()
    return int(pids[0]) if pids else None


class Walrus:
    """walrus serve in managed mode on fixed ports, restartable on the same data."""

    def __init__(self, tmp, name, segment_bytes):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.conf = os.path.join(self.dir, "walrus.toml")
        # The trigger is pinned at half the ring, which the ring is sized for (step 2): the
        # default, later one would space the checkpoints by more than --checkpoint-every.
        with open(self.conf, "w") as f:
            f.write("[upstream]\nvalkey_server = %r\n[journal]\nsegment_size_bytes = %d\nsegments = %d\n"
                    "[checkpoint]\nring_fill_trigger = 0.5\n"
                    % (valkey_binary(), segment_bytes, SEGMENTS))
        self.port, self.metrics = free_port(), "127.0.0.1:%d" % free_port()
        self.lives = []
        self.start()

    def start(self):
        args = [WALRUS, "serve", "--config", self.conf, "--listen", "127.0.0.1:%d" % self.port,
                "--metrics-listen", self.metrics, "--data-dir", os.path.join(self.dir, "data")]
        env = dict(os.environ, RUST_LOG="warn,walrus::daemon=info,walrus::restore=info,walrus::checkpoint=info")
        self.proc = Proc(args, "walrus listening on ", env=env, timeout=600)
        self.lives.append(self.proc)

    def restart(self):
        self.proc.p.send_signal(signal.SIGTERM)
        self.proc.p.wait(120)
        LIVE.remove(self.proc)
        self.start()

    def metrics_now(self):
        try:
            return scrape(self.metrics)
        except OSError:
            return {}

    def errors(self):
        """Errors walrus logged, but the one the soak causes: the managed Valkey's SIGKILL."""
        return [line for p in self.lives for line in p.lines
                if (" ERROR " in line or "panicked" in line) and "managed valkey-server exited" not in line]


def run_client(port, args):
    out = subprocess.run([SOAK, "--port", str(port), *args], capture_output=True, text=True)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not last.startswith("soak "):
        sys.exit("soak client failed: %s" % (out.stdout + out.stderr)[-2000:])
    return dict(kv.split("=") for kv in last.split()[1:]), out


def counter(m, name):
    return m.get("walrus_" + name, 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--load", type=float, default=0.7, help="fraction of the measured maximum offered")
    ap.add_argument("--keys", type=int, default=2000, help="keys per client")
    ap.add_argument("--data-size", type=int, default=256)
    ap.add_argument("--window", type=int, default=10, help="seconds per sample")
    ap.add_argument("--checkpoint-every", type=int, default=180, help="seconds of writes per half ring")
    ap.add_argument("--calibrate-seconds", type=int, default=30)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", help="markdown report (default: stdout)")
    ap.add_argument("--plot", help="PNG of the run (matplotlib)")
    ap.add_argument("--csv", help="the samples, one line per window")
    o = ap.parse_args()
    if not o.no_build:
        subprocess.run(["cargo", "build", "--release", "--bin", "walrus", "--example", "soak"], cwd=ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="walrus-soak-")
    try:
        report = soak(o, tmp)
    finally:
        for p in list(LIVE):
            p.stop()
    if o.out:
        with open(o.out, "w") as f:
            f.write(report)
    else:
        print(report)


def soak(o, tmp):
    common = ["--clients", str(o.clients), "--keys", str(o.keys), "--data-size", str(o.data_size),
              "--window", str(o.window)]
    # 1. The maximum, closed loop; then how fast the offered load advances through the ring
    #    (group commits are smaller at a lower rate, so their padding costs more per command).
    w = Walrus(tmp, "calibrate", 64 << 20)
    top, _ = run_client(w.port, common + ["--rate", "0", "--seconds", str(o.calibrate_seconds)])
    rate = float(top["ops_per_sec"]) * o.load
    before = w.metrics_now()
    run_client(w.port, common + ["--rate", "%.1f" % rate, "--seconds", str(o.calibrate_seconds)])
    after = w.metrics_now()
    w.proc.stop()
    ring_per_second = (counter(after, RING) - counter(before, RING)) / o.calibrate_seconds
    # 2. The ring: half of it (checkpoint.ring_fill_trigger) per --checkpoint-every seconds.
    ring = 2 * ring_per_second * o.checkpoint_every
    segment = max(1 << 20, int(ring / SEGMENTS) // 4096 * 4096)
    print("soak: maximum %.0f ops/s; offering %.0f ops/s, %.1f MiB/s of ring; ring %d x %d MiB"
          % (float(top["ops_per_sec"]), rate, ring_per_second / 2**20, SEGMENTS, segment >> 20), flush=True)
    # 3. The run.
    w = Walrus(tmp, "run", segment)
    client = subprocess.Popen([SOAK, "--port", str(w.port), *common, "--rate", "%.1f" % rate,
                               "--seconds", str(o.seconds), "--out", os.path.join(tmp, "client.csv")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    events = []  # (seconds, what)
    samples = []
    totals = {"checkpoints_total": 0.0, RING: 0.0}
    last = {k: 0.0 for k in totals}
    plan = [(o.seconds / 3, "valkey"), (2 * o.seconds / 3, "walrus")]
    while client.poll() is None:
        now = time.monotonic() - t0
        if plan and now >= plan[0][0]:
            what = plan.pop(0)[1]
            if what == "valkey":
                pid = valkey_pid(w.proc.p.pid)
                os.kill(pid, signal.SIGKILL)
                events.append((now, "Valkey SIGKILL"))
            else:
                events.append((now, "walrus SIGTERM + restart"))
                w.restart()
                last = {k: 0.0 for k in totals}  # counters start again
        m = w.metrics_now()
        for k in totals if m else ():
            v = counter(m, k)
            totals[k] += max(0.0, v - last[k])
            last[k] = v
        vpid = valkey_pid(w.proc.p.pid)
        samples.append({
            "t": now,
            "walrus_rss_mib": rss_mib(w.proc.p.pid),
            "walrus_fds": fds(w.proc.p.pid),
            "valkey_rss_mib": rss_mib(vpid) if vpid else float("nan"),
            "checkpoints": totals["checkpoints_total"],
            "journal_bytes": totals[RING],
            "ring_fill": counter(m, "journal_ring_fill_ratio"),
            "held_bytes": counter(m, "held_bytes"),
        })
        # Sampled on the window's beat; the client's schedule does not depend on this loop.
        deadline = t0 + (len(samples)) * o.window
        while client.poll() is None and time.monotonic() < deadline:
            try:
                client.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    out, err = client.communicate()
    last_line = out.strip().splitlines()[-1] if out.strip() else ""
    if not last_line.startswith("soak "):
        sys.exit("soak client failed: %s" % (out + err)[-2000:])
    result = dict(kv.split("=") for kv in last_line.split()[1:])
    with open(os.path.join(tmp, "client.csv")) as f:
        header = f.readline().strip().split(",")
        windows = [dict(zip(header, line.rstrip("\n").split(",", len(header) - 1))) for line in f]
    errors_logged = w.errors()
    ring_bytes = SEGMENTS * segment
    if o.csv:
        write_csv(o.csv, samples, windows)
    if o.plot:
        plot(o.plot, samples, windows, events, o)
    report = render(o, top, rate, segment, ring_bytes, result, samples, windows, events, totals, errors_logged,
                    err)
    failed = int(result["violations"]) > 0 or errors_logged
    if failed:
        print(report)
        sys.exit("soak: FAILED (violations or logged errors)")
    return report


def write_csv(path, samples, windows):
    with open(path, "w") as f:
        f.write("t,walrus_rss_mib,walrus_fds,valkey_rss_mib,checkpoints,journal_bytes,ring_fill,held_bytes\n")
        for s in samples:
            f.write("%.1f,%.1f,%d,%.1f,%d,%d,%.3f,%d\n" % (s["t"], s["walrus_rss_mib"], s["walrus_fds"],
                                                          s["valkey_rss_mib"], s["checkpoints"], s["journal_bytes"],
                                                          s["ring_fill"], s["held_bytes"]))


def steady(values, times, events, seconds, margin=60):
    """The values sampled away from the restarts (more than `margin` s after one) and after
    the first minute."""
    out = []
    for v, t in zip(values, times):
        if t < 60 or t > seconds:
            continue
        if any(0 <= t - e < margin for e, _ in events):
            continue
        out.append(v)
    return out


def median(xs):
    xs = sorted(x for x in xs if x == x)
    return xs[len(xs) // 2] if xs else float("nan")


def thirds(samples_t, values, seconds):
    """Median of each third of the run."""
    out = []
    for i in range(3):
        lo, hi = i * seconds / 3, (i + 1) * seconds / 3
        out.append(median([v for t, v in zip(samples_t, values) if lo <= t < hi]))
    return out


def render(o, top, rate, segment, ring_bytes, result, samples, windows, events, totals, errors_logged, stderr):
    wt = [float(w["t"]) for w in windows]
    p99 = [float(w["p99_ms"]) for w in windows]
    p50 = [float(w["p50_ms"]) for w in windows]
    st = [s["t"] for s in samples]
    rss = [s["walrus_rss_mib"] for s in samples]
    vrss = [s["valkey_rss_mib"] for s in samples]
    fd = [s["walrus_fds"] for s in samples]
    # Steady state: after the first minute, away from the two restarts, in each third.
    steady_p99 = steady(p99, wt, events, o.seconds)
    lines = []
    add = lines.append
    add("| | |\n|---|---|")
    add("| measured maximum (closed loop, %d clients) | %.0f ops/s |" % (o.clients, float(top["ops_per_sec"])))
    add("| offered (%.0f%%) / achieved | %.0f / %s ops/s |" % (o.load * 100, rate, result["ops_per_sec"]))
    add("| commands answered | %s |" % result["ops"])
    add("| errors (all in the restart windows below) | %s |" % result["errors"])
    add("| violations (stale or lost reads, lost acknowledged writes, bad INCR) | %s |" % result["violations"])
    add("| keys checked at the end | %s |" % result["checked_keys"])
    add("| checkpoints taken | %d |" % totals["checkpoints_total"])
    add("| journal ring advanced / ring size | %.0f MiB / %d MiB: the ring wrapped %.1f times |"
        % (totals[RING] / 2**20, ring_bytes >> 20, totals[RING] / ring_bytes))
    add("| errors logged by walrus (besides the managed Valkey's exit) | %d |" % len(errors_logged))
    add("")
    add("Each third of the run (median of its samples; p99 of the %d-second windows away from the restarts):\n" % o.window)
    add("| | first third | second third | last third |\n|---|---|---|---|")
    def row(name, vals, fmt):
        add("| %s | %s |" % (name, " | ".join(fmt % v for v in vals)))
    row("p50 latency, ms", thirds(wt, p50, o.seconds), "%.3f")
    steady_t = [t for t in wt if t >= 60 and not any(0 <= t - e < 60 for e, _ in events)]
    row("p99 latency, ms (steady)", thirds(steady_t, steady_p99, o.seconds), "%.3f")
    row("walrus RSS, MiB", thirds(st, rss, o.seconds), "%.1f")
    row("Valkey RSS, MiB", thirds(st, vrss, o.seconds), "%.1f")
    row("walrus open files", thirds(st, fd, o.seconds), "%d")
    add("")
    add("Windows with errors:\n")
    add("| window (s) | errors | kinds |\n|---|---|---|")
    for w in windows:
        if int(w["errors"]) > 0:
            add("| %s | %s | %s |" % (w["t"], w["errors"], w["error_kinds"]))
    add("")
    add("Events: " + "; ".join("%s at %.0f s" % (what, t) for t, what in events))
    if errors_logged:
        add("\nwalrus logged:\n\n```\n%s\n```" % "\n".join(errors_logged[:20]))
    if stderr.strip():
        add("\nThe client said:\n\n```\n%s\n```" % stderr.strip()[-2000:])
    return "\n".join(lines) + "\n"


def plot(path, samples, windows, events, o):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    wt = [float(w["t"]) / 60 for w in windows]
    ax[0].plot(wt, [float(w["p99_ms"]) for w in windows], label="p99")
    ax[0].plot(wt, [float(w["p50_ms"]) for w in windows], label="p50")
    ax[0].set_yscale("log")
    ax[0].set_ylabel("latency, ms (log)")
    ax[0].legend(loc="upper right")
    ax[1].plot(wt, [int(w["ops"]) / o.window for w in windows], label="answered")
    ax[1].bar(wt, [int(w["errors"]) / o.window for w in windows], width=o.window / 60, color="red", label="errors")
    ax[1].set_ylabel("commands/s")
    ax[1].legend(loc="lower right")
    st = [s["t"] / 60 for s in samples]
    ax[2].plot(st, [s["walrus_rss_mib"] for s in samples], label="walrus")
    ax[2].plot(st, [s["valkey_rss_mib"] for s in samples], label="Valkey")
    ax[2].set_ylabel("RSS, MiB")
    ax[2].legend(loc="upper left")
    ax[3].plot(st, [s["walrus_fds"] for s in samples], label="walrus open files")
    ax3b = ax[3].twinx()
    ax3b.step(st, [s["checkpoints"] for s in samples], color="green", label="checkpoints")
    ax[3].set_ylabel("open files")
    ax3b.set_ylabel("checkpoints")
    ax[3].set_xlabel("minutes")
    for a in ax:
        for t, what in events:
            a.axvline(t / 60, color="grey", linestyle="--")
    ax[0].set_title("walrus soak: %.0f%% of the maximum, %d clients; dashed: %s"
                    % (o.load * 100, o.clients, ", ".join(what for _, what in events)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()
