"""bench.py --suite archive: what the archive (docs/archive.md) costs and gives, against a
SeaweedFS on this machine (the S3 store of the tests; deploy/setup.sh builds it):

- durable SETs (1 KiB, 50 clients; 180 KiB, 20 clients) through walrus without an archive,
  with one (durability.ack = "local"), and with durability.ack = "archive", every setup in
  the same rounds: ops/s, p50, p99, the ratio to no archive (goal: at least 0.95x with the
  archive on), and the archive's largest lag seen during the run;
- bytes and requests sent to the store per byte of the stream (the journal's payload);
- a restart from the local disk against a new node bootstrapped from the archive, for
  --dataset-mb of data: seconds until walrus serves.

    deploy/bench.py --suite archive                     # ~1 GB restore, 3 rounds
    deploy/bench.py --suite archive --rounds 1 --scale 0.02 --dataset-mb 16   # a quick check

The store runs on the same two cores as everything else and answers in microseconds: the
ratios show what walrus spends on the archive, not a real store's latency.
"""
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import bench
from bench import (Proc, free_port, start_valkey, start_walrus, redis_benchmark, scrape, fill,
                   dbsize_check, WalrusManaged, WALRUS_VALKEY_SETTINGS, SET_BYTES)

ACCESS_KEY, SECRET_KEY = "walrusBenchKey", "walrusBenchSecret"

WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("SET 180 KiB, 20 clients", ["-t", "set", "-d", str(180 << 10), "-c", "20", "-r", "1000"], 6000),
]


def weed_binary():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ["HOME"], ".cache")
    path = os.environ.get("WALRUS_WEED") or os.path.join(cache, "walrus", "bin", "weed")
    if not os.path.exists(path):
        sys.exit("%s is missing: run deploy/setup.sh (it builds SeaweedFS)" % path)
    return path


def start_seaweed(tmp):
    """A SeaweedFS server (master, volume, filer, S3) on free loopback ports, with a bucket
    "walrus"; returns its S3 endpoint."""
    d = tempfile.mkdtemp(dir=tmp, prefix="seaweed-")
    os.makedirs(os.path.join(d, "data"))
    with open(os.path.join(d, "s3.json"), "w") as f:
        json.dump({"identities": [{"name": "walrus", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                                   "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
    p = [free_port() for _ in range(8)]
    args = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
            "-dir=%s" % os.path.join(d, "data"), "-master.port=%d" % p[0], "-master.port.grpc=%d" % p[1],
            "-volume.port=%d" % p[2], "-volume.port.grpc=%d" % p[3], "-master.volumeSizeLimitMB=1024",
            # SeaweedFS's default of 8 volumes (8 GiB here) fills in the third round: the store
            # then refuses every upload, and with ack = "archive" every write.
            "-volume.max=64",
            "-filer", "-filer.port=%d" % p[4], "-filer.port.grpc=%d" % p[5],
            "-s3", "-s3.port=%d" % p[6], "-s3.port.grpc=%d" % p[7], "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.config=%s" % os.path.join(d, "s3.json")]
    weed = Proc(args, "Start Seaweed S3 API Server", timeout=120)
    deadline = time.monotonic() + 120
    while weed.when("Volume server start with seed master") is None:
        if time.monotonic() > deadline:
            sys.exit("SeaweedFS: no volume server\n" + "\n".join(weed.lines[-20:]))
        time.sleep(0.1)
    # The bucket: a directory of the filer's /buckets (the filer may need a moment after the
    # volume server registers).
    url = "http://127.0.0.1:%d/buckets/walrus/?op=mkdir" % p[4]
    while True:
        try:
            req = urllib.request.Request(url, method="POST")
            urllib.request.urlopen(req, timeout=30).read()
            break
        except urllib.error.HTTPError as e:
            if time.monotonic() > deadline:
                sys.exit("SeaweedFS: cannot make the bucket: %s" % e)
            time.sleep(0.2)
    return weed, "http://127.0.0.1:%d" % p[6]


def archive_toml(endpoint, prefix):
    return '[archive]\nurl = "s3://walrus/%s"\nendpoint = "%s"\n' % (prefix, endpoint)


def status(metrics):
    with urllib.request.urlopen("http://%s/status" % metrics, timeout=10) as r:
        return json.loads(r.read())


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
    setups = []
    for name, config in [("no archive", ""), ("archive, ack local", archive_toml(endpoint, "local")),
                         ("archive, ack archive", 'ack = "archive"\n' + archive_toml(endpoint, "ack"))]:
        v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
        metrics = "127.0.0.1:%d" % free_port()
        w, wport = start_walrus(tmp, vport, durable=True, config=config, metrics=metrics)
        setups.append((name, wport, metrics))
    results = {(w, s): [] for w, _, _ in WORKLOADS for s, _, _ in setups}
    for r in range(opts.rounds):
        for wname, args, n in WORKLOADS:
            for sname, port, metrics in setups:
                probe = LagProbe(metrics) if sname != "no archive" else None
                row = redis_benchmark(port, args, max(1, int(n * opts.scale)))
                results[(wname, sname)].append((*row, probe.stop() if probe else 0.0))
        print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    print("\narchive suite, %d rounds, medians; ratio: median of per-round ops/s against no archive\n" % opts.rounds)
    print("| workload | setup | ops/s | ratio | p50 ms | p99 ms | largest archive lag s |")
    print("|---|---|---|---|---|---|---|")
    med = lambda rows, i: statistics.median(x[i] for x in rows)
    for wname, _, _ in WORKLOADS:
        base = results[(wname, "no archive")]
        for sname, _, _ in setups:
            rows = results[(wname, sname)]
            ratio = statistics.median(b[0] / a[0] for a, b in zip(base, rows))
            print("| %s | %s | %.0f | %.2fx | %.3f | %.3f | %s |" % (
                wname, sname, med(rows, 0), ratio, med(rows, 1), med(rows, 2),
                "" if sname == "no archive" else "%.2f" % max(x[4] for x in rows)))
    print("\n| setup | stream bytes archived | bytes sent per stream byte | requests per MiB of stream | requests |")
    print("|---|---|---|---|---|")
    for sname, _, metrics in setups[1:]:
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
    for r in range(opts.rounds):
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
        print("restore round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    print("\n| %d MiB of SETs | seconds until walrus serves (median of %d) |" % (opts.dataset_mb, opts.rounds))
    print("|---|---|")
    print("| restarted on its own disk | %.2f |" % statistics.median(local))
    print("| new node bootstrapped from the archive | %.2f |" % statistics.median(archive))


def archive_suite(opts, tmp):
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    weed, endpoint = start_seaweed(tmp)
    throughput(opts, tmp, endpoint)
    restore(opts, tmp, endpoint)
