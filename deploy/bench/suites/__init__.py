"""One module per suite of deploy/bench.py (`--suite NAME`), each with run(opts, tmp); the
proxy, durability and connect suites share one (plain.py): they differ in their workloads and
setups only. compare/ is a package of its own; notify_drain.py is the notifications suite's
listener process; shards.py is deploy/bench_shards.py's suite, with flags of its own (main)."""
