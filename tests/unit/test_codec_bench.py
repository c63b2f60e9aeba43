"""`koordstream bench codec`'s workload and figures (the timings themselves are not judged here)."""

from __future__ import annotations

from perf.codec_bench import run_codec, sandbox_path
from schemas.codec import decode_message, encode_batch


def test_the_sandbox_path_reads_back_the_same_one_by_one_and_batched() -> None:
    for records in sandbox_path(20).values():
        assert decode_message(encode_batch(records, False)) == records == decode_message(encode_batch(records))


def test_the_figures_name_every_kind_both_forms_and_the_ratios() -> None:
    result = run_codec(count=10, rounds=2)
    assert set(result["kinds"]) == {"Pod", "Claim", "Held", "Commit", "Binding", "NodeStateChange"}
    for figures in result["kinds"].values():
        assert figures["batched_bytes"] < figures["plain_bytes"]
        assert all(figures[f"{form}_{what}"] > 0 for form in ("plain", "batched") for what in ("encode", "decode"))
    assert result["codec_ratio"] == round(result["codec_us_per_pod"]["batched"] / result["codec_us_per_pod"]["plain"], 3)
