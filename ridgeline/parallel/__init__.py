"""Parallelism inside one model over torch.distributed process groups (gloo on CPU, NCCL on CUDA).
Expert parallelism: expert_placement (which rank owns which experts), expert_compute (a rank's
share of a sparse layer: routing, its experts, combine), expert_dispatch (the token exchange),
expert_group (the process group the engine builds sparse layers with)."""
