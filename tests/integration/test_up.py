"""`koordstream up` with a config: the warm pools of `sandbox.pools` published once the topics
exist, and the pools start in the worker it runs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perf.collector import Collector
from schemas import topics
from schemas.records import SandboxPoolStatus
from streams.process import stop
from streams.settings import load_settings

pytestmark = pytest.mark.integration


@pytest.mark.e2e  # 11 s; tests/integration/test_sandbox.py drives the pools through the broker in `make test`
def test_up_publishes_the_warm_pools_of_its_config_and_the_pools_start(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    config = tmp_path / "koordstream.yaml"
    config.write_text(f"sandbox: {{pools: {pools}}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "up", "--config", str(config)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "KOORDSTREAM_KAFKA_BOOTSTRAP": ""})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "sandbox_records=1" in line, line
        bootstrap = re.search(r"bootstrap=(\S+)", line).group(1)  # type: ignore[union-attr]
        status = asyncio.run(first_pool_status(bootstrap))
        assert (status.namespace, status.name, status.replicas) == ("agents", "python", 2)
    finally:
        stop(proc, 10)  # type: ignore[arg-type]


POOLS = """
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python, namespace: agents}
spec:
  podTemplate:
    spec:
      runtimeClassName: gvisor
      containers: [{name: python, image: python:3.12, resources: {requests: {cpu: 250m, memory: 256Mi}}}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python, namespace: agents}
spec: {replicas: 2, sandboxTemplateRef: {name: python}}
"""


async def first_pool_status(bootstrap: str, timeout: float = 60.0) -> SandboxPoolStatus:
    collector = Collector(bootstrap, [topics.SANDBOX_STATUS], load_settings(env={}).kafka.partitions)
    await collector.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for _, _, r in collector.records if isinstance(r, SandboxPoolStatus)]
            if found:
                return found[0]
            await asyncio.sleep(0.1)
        raise AssertionError("no SandboxPoolStatus within the timeout")
    finally:
        await collector.stop()
