"""Performance measurements: wall-clock against sync and against TRL, where an update's time goes, sampler
tokens/s, memory and disk over long runs, and the GPU smoke run."""
