"""What makes N ranks give one process's bits, tested without torch: counter-based dropout
masks keyed by global node id, bias sums that do not depend on the row split, and a
one-rank mini-batch run resumed from its checkpoint."""
import numpy as np
import pytest
import scipy.sparse as sp

from gnnweave.host.distributed import Comm, exact_row_sum, finish_row_sum, invariant_row_sum
from gnnweave.host.dropout import CounterDropout
from gnnweave.host.models import sparse_dropout


def _mask(rng, h, p, layer=0):
    out, keep = sparse_dropout(h, p, rng, True, layer=layer)
    return out


def test_a_rank_draws_the_rows_of_the_whole_mask():
    h = np.random.default_rng(0).standard_normal((500, 16)).astype(np.float32)
    full = _mask(CounterDropout(3, np.arange(500), epoch=7), h, 0.5, layer=1)
    rows = np.random.default_rng(1).permutation(500)[:180]
    part = _mask(CounterDropout(3, rows, epoch=7), h[rows], 0.5, layer=1)
    assert np.array_equal(part, full[rows])


def test_sparse_and_dense_inputs_draw_the_same_mask():
    x = sp.random(300, 200, density=0.05, random_state=2, dtype=np.float32).tocsr()
    rng = CounterDropout(0, np.arange(300))
    assert np.array_equal(_mask(rng, x, 0.3).toarray(), _mask(rng, x.toarray(), 0.3))


def test_draws_are_uniform_and_keyed_by_every_field():
    ids = np.arange(20000)
    cols = np.zeros(20000, dtype=np.int64)
    u = CounterDropout(0, ids).draw_at(0, ids, cols)
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    chi2 = ((counts - 1000) ** 2 / 1000).sum()
    assert chi2 < 45, chi2          # 19 degrees of freedom: p ~ 0.001
    for other in (CounterDropout(1, ids).draw_at(0, ids, cols),
                  CounterDropout(0, ids, epoch=1).draw_at(0, ids, cols),
                  CounterDropout(0, ids).draw_at(1, ids, cols),
                  CounterDropout(0, ids).draw_at(0, ids, cols + 1)):
        assert abs(np.corrcoef(u, other)[0, 1]) < 0.03


def test_keep_rate_is_one_minus_p():
    h = np.ones((2000, 50), dtype=np.float32)
    kept = np.count_nonzero(_mask(CounterDropout(5, np.arange(2000)), h, 0.5)) / h.size
    assert kept == pytest.approx(0.5, abs=5 * np.sqrt(0.25 / h.size))


def test_a_numpy_generator_still_draws_in_sequence():
    # the default path: one draw per non-zero element, in order, as before the counter path
    h = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    h[h < -1] = 0
    got = _mask(np.random.default_rng(9), h, 0.4)
    nz = np.flatnonzero(h)
    keep = nz[np.random.default_rng(9).random(nz.shape[0], dtype=np.float32) >= 0.4]
    want = np.zeros_like(h)
    want.reshape(-1)[keep] = h.reshape(-1)[keep] * np.float32(1 / 0.6)
    assert np.array_equal(got, want)


class _OneOfMany(Comm):
    """A rank whose collectives see a given global peak (the other ranks' rows elsewhere)."""

    def __init__(self, global_peak):
        super().__init__()
        self.global_peak = global_peak

    def peak(self, x):
        return self.global_peak


def test_bias_sums_are_the_same_bits_for_any_row_split():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((1000, 7)) * np.exp(rng.uniform(-30, 0, (1000, 7)))).astype(np.float32)
    whole = invariant_row_sum(a)
    comm = _OneOfMany(float(np.abs(a).max()))
    for cuts in ([300], [1, 999], [250, 500, 750]):
        partial = [exact_row_sum(piece, comm, total_rows=1000) for piece in np.split(a, cuts)]
        assert len({scale for _, scale in partial}) == 1
        total = sum(s for s, _ in partial)          # what the int64 all-reduce adds
        assert np.array_equal(finish_row_sum((total, partial[0][1])), whole)
    np.testing.assert_allclose(whole, a.astype(np.float64).sum(axis=0), rtol=1e-6, atol=1e-30)


def test_minibatch_over_ranks_resumes_from_its_checkpoint_bit_for_bit(tmp_path):
    # one rank of the distributed mini-batch path (no torch needed): 2 epochs, then on to 4
    from gnnweave.host.distributed import run_rank
    from gnnweave.host.train import TrainConfig
    from tests.conftest import require_dataset
    require_dataset("cora")
    kw = dict(dataset="cora", model="gcn", batch_size=64, fanouts=(5, 5), progress=False,
              checkpoint_dir=str(tmp_path), checkpoint_every=1)
    first = run_rank(TrainConfig(**kw, epochs=2), Comm())
    resumed = run_rank(TrainConfig(**kw, epochs=4, resume=True), Comm())
    straight = run_rank(TrainConfig(**{**kw, "checkpoint_dir": None}, epochs=4), Comm())
    assert first["seeds"][0]["epochs_done"] == 2
    assert resumed["seeds"][0]["resumed_from"] == 2
    assert resumed["seeds"][0]["params_sha256"] == straight["seeds"][0]["params_sha256"]


class _Disagreeing(Comm):
    """A rank whose peer reports another value in the digest check's all-reduce MAX."""

    def __init__(self, peer_value):
        super().__init__(rank=0, world=2)
        self.peer_value = peer_value

    def max(self, a, counter="format_bytes"):
        return np.maximum(a, np.array([self.peer_value, -self.peer_value]))


def test_a_digest_that_differs_between_ranks_stops_the_run():
    from gnnweave.host.distributed import DivergenceError
    _Disagreeing(7).check_same(7, "digest")              # the same on both: passes
    with pytest.raises(DivergenceError, match="rank 0: digest after epoch 3 differs"):
        _Disagreeing(8).check_same(7, "digest after epoch 3")
    with pytest.raises(DivergenceError):
        _Disagreeing(6).check_same(7, "digest")
