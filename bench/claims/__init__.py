"""Scripts whose results README.md and docs/ quote as claims about learning: does it learn, where each objective
converges, what stale data does, a real LLM, red-teaming, crash and resume."""
