"""deploy/bench.py --suite role: what walrus's ROLE calls cost inside Valkey.

walrus asks Valkey one ROLE per batch of writes (the offset oracle). What that costs Valkey
depends on the replica handshake: a replica that announced no `REPLCONF ip-address` makes
every ROLE look up its peer address. Each setup is walrus durable in front of its own Valkey
(this build, and with --baseline another); per round, each runs the durable SET workload
after CONFIG RESETSTAT, and Valkey's own commandstats give the microseconds per ROLE and per
SET."""
from ..resp import call, info
from ..runs import median_of, median_ratio, redis_benchmark, run_rounds, scaled
from ..servers import durable_walruses
from .plain import DURABILITY_WORKLOADS


def commandstat(port, command):
    """(calls, usec_per_call) of one command from Valkey's INFO commandstats."""
    fields = dict(kv.split("=", 1) for kv in info(port, "commandstats").get("cmdstat_" + command, "").split(",") if "=" in kv)
    return int(fields.get("calls", 0)), float(fields.get("usec_per_call", 0))


def run(opts, tmp):
    workload = wname, _, _ = DURABILITY_WORKLOADS[0]
    started = durable_walruses(tmp, opts.baseline)

    def one(w, setup):
        _, wport, vport = setup
        call(vport, "CONFIG", "RESETSTAT")
        ops = redis_benchmark(wport, w[1], scaled(w[2], opts.scale))[0]
        return (ops, *commandstat(vport, "role"), commandstat(vport, "set")[1])

    results = run_rounds(opts.rounds, [workload], started, one)
    print("\nrole suite: %s, %d rounds, medians; ratios: median of per-round ratios against %s\n"
          % (wname, opts.rounds, started[0][0]))
    print("| setup | ops/s | ops/s ratio | ROLE calls | ROLE µs per call | ROLE µs ratio | SET µs per call |")
    print("|---|---|---|---|---|---|---|")
    first = results[(wname, started[0][0])]
    for name, _, _ in started:
        xs = results[(wname, name)]
        print("| %s | %.0f | %.2f | %.0f | %.2f | %.2f | %.2f |"
              % (name, median_of(xs, 0), median_ratio(xs, first, 0), median_of(xs, 1), median_of(xs, 2),
                 median_ratio(xs, first, 2), median_of(xs, 3)))
