"""`koordstream bench codec`: what a record costs the codec, written one by one and as `Batch`es.

One message of `count` records per kind of a placed sandbox's path (its Pod, Claim, Held,
Commit and Binding, and its owner's report, a NodeStateChange), as the outbox writes them: the
pods of one class, spread one a node. Per kind, in the same run and interleaved round by round,
the encode and the decode (`schemas.codec.encode_batch` / `decode_message`) in microseconds a
record (the median of `rounds`), and the message's bytes, with batches off and on; the ratio
of the two is what `kafka.record_batches` saves. Every round checks that both messages decode to
the records written.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from schemas.codec import decode_message, encode_batch
from schemas.records import (
    SANDBOX_POOL_LABEL,
    Binding,
    BoundPod,
    Claim,
    Commit,
    Held,
    NodeStateChange,
    Pod,
    Record,
    ResourceList,
)

REQUESTS = ResourceList({"cpu": 250, "memory": 512 * 2**20})
ALLOCATABLE = ResourceList({"cpu": 32_000, "memory": 128 * 2**30, "pods": 110})


def sandbox_path(count: int) -> dict[str, list[Record]]:
    """The records of `count` sandboxes of one class placed one a node, by kind."""
    t0 = 1_780_000_000.0
    out: dict[str, list[Record]] = {kind: [] for kind in
                                    ("Pod", "Claim", "Held", "Commit", "Binding", "NodeStateChange")}
    for i in range(count):
        uid, name, node = f"uid-{i:06d}", f"sandbox-{i:06d}", f"node-{i:05d}"
        out["Pod"].append(Pod(uid=uid, namespace="agents", name=name, creation_timestamp=t0 + i * 1e-3,
                              requests=REQUESTS, runtime_class_name="gvisor",
                              labels={SANDBOX_POOL_LABEL: "coder", "app": "agent"}))
        out["Claim"].append(Claim(uid=uid, attempt=1, node=node, decision_key=uid, requests=REQUESTS, namespace="agents", name=name,
                                  creation_timestamp=t0 + i * 1e-3, scheduled_at=t0 + 1 + i * 1e-4,
                                  sandbox=True, warm_pool="coder"))
        out["Held"].append(Held(uid=uid, attempt=1, node=node, decision_key=uid, namespace="agents", name=name, scheduled_at=t0 + 1 + i * 1e-4,
                                requests=REQUESTS))
        out["Commit"].append(Commit(uid=uid, attempt=1, node=node, decision_key=uid))
        out["Binding"].append(Binding(uid=uid, namespace="agents", name=name, node=node, attempt=1,
                                      decision_key=uid))
        out["NodeStateChange"].append(NodeStateChange(
            node=node, seq=7 + i % 5, allocatable=ALLOCATABLE, used=ResourceList({"cpu": 250 * (1 + i % 5)}),
            holds={f"{uid}/1/{node}": "committed"},
            committed=(BoundPod(uid=uid, namespace="agents", name=name, requests=REQUESTS, decision_key=uid,
                                sandbox=True, warm_pool="coder"),)))
    return out


def _us_per_record(fn: Callable[[], Any], count: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / count * 1e6


def run_codec(count: int = 500, rounds: int = 30) -> dict[str, Any]:
    """Per kind: encode and decode us a record, and bytes a record, one by one and batched."""
    kinds: dict[str, Any] = {}
    for kind, records in sandbox_path(count).items():
        samples: dict[str, list[float]] = {"plain_encode": [], "batched_encode": [], "plain_decode": [],
                                           "batched_decode": []}
        sizes = {}
        for _ in range(rounds):
            for form, batched in (("plain", False), ("batched", True)):
                value = encode_batch(records, batched)
                sizes[form] = len(value)
                samples[f"{form}_encode"].append(_us_per_record(partial(encode_batch, records, batched), count))
                samples[f"{form}_decode"].append(_us_per_record(partial(decode_message, value), count))
                if decode_message(value) != records:
                    raise AssertionError(f"{kind}: the {form} message does not decode to the records written")
        figures: dict[str, float | None] = {name: round(statistics.median(values), 3)
                                            for name, values in samples.items()}
        figures["plain_bytes"] = round(sizes["plain"] / count, 1)
        figures["batched_bytes"] = round(sizes["batched"] / count, 1)
        for what in ("encode", "decode", "bytes"):
            plain, batched_figure = figures[f"plain_{what}"], figures[f"batched_{what}"]
            figures[f"{what}_ratio"] = round(batched_figure / plain, 3) if plain and batched_figure else None
        kinds[kind] = figures
    per_pod = {form: round(sum(k[f"{form}_encode"] + k[f"{form}_decode"] for k in kinds.values()), 2)
               for form in ("plain", "batched")}
    return {"records_per_message": count, "rounds": rounds, "kinds": kinds,
            "codec_us_per_pod": per_pod,  # one of each kind, encoded once and decoded once
            "codec_ratio": round(per_pod["batched"] / per_pod["plain"], 3)}
