#!/usr/bin/env python3
"""deploy/bench.py: the benchmarks (the package deploy/bench/; `--help` lists the suites)."""
from bench.__main__ import main

main()
