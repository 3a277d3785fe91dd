"""An inference endpoint in front of a searcher's sampler: verifiers' token route, OpenAI chat completions, sessions.

Why: environments and agent harnesses people already have (verifiers, OpenEnv, anything written against the
`openai` client) drive the model themselves over HTTP. This package puts the policy behind that HTTP — on the same
sampler and the same continuous batch a searcher decodes with — so their calls come back token-exact, with
behaviour log-probs and the policy version of every token, ready to become training samples (docs/serve.md).

    engine.py       the engine thread: owns the sampler, admits every request into its running batch
    hf_batch.py     hf backend: tba.models.continuous with per-request temperature, top-p, stop tokens, cancel
    vllm_batch.py   vllm backend: one engine request per sample, vLLM's scheduler batches them
    protocol.py     request bodies, limits, the error shape (400 naming the field)
    chat.py         chat template rendering, incremental text, Hermes/Qwen tool calls
    sessions.py     the calls of one episode, token-exact, for stitching by prefix extension
    stitch.py       a session's calls → trajectories by prefix extension (policy mask, log-probs, versions)
    agents.py       task.name=agent: the user's openai-client function run N at a time against a searcher's endpoint
    app.py          the FastAPI routes, bearer-token auth, timeouts
    server.py       uvicorn on a socket bound first (port 0 → a free one), in this thread or a background one

`tba serve RECIPE_OR_RUN` (tba.cli.serve, tba.run.serve) runs it alone. Needs the `serve` extra (fastapi, uvicorn).
"""
