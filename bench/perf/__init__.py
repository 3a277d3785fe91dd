"""Performance measurements: wall-clock against sync and against TRL, start-up, sampler tokens/s, memory and disk
over a long run, and the GPU smoke run."""
