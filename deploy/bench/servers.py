"""The servers a setup starts: Valkey (alone, or configured for walrus's replica link),
walrus in external mode and in managed mode, the proxies walrus is compared with (twemproxy,
HAProxy) and SeaweedFS (the archive's S3 store); walrus's /metrics and /status."""
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request

from .procs import WALRUS, Proc, free_port, sbin, valkey_binary, wait_serving
from .resp import info

# What walrus's replica link wants from an external Valkey (see docs/configuration.md, "Valkey settings").
WALRUS_VALKEY_SETTINGS = ["--repl-backlog-size", "256mb", "--repl-backlog-ttl", "0",
                          "--client-output-buffer-limit", "replica 0 0 0",
                          "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]

# --walrus-config: more TOML for every walrus started (both builds), after its own.
WALRUS_CONFIG = ""


def start_valkey(tmp, extra=()):
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp)
    args = [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--logfile", "", "--dir", d, *extra]
    return Proc(args, "Ready to accept connections"), port


def start_plain_valkey(args, timeout=900):
    """Valkey with nothing but `args` (its directory, persistence) set."""
    port = free_port()
    return Proc([valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--logfile", "", *args],
                "Ready to accept connections", timeout=timeout), port


def listening_port(proc):
    """The client port in walrus's "walrus listening on" line."""
    return int(proc.ready_line.split("walrus listening on ")[1].split(",")[0].rsplit(":", 1)[1])


def start_walrus(tmp, upstream_port, durable, binary=None, config="", metrics=""):
    """walrus in external mode in front of the Valkey at upstream_port (or at a Unix socket,
    given as "unix:/path"); `config`: more of its TOML (other sections than [durability]),
    `metrics`: its /metrics address ("" for none)."""
    d = tempfile.mkdtemp(dir=tmp)
    conf = os.path.join(d, "walrus.toml")
    with open(conf, "w") as f:
        f.write("[durability]\nenabled = %s\n%s\n%s" % ("true" if durable else "false", config, WALRUS_CONFIG))
    args = [binary or WALRUS, "serve", "--config", conf, "--listen", "127.0.0.1:0", "--metrics-listen", metrics,
            "--upstream", upstream_port if isinstance(upstream_port, str) else "127.0.0.1:%d" % upstream_port,
            "--data-dir", os.path.join(d, "data")]
    # walrus::cli too: a --baseline build from before src/daemon logs its ready line there.
    env = dict(os.environ, RUST_LOG="warn,walrus::daemon=info,walrus::cli=info,walrus::replication=info")
    # With the journal on, walrus listens once its replica link is attached.
    p = Proc(args, "walrus listening on ", env=env)
    return p, listening_port(p)



def durable_walruses(tmp, baseline=None):
    """walrus durable in front of a Valkey of its own, and with `baseline` (another walrus
    binary) that build the same way: [(name, walrus's port, its Valkey's port)]."""
    out = []
    for name, binary in [("walrus durable", None), ("baseline walrus durable", baseline)]:
        if name.startswith("baseline") and not binary:
            continue
        _, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
        _, wport = start_walrus(tmp, vport, durable=True, binary=binary)
        out.append((name, wport, vport))
    return out

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
        self.binary = WALRUS
        self.args = [self.binary, "serve", "--config", conf, "--data-dir", os.path.join(self.dir, "data")]
        self.env = dict(os.environ, RUST_LOG="info")
        self.proc = None

    def start(self, timeout):
        self.proc = Proc(self.args, "walrus listening on ", env=self.env, timeout=timeout)
        self.port = listening_port(self.proc)
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


def scrape(address):
    """walrus's /metrics: {sample name with its labels: value}."""
    with urllib.request.urlopen("http://%s/metrics" % address, timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def await_idle(ports, timeout=900):
    """Waits until none of the servers at `ports` (Valkeys, or walruses: through walrus, INFO
    persistence is its own, a checkpoint showing as a background save) runs a background save
    or an AOF rewrite: what one setup's run started must not run on into the next one's."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            pers = info(port, "persistence")
            if pers.get("rdb_bgsave_in_progress", "0") == "0" and pers.get("aof_rewrite_in_progress", "0") == "0":
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the server on port %d is still saving after %ds" % (port, timeout))
            time.sleep(0.1)


def status(metrics):
    """walrus's /status, decoded."""
    with urllib.request.urlopen("http://%s/status" % metrics, timeout=10) as r:
        return json.loads(r.read())


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


SEAWEED_ACCESS_KEY, SEAWEED_SECRET_KEY = "walrusBenchKey", "walrusBenchSecret"


def weed_binary():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ["HOME"], ".cache")
    path = os.environ.get("WALRUS_WEED") or os.path.join(cache, "walrus", "bin", "weed")
    if not os.path.exists(path):
        sys.exit("%s is missing: run deploy/setup.sh (it builds SeaweedFS)" % path)
    return path


def start_seaweed(tmp):
    """A SeaweedFS server (master, volume, filer, S3) on free loopback ports, with a bucket
    "walrus" its S3 identity (SEAWEED_ACCESS_KEY, SEAWEED_SECRET_KEY) may use; returns its
    S3 endpoint."""
    d = tempfile.mkdtemp(dir=tmp, prefix="seaweed-")
    os.makedirs(os.path.join(d, "data"))
    with open(os.path.join(d, "s3.json"), "w") as f:
        json.dump({"identities": [{"name": "walrus", "credentials": [{"accessKey": SEAWEED_ACCESS_KEY,
                                                                      "secretKey": SEAWEED_SECRET_KEY}],
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
