"""The training and software-stack flags of ``vrambudget estimate`` and ``vrambudget fit``
(vrambudget/cli/workload_args.py): each sets the request field it names, so the flags give the
same answer as the request written out; the text answer names the stack it assumed; misuse is
one line naming the flag."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.support.workloads import LLAMA_PROJECTIONS
from vrambudget.cli.errors import EXIT_FITS, EXIT_INPUT
from vrambudget.cli.main import main

QLORA_FLAGS = [
    "--model",
    "llama-3.1-8b",
    "--kind",
    "training",
    "--batch",
    "2",
    "--prompt",
    "2048",
    "--checkpointing",
    "full",
    "--finetune",
    "qlora",
    "--lora-rank",
    "64",
    "--lora-targets",
    ",".join(LLAMA_PROJECTIONS),
    "--optimizer",
    "adamw_8bit",
    "--grad-accum",
    "4",
    "--attention",
    "sdpa",
    "--framework",
    "axolotl==0.9.1",
    "--library",
    "peft==0.15.2",
    "--library",
    "bitsandbytes==0.45.4",
    "--torch",
    "2.6.0",
    "--cuda",
    "12.4",
    "--gpu",
    "rtx-4090-24gb",
]

QLORA_REQUEST: dict[str, Any] = {
    "workloads": [
        {
            "kind": "training",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "micro_batch_size": 2,
            "sequence_length": 2048,
            "checkpointing": "full",
            "gradient_accumulation_steps": 4,
            "attention": "sdpa",
            "optimizer": {"name": "adamw_8bit"},
            "method": {
                "kind": "qlora",
                "rank": 64,
                "target_modules": list(LLAMA_PROJECTIONS),
            },
        }
    ],
    "device": {"source": "catalog", "id": "rtx-4090-24gb"},
    "software": {
        "framework": "axolotl",
        "framework_version": "0.9.1",
        "libraries": {"peft": "0.15.2", "bitsandbytes": "0.45.4"},
        "torch_version": "2.6.0",
        "cuda_version": "12.4",
    },
}


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == EXIT_FITS
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_training_and_stack_flags_make_the_same_request_as_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_flags = _json(["estimate", *QLORA_FLAGS], capsys)
    f = tmp_path / "qlora.json"
    f.write_text(json.dumps(QLORA_REQUEST))
    assert _json(["estimate", "--file", str(f)], capsys) == by_flags
    stack = by_flags["stack"]
    assert (stack["framework"], stack["framework_version"], stack["torch_version"]) == (
        "axolotl",
        "0.9.1",
        "2.6.0",
    )
    # what the flags say reached the workload: rank 64 on all seven projections of 32 layers
    # (A: 64 x in, B: out x 64, fp32): (q 4096x4096, k/v 1024x4096, o 4096x4096, gate/up
    # 14336x4096, down 4096x14336) -> 64 x (8192 + 5120 x 2 + 8192 + 18432 x 3) per layer
    lines = {x["component"]: x["bytes"] for x in by_flags["devices"][0]["lines"]}
    per_layer = 64 * (8192 + 5120 * 2 + 8192 + 18432 * 3)
    assert lines["adapters"] == 32 * per_layer * 4 == 671_088_640


def test_all_linear_is_the_seven_projections_of_a_llama(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--lora-targets all-linear`` (PEFT's shorthand) sends ``["all-linear"]``: on Llama 3.1
    8B the same budget as the seven projections named one by one."""
    argv = list(QLORA_FLAGS)
    argv[argv.index("--lora-targets") + 1] = "all-linear"
    by_shorthand = _json(["estimate", *argv], capsys)
    assert by_shorthand["devices"] == _json(["estimate", *QLORA_FLAGS], capsys)["devices"]


def test_modules_to_save_reaches_the_method(capsys: pytest.CaptureFixture[str]) -> None:
    """``--modules-to-save embed_tokens,lm_head`` is the request's ``method.modules_to_save``:
    on Llama 3.1 8B QLoRA under axolotl 0.9.1 (which casts the embeddings and LM head back to
    bf16 after PEFT's fp32 upcast: the stack's qlora_unquantized_dtype) two bf16 copies of
    128,256 x 4,096."""
    argv = ["a100-sxm4-80gb" if a == "rtx-4090-24gb" else a for a in QLORA_FLAGS]  # it fits
    plain = _json(["estimate", *argv], capsys)
    saved = _json(["estimate", *argv, "--modules-to-save", "embed_tokens,lm_head"], capsys)

    def adapters(answer: dict[str, Any]) -> int:
        lines = {x["component"]: x["bytes"] for x in answer["devices"][0]["lines"]}
        return int(lines["adapters"])

    assert adapters(saved) - adapters(plain) == 2 * 128_256 * 4096 * 2


def test_fit_takes_the_same_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a for a in QLORA_FLAGS if a != "rtx-4090-24gb" and a != "--gpu"]
    by_flags = _json(["fit", *argv, "--gpu", "rtx-4090-24gb,l40s-48gb"], capsys)
    body = {k: v for k, v in QLORA_REQUEST.items() if k != "device"}
    body["devices"] = [
        {"source": "catalog", "id": "rtx-4090-24gb"},
        {"source": "catalog", "id": "l40s-48gb"},
    ]
    f = tmp_path / "fit.json"
    f.write_text(json.dumps(body))
    assert _json(["fit", "--file", str(f)], capsys) == by_flags


def _qwen_file(tmp_path: Path, **fields: Any) -> str:
    """A request for Qwen2.5 7B inference at the defaults, with ``fields``, as a file."""
    f = tmp_path / "request.json"
    model = {"source": "preset", "id": "qwen2.5-7b"}
    f.write_text(json.dumps({"workloads": [{"kind": "inference", "model": model}], **fields}))
    return str(f)


def test_headroom_flag_is_the_request_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--headroom 0`` budgets no headroom, as ``headroom.fraction: 0`` does; the default is
    the band's high end, which here is above the estimate: more headroom."""
    flags = ["estimate", "--model", "qwen2.5-7b", "--gpu", "l4-24gb"]
    zero = _json([*flags, "--headroom", "0"], capsys)
    f = _qwen_file(
        tmp_path, device={"source": "catalog", "id": "l4-24gb"}, headroom={"fraction": 0.0}
    )
    assert _json(["estimate", "--file", f], capsys) == zero
    lines = {x["component"]: x["bytes"] for x in zero["devices"][0]["lines"]}
    assert lines["headroom"] == 0
    default = _json(flags, capsys)
    assert default["total_bytes"] > zero["total_bytes"]


def test_fit_memory_in_use_is_each_devices_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fit --memory-in-use 2`` is ``memory_in_use_bytes`` = 2 GiB on every ``--gpu``: the
    free memory of the same layout is 2 GiB less."""
    flags = ["fit", "--model", "qwen2.5-7b", "--gpu", "l4-24gb,rtx-4090-24gb"]
    held = _json([*flags, "--memory-in-use", "2"], capsys)
    devices = [
        {"source": "catalog", "id": g, "memory_in_use_bytes": 2 << 30}
        for g in ("l4-24gb", "rtx-4090-24gb")
    ]
    assert _json(["fit", "--file", _qwen_file(tmp_path, devices=devices)], capsys) == held
    bare = _json(flags, capsys)
    for a, b in zip(held["gpus"], bare["gpus"], strict=True):
        assert a["layouts"][0]["free_bytes"] == b["layouts"][0]["free_bytes"] - (2 << 30)
    assert main(["fit", "--model", "qwen2.5-7b", "--memory-in-use", "2"]) == EXIT_INPUT
    assert "--memory-in-use needs --gpu" in capsys.readouterr().err
    assert main([*flags, "--memory-in-use", "-1"]) == EXIT_INPUT
    assert "(--memory-in-use)" in capsys.readouterr().err


def test_the_text_answer_names_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *QLORA_FLAGS]) == EXIT_FITS
    out = capsys.readouterr().out
    stack = next(line for line in out.splitlines() if line.startswith("  stack: "))
    assert stack.startswith("  stack: axolotl 0.9.1, torch 2.6.0; behaviours assumed: ")
    assert "qlora_unquantized_dtype" in stack and "allocator_segments" in stack


def _fragmentation(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    budget = _json(argv, capsys)
    lines = {x["component"]: x for x in budget["devices"][0]["lines"]}
    parts = {p["name"]: p["bytes"] for p in lines["allocator_overhead"]["parts"]}
    return int(parts["fragmentation of transient memory"])


def test_expandable_segments_flag_switches_the_fragmentation_fraction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Axolotl 0.9.1 with torch 2.6 turns expandable segments on by itself; the flag's two
    forms name the setting either way, and the fragmentation part follows: full
    checkpointing's fraction of the largest transient is 0.26 with fixed segments and 0.20
    with expandable ones (ACCURACY.md, "expandable segments"). The largest transient, by
    hand: 2 x 2,048 = 4,096 rows at the start of backward hold the fp32 log-softmax, the
    loss gradient and the log-softmax input gradient (3 x 4,096 x 128,256 x 4 B), the 32
    layers' bf16 inputs kept by full recomputation (32 x 4,096 x 4,096 x 2 B) and the final
    norm's fp32 and the LM head's bf16 inputs (4,096 x 4,096 x 6 B)."""
    transient = 3 * 4096 * 128256 * 4 + 32 * 4096 * 4096 * 2 + 4096 * 4096 * 6
    assert transient == 7_478_444_032
    default = _fragmentation(["estimate", *QLORA_FLAGS], capsys)
    on = _fragmentation(["estimate", *QLORA_FLAGS, "--expandable-segments"], capsys)
    off = _fragmentation(["estimate", *QLORA_FLAGS, "--no-expandable-segments"], capsys)
    assert default == on == math.ceil(transient * 0.20) == 1_495_688_807
    assert off == math.ceil(transient * 0.26) == 1_944_395_449


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--finetune", "lora"], "error: --finetune: applies to --kind training only"),
        (
            ["--optimizer", "sgd", "--grad-accum", "2"],
            "error: --optimizer, --grad-accum: apply to --kind training only",
        ),
        (
            ["--kind", "training", "--lora-rank", "8"],
            "error: --lora-rank / --lora-targets / --modules-to-save need --finetune lora or qlora",
        ),
        (
            ["--kind", "training", "--modules-to-save", "lm_head"],
            "error: --lora-rank / --lora-targets / --modules-to-save need --finetune lora or qlora",
        ),
        (
            ["--kind", "training", "--finetune", "lora", "--lora-rank", "0"],
            "error: workloads[0].method.rank (--lora-rank): Expected `int` >= 1; allowed "
            "range: 1 .. 65536",
        ),
        (
            ["--kind", "training", "--finetune", "lora", "--lora-targets", "all-linear,q_proj"],
            "error: --lora-targets: all-linear stands alone (every projection already)",
        ),
        (
            ["--kind", "training", "--library", "bogus==1"],
            "error: --library bogus==1: allowed names: transformers, peft, trl, accelerate, "
            "bitsandbytes, deepspeed, flash_attn, liger_kernel",
        ),
        (
            ["--library", "peft"],
            "error: --library peft: give NAME==VERSION, e.g. peft==0.13.2",
        ),
        (
            ["--framework", "vllm"],
            "error: --framework vllm (a serving engine is --kind llm_serving --engine): "
            "allowed: transformers, torchtune, litgpt, deepspeed, fsdp, unsloth, axolotl",
        ),
        (["--framework", "foo==1"], "error: --framework foo==1: allowed: transformers"),
        (
            ["--torch", "two"],
            "error: software.torch_version (--torch): Expected `str` matching regex",
        ),
        (
            ["--kind", "llm_serving", "--no-expandable-segments"],
            "error: --no-expandable-segments: not for --kind llm_serving",
        ),
        (
            ["--kind", "llm_serving", "--finetune", "lora"],
            "error: --finetune: applies to --kind training only",
        ),
        (
            ["--file", "w.json", "--framework", "axolotl", "--finetune", "lora"],
            "error: --file is the whole request: drop --finetune, --framework",
        ),
        (
            ["--headroom", "1.5"],
            "error: headroom.fraction (--headroom): Expected `float` <= 0.9; allowed range: "
            "0.0 .. 0.9",
        ),
    ],
)
def test_misuse_names_the_flag(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = [] if "--file" in argv else ["--model", "llama-3.1-8b"]
    assert main(["estimate", *model, *argv]) == EXIT_INPUT
    captured = capsys.readouterr()
    assert captured.err.startswith(expected), captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_driver_flag_reaches_vllms_graphs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--driver` sets `software.driver_version`: the same answer as the request written out,
    and a driver before R550 counts vLLM's CUDA graphs at 3.35x (docs/SERVING.md)."""
    flags = ["--model", "qwen3-8b", "--kind", "llm_serving", "--engine-version", "0.19.1"]
    flags += ["--gpu", "a100-sxm4-40gb"]
    old = _json(["estimate", *flags, "--driver", "535.247.01"], capsys)
    plain = _json(["estimate", *flags], capsys)
    f = tmp_path / "serve.json"
    f.write_text(
        json.dumps(
            {
                "workloads": [
                    {
                        "kind": "llm_serving",
                        "model": {"source": "preset", "id": "qwen3-8b"},
                        "engine_version": "0.19.1",
                    }
                ],
                "device": {"source": "catalog", "id": "a100-sxm4-40gb"},
                "software": {"driver_version": "535.247.01"},
            }
        )
    )
    assert _json(["estimate", "--file", str(f)], capsys) == old

    def graphs(answer: dict[str, Any]) -> int:
        line = next(
            x for x in answer["devices"][0]["lines"] if x["component"] == "runtime_workspace"
        )
        return int(line["bytes"])

    assert graphs(old) == round(graphs(plain) * 3.35)


def test_driver_and_cuda_with_a_serving_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--cuda` and `--driver` apply to --kind llm_serving (the compatibility checks read the
    build beside the driver: vLLM 0.26 pins torch 2.11 whose PyPI build is CUDA 13.0, which
    driver 535 cannot run, but a CUDA 12.9 build it can); `--driver` with `--file` is refused
    like the other request flags; `--torch` stays refused for an engine."""
    flags = ["--model", "llama-3.1-8b", "--kind", "llm_serving", "--engine-version", "0.26.0"]
    flags += ["--gpu", "a100-sxm4-40gb", "--driver", "535.247.01"]
    pinned = _json(["estimate", *flags], capsys)
    assert pinned["compatibility"]["verdict"] == "unsupported"
    built = _json(["estimate", *flags, "--cuda", "12.9"], capsys)
    assert built["compatibility"]["verdict"] == "supported"
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"workloads": [{"kind": "inference", "model": "x"}]}))
    assert main(["estimate", "--file", str(f), "--driver", "535.247.01"]) == EXIT_INPUT
    assert "--driver" in capsys.readouterr().err
    assert main(["estimate", *flags, "--torch", "2.9.0"]) == EXIT_INPUT
    assert "--torch" in capsys.readouterr().err
