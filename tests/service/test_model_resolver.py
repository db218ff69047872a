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

    def both(found: dict[str, Any]) -> tuple[InvalidWorkload, InvalidWorkload]:
        """The service's and the CLI's refusal of a repository whose config.json is found."""
        with pytest.raises(InvalidWorkload) as service:
            asyncio.run(_resolver(Fetcher(found)).resolve(workloads))
        monkeypatch.setattr(hub, "fetch", Fetcher(found))
        with pytest.raises(InvalidWorkload) as cli:
            resolve_models(workloads)
        assert service.value.field == cli.value.field == "workloads[0].model.id"
        assert service.value.message == cli.value.message
        return service.value, cli.value

    _, cli = both(PIPELINE)
    assert cli.message == (
        "org/pipeline has no model_type in its config.json (a diffusers pipeline or another "
        "library's repository): give its component models"
    )
    # A config.json the checks refuse: the same words from both, too.
    _, cli = both({**QWEN, "hidden_size": -1})
    assert cli.message.startswith("org/pipeline's config.json: "), cli.message
    assert "hidden_size" in cli.message


def test_a_hub_model_resolved_before_costs_no_fetch_no_thread_and_no_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second identical request: a peek at the Hub cache and a look-up of the resolution,
    on the event loop; the config was checked once, when it was resolved."""
    from vrambudget.service import models

    fetcher = Fetcher(QWEN)
    resolver = _resolver(fetcher)
    hops: list[Any] = []
    checks: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await to_thread(fn, *args, **kwargs)

    def check(repo_id: str, config: Any, field: str) -> None:
        checks.append(repo_id)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    monkeypatch.setattr(models, "check_hub_config", check)
    workloads = _workloads({"source": "hub", "id": "org/qwen", "revision": "main"})

    async def twice() -> tuple[Any, Any]:
        first = await resolver.resolve(workloads)
        assert len(fetcher.calls) == 1 and len(hops) == 2  # the fetch, then the resolution
        assert checks == ["org/qwen"]
        hops.clear()
        return first, await resolver.resolve(workloads)

    first, second = asyncio.run(twice())
    assert second == first and first
    assert fetcher.calls == [("org/qwen", "main")]
    assert hops == []
    assert checks == ["org/qwen"]
    # Another name for the same commit is another resolution, from the cached fetch.
    named = _workloads({"source": "hub", "id": "org/qwen", "revision": "main", "name": "q"})
    asyncio.run(resolver.resolve(named))
    assert len(fetcher.calls) == 1 and checks == ["org/qwen"] * 2
    assert len(hops) == 1  # the resolution only


def test_a_branch_past_the_hub_cache_ttl_is_fetched_again() -> None:
    """The peek keeps the Hub cache's TTL: a branch older than it is fetched again (its
    commit may have moved); the resolution of an unchanged commit is reused."""
    fetcher = Fetcher(QWEN)
    resolver = _resolver(fetcher)
    now = [1000.0]
    resolver.hub = HubCache(
        HubSettings(endpoint="http://127.0.0.1:9"), fetcher=fetcher, clock=lambda: now[0]
    )
    workloads = _workloads({"source": "hub", "id": "org/qwen"})
    first = asyncio.run(resolver.resolve(workloads))
    now[0] += 299.0
    assert asyncio.run(resolver.resolve(workloads)) == first
    assert len(fetcher.calls) == 1
    now[0] += 1.0
    assert asyncio.run(resolver.resolve(workloads)) == first  # the same commit
    assert len(fetcher.calls) == 2


def test_a_resolution_is_encoded_once() -> None:
    """What crosses to the workers is encoded when the model is resolved and sent as it is
    with every later request (the same bytes object)."""
    resolver = _resolver(Fetcher(QWEN))
    workloads = _workloads({"source": "hub", "id": "org/qwen"})
    first = asyncio.run(resolver.resolve(workloads))
    second = asyncio.run(resolver.resolve(workloads))
    ((index, key, encoded),) = first
    assert index == 0 and key and second[0][1] == key and second[0][2] is encoded
    assert (
        asyncio.run(resolver.resolve(_workloads({"source": "preset", "id": "qwen2.5-0.5b"}))) == ()
    )
