"""Parallelism inside one model over torch.distributed process groups (gloo on CPU, NCCL on CUDA),
one package, one launcher (launch.py: rank 0 starts ranks 1..N-1 on one machine; torchrun across
machines):
- tensor parallelism: the sharding rules (layout.py, torch-free, shared with the advisor), slicing
  checkpoint tensors per rank (shard.py), the collectives a step needs (comm.py);
- pipeline parallelism: stages (stages.py, torch-free; pipeline.py, pipeline_stats.py);
- expert parallelism: which rank owns which experts (expert_placement.py; a rank's experts run
  through layers/expert_compute.py as any sparse layer's do), the token exchange
  (expert_dispatch.py), the process group
  sparse layers are built with (expert_group.py), expert loads (expert_load.py), its ranks'
  runtime (ep_runtime.py);
- every kind: process groups and launching (group.py, launch.py, runtime.py, worker.py), start-up
  agreement (agreement.py), rank 0's plans to the others (plan_channel.py, plan_check.py,
  follow.py) and everything ranks send each other in one codec (wire.py, wire_types.py, frames.py)."""
