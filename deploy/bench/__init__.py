"""The benchmarks of walrus, run by deploy/bench.py (__main__.py: the suites and their flags)
and deploy/bench_shards.py.

The shared setups: procs.py (children, their readiness, CPU and RSS), resp.py (RESP on a
socket), servers.py (Valkey, walrus, twemproxy, HAProxy, SeaweedFS), disks.py (faultfs's slow
disks), dataset.py (the restore dataset), runs.py (redis-benchmark runs, the rounds, medians
and ratios). suites/: one module per suite; each prints its own report."""
