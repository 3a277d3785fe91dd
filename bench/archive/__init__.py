"""Finished one-off probes, kept runnable because a results file quotes what they printed; bench/README.md says
what each was for. Nothing here is maintained or tested beyond that."""
