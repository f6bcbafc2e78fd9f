#!/usr/bin/env python3
"""Writes the seeds of the fuzz targets that come from Valkey itself into fuzz/seeds/.

Starts its own valkey-server (VALKEY_SERVER, else the one deploy/setup.sh installs, as
walrus finds it) on a free port and records what it really sends: RESP2 and RESP3 replies
of every type (DEBUG PROTOCOL), a replication stream (transactions, a script's effects,
PUBLISH, SELECT, PING, REPLCONF GETACK), full resynchronizations in both RDB forms, a
COMMAND INFO reply, and INFO, ROLE and PSYNC answers. Client requests are written by hand
(RESP and inline, as redis-cli and telnet users send them), configurations are the shipped
config.toml and variants of it. The seeds written by walrus's own code (journal records,
manifests) come from tests/it/fuzz_seeds.rs (`WALRUS_WRITE_SEEDS=1`).

Every seed starts with the parameter bytes its target reads first (fuzz/harness/<target>.rs);
the name says what the rest is.

    python3 fuzz/capture_seeds.py          # from the repository root
"""

import os
import shutil
import sys
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
from bench import valkey_binary  # noqa: E402  (the same lookup as the benchmarks')
SEEDS = os.path.join(ROOT, "fuzz", "seeds")

# Parameter bytes (see each harness): limits/sizes, then the seed of the reads.
DEFAULTS_ONE_READ = b"\x00\x00"
DEFAULTS_SMALL_READS = b"\x00\x07"
SMALL_LIMITS_SMALL_READS = b"\xff\x2a"


def enc(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.settimeout(0.3)

    def drain(self, wait=0.15):
        time.sleep(wait)
        out = b""
        try:
            while True:
                d = self.s.recv(1 << 20)
                if not d:
                    break
                out += d
        except socket.timeout:
            pass
        return out

    def raw(self, data, wait=0.15):
        self.s.sendall(data)
        return self.drain(wait)

    def cmd(self, *args, wait=0.15):
        return self.raw(enc(*args), wait)


def write(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica(port, capa):
    """A replica connection after PSYNC ? -1: what the primary sent, from +FULLRESYNC on."""
    r = Conn(port)
    r.cmd("PING")
    r.cmd("REPLCONF", "listening-port", "0")
    r.cmd("REPLCONF", *capa)
    return r, r.raw(enc("PSYNC", "?", "-1"), wait=1.5)


def replies(port):
    c = Conn(port)
    c.cmd("FLUSHALL")
    resp2 = [
        ("set", c.cmd("SET", "k", "v")),
        ("get", c.cmd("GET", "k")),
        ("get-missing", c.cmd("GET", "missing")),
        ("mget-with-nulls", c.cmd("MGET", "k", "missing", "k")),
        ("incr-error", c.cmd("INCR", "k")),
        ("rpush", c.cmd("RPUSH", "l", "a", "b", "")),
        ("lrange", c.cmd("LRANGE", "l", "0", "-1")),
        ("hset", c.cmd("HSET", "h", "f", "1", "g", "2")),
        ("hgetall", c.cmd("HGETALL", "h")),
        ("xadd", c.cmd("XADD", "s", "1-1", "f", "v")),
        ("xrange-nested", c.cmd("XRANGE", "s", "-", "+")),
        ("multi-exec", c.raw(enc("MULTI") + enc("SET", "a", "1") + enc("LPOP", "none") + enc("EXEC"))),
        ("blpop-timeout-null-array", c.cmd("BLPOP", "nothing", "0.01", wait=0.2)),
    ]
    for name, r in resp2:
        write("reply", f"resp2-{name}", DEFAULTS_ONE_READ + r)
    all2 = b"".join(r for _, r in resp2)
    write("reply", "resp2-pipeline-small-reads", DEFAULTS_SMALL_READS + all2)
    write("reply", "resp2-pipeline-small-limits", SMALL_LIMITS_SMALL_READS + all2)
    write("reply", "resp3-hello", DEFAULTS_ONE_READ + c.cmd("HELLO", "3"))
    resp3 = []
    for t in ["string", "integer", "double", "bignum", "null", "array", "set", "map",
              "attrib", "push", "verbatim", "true", "false"]:
        r = c.cmd("DEBUG", "PROTOCOL", t)
        resp3.append(r)
        write("reply", f"resp3-{t}", DEFAULTS_ONE_READ + r)
    resp3.append(c.cmd("HGETALL", "h"))
    resp3.append(c.cmd("CLIENT", "INFO"))
    resp3.append(c.cmd("ZADD", "z", "1.5", "m"))
    resp3.append(c.cmd("ZRANGE", "z", "0", "-1", "WITHSCORES"))
    resp3.append(c.cmd("CLIENT", "TRACKING", "on"))
    resp3.append(c.cmd("GET", "k"))
    resp3.append(c.cmd("SET", "k", "changed"))  # an invalidation push comes with the reply
    write("reply", "resp3-all-small-reads", DEFAULTS_SMALL_READS + b"".join(resp3))
    write("reply", "resp3-all-small-limits", SMALL_LIMITS_SMALL_READS + b"".join(resp3))


def stream_and_rdb(port):
    c = Conn(port)
    c.cmd("FLUSHALL")
    c.cmd("SET", "greeting", "hello")
    c.cmd("HSET", "user:1", "name", "ada", "born", "1815")
    c.cmd("RPUSH", "list", "a", "b", "c")
    c.cmd("ZADD", "z", "1", "one", "2", "two")
    c.cmd("CONFIG", "SET", "repl-ping-replica-period", "1")
    # Diskless, announced with capa eof: `$EOF:<mark>`; without it, `$<len>`.
    _, marked = replica(port, ["capa", "eof", "capa", "psync2"])
    r, sized = replica(port, ["capa", "psync2"])
    c.cmd("SET", "k", "v")
    c.cmd("INCR", "counter")
    c.raw(enc("MULTI") + enc("INCR", "counter") + enc("LPUSH", "list", "z") + enc("EXEC"))
    c.cmd("EVAL", "redis.call('SET','a','1'); redis.call('DEL','greeting'); return 1", "0")
    c.cmd("PUBLISH", "news", "hello subscribers")
    c.cmd("SELECT", "1")
    c.cmd("SET", "k1", "in db 1")
    c.cmd("SELECT", "0")
    c.cmd("EXPIRE", "k", "100")
    c.cmd("HSET", "user:1", "born", "1816")
    r.s.sendall(enc("REPLCONF", "ACK", "0"))
    c.cmd("WAIT", "1", "200", wait=0.4)  # makes the primary send REPLCONF GETACK
    stream = r.drain(1.3)
    for name, full in [("eof-mark", marked), ("sized", sized)]:
        after_line = full[full.index(b"\n") + 1:]  # what follows +FULLRESYNC
        write("rdb", f"{name}", DEFAULTS_ONE_READ + after_line)
        write("rdb", f"{name}-small-reads-then-stream", DEFAULTS_SMALL_READS + after_line + stream[:200])
        write("rdb", f"{name}-keepalives", DEFAULTS_SMALL_READS + b"\n\n\n" + after_line)
    write("rdb", "refused", DEFAULTS_ONE_READ + b"-NOMASTERLINK Can't SYNC while not connected with my master\r\n")
    # Stream: entry sizes and limits, then the seed of the reads.
    write("stream", "real-stream", b"\x00\x00" + DEFAULTS_ONE_READ[1:] + stream)
    write("stream", "real-stream-small-entries", b"\x08\x00\x07" + stream)
    write("stream", "real-stream-small-limit", b"\x10\x04\x2a" + stream)
    write("stream", "open-transaction", b"\x00\x02\x07" + enc("MULTI") + enc("SET", "a", "x" * 200) * 3)
    return stream


def commands(port):
    c = Conn(port)
    names = ["get", "set", "mset", "eval", "evalsha", "fcall", "xread", "zunionstore", "migrate",
             "sort", "blpop", "lmpop", "georadius", "object", "client", "config", "bitfield_ro"]
    table = c.cmd("COMMAND", "INFO", *names, wait=0.4)
    requests = b"".join([
        enc("SET", "k", "v"), enc("MSET", "a", "1", "b", "2"),
        enc("EVAL", "return 1", "2", "k1", "k2", "arg"), enc("EVAL", "return 1", "9223372036854775807"),
        enc("XREAD", "COUNT", "2", "STREAMS", "s1", "s2", "0", "0"),
        enc("ZUNIONSTORE", "dst", "2", "a", "b", "WEIGHTS", "1", "2"),
        enc("MIGRATE", "host", "6379", "", "0", "5000", "KEYS", "a", "b"),
        enc("SORT", "k", "BY", "w_*"), enc("LMPOP", "2", "a", "b", "LEFT"),
        enc("OBJECT", "ENCODING", "k"), enc("CLIENT", "LIST"), enc("UNKNOWN", "x"),
        b"GET k\r\n", b"get \"a b\" 'c'\r\n",
    ])
    write("command_table", "command-info-and-requests", table + requests)
    return table


def info(port):
    c = Conn(port)
    sections = [c.cmd("INFO", s) for s in ["server", "replication", "keyspace"]]
    texts = []
    for s in sections:
        body = s[s.index(b"\n") + 1:-2]  # the bulk string's text
        texts.append(body)
    write("valkey_info", "info-server-replication-keyspace", b"\x00" + b"\x00".join(texts))
    role = c.cmd("ROLE")
    write("valkey_info", "role-primary", b"\x00" + role)
    write("valkey_info", "psync-answers",
          b"\x07\n\n+FULLRESYNC 70e03b3fce3a3c8a1747c5e25749ff471bca3225 620\r\n"
          b"+CONTINUE\r\n+CONTINUE 0123456789abcdef0123456789abcdef01234567\r\n"
          b"-NOMASTERLINK Can't SYNC while not connected with my master\r\n")
    dump = c.cmd("FUNCTION", "DUMP")
    write("valkey_info", "function-dump", b"\x00" + dump[dump.index(b"\n") + 1:-2])


def requests():
    seeds = [
        ("ping", enc("PING")),
        ("set", enc("SET", "key", "value")),
        ("set-binary-value", enc("SET", "bin", b"\x00\r\n\xff")),
        ("mset", enc("MSET", "a", "1", "b", "2", "c", "3")),
        ("hello-auth", enc("HELLO", "3", "AUTH", "default", "secret")),
        ("eval", enc("EVAL", "return 1", "0")),
        ("empty-array", b"*0\r\n"),
        ("null-array", b"*-1\r\n"),
        ("inline-ping", b"PING\r\n"),
        ("inline-quotes-and-escapes", b"SET k \"a b\\x41\\n\" 'it\\'s'\r\n"),
        ("inline-lf-only", b"GET k\n"),
        ("inline-blank", b"   \r\n"),
        ("inline-adjacent-quotes", b"ECHO \"a\"'b'c\r\n"),
        ("inline-nul", b"GET a\x00b\r\n"),
        ("bad-bulk-crlf", b"*1\r\n$4\r\nPINGxx"),
        ("bad-simple-string-in-array", b"*1\r\n+foo\r\n"),
        ("bad-count", b"*x\r\n"),
        ("bad-unbalanced-quote", b"SET \"a\r\n"),
        ("bad-leading-zero", b"*01\r\n"),
    ]
    for name, r in seeds:
        write("request", name, DEFAULTS_ONE_READ + r)
    pipeline = b"".join(r for name, r in seeds if not name.startswith("bad-"))
    write("request", "pipeline-small-reads", DEFAULTS_SMALL_READS + pipeline)
    write("request", "pipeline-small-limits", SMALL_LIMITS_SMALL_READS + pipeline)


def configs():
    with open(os.path.join(ROOT, "config.toml"), "rb") as f:
        shipped = f.read()
    write("config", "shipped-config.toml", shipped)
    write("config", "small-ring.toml", b"[journal]\nsegment_size_bytes = 1048576\nsegments = 3\n")
    write("config", "external.toml",
          b"[upstream]\nmode = \"external\"\naddress = \"10.0.0.5:6379\"\nusername = \"walrus\"\n"
          b"password = \"s3cret\"\n[durability]\nmax_pending_bytes = 1048576\n"
          b"[disk]\nhigh_watermark = 0.5\nlow_watermark = 0.4\n[checkpoint]\nring_fill_trigger = 0.3\n")
    write("config", "tests-journal.toml",
          b"[journal]\nsegment_size_bytes = 65536\nsegments = 3\nmax_write_bytes = 16384\n"
          b"max_in_flight_writes = 4\nwrite_buffers = 8\nmax_entry_bytes = 65536\n"
          b"io_backend = \"sync\"\ndirect_io = \"off\"\nrecovery_lookahead_bytes = 4096\n")
    write("config", "proxy-limits.toml",
          b"[proxy]\nlisten = \"0.0.0.0:7000\"\nmax_inline_bytes = 16\nmax_reply_depth = 8\n"
          b"max_reply_bytes = 1024\nworker_threads = 2\n[log]\nformat = \"json\"\nlevel = \"walrus=debug\"\n"
          b"[restore]\non_conflict = \"journal-wins\"\n")


def main():
    port = free_port()
    workdir = tempfile.mkdtemp()
    server = subprocess.Popen(
        [valkey_binary(), "--port", str(port), "--save", "", "--appendonly", "no",
         "--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0", "--dir", workdir, "--logfile", os.path.join(workdir, "log")])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
        replies(port)
        stream_and_rdb(port)
        commands(port)
        info(port)
        requests()
        configs()
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
