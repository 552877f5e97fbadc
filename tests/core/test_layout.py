"""gnnweave.layout: the memory image and registers of an Aggregator job."""
import numpy as np
import pytest

from gnnweave.graph import CSRGraph
from gnnweave.layout import BUFFERS, FILL_BYTE, AggregateJob


def small_job(**kw):
    g = CSRGraph.from_edge_index(np.array([[0, 1, 2, 2, 3], [1, 2, 0, 3, 3]]), 4)
    x = np.arange(4 * 7).reshape(4, 7) - 10
    return AggregateJob.from_graph(g, x, reduce="mean", shift=0, **kw)


def test_regions_are_aligned_disjoint_and_guarded():
    j = small_job(weights=np.array([1, -2, 3, -4, 5]))
    regions = [j.regions[n] for n in BUFFERS]
    for r in regions:
        assert r.addr % 16 == 0 and r.size % 16 == 0
    for a, b in zip(regions, regions[1:]):
        assert b.addr - a.end >= j.guard_bytes
    assert j.regions["indptr"].addr - j.base_addr >= j.guard_bytes
    assert j.base_addr + j.image_size >= j.regions["out"].end + j.guard_bytes
    assert j.base_addr > 1 << 32  # the upper address bits are exercised


def test_image_holds_the_words_little_endian():
    w = np.array([1, -2, 3, -4, 5])
    j = small_job(weights=w)
    img = j.memory_image()
    off = lambda n: j.regions[n].addr - j.base_addr  # noqa: E731
    assert img[off("indptr"):off("indptr") + 20].view("<u4").tolist() == j.indptr.tolist()
    assert img[off("indices"):off("indices") + 20].view("<u4").tolist() == j.indices.tolist()
    assert img[off("weights"):off("weights") + 10].view("<i2").tolist() == w.tolist()
    row = img[off("feat") + 2 * j.feat_stride: off("feat") + 2 * j.feat_stride + 14].view("<i2")
    assert row.tolist() == j.x[2].tolist()
    # padding of the 14-byte rows (stride 16) and the guards keep the fill pattern
    assert img[off("feat") + 14] == FILL_BYTE and img[off("feat") - 1] == FILL_BYTE
    assert (img[off("out"):off("out") + j.regions["out"].size] == FILL_BYTE).all()


def test_read_output_and_stray_writes():
    j = small_job()
    img = j.memory_image()
    want = np.arange(28).reshape(4, 7) * 3 - 40
    o = j.regions["out"].addr - j.base_addr
    for v in range(4):
        img[o + v * j.out_stride: o + v * j.out_stride + 14] = np.frombuffer(
            want[v].astype("<i2").tobytes(), np.uint8)
    assert (j.read_output(img) == want).all()
    assert j.stray_writes(img).size == 0
    img[o + 14] ^= 1                      # padding byte of row 0
    img[j.regions["feat"].addr - j.base_addr + 3] ^= 1
    assert sorted(j.stray_writes(img).tolist()) == sorted([o + 14, j.regions["feat"].addr - j.base_addr + 3])


def test_registers_use_the_contract_names():
    j = small_job(out_stride=48)
    regs = j.registers()
    assert regs["num_nodes"] == 4 and regs["num_edges"] == 5 and regs["feat_dim"] == 7
    assert regs["reduce_op"] == 1 and regs["use_weights"] == 0 and regs["shift"] == 0
    assert regs["feat_stride"] == 16 and regs["out_stride"] == 48
    for n in BUFFERS:
        assert regs[f"{n}_addr"] == j.regions[n].addr and regs[f"{n}_size"] == j.regions[n].size
    assert regs["weights_size"] == 0


@pytest.mark.parametrize("kw", [
    dict(registers_override={"feat_dim": 0}), dict(registers_override={"reduce_op": 3}),
    dict(addr_offsets={"indices": 4}), dict(feat_stride=24), dict(out_stride=0),
    dict(sizes={"indptr": 16}), dict(sizes={"out": 16 * 3}), dict(registers_override={"feat_dim": 300}),
])
def test_config_errors_by_the_contract(kw):
    assert small_job(**kw).config_error_expected(max_feat_dim=256)


def test_valid_job_is_not_a_config_error():
    assert not small_job().config_error_expected(max_feat_dim=256)
    assert small_job().config_error_expected(max_feat_dim=6)  # F=7 > 6


def test_malformed_words_are_kept_raw():
    j = AggregateJob(indptr=[3, 1, 0xFFFF_FFFF], indices=[5, -1], x=np.zeros((2, 3)))
    assert j.indptr.tolist() == [3, 1, 0xFFFF_FFFF] and j.indices.tolist() == [5, 0xFFFF_FFFF]


@pytest.mark.parametrize("kw, msg", [
    (dict(indptr=[0, 1], indices=[0], x=np.zeros((2, 2))), "indptr has 2 words"),
    (dict(indptr=[0, 1], indices=[0], x=np.zeros(3)), "2-D"),
    (dict(indptr=[0, 1], indices=[0], x=np.full((1, 2), 40000)), "int16"),
    (dict(indptr=[0, 1], indices=[0], x=np.zeros((1, 2)), weights=[1, 2]), "weights: shape"),
    (dict(indptr=[0, 1], indices=[0], x=np.zeros((1, 2)), num_edges=3), "num_edges=3"),
    (dict(indptr=[0, 1], indices=[0], x=np.zeros((1, 2)), sizes={"bogus": 4}), "bogus"),
])
def test_bad_jobs_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        AggregateJob(**kw)
