"""A verifiers v1 taskset, written as verifiers' docs say (examples/verifiers_sums.py trains on it)."""
from vf_sums.taskset import SumsTaskset

__all__ = ["SumsTaskset"]
