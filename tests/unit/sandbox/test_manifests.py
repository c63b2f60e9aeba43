"""agent-sandbox's v1beta1 manifests (and koordstream's SandboxBurst) to records: every field the
pool reads, a pool resolved with its template from the same input, and errors that name the field."""

from __future__ import annotations

import pytest

from schemas.errors import SchemaError
from schemas.kube import load_manifests
from schemas.records import EnvVar, SandboxBurst, SandboxClaim, SandboxWarmPool

TEMPLATE = """
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python, namespace: agents}
spec:
  envVarsInjectionPolicy: Allowed
  podTemplate:
    metadata: {labels: {app: sandbox}}
    spec:
      runtimeClassName: gvisor
      containers:
      - name: runtime
        image: registry.k8s.io/agent-sandbox/python-runtime-sandbox:v0.1.1
        env: [{name: HOME, value: /work}]
        resources: {requests: {cpu: 250m, memory: 512Mi}}
"""
POOL = """
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: python-pool
  namespace: agents
  annotations: {sandbox.koordstream.io/overflow: Deny, sandbox.koordstream.io/refill-batch: "50"}
spec:
  replicas: 40
  sandboxTemplateRef: {name: python}
  updateStrategy: {type: Recreate}
"""
CLAIM = """
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxClaim
metadata: {name: task-17, namespace: agents}
spec:
  warmPoolRef: {name: python-pool}
  lifecycle: {shutdownTime: "2026-12-07T10:00:00Z", shutdownPolicy: Delete}
  additionalPodMetadata: {labels: {task: "17"}, annotations: {trace: abc}}
  env: [{name: TASK_ID, value: "17"}]
"""
BURST = """
apiVersion: sandbox.koordstream.io/v1alpha1
kind: SandboxBurst
metadata: {name: eval-run, namespace: agents}
spec: {warmPoolRef: {name: python-pool}, count: 500, ttl: 10m, mode: AccountingOnly}
"""


def test_a_pool_a_claim_and_a_burst_convert_with_the_template_resolved() -> None:
    pool, claim, burst = load_manifests("---".join([TEMPLATE, POOL, CLAIM, BURST]))
    assert isinstance(pool, SandboxWarmPool) and isinstance(claim, SandboxClaim) and isinstance(burst, SandboxBurst)
    assert (pool.replicas, pool.overflow, pool.refill_batch, pool.update_strategy) == (40, "Deny", 50, "Recreate")
    t = pool.template
    assert (t.name, t.env_policy, t.env_names, t.pod.runtime_class_name) == ("python", "Allowed", ("HOME",), "gvisor")
    assert t.pod.requests == {"cpu": 250, "memory": 512 << 20} and t.pod.labels == {"app": "sandbox"}
    assert t.pod_spec["containers"][0]["image"] == "registry.k8s.io/agent-sandbox/python-runtime-sandbox:v0.1.1"
    assert (claim.uid, claim.warm_pool, claim.env) == ("agents.task-17", "python-pool", (EnvVar("TASK_ID", "17"),))
    assert claim.labels == {"task": "17"} and claim.annotations == {"trace": "abc"}
    assert claim.shutdown_policy == "Delete" and claim.shutdown_time == pytest.approx(1796637600.0)
    assert (burst.count, burst.ttl_s, burst.mode) == (500, 600.0, "AccountingOnly")


@pytest.mark.parametrize(("text", "field"), [
    (POOL, "spec.sandboxTemplateRef.name"),  # no template in the input
    (TEMPLATE + "---" + POOL.replace("replicas: 40", "replicas: -1"), "spec.replicas"),
    (CLAIM.replace("warmPoolRef: {name: python-pool}", "warmPoolRef: {}"), "spec.warmPoolRef.name"),
    (CLAIM.replace("2026-12-07T10:00:00Z", "tomorrow"), "spec.lifecycle.shutdownTime"),
    (BURST.replace("count: 500", "count: 0"), "spec.count"),
    (BURST.replace("ttl: 10m", "ttl: soon"), "spec.ttl"),
    (TEMPLATE.replace("cpu: 250m", "cpu: lots"), "spec.podTemplate.spec.containers[0].resources.requests.cpu"),
])
def test_bad_manifests_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(SchemaError) as err:
        load_manifests(text)
    assert err.value.field.endswith(field), err.value
