"""The driver's argument checks without a device: a graph checked once is not scanned
again, and each bad argument is named."""
from __future__ import annotations

import numpy as np
import pytest

from gnnweave.generators import rmat
from gnnweave.host.driver import CheckedGraph, check_graph, validate_job


def test_checked_graph_is_a_frozen_copy():
    g = rmat(5, 4, seed=1)
    indptr, indices = np.array(g.indptr), np.array(g.indices)
    w = np.arange(g.num_edges) % 7
    checked = check_graph(g, w)
    assert isinstance(checked, CheckedGraph)
    assert check_graph(checked) is checked
    assert (checked.num_nodes, checked.num_edges) == (g.num_nodes, g.num_edges)
    for arr in (checked.indptr, checked.indices, checked.weights):
        assert not arr.flags.writeable
    g.indices[:] = 0            # the caller's arrays change: the checked copy does not
    w[:] = 99
    np.testing.assert_array_equal(checked.indices, indices)
    np.testing.assert_array_equal(checked.indptr, indptr)
    assert checked.weights.max() == 6


def test_validate_job_takes_a_checked_graph_and_its_weights():
    g = rmat(5, 4, seed=2)
    w = np.ones(g.num_edges, dtype=np.int64)
    checked = check_graph(g, w)
    x = np.zeros((g.num_nodes, 3))
    indptr, indices, x_out, red, shift, weights = validate_job(
        checked, x, "mean", 3, None, max_feat_dim=8, timeout_s=1.0)
    assert indptr is checked.indptr and indices is checked.indices and weights is checked.weights
    assert (int(red), shift, x_out.shape) == (1, 3, (g.num_nodes, 3))
    with pytest.raises(ValueError, match="a checked graph carries its weights"):
        validate_job(checked, x, "sum", 0, w, max_feat_dim=8, timeout_s=1.0)


@pytest.mark.parametrize("weights, match", [
    (np.zeros(3), r"weights: 3 values, the graph has \d+ edges"),
    ("big", r"weights\[0\] = 32768 is outside \[-32768, 32767\]"),
])
def test_check_graph_names_bad_weights(weights, match):
    g = rmat(5, 4, seed=3)
    if isinstance(weights, str):
        weights = np.full(g.num_edges, 1 << 15)
    with pytest.raises(ValueError, match=match):
        check_graph(g, weights)
