"""deploy/bench.py --suite restore: a restart of ~1 GB, walrus's restore against Valkey's AOF and RDB
loads, and the p99 of client writes while a checkpoint runs.

One dataset of SETs (keys k:0000000000.., 200-byte values of base64 noise that Valkey's LZF
cannot shrink, so RDBs are as large as the data) is written once into each setup:
  - walrus durable, managed mode: `walrus checkpoint` after the first half of the keys
    (--checkpoint-at), so half the stream is in the checkpoint and half in the journal after
    it; the ring is sized so that walrus never checkpoints by itself (it does at half the
    ring), which would change the layout from one round to the next;
  - Valkey appendonly yes, appendfsync always, automatic rewrites off and one BGREWRITEAOF at
    the same key, so the AOF is a base RDB + an incr file holding what walrus's checkpoint
    and journal hold (--aof-layout natural: Valkey's own automatic rewrites instead);
  - Valkey with that dataset as an RDB (SAVE).
Each round restarts each setup on its data: Valkey SIGTERMed with save "" (no save at exit,
as SHUTDOWN NOSAVE), walrus SIGTERMed (it stops its Valkey, so the restart restores an empty
one). Then, with walrus up, redis-benchmark runs plainly and during `walrus checkpoint`.
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ..dataset import SET_BYTES, VALUE_BYTES, dbsize_check, fill
from ..resp import call, info
from ..runs import redis_benchmark
from ..servers import WalrusManaged, start_plain_valkey

CHECKPOINT_BENCH = ("SET 1 KiB, 50 clients", ["-t", "set", "-d", "1024", "-c", "50", "-r", "100000"])


def number(pattern, text, cast=float):
    m = re.search(pattern, text or "")
    return cast(m.group(1)) if m else None



def run(opts, tmp):
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

