"""deploy/bench.py --suite archive: what the archive (docs/archive.md) costs and gives, against a
SeaweedFS on this machine (the S3 store of the tests; deploy/setup.sh builds it):

- durable SETs (1 KiB, 50 clients; 180 KiB, 20 clients) through walrus without an archive,
  with one (durability.ack = "local"), and with durability.ack = "archive", every setup in
  the same rounds: ops/s, p50, p99, the ratio to no archive (goal: at least 0.95x with the
  archive on), the archive's largest lag seen during the run, and how many checkpoints fell
  inside it; each run starts once every setup is idle (no checkpoint running, its archive
  caught up), so that no setup pays for what the one before it left running;
- the same with the archive in a directory on tmpfs (file://, ack local): what walrus itself
  spends on archiving (checksums, the objects' writes, the manifest), without a store's
  CPU or a second copy on the same disk;
- bytes and requests sent to the store per byte of the stream (the journal's payload);
- a restart from the local disk against a new node bootstrapped from the archive, for
  --dataset-mb of data: seconds until walrus serves.

    deploy/bench.py --suite archive                     # ~1 GB restore, 3 rounds
    deploy/bench.py --suite archive --rounds 1 --scale 0.02 --dataset-mb 16   # a quick check

The store runs on the same two cores as everything else and answers in microseconds: the
ratios show what walrus spends on the archive, not a real store's latency.
"""
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from ..dataset import SET_BYTES, dbsize_check, fill
from ..procs import cpu_ticks, cpu_us_per_request, free_port
from ..runs import median_of, median_ratio, redis_benchmark, rounds, run_rounds, scaled
from ..servers import (SEAWEED_ACCESS_KEY, SEAWEED_SECRET_KEY, WALRUS_VALKEY_SETTINGS, WalrusManaged, await_idle,
                       scrape, start_seaweed, start_valkey, start_walrus, status)

WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    # 2.2 GB a run: several checkpoints of the default 1 GiB ring (four to six on this
    # machine), so that how many fall inside one run does not decide its figure.
    ("SET 180 KiB, 20 clients", ["-t", "set", "-d", str(180 << 10), "-c", "20", "-r", "1000"], 12000),
]


def archive_toml(endpoint, prefix):
    return '[archive]\nurl = "s3://walrus/%s"\nendpoint = "%s"\n' % (prefix, endpoint)


def await_archived(metrics, timeout=900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status(metrics)
        if s.get("archive_lag_bytes") == 0 and s.get("archive_lag_seconds") == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("the archive did not catch up: %s" % status(metrics))


class LagProbe:
    """The largest walrus_archive_lag_seconds seen while it runs (sampled every 100 ms)."""

    def __init__(self, metrics):
        self.metrics, self.worst, self.done = metrics, 0.0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.1):
            self.worst = max(self.worst, scrape(self.metrics).get("walrus_archive_lag_seconds", 0.0))

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.worst


def throughput(opts, tmp, endpoint):
    shm = tempfile.mkdtemp(prefix="walrus-archive-bench-", dir="/dev/shm")
    try:
        return throughput_to(opts, tmp, endpoint, shm)
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def throughput_to(opts, tmp, endpoint, shm):
    setups = []
    # One directory each, beside each other: an archive's directory is its alone.
    def tmpfs(name):
        os.makedirs(os.path.join(shm, name))
        return '[archive]\nurl = "file://%s"\n' % os.path.join(shm, name)
    chosen = [("no archive", "", None), ("archive, ack local", archive_toml(endpoint, "local"), None),
              ("archive on tmpfs (file://), ack local", tmpfs("current"), None),
              ("archive, ack archive", 'ack = "archive"\n' + archive_toml(endpoint, "ack"), None)]
    if opts.baseline:
        # The archive's cost in an older build, against the same "no archive" setup.
        chosen += [("baseline: archive, ack local", archive_toml(endpoint, "base"), opts.baseline),
                   ("baseline: archive on tmpfs, ack local", tmpfs("baseline"), opts.baseline),
                   ("baseline: archive, ack archive", 'ack = "archive"\n' + archive_toml(endpoint, "base-ack"),
                    opts.baseline)]
    for name, config, binary in chosen:
        v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
        metrics = "127.0.0.1:%d" % free_port()
        w, wport = start_walrus(tmp, vport, durable=True, config=config, metrics=metrics, binary=binary)
        setups.append((name, wport, metrics, w, v))

    def one(w, setup):
        _, args, n = w
        sname, port, metrics, proc, valkey = setup
        # What one setup's run started (a checkpoint, the archive's catching up) must not
        # run on into the next one's.
        await_idle([other[1] for other in setups])
        for other in setups[1:]:
            await_archived(other[2])
        probe = LagProbe(metrics) if sname != "no archive" else None
        requests = scaled(n, opts.scale)
        ticks = cpu_ticks(proc)
        checkpoints = scrape(metrics).get("walrus_checkpoints_total", 0.0)
        try:
            row = redis_benchmark(port, args, requests)
        except RuntimeError:
            print("%s failed; the last lines of its walrus, then of its Valkey:\n%s\n%s" % (
                sname, "\n".join(proc.lines[-15:]), "\n".join(valkey.lines[-15:])), file=sys.stderr)
            raise
        lag = probe.stop() if probe else 0.0
        return (*row, lag, cpu_us_per_request(proc, ticks, requests),
                scrape(metrics).get("walrus_checkpoints_total", 0.0) - checkpoints)

    results = run_rounds(opts.rounds, WORKLOADS, setups, one)
    print("\narchive suite, %d rounds, medians; ratio: median of per-round ops/s against no archive\n" % opts.rounds)
    print("| workload | setup | ops/s | ratio | p50 ms | p99 ms | largest archive lag s | walrus CPU µs per SET "
          "| checkpoints per run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wname, _, _ in WORKLOADS:
        base = results[(wname, "no archive")]
        for sname, *_ in setups:
            rows = results[(wname, sname)]
            print("| %s | %s | %.0f | %.2fx | %.3f | %.3f | %s | %.1f | %g |" % (
                wname, sname, median_of(rows, 0), median_ratio(rows, base, 0), median_of(rows, 1), median_of(rows, 2),
                "" if sname == "no archive" else "%.2f" % max(x[4] for x in rows), median_of(rows, 5),
                median_of(rows, 6)))
    print("\n| setup | stream bytes archived | bytes sent per stream byte | requests per MiB of stream | requests |")
    print("|---|---|---|---|---|")
    for sname, _, metrics, *_ in setups[1:]:
        await_archived(metrics)
        m = scrape(metrics)
        stream = m.get("walrus_archive_journal_bytes_total", 0.0)
        sent = m.get("walrus_archive_sent_bytes_total", 0.0)
        requests = sum(v for k, v in m.items() if k.startswith("walrus_archive_requests_total"))
        print("| %s | %.0f | %.2f | %.2f | %.0f |" % (
            sname, stream, sent / stream if stream else float("nan"),
            requests / (stream / (1 << 20)) if stream else float("nan"), requests))


def restore(opts, tmp, endpoint):
    """Seconds until walrus serves: restarted on its own disk, and a new node bootstrapped
    from the archive, for the same --dataset-mb."""
    n = max(1, opts.dataset_mb * (1 << 20) // SET_BYTES)
    segment = max(1 << 20, -(-int(n * SET_BYTES * 1.2 / 8) // (1 << 20)) * (1 << 20))
    w = WalrusManaged(tmp, segment)
    conf = w.args[w.args.index("--config") + 1]
    with open(conf, "a") as f:
        f.write(archive_toml(endpoint, "restore") + "bootstrap = true\n")
    w.start(900)
    fill(w.port, 0, n)
    w.settle()
    await_archived(w.metrics)
    dbsize_check(w.port, n, "walrus after the fill")
    w.stop()
    local, archive = [], []
    for _ in rounds(opts.rounds, "restore "):
        t = time.monotonic()
        w.start(900)
        local.append(time.monotonic() - t)
        dbsize_check(w.port, n, "walrus restarted")
        w.stop()
        data = w.args[w.args.index("--data-dir") + 1]
        moved = data + ".local"
        os.rename(data, moved)
        t = time.monotonic()
        w.start(900)
        archive.append(time.monotonic() - t)
        dbsize_check(w.port, n, "walrus bootstrapped")
        w.stop()
        # The bootstrapped node took the archive over: it is the node from here on.
        shutil.rmtree(moved)
    print("\n| %d MiB of SETs | seconds until walrus serves (median of %d) |" % (opts.dataset_mb, opts.rounds))
    print("|---|---|")
    print("| restarted on its own disk | %.2f |" % statistics.median(local))
    print("| new node bootstrapped from the archive | %.2f |" % statistics.median(archive))


def run(opts, tmp):
    os.environ.update(AWS_ACCESS_KEY_ID=SEAWEED_ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SEAWEED_SECRET_KEY)
    _, endpoint = start_seaweed(tmp)
    throughput(opts, tmp, endpoint)
    restore(opts, tmp, endpoint)
