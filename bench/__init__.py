"""tba's benchmarks: the scripts behind every number the README and docs/ quote.

A package so that each script runs as `python -m bench.<group>.<script>` from the repository root, imports its
helpers from `bench.lib`, and can be found again by name in a spawned pool worker. bench/README.md maps each claim
to its script, results file and command.
"""
