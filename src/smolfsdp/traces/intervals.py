"""Interval algebra on sorted numpy arrays: union and intersection lengths of event intervals.

Used by ``smolfsdp.traces.analysis`` (busy time, overlap). Times in any unit (the traces' µs).
Vectorised: sort once, then cumulative maxima and sums; no Python loop over events.
"""

from __future__ import annotations

import numpy as np


def merge_intervals(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals ``[starts[i], ends[i]]`` as sorted, disjoint ``(starts, ends)`` float arrays."""
    if len(starts) == 0:
        return np.array([]), np.array([])
    s, e = np.asarray(starts, float), np.asarray(ends, float)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def union_length(starts, ends) -> float:
    """Length of the union of the intervals (overlaps counted once)."""
    s, e = merge_intervals(starts, ends)
    return float((e - s).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of (∪a) ∩ (∪b) for two interval sets given as ``(starts, ends)``.

    A sweep over the merged boundaries, as HTA's ``get_comm_comp_overlap`` does: +1/-1 at the
    starts/ends of a, +2/-2 for b; time where the running sum is 3 lies in both.
    """
    (a_s, a_e), (b_s, b_e) = merge_intervals(*a), merge_intervals(*b)
    times = np.concatenate([a_s, a_e, b_s, b_e])
    if len(times) == 0:
        return 0.0
    delta = np.concatenate(
        [np.ones(len(a_s)), -np.ones(len(a_e)), 2 * np.ones(len(b_s)), -2 * np.ones(len(b_e))]
    )
    order = np.argsort(times, kind="stable")
    t, state = times[order], np.cumsum(delta[order])
    return float(((state[:-1] == 3) * np.diff(t)).sum())
