"""What the NVIDIA driver changes in a serving engine's CUDA-graph memory.

Captured CUDA graphs hold driver memory of their own, besides the tensors of the graph pool.
Drivers before R550 (the CUDA 12.4 driver) hold about 3.35 times as much for the same graphs.
vLLM's issue #5517 measured it by reinstalling only the driver (toolkit kept at 12.1) on an
A10G and an L4: 3.8086 / 3.8086 / 1.1367 GiB and 3.7891 / 3.7891 / 1.1367 GiB of graph
memory with the CUDA 12.2.2 / 12.3.2 / 12.4.1 drivers (ratios 3.35 and 3.33). A vLLM 0.19.1
launch on an A100 40GB with driver 535.247.01 (research/data/engine_logs.json, tokenkaki)
took 2.44 GiB of graph memory, which vLLM's own estimate put at 2.35 GiB; the graph rule
fitted on current drivers counts 0.79 GiB, 2.64 GiB with this factor. One machine's logs
(github.com/xlisp/jimw-vllm, vLLM 0.6.4.post1, facebook/opt-125m at its defaults on an 8 GB
GTX 1080, the same day) took 0.39 GiB under driver 535.183.01 (quickstart.py) and 0.12 GiB
under 560.35.05 (ubuntu2404_560_12_6_vllm.py): 3.25x, with the OS and Python environment
reinstalled between them.

R535 is a long-term branch still common on cloud images, and it runs CUDA 12.x builds of
torch through CUDA's minor-version compatibility, so the case is not historical."""

from __future__ import annotations

from ..result import StackBehaviour
from ..stack import version_tuple

__all__ = [
    "OLD_DRIVER_BELOW",
    "OLD_DRIVER_EXAMPLE",
    "OLD_DRIVER_GRAPH_FACTOR",
    "graph_driver_behaviour",
    "graph_driver_factor",
]

OLD_DRIVER_BELOW = 550
"""The first driver branch with the smaller graph memory: R550, CUDA 12.4's driver."""

OLD_DRIVER_EXAMPLE = "535"
"""The driver an answer counts with where it says what a driver before R550 would change: R535,
the long-term branch before it."""

OLD_DRIVER_GRAPH_FACTOR = 3.35
"""Graph memory before R550 over graph memory from R550 (vLLM #5517: 3.8086 / 1.1367 on an
A10G, 3.7891 / 1.1367 on an L4; the larger ratio, rounded)."""

GRAPH_DRIVER_SOURCE = (
    "vLLM issue #5517 (driver reinstalled, toolkit unchanged: A10G 3.81 -> 1.14 GiB, L4 "
    "3.79 -> 1.14 GiB of graph memory from the CUDA 12.3.2 to the 12.4.1 driver); checked on "
    "a vLLM 0.19.1 A100 launch with driver 535 (research/data/engine_logs.json) and one "
    "machine's vLLM 0.6.4 logs under drivers 535 and 560 (xlisp/jimw-vllm: 0.39 -> 0.12 GiB)"
)


def graph_driver_factor(driver: str | None, vendor: str | None = "nvidia") -> float:
    """How many times the fitted graph memory the driver takes: 3.35 for an NVIDIA driver
    named below R550, 1 otherwise (a driver not named is taken as current, and AMD's
    runtime is not NVIDIA's driver)."""
    if driver is None or vendor == "amd":
        return 1.0
    v = version_tuple(driver)
    return OLD_DRIVER_GRAPH_FACTOR if v and v[0] < OLD_DRIVER_BELOW else 1.0


def graph_driver_behaviour(
    driver: str | None,
    factor: float = 1.0,
    scaled: bool = True,
    unnamed: tuple[str, int, str | None] | None = None,
) -> StackBehaviour:
    """The answer's ``cuda_graph_driver`` behaviour: what the budget assumed of the driver, for
    an engine whose graphs the factor scales (vLLM), or, ``scaled`` False, one whose graph
    memory is a reserve the factor does not scale (SGLang; said only for an old driver).
    ``unnamed``: for a driver not named, the build (its words), the oldest driver it runs on,
    and, where that is before R550, what such a driver would change here (words)."""
    return StackBehaviour(
        name="cuda_graph_driver",
        assumed=_words(driver, factor, unnamed) if scaled else _unscaled_words(driver),
        source=GRAPH_DRIVER_SOURCE,
    )


def _words(
    driver: str | None, factor: float, unnamed: tuple[str, int, str | None] | None = None
) -> str:
    if driver is None and unnamed is not None:
        build, minimum, shift = unnamed
        if minimum >= OLD_DRIVER_BELOW:
            return (
                f"the NVIDIA driver is not named; {build} needs driver {minimum} or later, so "
                f"R{OLD_DRIVER_BELOW} or later: CUDA-graph memory as fitted on current drivers"
                + (
                    " (a CUDA 12.x install of the engine: name software.cuda_version)"
                    if build.startswith("this CUDA")
                    else ""
                )
            )
        return (
            "the NVIDIA driver is taken as R550 or later (not named): CUDA-graph memory as "
            f"fitted on current drivers; {build} also runs on drivers from {minimum}, and one "
            f"before R{OLD_DRIVER_BELOW} takes about {OLD_DRIVER_GRAPH_FACTOR}x as much"
            + (f": {shift}" if shift else "")
            + " (name the driver in software.driver_version)"
        )
    if driver is None:
        return (
            "the NVIDIA driver is R550 or later (not named): CUDA-graph memory as fitted on "
            f"current drivers; a driver before R550 takes about {OLD_DRIVER_GRAPH_FACTOR}x "
            "as much (name it in software.driver_version)"
        )
    if factor == 1.0:
        return f"driver {driver}: CUDA-graph memory as fitted on current drivers"
    return (
        f"driver {driver} is older than R{OLD_DRIVER_BELOW}: its CUDA graphs take "
        f"{OLD_DRIVER_GRAPH_FACTOR}x the memory they take on R{OLD_DRIVER_BELOW} and later"
    )


def _unscaled_words(driver: str | None) -> str:
    return (
        f"driver {driver} is older than R{OLD_DRIVER_BELOW}, where vLLM's CUDA graphs take "
        f"{OLD_DRIVER_GRAPH_FACTOR}x the memory; SGLang's graph memory here is its own reserve "
        "per captured batch size, not scaled for the driver: allow for more outside the pool"
    )
