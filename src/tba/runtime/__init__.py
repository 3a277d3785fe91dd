"""Runtimes host the searchers and move data; the training loop (tba.loop) is the same for all of them."""
