"""The command line's exit codes and its error lines: what the service would answer as a 4xx
problem (the field, the message, the values or range the field allows) printed as one line
naming the flag that sets the field, never a traceback."""

from __future__ import annotations

import difflib
import sys
from typing import Any

import msgspec

__all__ = [
    "EXIT_CODES",
    "EXIT_DOES_NOT_FIT",
    "EXIT_FITS",
    "EXIT_INPUT",
    "describe",
    "report",
]

EXIT_FITS = 0
EXIT_INPUT = 2
EXIT_DOES_NOT_FIT = 3

EXIT_CODES = """exit status:
  0  done; with a device: the budget fits it (fit: at least one GPU layout fits)
  1  an unexpected error (a bug: please report it with the traceback)
  2  bad input: a flag, a file or a field out of range (the error names it and what it allows)
  3  does not fit: the budget needs more than the device has (fit: no layout fits)"""
"""The exit statuses (every subcommand's ``--help`` ends with them; docs/CLI.md)."""


def _close(value: str, field: str) -> str:
    """Near spellings of an unknown catalog id, and the command that lists them all."""
    from vrambudget.core.catalog import gpus, presets

    is_gpu = field.endswith(("device.id", "devices[0].id")) or "devices[" in field
    ids = list(gpus() if is_gpu else presets())
    near = [i for i in ids if value and value.lower() in i][:4] or difflib.get_close_matches(
        value, ids, n=4, cutoff=0.5
    )
    listing = "vrambudget gpus" if is_gpu else "vrambudget models"
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return f"{hint}`{listing}` lists all {len(ids)}"


def _flag(field: str, flags: dict[str, str]) -> str:
    last = field.rstrip("]").split(".")[-1].split("[")[0]
    if field.endswith("model.id"):
        return " (--model)"
    if field.endswith(("device.id", ".id")) and "device" in field:
        return " (--gpu)"
    flag = flags.get(last)
    return f" ({flag})" if flag else ""


def describe(
    exc: BaseException, root: Any | None = None, flags: dict[str, str] | None = None
) -> str:
    """One line for an input error: the field (and the flag that sets it) and what it allows."""
    from vrambudget.core.errors import InvalidWorkload, UnknownGPU, UnknownModel
    from vrambudget.http.problems import field_error

    flags = flags or {}
    if isinstance(exc, msgspec.ValidationError):
        e = field_error(str(exc), root)
        field = e.field.removeprefix("$.").removeprefix("$")
        text = e.message
        if text.startswith("Invalid enum value") and field.endswith(".id"):
            value = text.split("'")[1] if "'" in text else ""
            text = f"{text.split(';')[0]}; {_close(value, field)}"
        where = f"{field}{_flag(field, flags)}: " if field else ""
        return f"{where}{text}"
    if isinstance(exc, InvalidWorkload):
        field = exc.field.removeprefix("$.")
        return f"{field}{_flag(field, flags)}: {exc.message}"
    if isinstance(exc, UnknownModel):
        return f"no model preset {exc.model_id!r}; {_close(exc.model_id, 'model.id')}"
    if isinstance(exc, UnknownGPU):
        return f"no GPU {exc.gpu_id!r} in the catalog; {_close(exc.gpu_id, 'device.id')}"
    if isinstance(exc, msgspec.DecodeError):
        return f"not valid JSON: {exc}"
    return str(exc)


def report(exc: BaseException, root: Any | None = None, flags: dict[str, str] | None = None) -> int:
    """Print the error line to stderr; the exit status of bad input."""
    print(f"error: {describe(exc, root, flags)}", file=sys.stderr)
    return EXIT_INPUT
