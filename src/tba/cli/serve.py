"""`tba serve RECIPE_OR_RUN [key.sub=value ...] [--host H] [--port P] [--token T]`: the policy behind the inference
endpoint alone (tba.serve; docs/serve.md), until Ctrl-C.

Why a command of its own: a harness or environment can be developed and evaluated against the policy before any
training, and a trained policy served exactly as it will be sampled in training. It prints one line — the URL, the
token, the model name — once the server accepts connections; Ctrl-C (or SIGTERM) stops the server, then the
engine, then the sampler: nothing is left running.
"""

from __future__ import annotations

import argparse
import sys

from tba.cli.command import Command


def serve(ns: argparse.Namespace) -> int:
    from tba.run.serve import check_serve_installed, load

    check_serve_installed()
    if not ns.args:
        print("tba serve: name a recipe (or CONFIG.yaml) or a run directory", file=sys.stderr)
        return 2
    target, overrides = ns.args[0], ns.args[1:]
    cfg, run_dir = load(target, overrides)  # validated before any model is built

    from tba.run.serve import served
    from tba.serve.engine import EngineLoop
    from tba.serve.protocol import Limits
    from tba.serve.server import Server, batch_for

    policy = served(cfg, run_dir, name=ns.model_name, slots=ns.slots, max_model_len=ns.max_model_len)
    try:
        limits = Limits(max_model_len=policy.max_model_len, max_tokens=min(ns.max_tokens, policy.max_model_len),
                        timeout_s=ns.timeout)
        engine = EngineLoop(batch_for(policy.sampler, policy.slots), version=lambda: policy.version)
        server = Server(engine, policy.tokenizer, model_name=policy.name, token=ns.token, limits=limits,
                        host=ns.host, port=ns.port)

        def ready():
            print(f"tba serve: {server.url}/v1 token={server.token} model={policy.name} "
                  f"(policy {policy.source}, version {policy.version}, {policy.slots} slots)", flush=True)

        server.run(on_ready=ready)
    finally:
        policy.close()
    print("tba serve: stopped", file=sys.stderr)
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs="*", metavar="RECIPE_OR_RUN [key.sub=value ...]",
                        help="a recipe name, CONFIG.yaml, or a run directory (its config.yaml and newest policy), "
                             "then dotted overrides (search.backend=vllm, model.policy=…)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="default 8000; 0 = a free port (printed)")
    parser.add_argument("--token", default=None,
                        help="the bearer token clients must send (default: a new random one, printed)")
    parser.add_argument("--model-name", default=None,
                        help="the model name clients send (default: the policy's name, or the run's folder name)")
    parser.add_argument("--slots", type=int, default=None,
                        help="rows decoding at once (default search.slots, else at most 16)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="prompt + new tokens at most (default: the model's context length)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="new tokens per request at most (default 4096)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a generation may take before it is cancelled with 504 (default 600)")


COMMAND = Command("serve", "The policy behind an inference endpoint (verifiers' token route, OpenAI chat "
                  "completions), until Ctrl-C.", arguments, serve)
