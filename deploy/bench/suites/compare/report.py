"""The compare suite's report: per disk regime the targets of the performance issue, a table
per workload, the ratios against Valkey's persistence and twemproxy, the journal's bytes per
entry and the write amplification; the whole report's header; the plot."""
import statistics
import sys
import time

from ...disks import LATENCY_US
from ...procs import CLK_TCK
from ...runs import ratios as per_round_ratios
from .setups import (ALWAYS, EVERYSEC, HAPROXY, NO_PERSISTENCE, SLOW_DISK_SETUPS, TWEMPROXY, WALRUS, WALRUS_OFF,
                     WALRUS_SYNC)
from .workloads import GET_ALONE, GET_BESIDE, PRELOAD_KEYS, REGIME_SCALE, runs

def ratio_values(results, wa, a, wb, b, key, keyb=None):
    """The per-round ratios of a's figure in workload wa to b's in wb (rounds where b's is 0,
    as a CPU time below one clock tick, left out)."""
    return per_round_ratios(results.get((wa, a), []), results.get((wb, b), []), key, keyb)


def ratio_cell(results, wname, a, b, key):
    """"0.68x": the median over the rounds of a's figure divided by b's ("-" if there is none)."""
    ratios = ratio_values(results, wname, a, wname, b, key)
    return "%.2fx" % statistics.median(ratios) if ratios else "-"


def amplification(journal):
    """Bytes written to the device per payload byte: the journal's blocks plus the checkpoints'
    RDBs, over the payload appended (None where the build lacks a counter)."""
    if any(journal[k] is None for k in ("written", "checkpoint", "payload")) or not journal["payload"]:
        return None
    return (journal["written"] + journal["checkpoint"]) / journal["payload"]


# The targets of the performance issue: rows of (text, figure, met), each of walrus's targets
# for both journal backends ("walrus": io_uring; "walrus (sync backend)": the fallback where
# seccomp refuses io_uring), then the fallback against io_uring in every workload.
def targets(regime, compare_workloads, results, floor):
    med = lambda xs: statistics.median(xs) if xs else None
    rows = []

    def ratio(text, wa, a, wb, b, key, want, keyb=None, above=True):
        r = med(ratio_values(results, wa, a, wb, b, key, keyb))
        rows.append((text, "-" if r is None else "%.2fx" % r,
                     "-" if r is None else ("met" if (r >= want if above else r <= want) else "**not met**")))

    workloads = [w for w, _, _, _ in compare_workloads]
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


def regime_report(opts, regime, workloads, started, results, floor):
    """The markdown of one disk regime: a table per workload, the targets, the ratios and the
    journal's bytes."""
    latency, regime_scale = LATENCY_US[regime], REGIME_SCALE[regime]
    med = lambda rows, key: statistics.median(r[key] for r in rows) if rows and key in rows[0] else None
    fmt = lambda v, f: "-" if v is None else f % v
    title = "the local disk" if latency is None else \
        "a slow disk: faultfs, %g ms per synchronous write" % (latency / 1000)
    lines = ["### %s: %s" % (regime, title), "",
             "The device's own 4 KiB O_DIRECT|O_DSYNC write p50 here: %.3f ms. Runs: %s." % (floor, "; ".join(
                 "%s %d%s" % (w, runs(n, opts.scale, regime_scale, t), " s" if t in ("pair", "loadgen-timed") else "")
                 for w, t, _, n in workloads)), ""]
    lines += ["#### Targets", "", "| target | measured | |", "|---|---|---|"]
    lines += ["| %s | %s | %s |" % row for row in targets(regime, workloads, results, floor)]
    lines.append("")
    for wname, tool, _, _ in workloads:
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
    for wname, _, _, _ in workloads:
        for name in durable:
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                wname, name, ratio_cell(results, wname, name, ALWAYS, "ops"),
                ratio_cell(results, wname, name, ALWAYS, "p99"),
                ratio_cell(results, wname, name, NO_PERSISTENCE, "ops"),
                ratio_cell(results, wname, name, NO_PERSISTENCE, "p99")))
    proxies = [s.name for s in started if s.proxy and s.name != TWEMPROXY]
    if TWEMPROXY in names:
        lines += ["", "#### Proxies against twemproxy", "",
                  "CPU: the proxy process's own, per request (lower is better).", "",
                  "| workload | setup | ops/s vs twemproxy | proxy CPU/req vs twemproxy |", "|---|---|---|---|"]
        for wname, _, _, _ in workloads:
            for name in proxies:
                lines.append("| %s | %s | %s | %s |" % (
                    wname, name, ratio_cell(results, wname, name, TWEMPROXY, "ops"),
                    ratio_cell(results, wname, name, TWEMPROXY, "proxy_cpu")))
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
    for wname, _, _, _ in workloads:
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
             "other, each run once no setup is saving (walrus's checkpoint, Valkey's RDB or AOF rewrite); figures "
             "are medians over the rounds, a ratio is the median of the per-round ratios. The suite took %.1f "
             "minutes." % (" ".join(["deploy/bench.py"] + sys.argv[1:]),
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


def compare_plot(path, workloads, sections, caption):
    """A column per disk regime, a panel per workload: ops/s bars per setup, each labelled with
    its ops/s and p99."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Blues: Valkey alone; oranges: walrus (darker: durable); greens: the other proxies.
    colours = {NO_PERSISTENCE: "#9ecae1", EVERYSEC: "#6baed6", ALWAYS: "#2171b5", WALRUS: "#e6550d",
               WALRUS_SYNC: "#a63603", WALRUS_OFF: "#fdae6b", TWEMPROXY: "#74c476", HAPROXY: "#31a354"}
    cols, rows = len(sections), len(workloads)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 2.4 * rows), squeeze=False)
    for c, (regime, started, results, _) in enumerate(sections):
        names = [s.name for s in started]
        for r, (wname, _, _, _) in enumerate(workloads):
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
