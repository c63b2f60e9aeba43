"""Adversarial runs of the bridge against the real control plane (kube-apiserver, etcd, Kwok),
the session's broker and worker: leader election against a real Lease, the actuator's calls
against real refusals, the API server restarted under a watch, and the bridge process killed
while pods come and go. Each test names a fault an adversarial review found (see the report
on branch `bridge-adversary`), or something it tried that held."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streams.bridge.lease import LeaderElection
from streams.kube_cluster import ControlPlane
from streams.kubeapi import Limits
from tests.integration.kube import unique

pytestmark = pytest.mark.integration


async def _lead_forever() -> None:
    await asyncio.sleep(3600)


async def _both_lead(a: LeaderElection, b: LeaderElection, seconds: float) -> float:
    """How long, within `seconds`, both candidates believed they led."""
    both = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if a.leading and b.leading:
            both += 0.05
        await asyncio.sleep(0.05)
    return both


async def _until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s for {what}")
        await asyncio.sleep(0.05)


async def _campaign(election: LeaderElection, lead: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    return asyncio.create_task(election.run(lead))  # type: ignore[arg-type]


async def _stop(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_leader_whose_renewals_queue_behind_its_own_writes_never_leads_beside_another(
        control_plane: ControlPlane) -> None:
    """The Lease's requests go through the same token bucket and concurrency bound as the
    bridge's writes. A leader busy with a burst (here 30 calls at 2 qps: 15 s of queue, as
    10,000 Bindings at the default 200 qps are 50 s) waits that long for its renewal and, all
    the while, believes it leads: its Lease expires after 3 s and another bridge takes it."""
    lease = unique("lease")
    async with control_plane.api(Limits(qps=2, burst=1)) as busy, control_plane.api() as idle:
        a = LeaderElection(busy, "a", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5)
        b = LeaderElection(idle, "b", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5)

        async def burst() -> None:  # what a leader does with a batch of Bindings: many calls at once
            await asyncio.gather(*(busy.request("GET", "/api/v1/namespaces/default") for _ in range(30)))
            await asyncio.sleep(3600)

        task_a = await _campaign(a, burst)
        await _until("a to lead", lambda: a.leading)
        task_b = await _campaign(b, _lead_forever)
        try:
            both = await _both_lead(a, b, 12.0)
        finally:
            await _stop(task_a, task_b)
        assert both == 0.0, f"two bridges led at once for {both:.1f} s"


async def test_a_candidate_whose_clock_runs_ahead_does_not_take_the_lease_from_a_live_leader(
        control_plane: ControlPlane) -> None:
    """Expiry is judged by comparing the holder's renewTime (the holder's clock) with the
    candidate's clock: a candidate 10 s ahead takes a Lease of 3 s that its holder renews
    every 0.5 s, and both lead until the holder's next renewal. client-go judges expiry by
    when the candidate last saw the record change (its own clock only)."""
    lease = unique("lease")
    async with control_plane.api() as api:
        a = LeaderElection(api, "a", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5)
        b = LeaderElection(api, "b", namespace="default", name=lease, duration_s=3, renew_deadline_s=2, retry_s=0.5,
                           clock=lambda: time.time() + 10)
        task_a = await _campaign(a, _lead_forever)
        await _until("a to lead", lambda: a.leading)
        task_b = await _campaign(b, _lead_forever)
        try:
            both = await _both_lead(a, b, 6.0)
            took_over = b.transitions
        finally:
            await _stop(task_a, task_b)
        assert (took_over, both) == (0, 0.0), f"b took the Lease {took_over} time(s); both led for {both:.2f} s"
