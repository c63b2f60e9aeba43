"""The shared score normalisation (kube-scheduler's DefaultNormalizeScore), judged by the
feasible nodes only, as NormalizeScore sees only the nodes that passed the filters."""

from __future__ import annotations

import numpy as np

from agents.scheduler.framework.interface import MAX_NODE_SCORE, Mask, Scores


def normalize(raw: Scores, feasible: Mask) -> Scores:
    """kube-scheduler's DefaultNormalizeScore: score x 100 / max over the feasible nodes."""
    top = int(raw[feasible].max()) if feasible.any() else 0
    if top == 0:
        return np.zeros_like(raw)
    return raw * MAX_NODE_SCORE // top


def normalize_reverse(raw: Scores, feasible: Mask) -> Scores:
    """DefaultNormalizeScore with reverse: 100 - score x 100 / max (all 100 when max is 0)."""
    top = int(raw[feasible].max()) if feasible.any() else 0
    if top == 0:
        return np.full_like(raw, MAX_NODE_SCORE)
    return MAX_NODE_SCORE - raw * MAX_NODE_SCORE // top
