"""check_job (the bench's verdict) catches every kind of wrong run; no simulator needed."""
import numpy as np
import pytest

from gnnweave.sim.aggregate_bench import SUM, config_error_jobs, csr_from_lists, job, random_features
from gnnweave.sim.tb import AP_IDLE, STATUS_BITS, Burst, JobResult, check_job, golden_for


def _job(**kw):
    ip, ix = csr_from_lists([[1, 2, 7], [0], [], [2, 2, 1]])   # index 7 >= N: rejected
    return job(ip, ix, random_features(np.random.default_rng(1), 4, 9), SUM, True, **kw)


def _perfect(j, config_error=False):
    """What a correct engine would leave behind."""
    img = j.memory_image()
    status = 0
    bursts = []
    counters = dict.fromkeys(("busy_cycles", "read_beats", "write_beats", "stall_cycles",
                              "mem_wait_cycles", "edges", "rejected_indices", "saturations"), 0)
    if config_error:
        status = 1 << STATUS_BITS["config_error"]
        out = j.read_output(img)
    else:
        g = golden_for(j)
        out = g.out.copy()
        o = j.regions["out"].addr - j.base_addr
        for v in range(j.num_nodes):
            img[o + v * j.out_stride: o + v * j.out_stride + j.row_bytes] = np.frombuffer(
                out[v].astype("<i2").tobytes(), np.uint8)
        status = (int(g.rejected > 0) << STATUS_BITS["index_rejected"]) | \
                 (int(g.bad_indptr) << STATUS_BITS["bad_indptr"])
        counters.update(edges=g.edges, rejected_indices=g.rejected, saturations=g.saturations,
                        read_beats=6, write_beats=4, busy_cycles=50)
        bursts = [Burst("read", j.regions["indptr"].addr, 2, 16, 1, 0.0),
                  Burst("read", j.regions["feat"].addr, 4, 16, 1, 0.0),
                  Burst("write", j.regions["out"].addr, 4, 16, 1, 0.0)]
    return JobResult(out=j.read_output(img), counters=counters, status=status, cycles=60,
                     bursts=bursts, violations=[], stray_writes=j.stray_writes(img),
                     ap_ctrl_after=AP_IDLE,
                     flags={k: bool(status >> b & 1) for k, b in STATUS_BITS.items()})


def test_a_correct_run_passes():
    j = _job()
    assert check_job(j, _perfect(j), max_feat_dim=256)["mismatches"] == 0


@pytest.mark.parametrize("spoil, message", [
    (lambda r: r.out.__setitem__((2, 3), r.out[2, 3] + 1), r"out\[2\]\[3\]"),
    (lambda r: r.counters.__setitem__("edges", r.counters["edges"] + 1), "counter edges"),
    (lambda r: r.counters.__setitem__("rejected_indices", 0), "counter rejected_indices"),
    (lambda r: r.counters.__setitem__("read_beats", 7), "read_beats = 7, bench saw 6"),
    (lambda r: r.flags.__setitem__("bad_indptr", True), "bad_indptr"),
    (lambda r: r.flags.__setitem__("index_rejected", False), "index_rejected"),
    (lambda r: r.flags.__setitem__("axi_error", True), "unexpected status"),
    (lambda r: r.violations.append("read burst ... outside"), "memory-safety"),
    (lambda r: setattr(r, "stray_writes", np.array([5])), "outside the output rows"),
    (lambda r: setattr(r, "ap_ctrl_after", AP_IDLE | 2), "ap_done did not clear"),
    (lambda r: setattr(r, "ap_ctrl_after", 0), "not idle"),
    (lambda r: r.flags.__setitem__("config_error", True), "unexpected config_error"),
])
def test_every_fault_is_reported(spoil, message):
    j = _job()
    r = _perfect(j)
    spoil(r)
    with pytest.raises(AssertionError, match=message):
        check_job(j, r, max_feat_dim=256)


def test_config_errors_need_the_flag_and_silence():
    for name, j in config_error_jobs(np.random.default_rng(0), 256):
        r = _perfect(j, config_error=True)
        check_job(j, r, max_feat_dim=256)
        r.bursts = [Burst("read", j.regions["indptr"].addr, 1, 16, 1, 0.0)]
        with pytest.raises(AssertionError, match="bursts issued"):
            check_job(j, r, max_feat_dim=256)
        r = _perfect(j, config_error=True)
        r.flags["config_error"] = False
        with pytest.raises(AssertionError, match="config error expected"):
            check_job(j, r, max_feat_dim=256)
