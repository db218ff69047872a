#!/usr/bin/env python3
"""Generate the example answers in the docs from the service itself, or check that they match.

    python scripts/docs_examples.py           # rewrite every generated block in docs/ and README.md
    python scripts/docs_examples.py --check   # exit 1, naming each example whose text drifted

The request of an example lives in one place, the doc, and the answer shown is what the app
answers to exactly that request (built in-process with ``create_app()`` and Litestar's
``TestClient``; no server, no network). Markers (HTML comments, invisible when rendered):

``<!-- example-request: NAME [path=/v1/...] [method=POST] [app=agent] -->``
    followed by a fenced block: a ``curl`` command (method, path, ``-H 'Name: value'`` headers
    and the ``-d '...'`` body are read from it; a ``path=`` given as well must agree) or a JSON
    body (then ``path=`` is required). With ``body=<json>`` at the end of the marker, or
    ``method=GET`` and a ``path=``, the request is the marker itself and no block is read (for
    worked numbers in prose). ``app=agent`` sends it to a probe agent (in-process, an empty
    data directory, the token ``dev-token``) instead of the service.

``<!-- example-answer: NAME [status=200] [keep=P,P] [drop=P,P] -->`` ...
``<!-- /example-answer -->``
    replaced by a ``json`` block of the answer: the fields matched by ``keep`` (default: all)
    minus those matched by ``drop``. A path is dot-separated keys with list selectors:
    ``devices[*].lines[*].bytes``, ``gpus[0]``, ``lines[component=kv_cache]``. An answer with
    another status than ``status`` (default 200) is a drift.

``<!-- value: NAME PATH [int|gib|neg,int|raw] -->TEXT<!-- /value -->``
    one number (or string) of an answer in prose: ``int`` 27,927,487,796 (default for
    integers), ``gib`` 26.01 (GiB to two decimals), ``neg`` negates first, ``raw`` as is.

``<!-- example-cli: NAME [status=N] -->``
    followed by a ``text`` block whose first line is ``$ ... vrambudget ARGS`` (``\\``
    continuations allowed); the lines after it are what ``vrambudget ARGS`` prints, and it must
    exit with ``N`` (default 0; 3: a budget that does not fit).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = (
    "README.md",
    "docs/API.md",
    "docs/COMPONENTS.md",
    "docs/COMPARISON.md",
    "docs/AGENT.md",
    "docs/COMPATIBILITY.md",
    "docs/ACCURACY.md",
    "docs/LATENCY.md",
    "docs/PERFORMANCE.md",
    "docs/MIG.md",
    "docs/KUBERNETES.md",
    "docs/CATALOG.md",
    "docs/CLI.md",
    "docs/FIRST_HOUR.md",
    "CONTRIBUTING.md",
)
WIDTH = 100

__all__ = ["Drift", "check", "generate", "main"]

_ATTRS = re.compile(r"(\w+)=(\S+)")
_REQUEST = re.compile(r"<!--\s*example-request:\s*(?P<name>[\w.-]+)(?P<attrs>.*?)-->", re.S)
_ANSWER = re.compile(
    r"(?P<open><!--\s*example-answer:\s*(?P<name>[\w.-]+)(?P<attrs>[^>]*?)-->)"
    r"(?P<body>.*?)(?P<close><!--\s*/example-answer\s*-->)",
    re.S,
)
_VALUE = re.compile(
    r"(?P<open><!--\s*value:\s*(?P<name>[\w.-]+)\s+(?P<path>\S+)"
    r"(?:\s+(?P<fmt>[\w,]+))?\s*-->)(?P<body>.*?)(?P<close><!--\s*/value\s*-->)",
    re.S,
)
_CLI = re.compile(
    r"(?P<open><!--\s*example-cli:\s*(?P<name>[\w.-]+)(?:\s+status=(?P<status>\d+))?\s*-->\s*\n)"
    r"(?P<fence>```\w*\n)(?P<body>.*?)(?P<end>^```)",
    re.S | re.M,
)
_FENCE = re.compile(r"\s*```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)
_QUOTED = re.compile(r"^````.*?^````", re.S | re.M)
_URL = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1)(?::\d+)?(?P<path>/[^\s'\"]*)")
_DATA = re.compile(r"(?:-d|--data|--data-raw|--data-binary)\s+'(?P<body>[^']*)'", re.S)
_METHOD = re.compile(r"(?:-X|--request)\s+(?P<method>[A-Z]+)")
_HEADER = re.compile(r"(?:-H|--header)\s+'(?P<name>[\w-]+):\s*(?P<value>[^']*)'")
AGENT_TOKEN = "dev-token"


class DocError(Exception):
    """A marker the script cannot read (a broken doc, not a drift)."""


@dataclass(frozen=True)
class Request:
    name: str
    doc: str
    method: str
    path: str
    body: bytes | None
    app: str = "service"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Drift:
    """One generated text that differs from what the service answers now."""

    doc: str
    name: str
    kind: str  # "answer", "value", "cli"
    expected: str
    found: str
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        exp, got = self.expected.splitlines(), self.found.splitlines()
        first = next(
            (i for i, (a, b) in enumerate(zip(exp, got, strict=False)) if a != b),
            min(len(exp), len(got)),
        )
        want = exp[first] if first < len(exp) else "<end>"
        have = got[first] if first < len(got) else "<end>"
        return (
            f"{self.doc}: {self.kind} {self.name!r} drifted (line {first + 1}: "
            f"doc has {have.strip()[:90]!r}, service gives {want.strip()[:90]!r})"
        )


# -- paths ------------------------------------------------------------------------------------


def _parse_path(text: str) -> list[tuple[str, str]]:
    """``a.b[*].c[k=v]`` -> [("key","a"), ("key","b"), ("all",""), ("key","c"), ("where","k=v")]."""
    tokens: list[tuple[str, str]] = []
    for part in text.split("."):
        m = re.fullmatch(r"([^\[\]]*)((?:\[[^\]]*\])*)", part)
        if not m:
            raise DocError(f"bad path {text!r}")
        if m.group(1):
            tokens.append(("key", m.group(1)))
        for sel in re.findall(r"\[([^\]]*)\]", m.group(2)):
            if sel == "*":
                tokens.append(("all", ""))
            elif re.fullmatch(r"-?\d+", sel):
                tokens.append(("index", sel))
            elif "=" in sel:
                tokens.append(("where", sel))
            else:
                raise DocError(f"bad selector [{sel}] in {text!r}")
    return tokens


def _match(
    node: Any, tokens: list[tuple[str, str]], at: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if not tokens:
        yield at, node
        return
    (kind, arg), rest = tokens[0], tokens[1:]
    if kind == "key":
        if isinstance(node, dict) and arg in node:
            yield from _match(node[arg], rest, at + (arg,))
    elif isinstance(node, list):
        if kind == "all":
            for i, item in enumerate(node):
                yield from _match(item, rest, at + (i,))
        elif kind == "index":
            i = int(arg) % len(node) if node else 0
            if node:
                yield from _match(node[i], rest, at + (i,))
        else:
            key, _, want = arg.partition("=")
            for i, item in enumerate(node):
                if isinstance(item, dict) and str(item.get(key)) == want:
                    yield from _match(item, rest, at + (i,))


def _project(doc: Any, keep: Sequence[str], drop: Sequence[str]) -> Any:
    kept: set[tuple[Any, ...]] = set()
    for pattern in keep:
        found = [p for p, _ in _match(doc, _parse_path(pattern))]
        if not found:
            raise DocError(f"keep path {pattern!r} matches nothing in the answer")
        kept.update(found)
    dropped = {p for pattern in drop for p, _ in _match(doc, _parse_path(pattern))}
    prefixes = {p[:i] for p in kept for i in range(len(p))}

    def build(node: Any, at: tuple[Any, ...], whole: bool) -> Any:
        whole = whole or at in kept or not keep
        if isinstance(node, dict):
            return {
                k: build(v, at + (k,), whole)
                for k, v in node.items()
                if at + (k,) not in dropped
                and (whole or at + (k,) in prefixes or at + (k,) in kept)
            }
        if isinstance(node, list):
            return [
                build(v, at + (i,), whole)
                for i, v in enumerate(node)
                if at + (i,) not in dropped
                and (whole or at + (i,) in prefixes or at + (i,) in kept)
            ]
        return node

    return build(doc, (), False)


def _pretty(value: Any, indent: int = 0) -> str:
    """JSON with each value on one line when it fits in WIDTH columns, else one item a line."""
    flat = json.dumps(value, ensure_ascii=False)
    if indent + len(flat) <= WIDTH or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + 1
    if isinstance(value, dict):
        items = [
            f"{json.dumps(k, ensure_ascii=False)}: "
            f"{_pretty(v, inner + len(json.dumps(k, ensure_ascii=False)) + 2)}"
            for k, v in value.items()
        ]
        opening, closing = "{", "}"
    else:
        items = [_pretty(v, inner) for v in value]
        opening, closing = "[", "]"
    # items that fit on one line share lines (filled up to WIDTH); longer ones get their own
    lines: list[str] = []
    for item in items:
        if (
            lines
            and "\n" not in item
            and "\n" not in lines[-1]
            and (inner + len(lines[-1]) + 2 + len(item) + 1 <= WIDTH)
        ):
            lines[-1] += ", " + item
        else:
            lines.append(item)
    return opening + (",\n" + " " * inner).join(lines) + closing


def _format_value(value: Any, fmt: str | None) -> str:
    steps = (
        fmt or ("int" if isinstance(value, int) and not isinstance(value, bool) else "raw")
    ).split(",")
    for step in steps:
        if step == "neg":
            value = -value
        elif step == "int":
            value = f"{value:,}"
        elif step == "gib":
            value = f"{value / 2**30:,.2f}"
        elif step == "raw":
            value = value if isinstance(value, str) else json.dumps(value)
        else:
            raise DocError(f"unknown value format {step!r}")
    return str(value)


# -- reading the docs -------------------------------------------------------------------------


def _requests(doc: str, text: str) -> dict[str, Request]:
    found: dict[str, Request] = {}
    for m in _REQUEST.finditer(text):
        name, raw = m.group("name"), m.group("attrs")
        body_text: str | None = None
        if " body=" in raw or raw.startswith("body="):
            raw, _, body_text = raw.partition("body=")
            body_text = body_text.strip()
        attrs = dict(_ATTRS.findall(raw))
        method, path = attrs.get("method"), attrs.get("path")
        app = attrs.get("app", "service")
        if app not in ("service", "agent"):
            raise DocError(f"{doc}: example-request {name!r}: app={app}; allowed: service, agent")
        headers: tuple[tuple[str, str], ...] = ()
        if body_text is not None or method == "GET":
            if not path:
                raise DocError(f"{doc}: example-request {name!r} without a block needs path=")
            body = body_text.encode() if body_text is not None else None
            method = method or ("POST" if body is not None else "GET")
        else:
            block = _FENCE.match(text, m.end())
            if not block:
                raise DocError(f"{doc}: example-request {name!r} is not followed by a block")
            content = block.group("body")
            if re.match(r"\s*(\$\s*)?curl\b", content):
                url = _URL.search(content)
                if not url:
                    raise DocError(f"{doc}: example-request {name!r}: no URL in the curl")
                if path and path != url.group("path"):
                    raise DocError(
                        f"{doc}: example-request {name!r}: path= {path} but the curl "
                        f"asks {url.group('path')}"
                    )
                path = url.group("path")
                data = _DATA.search(content)
                body = data.group("body").encode() if data else None
                headers = tuple(
                    (h.group("name").lower(), h.group("value")) for h in _HEADER.finditer(content)
                )
                verb = _METHOD.search(content)
                method = verb.group("method") if verb else ("POST" if body is not None else "GET")
            else:
                if not path:
                    raise DocError(f"{doc}: example-request {name!r}: a JSON block needs path=")
                body, method = content.encode(), method or "POST"
        if name in found:
            raise DocError(f"{doc}: example-request {name!r} defined twice")
        found[name] = Request(name, doc, method, path, body, app, headers)
    return found


# -- asking the service -----------------------------------------------------------------------


class _Service:
    def __init__(self) -> None:
        from litestar.testing import TestClient

        from vrambudget.service.app import create_app

        self._client = TestClient(create_app())
        self._client.__enter__()
        self._agent: Any = None
        self._agent_dir: Any = None
        self._answers: dict[tuple[str, str, str, bytes | None], tuple[int, Any]] = {}

    def _agent_client(self) -> Any:
        if self._agent is None:
            import tempfile

            from litestar.testing import TestClient

            from vrambudget.agent.api import create_agent_app
            from vrambudget.agent.settings import AgentSettings

            self._agent_dir = tempfile.TemporaryDirectory(prefix="docs-agent-")
            settings = AgentSettings(
                data_dir=Path(self._agent_dir.name), tokens=(AGENT_TOKEN.encode(),)
            )
            self._agent = TestClient(create_agent_app(settings))
            self._agent.__enter__()
        return self._agent

    def ask(self, request: Request) -> tuple[int, Any]:
        key = (request.app, request.method, request.path, request.body)
        if key not in self._answers:
            headers = dict(request.headers)
            if request.body is not None:
                headers["content-type"] = "application/json"
            client = self._agent_client() if request.app == "agent" else self._client
            response = client.request(
                request.method, request.path, content=request.body, headers=headers
            )
            try:
                payload: Any = response.json()
            except ValueError:
                payload = response.text
            self._answers[key] = (response.status_code, payload)
        return self._answers[key]

    def close(self) -> None:
        self._client.__exit__(None, None, None)
        if self._agent is not None:
            self._agent.__exit__(None, None, None)
            self._agent_dir.cleanup()


def _run_cli(command: str, expected: int = 0) -> str:
    from vrambudget.cli.main import main as cli_main

    argv = shlex.split(command.replace("\\\n", " "))
    while argv and not argv[0].endswith("vrambudget"):
        argv.pop(0)
    if not argv:
        raise DocError(f"example-cli: {command!r} does not run vrambudget")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(argv[1:])
    if status != expected:
        raise DocError(f"example-cli: {command!r} exited {status}, not {expected}")
    return out.getvalue()


def _render(
    doc: str, text: str, service: _Service, requests: dict[str, Request]
) -> tuple[str, list[Drift]]:
    drifts: list[Drift] = []

    def answer_of(name: str, kind: str) -> tuple[int, Any]:
        if name not in requests:
            raise DocError(f"{doc}: {kind} {name!r} has no example-request in this doc")
        return service.ask(requests[name])

    def answer(m: re.Match[str]) -> str:
        name, attrs = m.group("name"), dict(_ATTRS.findall(m.group("attrs")))
        status, payload = answer_of(name, "example-answer")
        want = int(attrs.get("status", "200"))
        notes = [] if status == want else [f"status {status}, the doc expects {want}"]
        keep = [p for p in attrs.get("keep", "").split(",") if p]
        drop = [p for p in attrs.get("drop", "").split(",") if p]
        shown = _project(payload, keep, drop) if isinstance(payload, (dict, list)) else payload
        new = f"\n```json\n{_pretty(shown)}\n```\n"
        if new != m.group("body") or notes:
            drifts.append(Drift(doc, name, "answer", new, m.group("body"), notes))
        return m.group("open") + new + m.group("close")

    def value(m: re.Match[str]) -> str:
        name, path = m.group("name"), m.group("path")
        _, payload = answer_of(name, "value")
        found = [v for _, v in _match(payload, _parse_path(path))]
        if len(found) != 1:
            raise DocError(f"{doc}: value {name} {path} matches {len(found)} values, not one")
        new = _format_value(found[0], m.group("fmt"))
        if new != m.group("body"):
            drifts.append(Drift(doc, f"{name} {path}", "value", new, m.group("body")))
        return m.group("open") + new + m.group("close")

    def cli(m: re.Match[str]) -> str:
        body = m.group("body")
        lines = body.splitlines(keepends=True)
        command_lines = []
        for line in lines:
            command_lines.append(line)
            if not line.rstrip("\n").endswith("\\"):
                break
        command = "".join(command_lines)
        if not command.startswith("$ "):
            raise DocError(f"{doc}: example-cli {m.group('name')!r}: first line is not '$ ...'")
        new = command + _run_cli(command[2:], int(m.group("status") or 0))
        if new != body:
            drifts.append(Drift(doc, m.group("name"), "cli", new, body))
        return m.group("open") + m.group("fence") + new + m.group("end")

    for marker, pattern in (
        ("example-answer:", _ANSWER),
        ("value:", _VALUE),
        ("example-cli:", _CLI),
    ):
        opened = len(re.findall(r"<!--\s*" + marker, text))
        if opened != len(pattern.findall(text)):
            raise DocError(
                f"{doc}: {opened} '{marker}' markers but only "
                f"{len(pattern.findall(text))} readable ones (a path with a space, "
                "a missing close marker or block?)"
            )
    text = _ANSWER.sub(answer, text)
    text = _VALUE.sub(value, text)
    text = _CLI.sub(cli, text)
    return text, drifts


def generate(root: Path = ROOT, write: bool = False) -> list[Drift]:
    """Render every doc's generated blocks; with ``write`` save them. Returns the drifts found
    (before writing)."""
    service = _Service()
    drifts: list[Drift] = []
    try:
        for doc in DOCS:
            path = root / doc
            if not path.exists():
                continue
            text = path.read_text(encoding="utf-8")
            # markers inside ```` fences are documentation of the markers: left alone
            quoted = _QUOTED.findall(text)
            masked = _QUOTED.sub(lambda m: "\0", text)
            new, found = _render(doc, masked, service, _requests(doc, masked))
            for block in quoted:
                new = new.replace("\0", block, 1)
            drifts += found
            if write and new != text:
                path.write_text(new, encoding="utf-8")
    finally:
        service.close()
    return drifts


def check(root: Path = ROOT) -> list[Drift]:
    """The examples whose text in the docs differs from what the service answers now."""
    return generate(root, write=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 listing the examples that drifted",
    )
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        drifts = generate(ROOT, write=not args.check)
    except DocError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        for drift in drifts:
            print(drift, *drift.notes, sep="\n  ")
        if drifts:
            print(
                f"{len(drifts)} example(s) drifted: run python scripts/docs_examples.py",
                file=sys.stderr,
            )
            return 1
        print("docs examples: all current")
        return 0
    for drift in drifts:
        print(f"updated {drift.doc}: {drift.kind} {drift.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
