"""The service's model resolver (``ModelResolver``) without a Hub or trace workers: a fake fetcher
behind the real ``HubCache``; and the in-process resolver of the CLI and the probe child
(``vrambudget.trace.models``) saying the same as the service about the same repository."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from vrambudget.core.catalog import preset
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.spec import BudgetRequest
from vrambudget.http.cache import AnswerCache
from vrambudget.hub import HubCache, HubSettings, ResolvedCheckpoint
from vrambudget.service.models import ModelResolver
from vrambudget.service.tracing import TracePool

COMMIT = "ab" * 20
QWEN = dict(preset("qwen2.5-0.5b").config or {})  # a closed form: no trace worker needed
PIPELINE = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0"}


class Fetcher:
    """``fetch`` as HubCache calls it, answering ``config`` for every repository; counts calls."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[tuple[str, str | None]] = []

    def __call__(
        self, repo_id: str, revision: str | None, *, settings: HubSettings
    ) -> ResolvedCheckpoint:
        self.calls.append((repo_id, revision))
        return ResolvedCheckpoint(
            origin="hub",
            repo_id=repo_id,
            revision=revision,
            commit=COMMIT,
            config=self.config,
            checkpoint=None,
            files=(),
        )


def _resolver(fetcher: Fetcher) -> ModelResolver:
    pool = TracePool(
        entry="tests.support.trace_entries:scripted",
        workers=1,
        time_limit_s=5,
        max_pending=1,
        cache=AnswerCache(4),
    )
    resolver = ModelResolver(pool, HubSettings(endpoint="http://127.0.0.1:9"))
    resolver.hub = HubCache(HubSettings(endpoint="http://127.0.0.1:9"), fetcher=fetcher)
    return resolver


def _workloads(model: dict[str, Any]) -> tuple[Any, ...]:
    body = {"workloads": [{"kind": "inference", "model": model, "prompt_tokens": 16}]}
    return msgspec.convert(body, BudgetRequest).workloads


def test_a_repository_without_model_type_is_refused_alike_by_the_service_and_the_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A diffusers pipeline's repository (its ``model_index.json`` comes back as the config)
    has no model_type: both resolvers name the repository's id and say what to give."""
    from vrambudget import hub
    from vrambudget.trace.models import resolve_models

    workloads = _workloads({"source": "hub", "id": "org/pipeline"})
    with pytest.raises(InvalidWorkload) as service:
        asyncio.run(_resolver(Fetcher(PIPELINE)).resolve(workloads))
    monkeypatch.setattr(hub, "fetch", Fetcher(PIPELINE))
    with pytest.raises(InvalidWorkload) as cli:
        resolve_models(workloads)
    assert service.value.field == cli.value.field == "workloads[0].model.id"
    assert service.value.message == cli.value.message
    assert cli.value.message == (
        "org/pipeline has no model_type in its config.json (a diffusers pipeline or another "
        "library's repository): give its component models"
    )
    # A config.json the checks refuse: the same words from both, too.
    bad = {**QWEN, "hidden_size": -1}
    with pytest.raises(InvalidWorkload) as service:
        asyncio.run(_resolver(Fetcher(bad)).resolve(workloads))
    monkeypatch.setattr(hub, "fetch", Fetcher(bad))
    with pytest.raises(InvalidWorkload) as cli:
        resolve_models(workloads)
    assert service.value.field == cli.value.field == "workloads[0].model.id"
    assert service.value.message == cli.value.message
    assert cli.value.message.startswith("org/pipeline's config.json: "), cli.value.message
    assert "hidden_size" in cli.value.message
