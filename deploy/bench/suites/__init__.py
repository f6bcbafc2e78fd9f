"""One module per suite of deploy/bench.py (`--suite NAME`), each with run(opts, tmp); the
proxy, durability and connect suites share one (plain.py): they differ in their workloads and
setups only."""
