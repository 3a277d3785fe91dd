"""Scripts that read what earlier runs left behind (a run directory, results files) and train nothing."""
