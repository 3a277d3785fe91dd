"""`trainer/mfu`: each update's model FLOPs (tba.models.flops, from the policy's shape and the lengths it trained)
over its seconds (`trainer/step_s`) and the trainer devices' peak (tba.run.peak: a GPU's from the table, a CPU's
measured). A trainer of N ranks divides by N devices' peak. Nothing is logged where no peak is known (said once).
"""

from __future__ import annotations

import logging

import torch

from tba.models.flops import ModelFlops
from tba.models.shape import shape_of
from tba.run.peak import Peak, device_peak

logger = logging.getLogger(__name__)


class Utilization:
    """The loop's `Utilization` (tba.algorithm.loop): the metrics of an update's use of its devices."""

    def __init__(self, flops: ModelFlops, peak: Peak, *, devices: int = 1, shared_prompts: bool = True):
        self.flops, self.peak, self.devices, self.shared_prompts = flops, peak, devices, shared_prompts

    def __call__(self, draws, seconds: float) -> dict[str, float]:
        groups = [(len(d.prompt_tokens), [len(s.response) for s in d.samples]) for d in draws]
        done = self.flops.update(groups, shared_prompts=self.shared_prompts)
        return {"trainer/mfu": done / (max(seconds, 1e-9) * self.peak.flops * self.devices)}


def utilization(devices: list[torch.device], dtype: str, model_config, *, lora: bool, shared_prompts: bool
                ) -> Utilization | None:
    """The Utilization of a trainer on `devices` (one per rank) computing in `dtype`, whose policy has the
    architecture `model_config` (a transformers config); None, said once in the log, when no peak is known."""
    try:
        peak = device_peak(devices[0], dtype)
        if peak is None:
            name = torch.cuda.get_device_name(devices[0]) if devices[0].type == "cuda" else devices[0].type
            logger.info(f"trainer/mfu: not logged — no {dtype} peak known for {name} (tba.run.peak.GPU_PEAKS; float32 "
                        "with TF32 allowed has none)")
            return None
        flops = ModelFlops.of(shape_of(model_config), lora=lora)
    except Exception as e:  # a diagnostic: never the reason a run does not start
        logger.info(f"trainer/mfu: not logged — {type(e).__name__}: {e}")
        return None
    logger.debug(f"trainer/mfu over {len(devices)} × {peak.what}")
    return Utilization(flops, peak, devices=len(devices), shared_prompts=shared_prompts)
