"""The worker processes of a pool (compute or trace): a pebble process pool of spawned workers,
started on first use, replaced when it breaks, stopped at shutdown. One mechanism for both pools;
each pool keeps its own scheduling, limits and answers."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WorkerProcesses"]

log = logging.getLogger("vrambudget.service")


class WorkerProcesses:
    def __init__(
        self,
        name: str,
        workers: int,
        initializer: Callable[..., None],
        initargs: tuple[Any, ...],
        closed_error: Callable[[], Exception],
        join_timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.workers = workers
        self._initializer = initializer
        self._initargs = initargs
        self._closed_error = closed_error
        self._join_timeout_s = join_timeout_s
        self.pool: Any = None  # pebble.ProcessPool, made on first use
        self._lock = threading.Lock()  # made and replaced from worker threads
        self.closed = False

    @property
    def started(self) -> bool:
        return self.pool is not None

    def get(self) -> Any:
        """The running pool, started now if there is none; ``closed_error`` once shut down."""
        with self._lock:
            if self.closed:
                raise self._closed_error()
            if self.pool is None:
                import multiprocessing

                import pebble

                self.pool = pebble.ProcessPool(
                    max_workers=self.workers,
                    initializer=self._initializer,
                    initargs=self._initargs,
                    context=multiprocessing.get_context("spawn"),
                )
            return self.pool

    def discard(self, pool: Any) -> None:
        """Forget a broken pool (the next call makes a new one) and stop it in the background."""
        with self._lock:
            if pool is None or self.pool is not pool:
                return
            self.pool = None
        threading.Thread(
            target=self._stop, args=(pool,), name=f"{self.name}-pool-stop", daemon=True
        ).start()

    def open(self) -> None:
        """Accept work again (an app's lifespan may run more than once, e.g. under successive
        test clients); workers still start only on first use."""
        self.closed = False

    async def close(self) -> None:
        """Stop the workers (app shutdown): work still running is killed."""
        self.closed = True
        with self._lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            await asyncio.to_thread(self._stop, pool)

    def _stop(self, pool: Any) -> None:
        try:
            pool.stop()
            pool.join(timeout=self._join_timeout_s)
        except Exception:  # shutting down a broken pool; nothing left to save
            log.exception("stopping the %s pool", self.name)
