"""The policy Cells that export writes and verify treats as the training path.

Two sources, one interface (``RuntimeSource.cells``: graph name → Cell):

* ``TrainerCells``: a run of ours, ``ActorCritic`` rebuilt from ``policy_spec`` and its checkpoint;
* ``UserCells``: any team's Cell, from ``MODULE:FACTORY`` (imported from the current directory, like
  ``uvicorn main:app``) or a Cell object, with the team's checkpoint loaded strictly.

Both can also give the policy *without* its in-graph observation normalisation: the evidence verify needs
to name a missing normalisation as the failing stage. A team's Cell that takes constant inputs (the contract's
``[input.NAME] constant``) is given as ``ConstantInputs``: the graph everyone runs feeds them itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mindspore import float32 as ms_float32
from mindspore import nn, ops

from inference.bundle.contract import ConstantInput
from inference.compare.plugins import import_factory
from inference.errors import UsageError, first_line
from msrl_consistency import compat
from msrl_consistency.agent import PolicySpec
from msrl_consistency.agent.lowered import freeze
from msrl_consistency.artifacts.checkpoint import bookkeeping, describe_ignored, load_policy, read_checkpoint
from msrl_consistency.artifacts.graphs import export_heads


class TrainerCells:
    """Graph name → a freshly loaded head of our ``ActorCritic`` (each runtime gets its own Cell)."""

    def __init__(self, checkpoint: Path, spec: dict[str, Any]) -> None:
        self.checkpoint, self.spec = checkpoint, PolicySpec.from_dict(spec)

    def __call__(self, graph: str) -> nn.Cell:
        """The head as export writes it: a lowered actor frozen to float with the device's weights."""
        return export_heads(freeze(load_policy(self.checkpoint, self.spec)))[graph]

    @property
    def lowered(self) -> Callable[[str], nn.Cell] | None:
        """A run trained in the device's numerics (``train --lower``): its heads computing in them, as in training
        (what verify judges the lowered runtime against)."""
        if self.spec.lower == "fp32":
            return None
        return lambda graph: export_heads(load_policy(self.checkpoint, self.spec))[graph]

    def without_normalization(self, graph: str) -> nn.Cell | None:
        if not self.spec.normalize_obs:
            return None
        policy = freeze(load_policy(self.checkpoint, self.spec))
        policy.normalizer.enabled = False
        return export_heads(policy)[graph]


class UserCells:
    """A team's own policy Cell (one graph, ``policy``), from a factory or an object, checkpoint loaded strictly."""

    def __init__(self, factory: str | nn.Cell | Callable[[], nn.Cell], checkpoint: Path | None = None) -> None:
        self.label = factory if isinstance(factory, str) else type(factory).__name__
        self._factory = import_factory(factory) if isinstance(factory, str) else factory
        self.checkpoint = checkpoint
        self.constants: tuple[ConstantInput, ...] = ()  # set from the contract: fed by ``ConstantInputs``
        self.ignored: list[str] = []  # the checkpoint's entries MindSpore adds (optimizer state...), not loaded

    @property
    def shared(self) -> bool:
        """The caller handed over a Cell object: every call returns that object, never a rebuilt one."""
        return isinstance(self._factory, nn.Cell)

    @contextlib.contextmanager
    def caller_mode_kept(self) -> Iterator[None]:
        """A Cell object handed over leaves in the training mode it came in (export and verify put it in eval mode)."""
        was = self._factory.training if self.shared else None
        try:
            yield
        finally:
            if was is not None:
                self._factory.set_train(was)

    def __call__(self, graph: str = "policy") -> nn.Cell:
        return self._with_constants(self._built())

    def _with_constants(self, cell: nn.Cell) -> nn.Cell:
        return compat.wrapped(ConstantInputs, cell, self.constants) if self.constants else cell

    def _built(self) -> nn.Cell:
        if self.shared:
            cell = self._factory  # a Cell object handed to the library API: shared, never rebuilt
        else:
            try:
                cell = self._factory()
            except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
                raise UsageError(f"--cell {self.label}: calling the factory failed: {first_line(exc)}") from None
            if not isinstance(cell, nn.Cell):
                raise UsageError(f"--cell {self.label} returned {type(cell).__name__}, not a mindspore.nn.Cell")
        if self.checkpoint is not None:
            self.ignored = load_strict(cell, self.checkpoint)
        cell.set_train(False)
        return cell

    def without_normalization(self, graph: str = "policy") -> nn.Cell | None:
        """The Cell inside an ``export_safe.NormalizeObservation`` wrapper, if the policy is wrapped in one."""
        from msrl_consistency.agent.export_safe import NormalizeObservation

        cell = self._built()
        return self._with_constants(cell.inner) if isinstance(cell, NormalizeObservation) else None


class ConstantInputs(nn.Cell):
    """``inner(*inputs, *constants)``: the Cell's constant inputs (MAPPO's ``masks`` of ones), one row per row of the
    first input, made inside the graph (so every exported format takes only the contract's graph inputs); a flag
    (``training = false``) is passed as the Python bool, so the graph is compiled for that branch only."""

    def __init__(self, inner: nn.Cell, constants: tuple[ConstantInput, ...]) -> None:
        super().__init__()
        self.inner = inner
        self.specs = tuple((c.flag, tuple(c.shape), ms_float32 if c.flag else compat.ms_dtype(c.dtype), c.value)
                           for c in constants)  # fmt: skip

    def construct(self, *inputs):  # noqa: ANN002, ANN201 - graph mode
        first = inputs[0]
        ones = ops.ones_like(first.reshape((first.shape[0], -1))[:, :1]).astype(ms_float32)  # [batch, 1]
        extra = ()
        for flag, shape, dtype, value in self.specs:  # unrolled at compile time
            if flag:
                extra = extra + (value,)
            else:
                rows = ops.broadcast_to(ones.reshape((-1,) + (1,) * len(shape)), (-1,) + shape)
                extra = extra + ((rows * value).astype(dtype),)
        return self.inner(*inputs, *extra)


def load_strict(cell: nn.Cell, checkpoint: Path) -> list[str]:
    """Load every Parameter of ``cell`` from ``checkpoint``: none missing, none unexpected, same shapes and dtypes.
    Returns the entries MindSpore adds around a network (``checkpoint.bookkeeping``: optimizer state, counters),
    which are not loaded.

    A Cell wrapped after it was built carries its Parameters under one extra prefix (``inner.fc1.weight`` for a
    checkpoint's ``fc1.weight``); that prefix is accepted only when it maps *every* name one to one. Nothing is
    matched by suffix and nothing is cast (``load_param_into_net(strict_load=False)`` does both, silently).
    """
    params = read_checkpoint(checkpoint)
    expected = {p.name: p for p in cell.get_parameters()}
    ignored = bookkeeping(list(params), list(expected))
    for name in ignored:
        del params[name]
    mapping = _match_names(list(expected), list(params))
    if mapping is None:
        missing = sorted(set(expected) - set(params))
        extra = sorted(set(params) - set(expected))
        also = f" (besides {describe_ignored(ignored)}, which are not loaded)" if ignored else ""
        raise UsageError(
            f"checkpoint {checkpoint} does not match the Cell: missing {missing[:4]}{'...' if len(missing) > 4 else ''}"
            f", unexpected {extra[:4]}{'...' if len(extra) > 4 else ''}{also}"
        )
    for name, ckpt_name in mapping.items():
        param, got = expected[name], params[ckpt_name]
        if tuple(got.shape) != tuple(param.shape) or got.dtype != param.dtype:
            raise UsageError(
                f"checkpoint {checkpoint}: {ckpt_name} is {got.dtype}{tuple(got.shape)}, the Cell expects "
                f"{param.dtype}{tuple(param.shape)}"
            )
    for name, ckpt_name in mapping.items():
        expected[name].set_data(params[ckpt_name].value())
    return ignored


def _match_names(cell_names: list[str], ckpt_names: list[str]) -> dict[str, str] | None:
    if set(cell_names) == set(ckpt_names):
        return {n: n for n in cell_names}
    if not cell_names:
        return None
    prefix = cell_names[0].split(".")[0] + "."
    if all(n.startswith(prefix) for n in cell_names):
        stripped = {n: n[len(prefix) :] for n in cell_names}
        if set(stripped.values()) == set(ckpt_names):
            return stripped
    return None
