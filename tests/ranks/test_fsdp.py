"""tba.ranks.fsdp's start: every rank reads its own shards from the start's safetensors files (no whole model in any
process, nothing broadcast), two ranks under torchrun over gloo on loopback, against the model from_pretrained loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tba.config.schema import TinyModelConfig
from tba.models import save_buckets, save_checkpoint
from tba.models.builtin import build_tiny_model

RANK = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from tba.config.fsdp import FSDPConfig
from tba.models import load_model
from tba.models.sources import safetensors_index
from tba.ranks import fsdp
from tba.run.sharded import skeleton

source, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
cpu = torch.device("cpu")
model = skeleton(source, None, "float32")
buffers = fsdp.kept_buffers(model)
model = fsdp.shard(model, FSDPConfig(), dtype="float32", device=cpu)
model.to_empty(device=cpu)
files = safetensors_index(source)
readable = fsdp.readable(model, files, buffers)
fsdp.load_own_shards(model, files, buffers)
shards = {fsdp.clean(k): list(p.to_local().shape) for k, p in model.named_parameters()}
whole = {fsdp.clean(k): v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
mine = {fsdp.clean(k): b.clone() for k, b in model.named_buffers()}
short = dict(files)
short.pop("model.norm.weight")
without_one = fsdp.readable(model, short if dist.get_rank() == 1 else files, buffers)
if dist.get_rank() == 0:
    want = load_model(source)
    theirs = dict(want.named_buffers())
    json.dump({"readable": readable, "without_one": without_one,
               "equal": sorted(k for k, v in want.state_dict().items() if torch.equal(whole[k], v)),
               "keys": sorted(want.state_dict()),
               "buffers": sorted(k for k in theirs if torch.equal(mine[k], theirs[k])),
               "buffer_keys": sorted(theirs), "tied": model.lm_head.weight is model.model.embed_tokens.weight},
              open(out, "w"))
with open(out + f".rank{dist.get_rank()}", "w") as f:
    json.dump(shards, f)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module", params=["one-file", "index"])
def source(request, tmp_path_factory, tiny_tokenizer):
    """A start directory with an uneven dim 0 (intermediate 65: 33 + 32 rows): one safetensors file, or several
    with transformers' index (as a sharded trainer's checkpoint writes model/)."""
    model = build_tiny_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2,
                                                             intermediate_size=65), seed=0)
    path = tmp_path_factory.mktemp("start") / request.param
    save_checkpoint(model, tiny_tokenizer, path)
    if request.param == "index":
        (path / "model.safetensors").unlink()
        state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
        keys = list(state)
        save_buckets(path, ({k: state[k] for k in keys[i:i + 5]} for i in range(0, len(keys), 5)),
                     config=model.config)
        assert (path / "model.safetensors.index.json").is_file()
    return path


def test_each_of_two_ranks_reads_its_own_shards_and_together_they_are_the_start(source, tmp_path):
    out, script = tmp_path / "result.json", tmp_path / "rank.py"
    script.write_text(RANK)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(source), str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["readable"] and not result["without_one"]  # one rank lacking a tensor: every rank falls back
    assert result["equal"] == result["keys"]  # every tensor, bit for bit, the tied head included
    assert result["buffers"] == result["buffer_keys"] and result["tied"]  # rotary frequencies computed, not sent
    ranks = [json.loads((tmp_path / f"result.json.rank{r}").read_text()) for r in range(2)]
    assert ranks[0]["model.layers.0.mlp.up_proj.weight"] == [33, 32]
    assert ranks[1]["model.layers.0.mlp.up_proj.weight"] == [32, 32]
