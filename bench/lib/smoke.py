"""Overrides that shrink the default recipe to seconds: the CI smoke versions of the benchmarks use them.
A smoke run checks that a benchmark runs end to end and writes its table; its numbers mean nothing."""

SMOKE_OVERRIDES = [
    "sft.steps=20", "sft.log_every_steps=20", "task.train_size=200", "task.test_size=8", "trainer.steps=6",
    "buffer.prefill_samples=12", "search.prompts_per_batch=2", "search.generations_per_prompt=6",
    "trainer.prompts_per_step=2", "trainer.samples_per_prompt=4", "eval.max_new_tokens=8", "search.max_new_tokens=16",
    "logging.tensorboard=false",
]
