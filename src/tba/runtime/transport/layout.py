"""How a model's weights are laid out for transport: one flat buffer per dtype and a named view per tensor.

Both ends of every weight transport (tba.runtime.transport, tba.runtime.transport.broadcast) agree on a `WeightLayout`,
computed once from the trainer's synced tensors, so a bf16 model travels as bf16 in as few pieces as it has
dtypes, tied weights once, and the receiving end rebuilds named views without having a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """First element in the flat buffer of this slot's dtype."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class WeightLayout:
    """Where each named tensor lives in one flat buffer per dtype (picklable: sent to searchers once)."""

    slots: tuple[Slot, ...]
    dtypes: tuple[torch.dtype, ...]
    sizes: tuple[int, ...]
    """Elements per buffer, aligned with `dtypes`."""

    @classmethod
    def of(cls, weights: dict[str, torch.Tensor]) -> WeightLayout:
        """Tied tensors (one memory under two names: embeddings and LM head) get one place, so they travel once."""
        sizes: dict[torch.dtype, int] = {}
        slots, placed = [], {}
        for name, t in weights.items():
            same = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
            offset = placed.get(same) if t.numel() else None
            if offset is None:
                offset = placed[same] = sizes.get(t.dtype, 0)
                sizes[t.dtype] = offset + t.numel()
            slots.append(Slot(name, t.dtype, tuple(t.shape), offset))
        return cls(tuple(slots), tuple(sizes), tuple(sizes.values()))

    @property
    def nbytes(self) -> int:
        return sum(n * torch.empty((), dtype=d).element_size() for d, n in zip(self.dtypes, self.sizes, strict=True))

    def allocate(self, device: torch.device | str) -> list[torch.Tensor]:
        return [torch.empty(n, dtype=d, device=device) for d, n in zip(self.dtypes, self.sizes, strict=True)]

    def views(self, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named tensors backed by `buffers` (no copy), in the trainer's order."""
        index = {d: i for i, d in enumerate(self.dtypes)}
        return {s.name: buffers[index[s.dtype]][s.offset:s.offset + s.numel].view(s.shape) for s in self.slots}

    def pack(self, weights: dict[str, torch.Tensor], buffers: list[torch.Tensor]) -> None:
        """Copy `weights` (same names, shapes and dtypes as the layout's) into `buffers`."""
        views = self.views(buffers)
        if weights.keys() != views.keys():
            raise ValueError(f"published weights do not match the layout: missing "
                             f"{sorted(views.keys() - weights.keys())[:3]}, unexpected "
                             f"{sorted(weights.keys() - views.keys())[:3]}")
        with torch.no_grad():
            for name, view in views.items():
                t = weights[name]
                if t.dtype != view.dtype or t.shape != view.shape:
                    raise ValueError(f"published tensor {name} is {t.dtype} {tuple(t.shape)}, the layout has "
                                     f"{view.dtype} {tuple(view.shape)}")
                view.copy_(t)
