"""Dropout masks that do not depend on how the nodes are split: a counter-based generator.

A sequential generator hands out numbers in the order they are asked for, so a rank that
holds a different set of rows draws different masks from the same seed. Here the draw for
element ``(node, column)`` of layer ``layer``'s input in epoch ``epoch`` is a hash of those
integers and the seed (SplitMix64's finaliser, a bijection on 64-bit words with full
avalanche), so any rank computes the same mask for the same global node: N-rank training
sees the masks of one process.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 words."""
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z = z ^ (z >> np.uint64(27))
    z = z * _M2
    return z ^ (z >> np.uint64(31))


def _key(*words) -> np.uint64:
    k = np.uint64(0)
    with np.errstate(over="ignore"):
        for w in words:
            k = _mix(np.asarray(k ^ (np.uint64(int(w) & 0xFFFF_FFFF_FFFF_FFFF) + _GOLDEN),
                                dtype=np.uint64))
    return np.uint64(k)


class CounterDropout:
    """Uniform draws keyed by ``(seed, epoch, layer, global node id, column)``.

    ``node_ids[r]`` is the global id of local row ``r``; set :attr:`epoch` before each
    step. Passed as the ``rng`` of a model's forward, it makes
    :func:`~gnnweave.host.models.sparse_dropout` draw per element position instead of in
    sequence.
    """

    def __init__(self, seed: int, node_ids: np.ndarray, epoch: int = 0):
        self.seed = int(seed)
        self.node_ids = np.asarray(node_ids, dtype=np.uint64)
        self.epoch = int(epoch)

    def draw_at(self, layer: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """float32 in [0, 1) for the elements at local ``rows`` and ``cols``."""
        key = _key(self.seed, 0xD0D0, self.epoch, layer)
        with np.errstate(over="ignore"):
            z = self.node_ids[np.asarray(rows, dtype=np.int64)] * _GOLDEN
            z = _mix(z ^ key)
            z = _mix(z + np.asarray(cols, dtype=np.uint64) * _M2)
        # 24 random bits: exactly representable float32 values k / 2**24
        return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
