"""What the benchmark scripts share: the results header, where results go, the reading a rewrite keeps, scratch
directories, a process pool whose workers die with it, and the smoke overrides."""
