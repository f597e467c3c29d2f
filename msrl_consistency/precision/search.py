"""The cheapest set of layers to keep in fp32 so that the lowered policy stays within its bounds: any set, not only a
prefix or a suffix of the network (Polygraphy's ``debug precision`` bisects those two only).

1. Each layer's sensitivity alone: that layer lowered, every other kept in fp32.
2. Every layer lowered: when that is within the bounds, nothing is kept.
3. A layer that breaks the bounds when lowered alone is kept (no other choice can save it). Among the others, sets
   are tried in order of their cost (the weights and outputs they keep in fp32), cheapest first, each with the
   forced layers: the first within the bounds is the cheapest such set. Past ``EXHAUSTIVE`` candidates, or
   ``max_evaluations``, the search turns greedy: it adds the most sensitive remaining layer until the bounds hold,
   then drops every kept layer whose removal keeps them (a minimal set, said so).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from msrl_consistency.precision.evaluate import Evaluation
from msrl_consistency.precision.layers import Layer

EXHAUSTIVE = 12


@dataclass
class SearchResult:
    kept: frozenset[str]
    final: Evaluation
    all_lowered: Evaluation
    sensitivity: dict[str, Evaluation]
    method: str
    evaluations: int
    tried: list[tuple[list[str], bool]] = field(default_factory=list)


def search(layers: Sequence[Layer], evaluate: Callable[[frozenset[str]], Evaluation],
           max_evaluations: int = 64, progress: Callable[[str], None] = lambda _m: None) -> SearchResult:  # fmt: skip
    """See the module docstring. ``evaluate(kept)`` judges the policy with ``kept`` in fp32 and the rest lowered."""
    scopes = [layer.scope for layer in layers]
    cost = {layer.scope: layer.cost for layer in layers}
    every = frozenset(scopes)
    count = 0
    cache: dict[frozenset[str], Evaluation] = {}
    tried: list[tuple[list[str], bool]] = []

    def judge(kept: frozenset[str]) -> Evaluation:
        nonlocal count
        if kept not in cache:
            count += 1
            cache[kept] = evaluate(kept)
            tried.append((sorted(kept), cache[kept].ok))
        return cache[kept]

    sensitivity = {}
    for scope in scopes:
        sensitivity[scope] = judge(every - {scope})
        s = sensitivity[scope]
        progress(f"{scope} lowered alone: {'within' if s.ok else 'beyond'} the bounds (badness {s.badness:.3g})"
                 + (f": {'; '.join(s.broken)}" if s.broken else ""))  # fmt: skip
    lowest = judge(frozenset())
    progress(f"every layer lowered: {'within' if lowest.ok else 'beyond'} the bounds (badness {lowest.badness:.3g})"
             + (f": {'; '.join(lowest.broken)}" if lowest.broken else ""))  # fmt: skip
    if lowest.ok:
        return SearchResult(frozenset(), lowest, lowest, sensitivity, "every layer lowered is within the bounds",
                            count, tried)  # fmt: skip
    forced = frozenset(s for s in scopes if not sensitivity[s].ok)
    free = sorted((s for s in scopes if s not in forced), key=lambda s: (cost[s], s))
    budget = max_evaluations - count
    if len(free) <= EXHAUSTIVE:
        subsets = sorted((frozenset(c) for r in range(len(free) + 1) for c in itertools.combinations(free, r)),
                         key=lambda c: (sum(cost[s] for s in c), len(c), sorted(c)))  # fmt: skip
        for subset in subsets:
            if budget <= 0:
                break
            kept = forced | subset
            fresh = kept not in cache
            result = judge(kept)
            budget -= fresh
            if result.ok:
                return SearchResult(kept, result, lowest, sensitivity, "the cheapest set within the bounds (sets "
                                    "tried in order of cost, the layers that break the bounds alone always kept)",
                                    count, tried)  # fmt: skip
    return _greedy(scopes, forced, sensitivity, cost, judge, lowest, count, tried)


def _greedy(scopes: list[str], forced: frozenset[str], sensitivity: dict[str, Evaluation], cost: dict[str, int],
            judge: Callable[[frozenset[str]], Evaluation], lowest: Evaluation, count: int,
            tried: list[tuple[list[str], bool]]) -> SearchResult:  # fmt: skip
    kept = set(forced)
    order = sorted((s for s in scopes if s not in kept), key=lambda s: -sensitivity[s].badness)
    result = judge(frozenset(kept))
    while not result.ok and order:
        kept.add(order.pop(0))
        result = judge(frozenset(kept))
    for scope in sorted(kept - forced, key=lambda s: -cost[s]):
        trial = judge(frozenset(kept - {scope}))
        if trial.ok:
            kept.discard(scope)
            result = trial
    return SearchResult(frozenset(kept), result, lowest, sensitivity, "greedy (most sensitive first, then pruned): "
                        "a minimal set, not proven the cheapest", len(tried), tried)  # fmt: skip
