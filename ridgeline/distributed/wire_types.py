"""Every type a distributed engine's processes send each other (wire.py decodes only these): the
step plan and what it carries, the last pipeline stage's answer, the start-up facts the ranks
gather, the pipeline's counters, and what rank 0 hands a worker it starts (its config and place)."""
from __future__ import annotations

from ridgeline import config
from ridgeline.distributed.group import RankContext
from ridgeline.distributed.layout import RankShard
from ridgeline.distributed.pipeline_stats import StageStats
from ridgeline.distributed.stages import Stage
from ridgeline.distributed.wire import wire_type
from ridgeline.step_plan import TierCopies
from ridgeline.sampling_params import SamplingParams
from ridgeline.runner.draft import Draft
from ridgeline.step_plan import PromptLogprobs, SampledSeq, ScheduledSeq, StepPlan

for _cls in (StepPlan, ScheduledSeq, TierCopies, Draft, SampledSeq, PromptLogprobs, RankShard, Stage, StageStats,
             RankContext, config.EngineConfig, config.ModelConfig, config.CacheConfig, config.SchedulerConfig,
             config.SpeculativeConfig, config.ParallelConfig, config.LoRAConfig):
    wire_type(_cls)
wire_type(SamplingParams, cached=True)  # one per request, the same every step: built once per value
