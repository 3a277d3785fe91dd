"""Quantized copies of a policy to sample from (`search.quantize`), made with torch's and torchao's quantizers.

Why a copy: a searcher receives the trainer's full-precision weights into its own full-precision model (the
weight transport loads them in place, whatever the scheme), and each published version is then quantized into
a second model used only to generate. So the trainer trains the full-precision policy, and what changes is the
behaviour policy alone — which TB's fixed point π* ∝ π_ref·exp(r/β) does not depend on, as long as it gives
every response a chance. The reference stays exact: its log-probs define that target, and quantizing them would
move the target itself. The sampler returns the log-probs of the distribution it sampled from (the quantized
model's), so the ratio objectives see the real behaviour/trainer mismatch.

    int8          int8 weights (one scale per output channel) and activations quantized at run time, an int8 ×
                  int8 matmul: on a CPU torch's own dynamic quantization (fbgemm/x86 kernels: one scale per
                  activation tensor), on a GPU torchao's Int8DynamicActivationInt8WeightConfig (one per token)
    int8_weight   int8 weights, activations in the model's dtype (torchao's Int8WeightOnlyConfig)
    fp8           float8 (e4m3) weights and per-row dynamic activations (torchao's
                  Float8DynamicActivationFloat8WeightConfig): GPUs of compute capability ≥ 8.9 only

Why torch's quantizer for int8 on a CPU although `torch.ao.quantization` is deprecated in favour of torchao:
without torch.compile, torchao's int8 kernels on a CPU generate no faster than float32, while torch's fbgemm
kernels do — and speed is the only reason to sample from a quantized copy (bench/perf/quantized_sampler.py;
docs/results.md, "Quantized searchers").

Which layers: every `nn.Linear`, the LM head included (the largest matmul of a small model) — except, for the
CPU's int8, the MLP's down projection (the linear layer whose input is the MLP's hidden activation,
`in_features == config.intermediate_size`). Its input carries the few huge activations transformer MLPs are
known for, and one scale for the whole activation tensor then leaves the other channels a handful of levels: the
samples of a copy quantized there earn far less reward than the full-precision model's; with that layer kept in
float32 they earn about as much, and the copy still generates faster (docs/results.md, "Quantized searchers"). A
LoRA policy's adapters are merged into the copy first. Embeddings and norms stay as they are.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings

import torch

from tba.config.schema import QUANTIZE as SCHEMES
from tba.errors import ConfigError


@contextlib.contextmanager
def _quiet_import():
    """torchao's import logs a warning per CUDA/CUTLASS kernel library it cannot load on a machine without them,
    and torch's pytree a deprecation note: noise a user can do nothing about."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree", "torch.ao")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _torchao():
    """torchao.quantization, imported on first use: an optional dependency (pip install 'tba[quantize]')."""
    try:
        with _quiet_import():
            import torchao.quantization
    except ImportError:
        raise ConfigError("search.quantize: needs torchao (pip install 'tba[quantize]', or pip install torchao "
                          "--no-deps)") from None
    return torchao.quantization


def kept_full_precision(model: torch.nn.Module) -> set[str]:
    """The linear layers the CPU's int8 leaves in float32: the MLP down projections (module docstring)."""
    hidden = getattr(getattr(model, "config", None), "intermediate_size", None)
    return {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.in_features == hidden}


def _weight_qparams(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 scales and zero points: the observer quantize_dynamic uses with
    per_channel_dynamic_qconfig, so an in-place refresh equals a fresh quantization."""
    observer = torch.ao.quantization.per_channel_dynamic_qconfig.weight()
    observer(weight)
    scales, zero_points = observer.calculate_qparams()
    return scales.double(), zero_points.long()


def _quantize(model: torch.nn.Module, scheme: str, device: torch.device) -> torch.nn.Module:
    """`model` with its linear layers quantized by `scheme` (in place where the quantizer allows it)."""
    if scheme == "int8" and device.type == "cpu":  # fbgemm's kernels take float32 activations
        keep = kept_full_precision(model)
        spec = {n: torch.ao.quantization.per_channel_dynamic_qconfig for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and n not in keep}
        with _quiet_import():  # torch.ao.quantization warns that it is deprecated (see the module docstring)
            return torch.ao.quantization.quantize_dynamic(model.float(), spec, dtype=torch.qint8)
    ao = _torchao()
    config = {"int8": ao.Int8DynamicActivationInt8WeightConfig, "int8_weight": ao.Int8WeightOnlyConfig,
              "fp8": ao.Float8DynamicActivationFloat8WeightConfig}[scheme]()
    with _quiet_import():
        ao.quantize_(model, config)
    return model


def check(scheme: str, device: torch.device) -> None:
    """Refuse what cannot run here, before a model is copied: fp8 off a recent GPU, an unknown scheme."""
    if scheme not in SCHEMES or scheme == "none":
        raise ConfigError(f"search.quantize: must be one of {', '.join(SCHEMES[1:])} here, got {scheme!r}")
    if scheme == "fp8" and (device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9)):
        raise ConfigError(f"search.quantize: fp8 needs a CUDA GPU of compute capability ≥ 8.9 (L40, H100, …); the "
                          f"searcher is on {device}. On a CPU use int8")


@torch.no_grad()
def quantized_copy(model: torch.nn.Module, scheme: str) -> torch.nn.Module:
    """A copy of `model` (LoRA adapters merged) with every linear layer quantized by `scheme`; `model` is left
    as it is."""
    device = next(model.parameters()).device
    check(scheme, device)
    copied = copy.deepcopy(model)
    if getattr(copied, "peft_config", None):
        copied = copied.merge_and_unload()
    copied.requires_grad_(False).eval()
    if getattr(copied.config, "tie_word_embeddings", False):  # the head gets its own (quantized) weight
        head = copied.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    return _quantize(copied, scheme, device)


class QuantizedModel:
    """The quantized model a sampler generates with, kept in step with the full-precision `model` it is made
    from: `refresh()` after each weight load. For int8 on a CPU (no LoRA) the linear layers are re-quantized in
    place, with the observer `quantize_dynamic` uses, instead of making a fresh copy each time (every load at
    k = 1): the cost that decides whether quantized sampling is faster at all (bench/perf/quantized_sampler.py
    measures it as "load s")."""

    def __init__(self, model: torch.nn.Module, scheme: str):
        self.model, self.scheme = model, scheme
        self.quantized = quantized_copy(model, scheme)
        self._pairs = None
        if scheme == "int8" and next(model.parameters()).device.type == "cpu" and not getattr(
                model, "peft_config", None):
            linear = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
            self._pairs = [(linear[n], m) for n, m in self.quantized.named_modules() if n in linear
                           and isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
            source = dict(model.named_parameters())  # the rest (embeddings, norms) is copied as it is
            self._rest = [(source[n], p) for n, p in self.quantized.named_parameters() if n in source]

    @torch.no_grad()
    def refresh(self) -> None:
        if self._pairs is None:
            self.quantized = quantized_copy(self.model, self.scheme)
            return
        for fp, q in self._rest:
            q.copy_(fp)
        for fp, q in self._pairs:
            weight = fp.weight.detach().float()
            scales, zero_points = _weight_qparams(weight)
            q.set_weight_bias(torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8),
                              None if fp.bias is None else fp.bias.detach().float())
