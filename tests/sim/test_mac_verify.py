"""verify_mac (the `gnnweave verify mac` back end): RTL MacArray vs golden, all modes."""
import pytest

from gnnweave.sim.mac_bench import verify_mac


@pytest.mark.parametrize("mode", ["fwd", "dx", "dw"])
def test_odd_sizes_all_modes(mode):
    r = verify_mac(7, 5, 9, mode, array_rows=3, array_cols=2, relu=True, bias=True, seed=5)
    assert r["match"], r
    assert r["mac_ops"] == 7 * 5 * 9


def test_saturation_is_counted_like_golden():
    r = verify_mac(6, 6, 8, "fwd", shift=8, seed=1)
    assert r["match"] and r["golden_saturations"] > 0 and r["saturations"] == r["golden_saturations"]


def test_backpressure_stalls_the_array_without_changing_results():
    r = verify_mac(8, 8, 2, "dw", backpressure=0.6, seed=2)
    assert r["match"] and r["stall_cycles"] > 0


def test_tile_aligned_utilization_target():
    r = verify_mac(16, 16, 32, "fwd", seed=3)
    assert r["match"] and r["mac_utilization"] >= 0.85, r


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="--depth must be in"):
        verify_mac(4, 4, 0, "fwd")
    with pytest.raises(ValueError, match="unknown MAC mode"):
        verify_mac(4, 4, 4, "conv")
