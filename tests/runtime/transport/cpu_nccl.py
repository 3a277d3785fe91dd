"""vLLM's NCCL weight transfer on a CPU, for tests: where vLLM's two NCCL engines (nccl_engine.py) touch NCCL or CUDA
streams — the trainer's endpoint, the worker's group, the packed producer and consumer — vLLM's own TCPStore-based
`StatelessProcessGroup` stands in (each tensor pickled through its store), and `torch.accelerator.synchronize` (no
accelerator here) does nothing. Everything else runs as vLLM ships it: its trainer engine's `send_weights` (the
client calls in order, the update beside the broadcast, the metadata checked against iteration), its worker engine's
init, update and layerwise reload. Not shown by it: NCCL itself, packed buffers, CUDA streams, GPU memory.
"""

import torch


class CPUGroup:
    """What vLLM's engines call on their `PyNcclCommunicator` (broadcast, destroy), over a StatelessProcessGroup."""

    def __init__(self, host: str, port: int, rank: int, world: int):
        from vllm.distributed.utils import StatelessProcessGroup

        self.rank, self.world = rank, world
        self.pg = StatelessProcessGroup.create(host, port, rank, world, store_timeout=60)

    def broadcast(self, tensor, src: int, stream=None):
        return self.pg.broadcast(tensor, src)

    def destroy(self) -> None:
        self.pg = None


def _producer(iterator, group, src, post_iter_func, buffer_size_bytes=0, num_buffers=0):
    for item in iterator:
        group.broadcast(post_iter_func(item).contiguous(), src)


def _consumer(iterator, group, src, post_unpack_func, buffer_size_bytes=0, num_buffers=0, device=None):
    for name, (shape, dtype) in iterator:
        t = group.broadcast(None, src)
        assert t.dtype == dtype and list(t.shape) == list(shape), (name, t.dtype, t.shape, dtype, shape)
        post_unpack_func([(name, t.to(device) if device is not None else t)])


def worker_group(init_info, parallel_config) -> CPUGroup:
    """vLLM's worker_init_process_group, ranks as it computes them (data-parallel replicas, then the worker's rank)."""
    rank = (parallel_config.data_parallel_index * parallel_config.world_size + parallel_config.rank
            + init_info.rank_offset)
    return CPUGroup(init_info.master_address, init_info.master_port, rank, init_info.world_size)


def patch(monkeypatch) -> None:
    import vllm.distributed.weight_transfer.nccl_engine as engine

    monkeypatch.setattr(engine, "open_trainer_endpoint",
                        lambda info: CPUGroup(info.master_address, info.master_port, 0, info.world_size))
    monkeypatch.setattr(engine, "worker_init_process_group", worker_group)
    monkeypatch.setattr(engine, "packed_nccl_broadcast_producer", _producer)
    monkeypatch.setattr(engine, "packed_nccl_broadcast_consumer", _consumer)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *args, **kwargs: None)
