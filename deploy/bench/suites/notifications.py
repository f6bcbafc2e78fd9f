"""deploy/bench.py --suite notifications: what holding keyspace notifications and tracking
invalidations until their write is durable costs.

Per setup (Valkey alone, walrus durable, and with --baseline another walrus build):
redis-benchmark's SET writers, beside NOTIFY_SUBSCRIBERS RESP2 subscribers of every written
key's keyspace channel (a pattern) and NOTIFY_TRACKERS RESP3 clients tracking every written
key (BCAST), which read and drop what they get, in a process of their own (notify_drain.py).
Meanwhile a probe writes its own key every NOTIFY_PROBE_SECONDS through the same setup and
notes when the SET is acknowledged and when its keyspace notification and its invalidation
reach two probe listeners: the delay from acknowledgement to notification (negative: the
notification came first, as a Valkey alone and a walrus that does not hold notices send it)."""
import socket
import statistics
import sys
import threading
import time

from ..procs import Proc, package_module
from ..resp import call, read_reply, resp
from ..runs import median_of, median_ratio, percentile, redis_benchmark, run_rounds, scaled
from ..servers import durable_walruses, start_valkey
from . import notify_drain

NOTIFY_WRITERS = ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"], 100000)
NOTIFY_SUBSCRIBERS, NOTIFY_TRACKERS = 4, 4
NOTIFY_PROBE_SECONDS = 0.01


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


def run(opts, tmp):
    _, vport = start_valkey(tmp)
    started = [("Valkey, no persistence", vport, vport), *durable_walruses(tmp, opts.baseline)]
    for name, port, vport in started:
        call(vport, "CONFIG", "SET", "notify-keyspace-events", "KEA")
        Proc(package_module(notify_drain, port, NOTIFY_SUBSCRIBERS, NOTIFY_TRACKERS), "ready")

    def one(w, setup):
        _, wargs, n = w
        probe = NotifyProbe(setup[1])
        stop = threading.Event()
        out = {}
        th = threading.Thread(target=lambda: out.update(delays=probe.run(stop)), daemon=True)
        th.start()
        try:
            bench = redis_benchmark(setup[1], wargs, scaled(n, opts.scale))
        finally:
            stop.set()
            th.join()
        delays = out["delays"]
        ms = lambda i, q: 1000 * percentile([d[i] for d in delays], q)
        # The probe's acknowledgement, its notification and invalidation after it (p50, p99),
        # and its notification after the SET was sent: what a subscriber waits in all.
        return (*bench[:3], ms(0, 0.5), ms(1, 0.5), ms(1, 0.99), ms(2, 0.5), ms(2, 0.99),
                1000 * statistics.median(d[0] + d[1] for d in delays))

    wname = NOTIFY_WRITERS[0]
    results = run_rounds(opts.rounds, [NOTIFY_WRITERS], started, one)
    # Ratios: medians of per-round ops/s against Valkey alone, and against the baseline build.
    against = [results[(wname, started[0][0])], results.get((wname, "baseline walrus durable"))]
    print("\nnotifications suite: %s beside %d keyspace subscribers (RESP2, a pattern) and %d tracking clients "
          "(RESP3, BCAST); a probe SET every %g s with a keyspace subscriber and a tracking client of its own; "
          "%d rounds, medians; ratios: median of per-round ops/s; delays from the probe's acknowledgement to its "
          "notification (negative: the notification came first)\n"
          % (wname, NOTIFY_SUBSCRIBERS, NOTIFY_TRACKERS, NOTIFY_PROBE_SECONDS, opts.rounds))
    print("| setup | SET ops/s | vs Valkey | vs baseline | SET p50 ms | SET p99 ms | probe ack ms | keyspace p50 ms | keyspace p99 ms "
          "| invalidation p50 ms | invalidation p99 ms | keyspace after the SET was sent, p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _ in started:
        xs = results[(wname, name)]
        ratios = ["%.2fx" % median_ratio(xs, base, 0) if base else "n/a" for base in against]
        print("| %s | %.0f | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |"
              % (name, median_of(xs, 0), *ratios, *(median_of(xs, i) for i in range(1, 9))))
