"""The ECP5 timing bench's seed sweep: which route it keeps, the seeds it refuses, and the
build it routes each unit of (no tool runs here)."""
import pytest

from benchmarks import bench_timing


def _route(seed, stage, fmax, late=None):
    return {"unit": "mac_array", "seed": seed, "stage": stage, "fmax_mhz": fmax,
            "slow_endpoints": None if late is None else {"late": late}}


def test_best_of_seeds_keeps_the_fastest_route_and_lists_every_seed():
    best = bench_timing.best_of_seeds([_route(1, "post-route", 83.24, 247),
                                       _route(2, "post-route", 87.62, 220),
                                       _route(3, "post-route", 68.24, 928)])
    assert best["seed"] == 2 and best["fmax_mhz"] == 87.62
    assert best["seeds"] == [
        {"seed": 1, "stage": "post-route", "fmax_mhz": 83.24, "late_endpoints": 247},
        {"seed": 2, "stage": "post-route", "fmax_mhz": 87.62, "late_endpoints": 220},
        {"seed": 3, "stage": "post-route", "fmax_mhz": 68.24, "late_endpoints": 928}]


def test_a_routed_figure_beats_a_higher_post_placement_estimate():
    best = bench_timing.best_of_seeds([_route(1, "post-placement estimate", 61.0),
                                       _route(2, "post-route", 49.9, 3000),
                                       _route(3, None, None)])
    assert best["seed"] == 2 and best["stage"] == "post-route"


def test_one_seed_is_its_own_entry_without_a_sweep():
    route = _route(4, "post-route", 70.0, 12)
    assert bench_timing.best_of_seeds([route]) == route


@pytest.mark.parametrize("seed", ["0", "1,1", "a", "2,", ""])
def test_bad_seeds_are_refused_before_any_route(seed, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_timing, "run", lambda *a, **k: pytest.fail("routed anyway"))
    assert bench_timing.main([str(tmp_path), "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --seed {seed}: ") and err.count("\n") == 1


@pytest.mark.parametrize("weight", ["0", "30,30", "x", ""])
def test_bad_placer_timing_weights_are_refused_before_any_route(weight, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setattr(bench_timing, "run", lambda *a, **k: pytest.fail("routed anyway"))
    assert bench_timing.main([str(tmp_path), "--placer-timing-weight", weight]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --placer-timing-weight {weight}: ") and err.count("\n") == 1


def test_a_seed_list_reaches_every_unit(tmp_path, monkeypatch):
    seen = {}

    def fake_run(out_dir, units, **kw):
        seen.update(units=units, seeds=kw["seeds"], speed_grade=kw["speed_grade"],
                    weights=kw["weights"])
        return {"units": {}}

    monkeypatch.setattr(bench_timing, "run", fake_run)
    assert bench_timing.main([str(tmp_path), "--seed", "1,2,3", "--units", "mac_array"]) == 0
    assert seen == {"units": ("mac_array",), "seeds": (1, 2, 3), "speed_grade": 6,
                    "weights": (bench_timing.PLACER_TIMING_WEIGHT,)}
    assert bench_timing.main([str(tmp_path), "--units", "mac_array", "--speed-grade", "8",
                              "--placer-timing-weight", "10,30"]) == 0
    assert seen["speed_grade"] == 8 and seen["weights"] == (10, 30)


def test_a_sweep_elaborates_the_build_once_and_routes_every_seed(tmp_path, monkeypatch):
    from gnnweave.hw.flow import estimate
    elaborated, routed = [], []
    monkeypatch.setattr(estimate, "config_top",
                        lambda config: elaborated.append(config) or (None, "top"))
    monkeypatch.setattr(estimate, "component_rtlil", lambda component, name: "design")
    monkeypatch.setattr(estimate, "timing_units", lambda design, name: {"mac_array": "top.mac"})

    def fake_route(design, module, *, seed, **kw):
        assert kw["speed_grade"] == 6
        routed.append((design, module, seed, kw["log_path"].name))
        return {"fmax_mhz": {"clk": 80.0 + seed}, "stage": "post-route", "printed": [],
                "seconds": {}}

    monkeypatch.setattr(estimate, "ecp5_timing", fake_route)
    bench_timing._design.cache_clear()
    res = bench_timing.run(tmp_path, ("mac_array",), config="small", seeds=(1, 2, 3))
    bench_timing._design.cache_clear()
    assert elaborated == ["small"]
    assert routed == [("design", "top.mac", s, f"mac_array.seed{s}.nextpnr.log") for s in (1, 2, 3)]
    assert res["units"]["mac_array"]["seed"] == 3


def test_a_weight_sweep_routes_every_weight_with_every_seed(tmp_path, monkeypatch):
    from gnnweave.hw.flow import estimate
    monkeypatch.setattr(estimate, "config_top", lambda config: (None, "top"))
    monkeypatch.setattr(estimate, "component_rtlil", lambda component, name: "design")
    monkeypatch.setattr(estimate, "timing_units", lambda design, name: {"aggregator": "top.agg"})
    routed = []

    def fake_route(design, module, *, seed, placer_timing_weight, **kw):
        routed.append((seed, placer_timing_weight, kw["log_path"].name))
        fmax = {(1, 10): 80.7, (2, 10): 83.0, (1, 30): 97.4, (2, 30): 92.7}[seed, placer_timing_weight]
        return {"fmax_mhz": {"clk": fmax}, "stage": "post-route", "printed": [], "seconds": {}}

    monkeypatch.setattr(estimate, "ecp5_timing", fake_route)
    bench_timing._design.cache_clear()
    res = bench_timing.run(tmp_path, ("aggregator",), config="pynqz2", seeds=(1, 2),
                           weights=(10, 30))
    bench_timing._design.cache_clear()
    assert routed == [(s, w, f"aggregator.w{w}.seed{s}.nextpnr.log") for w in (10, 30) for s in (1, 2)]
    best = res["units"]["aggregator"]
    assert (best["seed"], best["placer_timing_weight"], best["fmax_mhz"]) == (1, 30, 97.4)
    assert [(t["seed"], t["placer_timing_weight"]) for t in best["seeds"]] == \
        [(1, 10), (2, 10), (1, 30), (2, 30)]


def test_the_smallest_build_has_the_fewest_multipliers_then_block_rams(monkeypatch):
    from gnnweave.buildconfig import BUILDS
    from gnnweave.hw.flow import budget
    sizes = {"small": (8, 0.0), "pynqz2": (4, 1.5), "ultra96v2": (4, 1.5), "default": (4, 0.5)}
    budgeted = []

    def fake_budget(name):
        budgeted.append(name)
        return {"units": {"aggregator": {"dsp": sizes.get(name, (99, 0))[0],
                                         "bram36": sizes.get(name, (99, 0))[1], "uram": 0}}}

    monkeypatch.setattr(budget, "budget", fake_budget)
    bench_timing.unit_sizes.cache_clear()
    try:
        assert bench_timing.smallest_build("aggregator") == "default"
        # every build is elaborated once, whichever units are asked for
        bench_timing.smallest_build("pipeline")
        assert budgeted == list(BUILDS)
        sizes["default"] = (4, 1.5)
        bench_timing.unit_sizes.cache_clear()
        # equals: the first in BUILDS order
        first = next(n for n in BUILDS if n in ("default", "ultra96v2", "pynqz2"))
        assert bench_timing.smallest_build("aggregator") == first
    finally:
        bench_timing.unit_sizes.cache_clear()

