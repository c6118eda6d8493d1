"""Tensor and pipeline parallelism over torch.distributed: the sharding rules (layout.py, torch-free,
shared with the advisor), slicing checkpoint tensors per rank (shard.py), the collectives a step needs
(comm.py), pipeline stages (stages.py, torch-free; pipeline.py), process groups and launching
(group.py, launch.py, runtime.py), and rank 0's plan broadcast (follow.py)."""
