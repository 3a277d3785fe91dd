"""What the benchmark scripts share: the results header (and reading a header's command back), where results go,
scratch directories, a process pool whose workers die with it, the smoke overrides, and the claims table of
bench/README.md (table.py)."""
