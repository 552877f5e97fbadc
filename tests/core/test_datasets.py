"""Dataset loaders: the shared files, every format round trip, every malformed input
named by file + field (+ index/line)."""
import gzip
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import gnnweave.datasets as ds
from gnnweave.datasets import (
    Dataset,
    DatasetError,
    DatasetNotFoundError,
    data_root,
    from_pyg,
    from_scipy,
    load_dataset,
    load_edge_list,
    load_npz,
    load_ogb,
    require_data,
    standard_split,
)
from gnnweave.graph import CSRGraph
from tests.conftest import require

# From shared/datasets/README.md: nodes, directed edges, features, classes, train/val/test
PUBLISHED = {
    "cora": (2708, 10556, 1433, 7, (140, 500, 1000)),
    "citeseer": (3327, 9104, 3703, 6, (120, 500, 1000)),
}


def shared_dataset(name):
    try:
        return load_dataset(name)
    except DatasetNotFoundError as exc:
        if require_data():
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shared_datasets_have_the_published_sizes(name):
    d = shared_dataset(name)
    nodes, edges, features, classes, split = PUBLISHED[name]
    assert (d.num_nodes, d.num_edges, d.num_features, d.num_classes) == (nodes, edges, features,
                                                                        classes)
    assert (d.train_mask.sum(), d.val_mask.sum(), d.test_mask.sum()) == split
    assert not (d.train_mask & d.test_mask).any() and not (d.val_mask & d.test_mask).any()
    ei = d.edge_index
    assert not np.any(ei[0] == ei[1])                     # no self loops added
    a = d.graph.to_scipy()
    assert (a != a.T).nnz == 0                            # both directions stored
    assert d.x.dtype == np.float32 and d.y.dtype == np.int64


def test_data_root_and_require_data(monkeypatch, tmp_path):
    monkeypatch.delenv("GNNWEAVE_DATA", raising=False)
    assert data_root() == Path(ds.__file__).resolve().parent.parent.parent / "shared" / "datasets"
    monkeypatch.setenv("GNNWEAVE_DATA", str(tmp_path))
    assert data_root() == tmp_path
    for value, want in (("1", True), ("0", False), ("", False), ("true", True)):
        monkeypatch.setenv("GNNWEAVE_REQUIRE_DATA", value)
        assert require_data() is want


def test_missing_named_dataset_says_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNWEAVE_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("cora")
    message = str(info.value)
    assert "cora.npz" in message and str(tmp_path) in message and "GNNWEAVE_DATA" in message
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


# ------------------------------------------------------------------------ .npz

def small_arrays(n=5):
    return dict(
        x=np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        y=np.array([0, 1, 2, 1, 0][:n], dtype=np.int64),
        edge_index=np.array([[0, 1, 2, 3, 4, 1], [1, 0, 3, 2, 0, 4]], dtype=np.int64),
        train_mask=np.array([1, 1, 0, 0, 0], dtype=bool),
        val_mask=np.array([0, 0, 1, 0, 0], dtype=bool),
        test_mask=np.array([0, 0, 0, 1, 1], dtype=bool),
    )


def write_npz(path, **changes):
    arrays = small_arrays()
    for key, value in changes.items():
        if value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    np.savez(path, **arrays)
    return path


def assert_same_dataset(a: Dataset, b: Dataset):
    np.testing.assert_array_equal(a.graph.indptr, b.graph.indptr)
    np.testing.assert_array_equal(a.graph.indices, b.graph.indices)
    if a.graph.weights is None:
        assert b.graph.weights is None
    else:
        np.testing.assert_array_equal(a.graph.weights, b.graph.weights)
    for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))


def test_npz_loads_the_shared_layout(tmp_path):
    d = load_npz(write_npz(tmp_path / "tiny.npz"))
    assert d.name == "tiny" and d.num_nodes == 5 and d.num_classes == 3
    # destination-grouped: node 0 receives from 1 and 4, in file order
    assert d.graph.indices[d.graph.indptr[0]:d.graph.indptr[1]].tolist() == [1, 4]
    assert sorted(map(tuple, d.edge_index.T.tolist())) == sorted(
        map(tuple, small_arrays()["edge_index"].T.tolist()))


def test_npz_round_trip_with_weights(tmp_path):
    d = load_npz(write_npz(tmp_path / "tiny.npz", edge_weight=np.linspace(0.5, 3, 6)))
    again = load_npz(d.save_npz(tmp_path / "again.npz"))
    assert_same_dataset(d, again)
    assert load_dataset(str(tmp_path / "again.npz")).num_edges == 6


NPZ_ERRORS = [
    (dict(x=None), "bad.npz: missing key 'x'"),
    (dict(test_mask=None), "bad.npz: missing key 'test_mask'"),
    (dict(edge_index=np.array([[0, 1], [1, 99]])), "bad.npz: edge_index[1, 1] = 99 is not a node id (N=5)"),
    (dict(edge_index=np.array([[0, -1], [1, 2]])), "bad.npz: edge_index[0, 1] = -1 is not a node id (N=5)"),
    (dict(edge_index=np.array([[0.0, 1.0], [1.0, 2.0]])), "bad.npz: edge_index: dtype float64, expected integer"),
    (dict(edge_index=np.array([0, 1, 2])), "bad.npz: edge_index: shape (3,), expected (2, E)"),
    (dict(x=np.array([[0.0, np.nan]] * 5)), "bad.npz: x[0, 1] = nan is not finite"),
    (dict(x=np.array([[0.0, 1.0]] * 4 + [[np.inf, 0]])), "bad.npz: x[4, 0] = inf is not finite"),
    (dict(x=np.zeros(5)), "bad.npz: x: shape (5,), expected (N, F)"),
    (dict(x=np.array([["a"]] * 5)), "bad.npz: x: dtype <U1, expected numbers"),
    (dict(y=np.array([0, 1, -3, 0, 0])), "bad.npz: y[2] = -3 is a negative class label"),
    (dict(y=np.zeros(5)), "bad.npz: y: dtype float64, expected integer class labels"),
    (dict(y=np.zeros(4, dtype=np.int64)), "bad.npz: y: shape (4,), expected (5,)"),
    # x short of rows: named as such, not as an edge to a node past x's end
    (dict(x=np.zeros((4, 2))), "bad.npz: y: shape (5,), expected (4,): x has 4 rows, y 5"),
    (dict(val_mask=np.zeros(6, bool)), "bad.npz: val_mask: shape (6,), expected (5,)"),
    (dict(train_mask=np.full(5, 0.5)), "bad.npz: train_mask: dtype float64, expected bool"),
    (dict(edge_weight=np.array([1, 2, np.inf, 1, 1, 1.0])), "bad.npz: edge_weight[2] = inf is not finite"),
    (dict(edge_weight=np.ones(3)), "bad.npz: edge_weight: shape (3,), expected (6,)"),
]


@pytest.mark.parametrize("changes, message", NPZ_ERRORS, ids=[m.split(": ", 1)[1][:40] for _, m in NPZ_ERRORS])
def test_npz_errors_name_file_field_and_index(tmp_path, changes, message):
    path = write_npz(tmp_path / "bad.npz", **changes)
    with pytest.raises(DatasetError) as info:
        load_npz(path)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_npz_integer_masks_of_zeros_and_ones_are_accepted(tmp_path):
    d = load_npz(write_npz(tmp_path / "ok.npz", train_mask=np.array([1, 0, 0, 0, 1])))
    assert d.train_mask.dtype == bool and d.train_mask.tolist() == [True, False, False, False, True]


def test_npz_unreadable_files(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"this is not a zip archive")
    with pytest.raises(DatasetError, match=r"^junk\.npz: not a readable \.npz archive"):
        load_npz(tmp_path / "junk.npz")
    arrays = small_arrays()
    arrays["y"] = np.array([0, 1, None, 1, 0], dtype=object)
    np.savez(tmp_path / "pickled.npz", **arrays)
    with pytest.raises(DatasetError, match=r"^pickled\.npz: y: cannot be read"):
        load_npz(tmp_path / "pickled.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    (tmp_path / "single.npy").rename(tmp_path / "single.npz")
    with pytest.raises(DatasetError, match=r"^single\.npz: holds a single array"):
        load_npz(tmp_path / "single.npz")
    with pytest.raises(DatasetNotFoundError, match="nothere.npz"):
        load_npz(tmp_path / "nothere.npz")


# ------------------------------------------------------------------------ OGB folder

def write_csv_gz(path: Path, rows, fmt="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(",".join(fmt.format(v) for v in np.atleast_1d(row)) + "\n" for row in rows)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)


def write_ogb(root: Path, *, suffix=".csv.gz", scheme="time", edges=None, labels=None,
              feats=None, split=None, num_nodes=True):
    edges = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 2]]) if edges is None else edges
    labels = np.array([[0], [1], [1], [2], [0]]) if labels is None else labels
    feats = np.arange(10, dtype=float).reshape(5, 2) / 4 if feats is None else feats
    split = split or dict(train=[0, 1], valid=[2], test=[3, 4])
    write_csv_gz(root / "raw" / f"edge{suffix}", edges)
    write_csv_gz(root / "raw" / f"node-label{suffix}", labels)
    if feats is not False:
        write_csv_gz(root / "raw" / f"node-feat{suffix}", feats)
    if num_nodes:
        write_csv_gz(root / "raw" / f"num-node-list{suffix}", [len(labels)])
        write_csv_gz(root / "raw" / f"num-edge-list{suffix}", [len(edges)])
    for part, ids in split.items():
        write_csv_gz(root / "split" / scheme / f"{part}{suffix}", [[i] for i in ids])
    return root


@pytest.mark.parametrize("suffix", [".csv.gz", ".csv"])
def test_ogb_folder_round_trip(tmp_path, suffix):
    root = write_ogb(tmp_path / "ogbn_tiny", suffix=suffix)
    d = load_dataset(str(root))
    assert d.name == "ogbn_tiny" and d.num_nodes == 5 and d.num_edges == 5
    np.testing.assert_array_equal(d.x, np.arange(10, dtype=np.float32).reshape(5, 2) / 4)
    assert d.y.tolist() == [0, 1, 1, 2, 0]
    assert np.flatnonzero(d.train_mask).tolist() == [0, 1]
    assert np.flatnonzero(d.val_mask).tolist() == [2]
    assert np.flatnonzero(d.test_mask).tolist() == [3, 4]
    # raw edge "src,dst": 4 -> 2 lands in row 2, after 1 -> 2
    assert d.graph.indices[d.graph.indptr[2]:d.graph.indptr[3]].tolist() == [1, 4]


def test_ogb_inverse_edges_for_the_datasets_ogb_stores_one_way(tmp_path):
    d = load_ogb(write_ogb(tmp_path / "ogbn_products", scheme="sales_ranking"))
    assert d.num_edges == 10
    a = d.graph.to_scipy()
    assert (a != a.T).nnz == 0
    assert load_ogb(tmp_path / "ogbn_products", add_inverse_edge=False).num_edges == 5


def test_ogb_without_node_features_gets_identity(tmp_path):
    d = load_ogb(write_ogb(tmp_path / "noattr", feats=False, num_nodes=False))
    np.testing.assert_array_equal(d.x, np.eye(5, dtype=np.float32))


def ogb_error(tmp_path, **kwargs):
    root = write_ogb(tmp_path / "ogbn_bad", **kwargs)
    with pytest.raises(DatasetError) as info:
        load_ogb(root)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_ogb_errors_name_the_file(tmp_path):
    assert ogb_error(tmp_path, edges=np.array([[0, 1], [1, 7]])) == (
        "ogbn_bad/raw/edge.csv.gz: edge_index[1, 1] = 7 is not a node id (N=5, line 2)")
    assert ogb_error(tmp_path, edges=np.array([[0, 1], [-1, 2]])).startswith(
        "ogbn_bad/raw/edge.csv.gz: edge_index[0, 1] = -1 is not a node id")


def test_ogb_label_errors(tmp_path):
    assert ogb_error(tmp_path / "a", labels=np.array([[0], [1], [-2], [0], [0]])) == (
        "ogbn_bad/raw/node-label.csv.gz: y[2] = -2 is a negative class label (line 3)")
    assert ogb_error(tmp_path / "b", labels=np.array([[0], [np.nan], [1], [0], [0]])) == (
        "ogbn_bad/raw/node-label.csv.gz: y[1] = nan is not a class label (line 2)")
    assert "only single-task" in ogb_error(tmp_path / "c", labels=np.zeros((5, 3), int))


def test_ogb_feature_and_count_errors(tmp_path):
    assert ogb_error(tmp_path / "a", feats=np.zeros((4, 2))).startswith(
        "ogbn_bad/raw/node-feat.csv.gz: 4 rows, expected N=5")
    root = write_ogb(tmp_path / "b" / "ogbn_bad")
    with gzip.open(root / "raw" / "node-feat.csv.gz", "wt") as fh:
        fh.write("0,1\n0,1\n0,oops\n0,1\n0,1\n")
    with pytest.raises(DatasetError, match=r"^ogbn_bad/raw/node-feat\.csv\.gz: line 3, column 2: "
                                          r"'oops' is not a number$"):
        load_ogb(root)
    write_csv_gz(root / "raw" / "num-node-list.csv.gz", [6])
    with gzip.open(root / "raw" / "node-feat.csv.gz", "wt") as fh:
        fh.write("0,1\n" * 5)
    with pytest.raises(DatasetError, match=r"num-node-list\.csv\.gz says 6 nodes"):
        load_ogb(root)


def test_ogb_split_errors(tmp_path):
    assert ogb_error(tmp_path / "a", split=dict(train=[0, 9], valid=[2], test=[3])) == (
        "ogbn_bad/split/time/train.csv.gz: [1] = 9 is not a node id (N=5, line 2)")
    root = write_ogb(tmp_path / "b" / "ogbn_bad")
    write_ogb(root, scheme="other")
    with pytest.raises(DatasetError, match=r"several schemes \(other, time\); pass split="):
        load_ogb(root)
    assert load_ogb(root, split="other").num_nodes == 5
    (root / "split" / "other" / "test.csv.gz").unlink()
    with pytest.raises(DatasetError, match=r"ogbn_bad/split/other/test\.csv\.gz: missing"):
        load_ogb(root, split="other")
    with pytest.raises(DatasetError, match=r"raw/edge\.csv\.gz: missing"):
        load_ogb(tmp_path)


# ------------------------------------------------------------------------ edge lists

def test_edge_list_txt_with_comments_header_and_blank_lines(tmp_path):
    path = tmp_path / "graph.txt"
    path.write_text("# a comment\nsource target\n\n0 1\n1\t2   # trailing comment\n2 0\n")
    d = load_edge_list(path)
    assert d.num_nodes == 3 and d.num_edges == 3 and d.graph.weights is None
    assert sorted(map(tuple, d.edge_index.T.tolist())) == [(0, 1), (1, 2), (2, 0)]
    np.testing.assert_array_equal(d.x, np.eye(3, dtype=np.float32))   # identity features
    assert d.y.shape == (3,) and d.y.max() < 2


@pytest.mark.parametrize("name, text", [
    ("g.csv", "0,1,0.5\n1,3,2.0\n"),
    ("g.tsv", "0\t1\t0.5\n1\t3\t2.0\n"),
    ("g.txt.gz", "0 1 0.5\n1 3 2.0\n"),
])
def test_edge_list_formats_with_weights(tmp_path, name, text):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    d = load_dataset(str(path))
    assert d.num_nodes == 4 and d.num_edges == 2
    assert d.graph.to_scipy()[1, 0] == 0.5 and d.graph.to_scipy()[3, 1] == 2.0


def test_edge_list_large_graphs_get_random_features(tmp_path, monkeypatch):
    monkeypatch.setattr(ds, "IDENTITY_FEATURES_MAX_NODES", 2)
    path = tmp_path / "g.txt"
    path.write_text("0 5\n")
    d = load_edge_list(path, seed=3)
    assert d.x.shape == (6, ds.RANDOM_FEATURE_DIM)
    np.testing.assert_array_equal(d.x, load_edge_list(path, seed=3).x)   # seeded
    assert load_edge_list(path, num_nodes=9).num_nodes == 9


@pytest.mark.parametrize("text, message", [
    ("0 1\n# c\n2 -1\n", "e.txt: line 3, column 2: -1 is a negative node id"),
    ("0 1\n1.5 2\n", "e.txt: line 2, column 1: 1.5 is not an integer node id"),
    ("0 1\n1 2 3 4\n", "e.txt: line 2: 4 columns, 2 on the first data line"),
    ("0 1\n1 x\n", "e.txt: line 2, column 2: 'x' is not a number"),
    ("0 1 1\n1 2 nan\n", "e.txt: line 2, column 3: weight nan is not finite"),
    ("0 1 1 1\n", "e.txt: 4 columns, expected 2 or 3"),
])
def test_edge_list_errors_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "e.txt"
    path.write_text(text)
    with pytest.raises(DatasetError) as info:
        load_edge_list(path)
    assert str(info.value) == message


def test_edge_list_node_count_too_small(tmp_path):
    path = tmp_path / "e.txt"
    path.write_text("0 1\n3 1\n")
    with pytest.raises(DatasetError, match=r"^e\.txt: line 2, column 1: 3 is not a node id \(N=3\)$"):
        load_edge_list(path, num_nodes=3)


def test_empty_edge_list(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("# nothing\n")
    with pytest.raises(DatasetError, match="empty.txt: no edges and no num_nodes"):
        load_edge_list(path)
    d = load_edge_list(path, num_nodes=5)
    assert d.num_nodes == 5 and d.num_edges == 0


# ------------------------------------------------------------------------ in memory

def test_from_scipy_source_rows_and_weights():
    # directed: 0 -> 1 (w 2), 2 -> 1 (w 3); adj[u, v] is u -> v
    adj = sp.csr_matrix(([2.0, 3.0], ([0, 2], [1, 1])), shape=(3, 3))
    x = np.ones((3, 2))
    y = np.array([0, 1, 0])
    d = from_scipy(adj, x, y)
    assert d.graph.indices[d.graph.indptr[1]:d.graph.indptr[2]].tolist() == [0, 2]
    assert d.graph.weights.tolist() == [2.0, 3.0]
    assert (d.train_mask | d.val_mask | d.test_mask).any()
    t = from_scipy(adj, x, y, rows="target")     # adj[v, u]: 1 -> 0 and 1 -> 2
    assert t.graph.in_degree.tolist() == [1, 0, 1]
    unweighted = from_scipy(sp.csr_matrix(np.array([[0, 1], [1, 0]])), np.ones((2, 1)), [0, 1])
    assert unweighted.graph.weights is None
    with pytest.raises(DatasetError, match="^scipy: val_mask: missing"):
        from_scipy(adj, x, y, train_mask=np.ones(3, bool))
    with pytest.raises(DatasetError, match=r"^scipy: adj: shape \(3, 2\)"):
        from_scipy(sp.csr_matrix((3, 2)), x, y)
    with pytest.raises(DatasetError, match=r"^scipy: x: shape \(2, 2\)"):
        from_scipy(adj, np.ones((2, 2)), y)


def test_from_pyg_needs_torch_geometric(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric", None)   # import fails
    with pytest.raises(ImportError, match="from_pyg needs torch_geometric"):
        from_pyg(object())


def test_from_pyg_round_trip():
    require("torch_geometric")
    import torch
    from torch_geometric.data import Data
    d = load_npz_like()
    data = Data(x=torch.as_tensor(d.x), y=torch.as_tensor(d.y)[:, None],
                edge_index=torch.as_tensor(d.edge_index),
                train_mask=torch.as_tensor(np.stack([d.train_mask, d.val_mask], 1)),
                val_mask=torch.as_tensor(d.val_mask), test_mask=torch.as_tensor(d.test_mask))
    back = from_pyg(data, name="tiny")
    assert_same_dataset(d, back)
    second = from_pyg(data, split=1)
    np.testing.assert_array_equal(second.train_mask, d.val_mask)
    with pytest.raises(DatasetError, match="has 2 splits"):
        from_pyg(data, split=2)


def load_npz_like():
    a = small_arrays()
    return Dataset("tiny", CSRGraph.from_edge_index(a["edge_index"], 5), a["x"], a["y"],
                   a["train_mask"], a["val_mask"], a["test_mask"])


# ------------------------------------------------------------------------ specs, split

def test_generated_specs():
    d = load_dataset("sbm:300:3", seed=1)
    assert (d.num_nodes, d.num_classes, d.num_features) == (300, 3, 64)
    assert load_dataset("sbm:300:3:8", seed=1).num_features == 8
    r = load_dataset("rmat:8:4")
    assert (r.num_nodes, r.num_edges) == (256, 1024)
    r2 = load_dataset("rmat:8:4:16:5")
    assert r2.num_features == 16 and r2.num_classes <= 5
    assert load_dataset("sbm").num_nodes == 2708


@pytest.mark.parametrize("spec, message", [
    ("sbm:abc", "sbm:abc: N = 'abc' is not a non-negative integer"),
    ("sbm:5:9", "sbm:5:9: C = 9 classes need at least as many nodes"),
    ("rmat:8", "rmat:8: expected rmat:SCALE:EF[:F[:C]]"),
    ("rmat:8:4:2:0", "rmat:8:4:2:0: C must be >= 1"),
    ("sbm:1:2:3:4", "sbm:1:2:3:4: too many fields"),
])
def test_bad_specs(spec, message):
    with pytest.raises(DatasetError) as info:
        load_dataset(spec)
    assert str(info.value).startswith(message)


def test_unknown_file_format(tmp_path):
    (tmp_path / "graph.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"^graph\.json: unknown dataset format"):
        load_dataset(str(tmp_path / "graph.json"))
    with pytest.raises(DatasetNotFoundError, match="no such file"):
        load_dataset(str(tmp_path / "absent.txt"))


def test_standard_split():
    y = np.repeat(np.arange(4), 600)
    train, val, test = standard_split(y, seed=0)
    assert [int(train[y == c].sum()) for c in range(4)] == [20] * 4
    assert (val.sum(), test.sum()) == (500, 1000)
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    again = standard_split(y, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
    assert not np.array_equal(standard_split(y, seed=1)[0], train)
    # a small graph shrinks the split instead of failing
    small = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    tr, va, te = standard_split(small)
    assert tr.sum() == 1 + 2 and va.sum() == 2 and te.sum() == 3
