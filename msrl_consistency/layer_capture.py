"""The layers of a policy Cell and what each outputs: the reference side of localisation.

* ``layer_cells``: every layer of a Cell, named by its scope (``actor.layers.2``; wrappers with a single child are
  not part of the name);
* ``capture_layers``: forward hooks on those layers (PyNative), every layer's output in call order;
* ``outside_parameters``: the Cell's Parameters no layer owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mindspore import Tensor, nn

from msrl_consistency import compat


@dataclass
class CapturedLayer:
    scope: str  # the reported name: the path below the wrappers that hold a single child
    kind: str
    params: tuple[str, ...]
    output: np.ndarray
    path: str = ""  # the full path from the exported Cell (``policy.normalizer``)
    role: str = ""  # "preprocessing" for the observation normaliser: a divergence there is a preprocessing fault
    tail: tuple[str, ...] = ()  # types of the layer's sub-Cells without Parameters (a Dense's activation), in order


def layer_cells(cell: nn.Cell) -> list[tuple[str, str, nn.Cell]]:
    """Every layer of ``cell``: (reported scope, full path, Cell). A layer is a sub-Cell, at any depth, with Parameters
    of its own (an ``nn.Dense(..., activation=...)``, each member of a ``SequentialCell`` of them) or without
    children; the sub-Cells of a layer that hold no Parameters at all (its activation) are part of it. The scope
    drops the wrappers that hold a single child."""
    root, prefix = cell, ""
    while len(children := list(root.name_cells().items())) == 1 and not list(root.get_parameters(expand=False)):
        name, root = children[0]
        prefix += f"{name}."
    layers, inside = [], []
    for name, sub in cell.cells_and_names():
        if not name or any(name.startswith(f"{outer}.") for outer in inside):
            continue
        own, children = list(sub.get_parameters(expand=False)), sub.name_cells()
        if own and not any(list(c.get_parameters()) for c in children.values()):
            inside.append(name)
        if own or not children:
            layers.append((name[len(prefix) :] if name.startswith(prefix) else name, name, sub))
    return layers


def outside_parameters(cell: nn.Cell) -> list[str]:
    """The Cell's Parameters that belong to no layer (a ``log_std`` of the policy Cell itself): no layer output
    shows them, so they are named as not compared (``ms-mindir`` compares them by name). A layer this graph never
    calls (the critic of an actor's graph) is not part of the graph, and neither are its Parameters."""
    inside = {p.name for _, _, sub in layer_cells(cell) for p in sub.get_parameters(expand=False)}
    return [p.name for p in cell.get_parameters() if p.name not in inside]


def _role(cell: nn.Cell) -> str:
    from msrl_consistency.agent.preprocess import ObsNormalizer

    return "preprocessing" if isinstance(cell, ObsNormalizer) else ""


def capture_layers(cell: nn.Cell, inputs: Sequence[np.ndarray]) -> tuple[list[CapturedLayer], list[np.ndarray]]:
    """Run ``cell`` once in PyNative on ``inputs``; every layer's (first) output in call order (``layer_cells``),
    and the Cell's own outputs. A layer called twice appears twice (``scope#2``)."""
    captured: list[CapturedLayer] = []
    calls: dict[str, int] = {}
    handles = []
    for scope, path, sub in layer_cells(cell):
        params = tuple(p.name for p in sub.get_parameters(expand=False))
        tail = tuple(type(c).__name__ for c in sub.name_cells().values()) if params else ()

        def hook(c: nn.Cell, _inputs: Any, output: Any, scope: str = scope, path: str = path,
                 params: tuple[str, ...] = params, tail: tuple[str, ...] = tail) -> None:  # fmt: skip
            calls[scope] = calls.get(scope, 0) + 1
            name = scope if calls[scope] == 1 else f"{scope}#{calls[scope]}"
            first = output[0] if isinstance(output, tuple | list) else output
            captured.append(CapturedLayer(name, type(c).__name__, params, first.asnumpy(), path, _role(c), tail))

        handles.append(sub.register_forward_hook(hook))
    try:
        with compat.execution_mode(graph=False):
            outputs = [o.asnumpy() for o in compat.as_tuple(cell(*[Tensor(a) for a in inputs]))]
    finally:
        for handle in handles:
            handle.remove()
    return captured, outputs
