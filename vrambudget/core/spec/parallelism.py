"""How a workload is laid out across devices."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from . import rules
from .limits import Degree, Stages, Wire

__all__ = ["Parallelism"]


class Parallelism(Wire, frozen=True, kw_only=True):
    """How the workload is laid out across devices. GPUs never pool memory: budgets are per
    device."""

    tensor: Annotated[
        Degree, Meta(description="Tensor-parallel degree: devices each layer is split over.")
    ] = 1
    sequence_parallel: Annotated[
        bool, Meta(description="Megatron sequence parallelism (training activations / tensor).")
    ] = False
    pipeline: Annotated[
        Stages, Meta(description="Pipeline-parallel degree: stages the layers are cut into.")
    ] = 1
    pipeline_schedule: Annotated[
        Literal["1f1b", "gpipe", "interleaved_1f1b"],
        Meta(
            description="Training schedule, which sets the micro-batches whose activations a "
            "stage holds: `gpipe` all of them, `1f1b` up to the stages after it, "
            "`interleaved_1f1b` as 1f1b plus the interleaving overhead."
        ),
    ] = "1f1b"
    virtual_stages: Annotated[
        int, Meta(ge=1, le=1024, description="Model chunks per device (interleaved 1F1B).")
    ] = 1
    expert: Annotated[
        int, Meta(ge=1, le=1 << 16, description="Expert parallelism: routed experts sharded.")
    ] = 1
    data: Annotated[
        Degree, Meta(description="Data-parallel degree: model replicas (ZeRO shards over them).")
    ] = 1
    zero_stage: Annotated[
        Literal[0, 1, 2, 3],
        Meta(
            description="ZeRO stage over the data-parallel group (FSDP FULL_SHARD = 3, "
            "SHARD_GRAD_OP = 2)."
        ),
    ] = 0
    offload_optimizer: Annotated[
        bool, Meta(description="Optimizer states and master weights in host RAM (ZeRO-Offload).")
    ] = False
    offload_parameters: Annotated[
        bool, Meta(description="Parameters in host RAM (ZeRO-Infinity; needs zero_stage 3).")
    ] = False

    def __post_init__(self) -> None:
        rules.check(self)

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data
