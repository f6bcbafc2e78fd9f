#!/usr/bin/env python3
"""deploy/bench_shards.py: N shards of a Valkey Cluster on one machine (deploy/bench/suites/shards.py;
`--help` says more)."""
from bench.suites.shards import main

main()
