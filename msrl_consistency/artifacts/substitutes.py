"""Export-safe substitutes: the same arithmetic, with the same Parameters, where MindSpore's ONNX exporter stops.

A team's Cell runs as written; only while its graphs are exported do these layers compute through ops the exporter
writes. Export's self-check then compares the written graphs with the Cell on its seeded observations, so a substitute
that computed anything else would fail the bundle, not pass silently.

* ``nn.GRU`` / ``nn.RNN`` / ``nn.LSTM`` (one direction, no ``seq_length``): on CPU MindSpore steps a GRU through time
  in a ``while`` loop that collects its outputs in a Python list. The ONNX exporter has no ``make_list`` (QMIX's and
  COMA's agents), and a dynamic-batch MindIR of that loop answers every later batch with the rows of its first call
  in the sequence output. The substitute unrolls every layer's (static) time steps and spells each step out with
  static slices of the gate products, in the ONNX and the MindIR alike.
* A negative ``axis`` on a Primitive (``P.Split(-1, 2)``, Dreamer's action decoder): the exporter says "``axis`` is
  out of range". The substitute counts it from the front, with the rank the Primitive was called with.
* ``nn.AdaptiveMaxPool2d`` / ``nn.AdaptiveAvgPool2d``: the exporter has neither. Where the output size divides the
  input size, the adaptive windows are fixed windows, and the substitute is ``MaxPool`` / ``AvgPool`` with them.
  Otherwise the windows differ in size and no fixed pool computes them: export says what to write instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mindspore import Tensor, nn, ops
from mindspore.nn.layer import rnns
from mindspore.ops.primitive import Primitive

from msrl_consistency import compat


class SubstituteError(ValueError):
    """A layer the exporter cannot write and no substitute computes exactly (the message says what to write)."""


# -- recurrent layers ----------------------------------------------------------------------------------------------
def _gru_step(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Any, b_hh: Any) -> Tensor:
    """MindSpore's ``_gru_cell`` (gates r, z, n in that order) with static slices instead of ``Split``."""
    n = h.shape[-1]
    gi = ops.MatMul(False, True)(x, w_ih)
    gh = ops.MatMul(False, True)(h, w_hh)
    if b_ih is not None:
        gi = gi + b_ih
        gh = gh + b_hh
    reset = ops.sigmoid(gi[:, 0:n] + gh[:, 0:n])
    update = ops.sigmoid(gi[:, n : 2 * n] + gh[:, n : 2 * n])
    new = ops.tanh(gi[:, 2 * n : 3 * n] + reset * gh[:, 2 * n : 3 * n])
    return new + update * (h - new)


def _lstm_step(x: Tensor, hidden: tuple[Tensor, Tensor], w_ih: Tensor, w_hh: Tensor, b_ih: Any, b_hh: Any) -> Any:
    """MindSpore's ``_lstm_cell`` (gates i, f, g, o) with static slices instead of ``Split``."""
    h, c = hidden
    n = h.shape[-1]
    gates = ops.MatMul(False, True)(x, w_ih) + ops.MatMul(False, True)(h, w_hh)
    if b_ih is not None:
        gates = gates + b_ih + b_hh
    i = ops.sigmoid(gates[:, 0:n])
    f = ops.sigmoid(gates[:, n : 2 * n])
    g = ops.tanh(gates[:, 2 * n : 3 * n])
    o = ops.sigmoid(gates[:, 3 * n : 4 * n])
    c = f * c + i * g
    return o * ops.tanh(c), c


def _rnn_step(self: Any, x: Tensor, h: Any, w_ih: Tensor, w_hh: Tensor, b_ih: Any, b_hh: Any) -> Any:
    if self.is_lstm:
        return _lstm_step(x, h, w_ih, w_hh, b_ih, b_hh)
    if isinstance(self.rnn, rnns._DynamicRNNBase):  # nn.RNN: tanh or relu of the two products
        total = ops.MatMul(False, True)(x, w_ih) + ops.MatMul(False, True)(h, w_hh)
        if b_ih is not None:
            total = total + b_ih + b_hh
        return ops.tanh(total) if self.rnn.cell is rnns._rnn_tanh_cell else ops.relu(total)
    return _gru_step(x, h, w_ih, w_hh, b_ih, b_hh)


def _rnn_unrolled(self: Any, x: Tensor, hx: Any = None, seq_length: Any = None) -> Any:
    """``_RNNBase.construct`` for one direction and no ``seq_length``: every layer's (static) time steps unrolled,
    outputs and final states concatenated. Dropout between layers is the identity in an exported (inference) graph."""
    if self.bidirectional or seq_length is not None:
        return _RNN_CONSTRUCT(self, x, hx, seq_length)
    if self.batch_first:
        x = ops.transpose(x, (1, 0, 2))
    if hx is None:
        zeros = ops.zeros((self.num_layers, x.shape[1], self.hidden_size), x.dtype)
        hx = (zeros, zeros) if self.is_lstm else zeros
    layer_input = x
    last_h, last_c = (), ()
    for i in range(self.num_layers):
        w_ih, w_hh = self.w_ih_list[i].astype(x.dtype), self.w_hh_list[i].astype(x.dtype)
        b_ih = self.b_ih_list[i].astype(x.dtype) if self.has_bias else None
        b_hh = self.b_hh_list[i].astype(x.dtype) if self.has_bias else None
        h = (hx[0][i], hx[1][i]) if self.is_lstm else hx[i]
        steps = ()
        for t in range(layer_input.shape[0]):  # the sequence length is static in an exported graph
            h = _rnn_step(self, ops.squeeze(layer_input[t : t + 1], 0), h, w_ih, w_hh, b_ih, b_hh)
            steps = steps + (ops.expand_dims(h[0] if self.is_lstm else h, 0),)
        layer_input = steps[0] if len(steps) == 1 else ops.concat(steps, 0)
        last_h = last_h + (ops.expand_dims(h[0] if self.is_lstm else h, 0),)
        if self.is_lstm:
            last_c = last_c + (ops.expand_dims(h[1], 0),)
    output = ops.transpose(layer_input, (1, 0, 2)) if self.batch_first else layer_input
    h_n = last_h[0] if len(last_h) == 1 else ops.concat(last_h, 0)
    if self.is_lstm:
        return output, (h_n, last_c[0] if len(last_c) == 1 else ops.concat(last_c, 0))
    return output, h_n


_RNN_CONSTRUCT = rnns._RNNBase.construct


# -- adaptive pools ------------------------------------------------------------------------------------------------
_ADAPTIVE = {nn.AdaptiveMaxPool2d: "MaxPool", nn.AdaptiveAvgPool2d: "AvgPool"}


def _fixed_pool_construct(self: Any, x: Tensor) -> Tensor:
    return self.export_fixed_pool(x)


def _fixed_window(name: str, layer: nn.Cell, shape: tuple[int, ...]) -> tuple[int, int]:
    size = layer.output_size if isinstance(layer.output_size, tuple) else (layer.output_size,) * 2
    out = [shape[-2 + k] if s is None else int(s) for k, s in enumerate(size)]
    if getattr(layer, "return_indices", False) or any(shape[-2 + k] % out[k] for k in range(2)):
        raise SubstituteError(
            f"layer {name!r} ({type(layer).__name__}{tuple(out)} on {shape[-2]}x{shape[-1]} inputs): MindSpore's ONNX "
            f"exporter has no adaptive pool, and these windows are not all of one size, so no fixed pool computes "
            f"them; write nn.{_ADAPTIVE[type(layer)].replace('Pool', 'Pool2d')} with the windows you mean, or resize "
            f"to a multiple of {out[0]}x{out[1]}"
        )
    return shape[-2] // out[0], shape[-1] // out[1]


# -- recording what each layer is called with ----------------------------------------------------------------------
def _negative_axis_primitives(cell: nn.Cell) -> dict[int, tuple[str, Primitive]]:
    found: dict[int, tuple[str, Primitive]] = {}
    for name, sub in cell.cells_and_names():
        for attr, prim in getattr(sub, "_primitives", {}).items():
            axis = getattr(prim, "axis", None) if prim is not None else None
            if isinstance(axis, int) and not isinstance(axis, bool) and axis < 0:
                found[id(prim)] = (f"{name}.{attr}" if name else attr, prim)
    return found


@contextlib.contextmanager
def _recording(prims: dict[int, tuple[str, Primitive]], pools: list[tuple[str, nn.Cell]]) -> Iterator[dict]:
    """While the block runs the Cell in PyNative: each Primitive's input ranks and each pool's input shapes."""
    seen: dict[int, set] = {}
    saved = []
    for cls in {type(p) for _, p in prims.values()}:
        original = cls.__call__

        def recorded(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            if id(self) in prims and args and hasattr(args[0], "ndim"):
                seen.setdefault(id(self), set()).add(args[0].ndim)
            return __original(self, *args, **kwargs)

        saved.append((cls, "__call__", cls.__dict__.get("__call__")))
        cls.__call__ = recorded
    for _, layer in pools:
        hook = layer.register_forward_pre_hook(
            lambda cell, args: seen.setdefault(id(cell), set()).add(tuple(args[0].shape))
        )
        saved.append((None, None, hook))
    try:
        yield seen
    finally:
        for cls, attr, value in saved:
            if cls is None:
                value.remove()
            elif value is None:
                delattr(cls, attr)  # it was inherited
            else:
                setattr(cls, attr, value)


SUBSTITUTES = ("recurrent", "axis", "pool")


def _set_axis(prim: Primitive, axis: int) -> None:
    prim.axis = axis
    prim.add_prim_attr("axis", axis)


@contextlib.contextmanager
def substituted(cell: nn.Cell, examples: list[Any], only: tuple[str, ...] = SUBSTITUTES) -> Iterator[list[str]]:
    """Inside the block, exporting ``cell`` writes the substitutes named in ``only``; yields one line per
    substituted layer.

    ``examples`` are the Cell's inputs for one PyNative run that records the ranks and shapes the substitutes are
    fixed with. ``SubstituteError`` when a layer has no exact substitute."""
    prims = _negative_axis_primitives(cell) if "axis" in only else {}
    pools = [(name, sub) for name, sub in cell.cells_and_names() if type(sub) in _ADAPTIVE and "pool" in only]
    recurrent = [(name, sub) for name, sub in cell.cells_and_names()
                 if isinstance(sub, rnns._RNNBase) and not sub.bidirectional and "recurrent" in only]  # fmt: skip
    used: list[str] = []
    undo: list[Any] = []
    try:
        if prims or pools:
            with _recording(prims, pools) as seen, compat.execution_mode(graph=False):
                cell(*examples)
            for key, (name, prim) in prims.items():
                ranks = seen.get(key, set())
                if len(ranks) == 1:  # called at one rank: the axis from the front is the same axis
                    axis, forward = prim.axis, prim.axis + next(iter(ranks))
                    _set_axis(prim, forward)
                    undo.append(lambda prim=prim, axis=axis: _set_axis(prim, axis))
                    used.append(f"{name}: axis {axis} written as {forward}")
            for name, layer in pools:
                shapes = seen.get(id(layer), set())
                if len(shapes) > 1:
                    raise SubstituteError(
                        f"layer {name!r} ({type(layer).__name__}) is called at several input "
                        f"sizes {sorted(shapes)}; MindSpore's ONNX exporter has no adaptive pool"
                    )
                if not shapes:
                    continue  # not on the exported path
                kernel = _fixed_window(name, layer, next(iter(shapes)))
                fixed = _ADAPTIVE[type(layer)]
                layer.export_fixed_pool = getattr(ops, fixed)(kernel_size=kernel, strides=kernel, pad_mode="VALID")
                undo.append(lambda layer=layer: delattr(layer, "export_fixed_pool"))
                used.append(f"{name}: {type(layer).__name__} written as {fixed} {kernel[0]}x{kernel[1]}")
            for cls in {type(layer) for _, layer in pools}:
                undo.append(lambda cls=cls, construct=cls.construct: setattr(cls, "construct", construct))
                cls.construct = _fixed_pool_construct
        if recurrent:
            undo.append(lambda: setattr(rnns._RNNBase, "construct", _RNN_CONSTRUCT))
            rnns._RNNBase.construct = _rnn_unrolled
            used += [f"{name}: {type(layer).__name__} written as its unrolled steps" for name, layer in recurrent]
        yield used
    finally:
        for step in reversed(undo):
            step()
