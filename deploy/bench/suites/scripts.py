"""deploy/bench.py --suite scripts: what treating every script as touching every key costs
readers. 50 clients GET keys nobody writes while 10 other clients write, either with SET
(walrus knows the key: the GETs are clean and never wait) or with the same SET inside EVAL
(the script may touch any key: every GET waits for the journal to cover the pending script
writes). Both through walrus durable, alternating in each round."""
import subprocess

from ..runs import median_of, median_ratio, redis_benchmark, rounds, scaled
from ..servers import WALRUS_VALKEY_SETTINGS, start_valkey, start_walrus

SCRIPT_WRITERS = [
    ("SET", ["SET", "w:__rand_int__", "v"]),
    ("EVAL", ["EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "w:__rand_int__", "v"]),
]
SCRIPT_READS = ["-c", "50", "-r", "100000", "GET", "r:__rand_int__"]


def run(opts, tmp):
    _, vport = start_valkey(tmp, WALRUS_VALKEY_SETTINGS)
    _, port = start_walrus(tmp, vport, durable=True)
    requests = scaled(100000, opts.scale)
    results = {name: [] for name, _ in SCRIPT_WRITERS}
    for _ in rounds(opts.rounds):
        for name, cmd in SCRIPT_WRITERS:
            writer = subprocess.Popen(["redis-benchmark", "-p", str(port), "-c", "10", "-n", "100000000",
                                       "-r", "100000", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                results[name].append(redis_benchmark(port, SCRIPT_READS, requests))
            finally:
                writer.terminate()
                writer.wait()
    print("\nscripts suite, %d rounds, medians: GET of unwritten keys (50 clients, walrus durable) "
          "while 10 clients write\n" % opts.rounds)
    print("| concurrent writes | GET ops/s | GET p50 ms | GET p99 ms | ops/s vs SET |")
    print("|---|---|---|---|---|")
    for name, _ in SCRIPT_WRITERS:
        rows = results[name]
        print("| %s | %.0f | %.3f | %.3f | %.2fx |" % (name, median_of(rows, 0), median_of(rows, 1),
                                                     median_of(rows, 2), median_ratio(rows, results["SET"], 0)))
