"""List + watch of one resource, as client-go's reflector does, in micro-batches.

A `Reflector` lists the resource (paginated), hands the whole list to `on_list`, then watches
from the list's resourceVersion with bookmarks, handing the events to `on_events` in batches
(up to `batch` events, or what arrived within `linger_s`). The watch is resumed from the last
resourceVersion seen (an event's or a bookmark's) whenever the server ends it; a 410 Gone (the
version compacted away: as an ERROR event, or as the answer to the watch or to a list page's
continue token) makes it list again, and `on_list` says what was deleted meanwhile. Other
errors back off (doubling up to `max_backoff_s`) and retry; `relists` and `errors` count
what happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streams.kubeapi import KubeApi, KubeError

log = logging.getLogger("koordstream.bridge")

OnList = Callable[[list[dict[str, Any]]], Awaitable[None]]
OnEvents = Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[None]]


@dataclass
class Reflector:
    api: KubeApi
    path: str  # the list path, e.g. /api/v1/pods
    on_list: OnList
    on_events: OnEvents
    page: int = 1000
    timeout_s: int = 300
    batch: int = 1000
    linger_s: float = 0.01
    max_backoff_s: float = 10.0
    resource_version: str = ""
    relists: int = 0
    errors: int = 0
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params: dict[str, Any] = {"limit": self.page}
            if token:
                params["continue"] = token
            answer = await self.api.request("GET", self.path, params=params, timeout_s=120)
            items += answer.get("items") or ()
            meta = answer.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    async def run(self) -> None:
        backoff = 0.1
        while True:
            try:
                if not self.resource_version:
                    items, self.resource_version = await self.list()
                    self.relists += 1
                    await self.on_list(items)
                    self.synced.set()
                await self.watch()
                backoff = 0.1
            except KubeError as exc:
                self.errors += 1
                if exc.status == 410:
                    log.info("%s: %s; listing again", self.path, exc.reason or "Gone")
                    self.resource_version = ""
                    continue
                log.warning("%s: %s; retrying in %.1f s", self.path, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)

    async def watch(self) -> None:
        """One watch, until the server ends it; events in batches."""
        pending: list[tuple[str, dict[str, Any]]] = []
        first = 0.0
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for event in self.api.watch(self.path, {"resourceVersion": self.resource_version,
                                                              "timeoutSeconds": self.timeout_s}):
                    queue.put_nowait(event)
            finally:
                queue.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                timeout = None if not pending else max(0.0, first + self.linger_s - time.monotonic())
                try:
                    event = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    event = {}
                if event is None or not event or len(pending) >= self.batch:
                    if pending:
                        await self.on_events(pending)
                        pending = []
                    if event is None:
                        break
                    if not event:
                        continue
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if event.get("type") != "BOOKMARK":
                    if not pending:
                        first = time.monotonic()
                    pending.append((str(event.get("type")), obj))
                if version:
                    self.resource_version = str(version)
            await reader  # its exception (a 410, an error) is raised here
        finally:
            if not reader.done():
                reader.cancel()
