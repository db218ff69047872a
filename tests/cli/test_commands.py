"""The command line as a user meets it (vrambudget/cli/): help on every flag, the exit status
that says whether a budget fits, errors that name the flag and what it allows, the ``fit``,
``gpus`` and ``models`` commands, ``llm_serving`` flags, ``--version`` and the progress line."""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
import pytest

from vrambudget.cli.errors import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_INPUT
from vrambudget.cli.main import build_parser, main
from vrambudget.cli.progress import progress
from vrambudget.core.catalog import gpus, presets
from vrambudget.core.catalog_view import gpu_entry
from vrambudget.core.fit import fit
from vrambudget.core.spec import FitRequest

GiB = 1 << 30


def _actions(parser: argparse.ArgumentParser, name: str) -> list[tuple[str, Any]]:
    """Every (command, action) of the parser and its subcommands, subcommand entries too."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            out += [(f"{name} {c.dest}", c) for c in a._choices_actions]
            for sub_name, sub in a.choices.items():
                out += _actions(sub, f"{name} {sub_name}")
        else:
            out.append((name, a))
    return out


def test_every_flag_and_command_has_help() -> None:
    actions = _actions(build_parser(), "vrambudget")
    commands = {name for name, _ in actions}
    assert {"vrambudget fit", "vrambudget gpus", "vrambudget models"} <= commands
    missing = [
        f"{name}: {a.option_strings or a.dest}"
        for name, a in actions
        if not (a.help and a.help.strip() and a.help != argparse.SUPPRESS)
    ]
    assert missing == []


def test_help_ends_with_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ([], ["estimate"], ["fit"], ["gpus"]):
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "exit status:" in out and "3  does not fit" in out, command


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"vrambudget {version('vrambudget')}\n"


def test_estimate_says_when_the_band_stops_at_the_model_s_own_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """6 GiB of assets are all of the budget: the band's low end is them, and says so; a 6 GiB
    workspace is no tensor of the model, and its band's low end is the class's ratio."""
    main(["estimate", "--file", _generic_file(tmp_path, 16 * GiB)])
    (band,) = [ln for ln in capsys.readouterr().out.splitlines() if "error band" in ln]
    assert (
        band.startswith("  error band: the real peak 6.00 GiB .. ")
        and "(the low end: the model's own tensors, which it must hold)" in band
    )
    body = json.loads(Path(_generic_file(tmp_path, 16 * GiB)).read_text())
    body["workloads"][0] = {
        "kind": "generic",
        "workspaces": [{"name": "scratch", "bytes": 6 * GiB}],
        "uses_cuda_context": False,
    }
    f = tmp_path / "workspace.json"
    f.write_text(json.dumps(body))
    main(["estimate", "--file", str(f)])
    (band,) = [ln for ln in capsys.readouterr().out.splitlines() if "error band" in ln]
    assert "own tensors" not in band and not band.startswith("  error band: the real peak 6.00")


def _generic_file(tmp_path: Path, capacity: int) -> str:
    """6 GiB of assets, no CUDA context, no headroom, on a custom device."""
    body = {
        "workloads": [
            {
                "kind": "generic",
                "assets": [{"name": "scene", "bytes": 6 * GiB}],
                "uses_cuda_context": False,
            }
        ],
        "device": {"source": "custom", "name": "box", "memory_total_bytes": capacity},
        "headroom": {"fraction": 0, "min_bytes": 0},
    }
    f = tmp_path / f"w{capacity}.json"
    f.write_text(json.dumps(body))
    return str(f)


def test_estimate_says_the_verdict_and_exits_by_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--file", _generic_file(tmp_path, 5 * GiB)]) == EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    # 6 GiB used on 5 GiB: 1 GiB missing.
    assert out.rstrip().splitlines()[-1] == (
        "DOES NOT FIT box (5.00 GiB): needs 6.00 GiB, 1.00 GiB missing"
    )
    assert main(["estimate", "--file", _generic_file(tmp_path, 16 * GiB)]) == EXIT_FITS
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == (
        "FITS box (16.00 GiB): uses 6.00 GiB, 10.00 GiB free"
    )
    # 6.5 GiB: the total fits, the error band's high end (above 6.5 GiB for this class) does not.
    assert main(["estimate", "--file", _generic_file(tmp_path, 13 * GiB // 2)]) == EXIT_FITS
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("FITS box (6.50 GiB): uses 6.00 GiB, 512.00 MiB free; the error band")
    # --json: the same exit status, the answer's fit in the JSON
    assert (
        main(["estimate", "--file", _generic_file(tmp_path, 5 * GiB), "--json"])
        == EXIT_DOES_NOT_FIT
    )
    answer = json.loads(capsys.readouterr().out)
    assert answer["fit"]["missing_bytes"] == GiB and answer["fit"]["fits"] is False
    # No device: nothing to fit, exit 0, no verdict line.
    assert main(["estimate", "--model", "qwen2.5-0.5b"]) == EXIT_FITS
    assert "FIT" not in capsys.readouterr().out


def test_flashinfer_sampler_flag_is_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    """``--flashinfer-sampler`` sets ``flashinfer_sampler``: the launch carries the variable."""
    flags = [
        "estimate", "--kind", "llm_serving", "--model", "qwen2.5-7b", "--engine-version",
        "0.10.1", "--gpu", "a100-sxm4-80gb", "--json",
    ]  # fmt: skip
    main(flags)
    plain = json.loads(capsys.readouterr().out)["serving"]
    main([*flags, "--flashinfer-sampler"])
    named = json.loads(capsys.readouterr().out)["serving"]
    assert named["launch"].startswith("VLLM_USE_FLASHINFER_SAMPLER=1 vllm serve ")
    assert named["kv_cache_tokens"] > plain["kv_cache_tokens"]


def test_gpu_names_the_device_of_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _generic_file(tmp_path, 5 * GiB)  # a custom 5 GiB device in the file
    assert main(["estimate", "--file", path]) == EXIT_DOES_NOT_FIT
    capsys.readouterr()
    assert main(["estimate", "--file", path, "--gpu", "l4-24gb"]) == EXIT_FITS
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == (
        "FITS NVIDIA L4 24GB (21.95 GiB): uses 6.00 GiB, 15.95 GiB free"
    )


def test_serving_flags_make_the_same_request_as_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The llm_serving flags set the fields of docs/API.md's serving example: the same
    answer as the request written out."""
    flags = [
        "estimate",
        "--kind",
        "llm_serving",
        "--model",
        "llama-3.1-8b",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.9",
        "--engine-version",
        "0.19.0",
        "--gpu",
        "h100-sxm5-80gb",
    ]
    assert main(flags) == EXIT_FITS
    out = capsys.readouterr().out
    assert "443,600 tokens; max concurrency 54.1504 at 8,192 tokens per request" in out
    assert out.rstrip().splitlines()[-1].startswith("FITS NVIDIA H100 SXM5 80GB (79.20 GiB)")
    assert main([*flags, "--json"]) == EXIT_FITS
    by_flags = json.loads(capsys.readouterr().out)
    f = tmp_path / "serving.json"
    f.write_text(
        json.dumps(
            {
                "workloads": [
                    {
                        "kind": "llm_serving",
                        "model": {"source": "preset", "id": "llama-3.1-8b"},
                        "max_model_len": 8192,
                        "gpu_memory_utilization": 0.9,
                        "engine_version": "0.19.0",
                    }
                ],
                "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
            }
        )
    )
    assert main(["estimate", "--file", str(f), "--json"]) == EXIT_FITS
    assert json.loads(capsys.readouterr().out) == by_flags


def test_gguf_flags(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["estimate", "--kind", "llm_serving", "--engine", "llama_cpp", "--model"]
    rest = ["--file-type", "Q8_0", "--n-ctx", "4096", "--gpu", "l4-24gb", "--json"]
    rc = main([*flags, "llama-3.1-8b", *rest])
    assert rc == EXIT_FITS
    answer = json.loads(capsys.readouterr().out)
    assert answer["serving"]["details"]["file_type"] == "Q8_0"
    assert answer["serving"]["details"]["n_ctx"] == 4096


def test_a_serving_budget_that_does_not_start_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "estimate",
            "--kind",
            "llm_serving",
            "--model",
            "llama-3.1-70b",
            "--max-model-len",
            "8192",
            "--gpu",
            "l4-24gb",
        ]
    )
    assert rc == EXIT_DOES_NOT_FIT
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("DOES NOT FIT NVIDIA L4 24GB (21.95 GiB): needs ")
    assert "no available memory for the cache blocks" in last


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--model", "llama-3.1-8b", "--batch", "0"],
            "error: workloads[0].batch_size (--batch): Expected `int` >= 1; "
            "allowed range: 1 .. 16777216",
        ),
        (
            ["--kind", "llm_serving", "--model", "llama-3.1-8b", "--gpu-memory-utilization", "2"],
            "error: workloads[0].gpu_memory_utilization (--gpu-memory-utilization): Expected "
            "`float` <= 1.0; allowed range: 0.0 .. 1.0",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h100"],
            "error: device.id (--gpu): Invalid enum value 'h100'; did you mean h100-sxm5-80gb "
            "or h100-pcie-80gb or h100-nvl-94gb? `vrambudget gpus` lists all",
        ),
        (
            ["--model", "lama-3.1-8b"],
            "error: workloads[0].model.id (--model): Invalid enum value 'lama-3.1-8b'; did you "
            "mean llama-3.1-8b",
        ),
        (
            ["--model", "llama-3.1-8b", "--tp", "3"],
            "error: workloads[0].parallelism.tensor (--tp): 3 must divide the model's 32 "
            "attention heads (allowed: divisors of 32)",
        ),
        (
            ["--kind", "llm_serving", "--model", "llama-3.1-8b", "--batch", "4"],
            "error: --batch does not apply to --kind llm_serving",
        ),
        (
            ["--model", "llama-3.1-8b", "--max-model-len", "4096"],
            "error: --max-model-len applies to --kind llm_serving only",
        ),
        (
            ["--kind", "llm_serving", "--engine", "sglang", "--model", "x", "--n-ctx", "9"],
            "error: --n-ctx applies to engine llama_cpp / ollama, not sglang",
        ),
        (
            ["--kind", "llm_serving", "--model", "llama-3.1-8b", "--quant", "bnb_4bit"],
            "error: --quant bnb_4bit: for --kind llm_serving, allowed: awq, fp8, fp8_block, "
            "fp8_channel, gptq, w4a16, w8a8_int8",
        ),
        (["--batch", "2"], "error: estimate: give one of --model PRESET"),
        (
            ["--kind", "llm_serving", "--engine", "sglang", "--model", "x", "--enforce-eager"],
            "error: --enforce-eager applies to engine vllm, not sglang",
        ),
        (
            ["--kind", "llm_serving", "--engine", "ollama", "--model", "x", "--flashinfer-sampler"],
            "error: --flashinfer-sampler applies to engine vllm, not ollama",
        ),
        (
            ["--file", "w.json", "--model", "qwen2.5-7b", "--max-model-len", "5"],
            "error: --file is the whole request: drop --model, --max-model-len",
        ),
    ],
)
def test_input_errors_name_the_flag_and_what_it_allows(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", *argv]) == EXIT_INPUT
    captured = capsys.readouterr()
    assert captured.err.startswith(expected), captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.out == ""


def test_a_bad_choice_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["estimate", "--model", "llama-3.1-8b", "--engine", "tgi"])
    assert done.value.code == EXIT_INPUT
    err = capsys.readouterr().err
    assert "invalid choice: 'tgi' (choose from 'vllm', 'sglang', 'llama_cpp', 'ollama')" in err


def _rows(out: str) -> dict[tuple[str, str], list[str]]:
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:4] == ["gpu", "GiB", "n", "verdict"]
    rows = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = line.split(None, 3)
        rows[(cells[0], cells[2])] = line.split()
    return rows


def test_fit_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "fit",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "h100-sxm5-80gb,l40s-48gb",
        "--counts",
        "1,2,4",
    ]
    assert main(argv) == EXIT_FITS
    out = capsys.readouterr().out
    assert main([*argv, "--json"]) == EXIT_FITS
    answer = json.loads(capsys.readouterr().out)
    expected = fit(
        msgspec.convert(
            {
                "workloads": [
                    {"kind": "inference", "model": {"source": "preset", "id": "llama-3.1-70b"}}
                ],
                "devices": [
                    {"source": "catalog", "id": "h100-sxm5-80gb"},
                    {"source": "catalog", "id": "l40s-48gb"},
                ],
                "device_counts": [1, 2, 4],
            },
            FitRequest,
        )
    )
    assert answer == json.loads(msgspec.json.encode(expected))
    rows = _rows(out)
    # Smallest GPU first; every layout that fits (or only if low), and each GPU's first.
    assert list(rows) == [
        ("l40s-48gb", "1"),
        ("l40s-48gb", "4"),
        ("h100-sxm5-80gb", "1"),
        ("h100-sxm5-80gb", "2"),
        ("h100-sxm5-80gb", "4"),
    ]
    for g in expected.gpus:
        for lay in g.layouts:
            row = rows.get((g.gpu_id or "", str(lay.device_count)))
            if row is None:
                assert not lay.fits
                continue
            # the fit table's words: "fits" only when the total with headroom fits
            words = {
                "fits": ["fits"] if lay.fits else ["does", "not", "fit"],
                "fits_if_low": ["only", "if", "low"],
                "does_not_fit": ["does", "not", "fit"],
            }[lay.verdict]
            assert row[3 : 3 + len(words)] == words
            used = f"{lay.total_bytes / GiB:.2f}"
            assert used in row and f"{lay.free_bytes / GiB:.2f}" in row
            assert lay.limiting_component.value in row
            assert str(g.min_device_count) in row


def test_fit_exits_3_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fit", "--model", "llama-3.1-405b", "--gpu", "l4-24gb", "--max-device-count", "2"]
    assert main(argv) == EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    assert _rows(out)[("l4-24gb", "1")][3:6] == ["does", "not", "fit"]
    assert "does not fit on any layout of up to 2 devices" in out


def test_fit_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--model", "llama-3.1-8b", "--counts", "0"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: device_counts[0]: Expected `int` >= 1; allowed range: 1 .. ")


def test_gpus_filters_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--vendor", "amd", "--min-memory", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = sorted(
        (g for g in gpus().values() if g.vendor == "amd" and g.memory_total_bytes >= 60 * GiB),
        key=lambda g: (g.memory_total_bytes, g.id),
    )
    assert len(expected) >= 2
    assert [line.split()[0] for line in lines[1:]] == [g.id for g in expected]
    assert main(["gpus", "--search", "H100", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {g["id"] for g in listed} == {i for i in gpus() if "h100" in i}
    # the service's entry (citations, no research notes), as GET /v1/gpus/{id} answers it
    assert listed[0] == json.loads(msgspec.json.encode(gpu_entry(gpus()[listed[0]["id"]])))
    assert "notes" not in listed[0] and "title" in listed[0]["memory_total_source"]


def test_models_filters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--search", "qwen", "--max-params", "2"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert ids and set(ids) <= {i for i in presets() if "qwen" in i}
    assert main(["models", "--search", "qwen2.5-0.5b", "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)
    assert m["id"] == "qwen2.5-0.5b" and m["num_layers"] == 24


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_only() -> None:
    tty = _Terminal()
    with progress("tracing", tty):
        time.sleep(1.2)  # drawn every 0.5 s
    text = tty.getvalue()
    assert re.fullmatch(
        r"(\r\x1b\[2Kvrambudget: tracing \.\.\. [0-9]+\.[0-9] s)+\r\x1b\[2K", text
    ), text
    # first drawn after INTERVAL_S, not at once
    assert re.match(r"\r\x1b\[2Kvrambudget: tracing \.\.\. (0\.[5-9]|[1-9]\.[0-9]) s", text)
    quick = _Terminal()
    with progress("resolving", quick):
        pass
    assert quick.getvalue() == ""  # a quick step leaves no trace
    pipe = io.StringIO()
    with progress("tracing", pipe):
        time.sleep(0.6)
    assert pipe.getvalue() == ""


def test_progress_is_cleared_when_the_step_fails() -> None:
    tty = _Terminal()
    with pytest.raises(RuntimeError), progress("resolving", tty):
        time.sleep(0.6)
        raise RuntimeError("boom")
    assert tty.getvalue().startswith("\r\x1b[2Kvrambudget: resolving ... 0.")
    assert tty.getvalue().endswith("\r\x1b[2K")


def test_a_run_to_a_pipe_prints_nothing_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "l4-24gb"]) == EXIT_FITS
    assert capsys.readouterr().err == ""
