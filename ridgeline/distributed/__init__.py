"""Tensor parallelism over torch.distributed: the sharding rules (layout.py, torch-free, shared with
the advisor), slicing checkpoint tensors per rank (shard.py), the collectives a step needs (comm.py),
process groups and launching (group.py, launch.py), and rank 0's plan broadcast (follow.py)."""
