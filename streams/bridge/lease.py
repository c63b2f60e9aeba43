"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does.

Every bridge tries to hold the Lease `name` in `namespace`: it takes it when it is free or its
holder has not renewed it within `leaseDurationSeconds`, and renews it every `retry_s` while
it holds it; writes go with the Lease's resourceVersion, so of two candidates that read the
same expired Lease, the API server lets one win. As client-go does, a candidate judges expiry
by its own clock only: by how long ago it first saw the Lease's current version (a renewal
changes it), never by comparing the holder's `renewTime` with its own clock, so a candidate
whose clock runs ahead does not take the Lease from a holder that renews. A holder that cannot
renew for `renew_deadline_s` (the API server unreachable or slow, the Lease taken, its own
event loop blocked) stops leading before another candidate may take over (`renew_deadline_s <
duration_s`): each renewal is bounded by the time left before that deadline, counted from the
start of the last renewal that succeeded (its `renewTime`), and the Lease's calls pass neither
the client's rate limit nor its concurrency bound, so they never wait behind a burst of the
leader's own writes. So two bridges never write at once as long as clocks advance at the
same rate. The time a candidate took the Lease (its `acquireTime`, in milliseconds) is its
`epoch`: a new leader takes it at least a Lease duration after the one before last renewed it,
so its epoch is higher as long as the hosts' clocks differ by less than that (a Lease deleted
and created again changes nothing); the bridge stamps its records with it, so readers drop what
a deposed leader still writes (`agents.intake.EpochFence`). `run(lead)` calls `lead()` while
leading and cancels it when leadership is lost; the Lease is released (holder emptied) on a clean exit so that a successor
takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from streams.kubeapi import KubeApi, KubeError

log = logging.getLogger("koordstream.bridge")


def _micro(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class LeaderElection:
    api: KubeApi
    identity: str
    namespace: str = "kube-system"
    name: str = "koordstream-bridge"
    duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0
    clock: Callable[[], float] = time.time
    leading: bool = False
    transitions: int = 0
    holder: str = ""  # the holder the last attempt saw
    epoch: int = -1  # when this candidate took the Lease (ms since the epoch): higher for every new leader
    monotonic: Callable[[], float] = time.monotonic  # this candidate's own clock for expiry and deadlines
    _observed: tuple[str, float] = ("", 0.0)  # (the Lease's resourceVersion, when this candidate first saw it)

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _spec(self, acquire: float, renew: float, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.duration_s),
                "acquireTime": _micro(acquire), "renewTime": _micro(renew), "leaseTransitions": transitions}

    async def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; whether this candidate holds it now."""
        now = self.clock()
        try:
            lease = await self.api.request("GET", self.path, limited=False)
        except KubeError as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(now, now, 0)}
            try:
                await self.api.request("POST", self.path.rsplit("/", 1)[0], body=body, limited=False)
                self.epoch = int(now * 1000)
                return True
            except KubeError as again:
                if again.status == 409:
                    return False  # another candidate created it first
                raise
        spec = lease.get("spec") or {}
        holder = self.holder = spec.get("holderIdentity") or ""
        version = str((lease.get("metadata") or {}).get("resourceVersion", ""))
        seen = self.monotonic()
        if self._observed[0] != version:
            self._observed = (version, seen)  # a renewal (or any change): the holder is alive as of now
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        if holder and holder != self.identity and self._observed[1] + duration > seen:
            return False  # held by another, not expired (by how long ago we saw it change, on our clock)
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquired = _parse(spec.get("acquireTime")) if holder == self.identity else now
        lease["spec"] = self._spec(acquired, now, transitions)
        try:
            await self.api.request("PUT", self.path, body=lease, limited=False)  # with its resourceVersion: one wins
            self.epoch = int(acquired * 1000)
            return True
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise

    async def release(self) -> None:
        with contextlib.suppress(KubeError):
            lease = await self.api.request("GET", self.path, limited=False)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                await self.api.request("PUT", self.path, body=lease, limited=False)

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign for ever; run `lead` while leading (see the module docstring)."""
        try:
            while True:
                while True:
                    started = self.monotonic()
                    if await self._attempt():
                        break
                    await asyncio.sleep(self.retry_s)
                self.leading = True
                self.transitions += 1
                log.info("%s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
                task: asyncio.Task[None] = asyncio.create_task(lead())
                try:
                    await self._keep(task, started)
                finally:
                    self.leading = False
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                log.warning("%s lost the Lease %s/%s; stopped leading", self.identity, self.namespace, self.name)
        finally:
            if self.leading:
                self.leading = False
            await asyncio.shield(self.release())

    async def _attempt(self) -> bool:
        try:
            return await self.try_acquire()
        except KubeError as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    async def _keep(self, task: asyncio.Task[None], renewed: float) -> None:
        """Renew until no renewal succeeded for `renew_deadline_s` (or `lead` ends).
        `renewed`: when the attempt that last wrote the Lease began (the `renewTime` it wrote)."""
        while not task.done():
            await asyncio.wait([task], timeout=self.retry_s)
            if task.done():
                task.result()  # raise what `lead` raised
                return
            started = self.monotonic()
            left = self.renew_deadline_s - (started - renewed)
            if left <= 0:
                return  # (the event loop was blocked past the deadline)
            try:  # (not asyncio.wait_for: on Python 3.11 it can swallow this task's own cancellation)
                async with asyncio.timeout(left):
                    ok = await self._attempt()
            except TimeoutError:
                return  # the renewal did not come back in time
            if ok:
                renewed = started
            elif self.holder not in ("", self.identity):
                return  # another holds it
