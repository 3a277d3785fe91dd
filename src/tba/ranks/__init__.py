"""A trainer of N ranks (trainer.world_size > 1): the policy, its gradients and Adam's moments sharded with FSDP2
over N ordinary ranks, driven by the run's controller, which holds no model on a training device.

    controller.py   the controller's handle on the ranks: what the loop calls a trainer (update, publish, save)
    rank.py         one rank: its shard, its share of each update, the commands it carries out
    fsdp.py         FSDP2 over the policy: sharding, whole tensors gathered in buckets, the optimizer state (DCP)
    local.py        the ranks as processes of this machine (runtime=local, offline)
    ray.py          the ranks as Ray actors of one placement group, on one node or several (runtime=ray)

A rank never knows about searchers and a searcher never knows how many ranks trained the weights it loads: the
controller publishes from a host-memory copy through the runtime's transports (tba.runtime.transport).
"""
