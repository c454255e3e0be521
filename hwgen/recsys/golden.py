"""Golden models of the recommendation-inference blocks (int64 numpy).

Embedding lookup: one row per table, concatenated in table order with the dense features.
Fully-connected layers: exact integer accumulation, bias, ReLU, requantisation.
"""

import numpy as np


# -- fully-connected layers ------------------------------------------------------------------
# An FC layer is ``acc = x @ w.T + b`` in a signed ACC_BITS-bit accumulator (products, their
# sum and the bias), then an optional ReLU, then requantisation to the next layer's precision.

from ..ibert.golden import round_shift  # noqa: E402  (FC section kept self-contained)

#: Width of every FC accumulator and bias (the raw output of a layer without requantisation).
ACC_BITS = 32


def fc_layer(x, w, b, *, relu, shift, out_bits):
    """One fully-connected layer on integers.

    ``acc = x @ w.T + b`` exactly (``x``: (..., in) activations, ``w``: (out, in) weights,
    ``b``: (out,) biases); then ``max(acc, 0)`` if ``relu``; then, if ``out_bits`` (non-zero),
    ``clamp(round_half_even(acc / 2**shift), -2**(out_bits-1), 2**(out_bits-1) - 1)``, else the
    ACC_BITS-bit accumulator itself (``shift`` ignored). Returns int64.

    Raises ValueError if an accumulator leaves the signed ACC_BITS-bit range: the weights and
    biases of :func:`fc_params` never let that happen for inputs of the declared width.
    """
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    acc = x @ w.T + np.asarray(b, dtype=np.int64)
    lo, hi = -(1 << (ACC_BITS - 1)), (1 << (ACC_BITS - 1)) - 1
    if acc.size and (acc.min() < lo or acc.max() > hi):
        raise ValueError(f"FC accumulator leaves the signed {ACC_BITS}-bit range "
                         f"({acc.min()} .. {acc.max()})")
    if relu:
        acc = np.maximum(acc, 0)
    if not out_bits:
        return acc
    q = round_shift(acc, shift)
    return np.clip(q, -(1 << (out_bits - 1)), (1 << (out_bits - 1)) - 1).astype(np.int64)


def fc_weight_range(in_dim, weight_bits, act_bits):
    """``(lo, hi)`` of the weights of a layer with ``in_dim`` inputs of ``act_bits`` bits.

    The full signed ``weight_bits`` range while ``in_dim`` products of extreme operands stay
    within 2**30 in magnitude, else the symmetric ``-m .. m`` with the largest such ``m``
    (16-bit activations and weights at in_dim 876: -37 .. 37): ``in_dim * max|x * w| <= 2**30``
    leaves at least 2**30 of the accumulator to the bias.
    """
    xmag = 1 << (act_bits - 1)
    lo, hi = -(1 << (weight_bits - 1)), (1 << (weight_bits - 1)) - 1
    if in_dim * xmag * -lo <= 1 << 30:
        return lo, hi
    m = (1 << 30) // (in_dim * xmag)
    if m < 1:
        raise ValueError(f"in_dim={in_dim} too large for {act_bits}-bit activations in a "
                         f"{ACC_BITS}-bit accumulator")
    return -m, m


def fc_bias_range(in_dim, weight_bits, act_bits):
    """``(lo, hi)`` of the biases: ``x @ w.T + b`` fits ACC_BITS bits for every input of
    ``act_bits`` bits and weights in :func:`fc_weight_range`; ``hi`` is reached exactly by
    an all-minimum input against an all-minimum weight row."""
    wlo, _ = fc_weight_range(in_dim, weight_bits, act_bits)
    room = in_dim * (1 << (act_bits - 1)) * -wlo
    return -(1 << (ACC_BITS - 1)) + room, (1 << (ACC_BITS - 1)) - 1 - room


def fc_params(in_dim, out_dim, weight_bits, act_bits, rng, *, extremes=False):
    """Random weights (``out_dim`` x ``in_dim``) and biases (``out_dim``) of one layer, drawn
    with the numpy Generator ``rng``; int64.

    Weights are uniform over :func:`fc_weight_range`; biases uniform over +-2**-6 of the
    largest dot product (comparable to typical dot products). With ``extremes`` (test
    parameters of a single layer), row 0 is all the lowest weight with the top of
    :func:`fc_bias_range` as its bias and row 1 all the highest weight with its bottom, so
    extreme inputs reach the accumulator's limits exactly, and every seventh bias from row 2
    on is uniform over the whole bias range.
    """
    wlo, whi = fc_weight_range(in_dim, weight_bits, act_bits)
    blo, bhi = fc_bias_range(in_dim, weight_bits, act_bits)
    w = rng.integers(wlo, whi, size=(out_dim, in_dim), endpoint=True)
    typical = max(1, (in_dim * (1 << (act_bits - 1)) * -wlo) >> 6)
    b = rng.integers(-typical, typical, size=out_dim, endpoint=True)
    if extremes:
        wide = rng.integers(blo, bhi, size=out_dim, endpoint=True)
        b[2::7] = wide[2::7]
        w[0], b[0] = wlo, bhi
        if out_dim > 1:
            w[1], b[1] = whi, blo
    return w.astype(np.int64), b.astype(np.int64)


def layer_params(model, layer):
    """``(w, b)`` of FC layer ``layer`` (0-based) of a :class:`~hwgen.recsys.model.RecModel`:
    :func:`fc_params` with ``weight_bits`` weights against ``act_bits[layer]`` inputs, drawn
    with ``numpy.random.default_rng([model.seed, layer])`` (reproducible, independent per
    layer)."""
    if not 0 <= layer < len(model.layers):
        raise ValueError(f"layer {layer} out of range: the model has {len(model.layers)}")
    in_dim, out_dim = model.layer_shapes[layer]
    rng = np.random.default_rng([model.seed, layer])
    return fc_params(in_dim, out_dim, model.weight_bits, model.act_bits[layer], rng)


def mlp(model, x):
    """All FC layers of ``model`` on the concatenated vectors ``x`` ((..., concat_len)
    integers of ``act_bits[0]`` bits): ReLU and requantisation to ``act_bits[l + 1]`` bits
    with ``shifts[l]`` after every layer ``l`` but the last, whose ACC_BITS-bit accumulator is
    returned (int64, (..., layers[-1]))."""
    x = np.asarray(x, dtype=np.int64)
    bits = model.act_bits[0]
    if x.shape[-1:] != (model.concat_len,):
        raise ValueError(f"input length {x.shape[-1:]} != concat_len {model.concat_len}")
    if x.size and (x.min() < -(1 << (bits - 1)) or x.max() >= 1 << (bits - 1)):
        raise ValueError(f"input outside the signed {bits}-bit range")
    last = len(model.layers) - 1
    for layer in range(last + 1):
        w, b = layer_params(model, layer)
        if layer < last:
            x = fc_layer(x, w, b, relu=True, shift=model.shifts[layer],
                         out_bits=model.act_bits[layer + 1])
        else:
            x = fc_layer(x, w, b, relu=False, shift=0, out_bits=0)
    return x


# -- embedding lookup --------------------------------------------------------------------------
# One row per table and inference, concatenated in table order, then the dense features. An
# index is unsigned; one at or beyond its table's rows is out of range: with oob="clamp" it
# reads the table's last row, with oob="flag" the table's vector is all zeros (and the hardware
# raises an error flag with the inference's output).

#: Out-of-range policies of :func:`embed`.
OOB_POLICIES = ("clamp", "flag")


def signed_range(bits):
    """``(lo, hi)``: the range of a ``bits``-bit two's complement integer."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def table_content(model, t):
    """Reproducible contents of table ``t`` of ``model``: a ``(rows, dim)`` int64 array.

    Drawn with ``numpy.random.default_rng([model.seed, 0x454D, t])``: uniform signed
    ``elem_bits`` values, about 3% of elements set to the minimum and 3% to the maximum; row 0
    starts with the minimum and the last row alternates maximum and minimum.
    """
    lo, hi = signed_range(model.elem_bits)
    table = model.tables[t]
    rng = np.random.default_rng([model.seed, 0x454D, t])
    x = rng.integers(lo, hi, size=(table.rows, table.dim), endpoint=True)
    u = rng.random(x.shape)
    x[u < 0.03] = lo
    x[u > 0.97] = hi
    x[0, 0] = lo
    x[-1] = np.where(np.arange(table.dim) % 2, lo, hi)
    return x.astype(np.int64)


def table_contents(model):
    """Reproducible contents of every table of ``model`` (:func:`table_content`), one
    ``(rows, dim)`` int64 array per table. Meant for models small enough to simulate
    (paper-ctr's 15 GB would not fit in host memory)."""
    return [table_content(model, t) for t in range(len(model.tables))]


def dense_features(model, count, rng):
    """``(count, model.dense)`` int64 dense features: signed ``elem_bits`` values.

    Inference 0 is all minimum values, inference 1 all maximum (when ``count`` allows); the
    rest are uniform over the range with 5% extremes mixed in, every other one scaled down to
    realistic small magnitudes (a rounded normal, sigma 1/16 of the range).
    """
    lo, hi = signed_range(model.elem_bits)
    x = rng.integers(lo, hi, size=(count, model.dense), endpoint=True)
    u = rng.random(x.shape)
    x[u < 0.025] = lo
    x[u > 0.975] = hi
    small = np.clip(np.round(rng.normal(0, (hi + 1) / 16, size=x.shape)), lo, hi)
    x[1::2] = small[1::2]
    if count > 0:
        x[0] = lo
    if count > 1:
        x[1] = hi
    return x.astype(np.int64)


def out_of_range(model, indices):
    """``(n, tables)`` bool: which indices are at or beyond their table's rows."""
    idx = np.atleast_2d(np.asarray(indices, dtype=np.int64))
    if idx.shape[1] != len(model.tables):
        raise ValueError(f"indices need {len(model.tables)} columns, got {idx.shape[1]}")
    if (idx < 0).any():
        raise ValueError("indices are unsigned: negative values are not allowed")
    rows = np.array([t.rows for t in model.tables], dtype=np.int64)
    return idx >= rows


def embed(model, contents, indices, dense, oob="clamp"):
    """The concatenated embedding vector(s) the lookup unit emits, as int64.

    Parameters
    ----------
    model : RecModel
    contents : list of array
        One ``(rows, dim)`` array per table (:func:`table_contents`).
    indices : array_like
        ``(tables,)`` for one inference or ``(n, tables)``; unsigned.
    dense : array_like
        ``(dense,)`` or ``(n, dense)`` dense features.
    oob : {"clamp", "flag"}
        Out-of-range indices read the last row ("clamp") or give a zero vector ("flag").

    Returns
    -------
    ndarray
        ``(concat_len,)`` or ``(n, concat_len)``: table 0's row, table 1's row, ..., then the
        dense features.
    """
    if oob not in OOB_POLICIES:
        raise ValueError(f"oob must be one of {OOB_POLICIES}, not {oob!r}")
    single = np.ndim(indices) == 1
    idx = np.atleast_2d(np.asarray(indices, dtype=np.int64))
    bad = out_of_range(model, idx)
    dense = np.asarray(dense, dtype=np.int64).reshape(len(idx), model.dense)
    parts = []
    for t, table in enumerate(model.tables):
        rows = np.asarray(contents[t], dtype=np.int64)
        got = rows[np.minimum(idx[:, t], table.rows - 1)]
        if oob == "flag":
            got = np.where(bad[:, t, None], 0, got)
        parts.append(got)
    out = np.concatenate(parts + [dense], axis=1)
    return out[0] if single else out
