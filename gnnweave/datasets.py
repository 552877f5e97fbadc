"""Node-classification datasets: one container, checked loaders for several formats.

A :class:`Dataset` holds the graph as a destination-grouped :class:`~gnnweave.graph.CSRGraph`
built from ``edge_index`` (row 0 = source, row 1 = target) exactly as stored — no self
loops or reverse edges are added — plus float32 features, int64 labels and boolean
train/val/test masks.

:func:`load_dataset` takes one string:

=====================================  =====================================================
``cora``, ``citeseer`` (any name)      ``data_root()/<name>.npz`` in the shared layout
``sbm`` or ``sbm:N:C[:F]``             :func:`gnnweave.generators.sbm` (planted classes)
``rmat:SCALE:EF[:F[:C]]``              :func:`gnnweave.generators.rmat` (directed, as drawn),
                                       random features (F=64) and labels (C=8): for
                                       benchmarks, not a learning task
``path/to/file.npz``                   :func:`load_npz`
``path/to/ogb_folder``                 :func:`load_ogb` (``raw/`` + ``split/`` as ogb lays
                                       out a node-property dataset)
``path/to/edges.txt|.csv|.tsv[.gz]``   :func:`load_edge_list`
=====================================  =====================================================

Malformed input raises :class:`DatasetError` (a ``ValueError``) with one line that names
the file, the field and, where it applies, the index.
"""
from __future__ import annotations

import gzip
import io
import os
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph

#: Keys of the shared ``.npz`` layout (see ``shared/datasets/README.md``).
NPZ_KEYS = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask")
MASK_NAMES = ("train_mask", "val_mask", "test_mask")

#: Feature-less graphs (edge lists, OGB folders without node-feat) get one-hot identity
#: features up to this many nodes (GCN's featureless setting), random ones above.
IDENTITY_FEATURES_MAX_NODES = 4096
#: Width of the random features given to feature-less graphs above that size.
RANDOM_FEATURE_DIM = 64

#: What ogb's master.csv says for the homogeneous node-property datasets: whether the raw
#: edge list holds one direction only (ogb adds the reverse edges), and the split scheme.
OGB_KNOWN = {
    "ogbn_arxiv": dict(add_inverse_edge=False, split="time"),
    "ogbn_products": dict(add_inverse_edge=True, split="sales_ranking"),
    "ogbn_proteins": dict(add_inverse_edge=True, split="species"),
    "ogbn_papers100m": dict(add_inverse_edge=False, split="time"),
}

EDGE_LIST_SUFFIXES = (".txt", ".csv", ".tsv", ".edges", ".el")
_PROGRESS_MIN_BYTES = 16 << 20


class DatasetError(InputError):
    """Malformed dataset input; the message names the file, the field and the index."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A named dataset file is not where it was looked for."""


# ------------------------------------------------------------------------ container

@dataclass
class Dataset:
    name: str
    graph: CSRGraph
    x: np.ndarray           # float32 [N, F]
    y: np.ndarray           # int64 [N]
    train_mask: np.ndarray  # bool [N]
    val_mask: np.ndarray    # bool [N]
    test_mask: np.ndarray   # bool [N]

    def __post_init__(self):
        self.x, self.y, masks = _check_node_arrays(
            self.name, self.graph.num_nodes, self.x, self.y,
            dict(train_mask=self.train_mask, val_mask=self.val_mask, test_mask=self.test_mask))
        self.train_mask, self.val_mask, self.test_mask = (masks[k] for k in MASK_NAMES)

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1 if self.y.size else 0

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def edge_index(self) -> np.ndarray:
        """int64 [2, E]: (source, target) per edge, in CSR (target-grouped) order."""
        target = np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.graph.in_degree)
        return np.stack([self.graph.indices, target])

    def save_npz(self, path) -> Path:
        """Write the shared ``.npz`` layout (plus ``edge_weight`` for a weighted graph)."""
        path = Path(path)
        arrays = dict(x=self.x, y=self.y, edge_index=self.edge_index,
                      train_mask=self.train_mask, val_mask=self.val_mask,
                      test_mask=self.test_mask)
        if self.graph.weights is not None:
            arrays["edge_weight"] = self.graph.weights
        np.savez_compressed(path, **arrays)
        return path

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"features={self.num_features}, classes={self.num_classes}, "
                f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/"
                f"{int(self.test_mask.sum())})")


# ------------------------------------------------------------------------ locations

def repo_root() -> Path:
    """The project root: the folder that holds the ``gnnweave/`` package."""
    return Path(__file__).resolve().parent.parent


def data_root() -> Path:
    """``$GNNWEAVE_DATA``, else ``<repo root>/../shared/datasets``."""
    env = os.environ.get("GNNWEAVE_DATA")
    if env:
        return Path(env).expanduser()
    return repo_root().parent / "shared" / "datasets"


def require_data() -> bool:
    """True when ``GNNWEAVE_REQUIRE_DATA=1``: a missing dataset must fail, not skip."""
    return os.environ.get("GNNWEAVE_REQUIRE_DATA", "").strip().lower() in ("1", "true", "yes")


# ------------------------------------------------------------------------ entry point

def load_dataset(spec: str, *, seed: int = 0) -> Dataset:
    """Load or generate a dataset from a spec string (see the module docstring).

    ``seed`` drives everything random: generated graphs, generated features/labels and
    splits that a format does not store.
    """
    spec = str(spec).strip()
    kind, _, rest = spec.partition(":")
    if kind.lower() == "sbm":
        return _sbm_spec(spec, rest, seed)
    if kind.lower() == "rmat" and rest:
        return _rmat_spec(spec, rest, seed)
    path = Path(spec).expanduser()
    looks_like_path = os.sep in spec or "/" in spec or path.suffix != "" or path.exists()
    if not looks_like_path:
        candidate = data_root() / f"{spec.lower()}.npz"
        if candidate.is_file():
            return load_npz(candidate, name=spec.lower())
        raise DatasetNotFoundError(
            f"{spec.lower()}.npz: not found in {data_root()} (looked for {candidate}; set "
            f"GNNWEAVE_DATA to the folder that holds it, or pass sbm[:N:C], rmat:SCALE:EF, "
            f"a .npz, an OGB folder or an edge list)")
    if not path.exists():
        raise DatasetNotFoundError(f"{spec}: no such file or folder")
    if path.is_dir():
        return load_ogb(path, seed=seed)
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".npz":
        return load_npz(path)
    core = suffixes[-2] if suffixes and suffixes[-1] == ".gz" and len(suffixes) > 1 else (
        suffixes[-1] if suffixes else "")
    if core in EDGE_LIST_SUFFIXES:
        return load_edge_list(path, seed=seed)
    raise DatasetError(f"{path.name}: unknown dataset format (expected .npz, an OGB folder, "
                       f"or an edge list {'/'.join(EDGE_LIST_SUFFIXES)}[.gz])")


def _spec_ints(spec: str, rest: str, names: list[str], minimum: int = 1) -> list[int]:
    fields = [f for f in rest.split(":")] if rest else []
    if len(fields) > len(names):
        raise DatasetError(f"{spec}: too many fields (expected {':'.join(names)})")
    values = []
    for name, text in zip(names, fields):
        if not re.fullmatch(r"\d+", text.strip()):
            raise DatasetError(f"{spec}: {name} = {text!r} is not a non-negative integer")
        value = int(text)
        if value < minimum:
            raise DatasetError(f"{spec}: {name} = {value} must be >= {minimum}")
        values.append(value)
    return values


def _sbm_spec(spec: str, rest: str, seed: int) -> Dataset:
    from gnnweave.generators import SBM_DEFAULTS, sbm
    values = _spec_ints(spec, rest, ["N", "C", "F"])
    num_nodes, num_classes, feat_dim = values + [SBM_DEFAULTS[k] for k in
                                                 ("num_nodes", "num_classes", "feat_dim")][len(values):]
    if num_classes > num_nodes:
        raise DatasetError(f"{spec}: C = {num_classes} classes need at least as many nodes")
    return sbm(num_nodes, num_classes, feat_dim=feat_dim, seed=seed, name=spec)


def _rmat_spec(spec: str, rest: str, seed: int) -> Dataset:
    from gnnweave.generators import rmat
    values = _spec_ints(spec, rest, ["SCALE", "EF", "F", "C"], minimum=0)
    if len(values) < 2:
        raise DatasetError(f"{spec}: expected rmat:SCALE:EF[:F[:C]]")
    scale, edge_factor = values[:2]
    feat_dim = values[2] if len(values) > 2 else RANDOM_FEATURE_DIM
    num_classes = values[3] if len(values) > 3 else 8
    if num_classes < 1:
        raise DatasetError(f"{spec}: C must be >= 1")
    graph = rmat(scale, edge_factor, seed=seed)
    return synthetic_node_data(spec, graph, feat_dim=feat_dim, num_classes=num_classes,
                               seed=seed)


def synthetic_node_data(name: str, graph: CSRGraph, *, feat_dim: int = RANDOM_FEATURE_DIM,
                        num_classes: int = 8, seed: int = 0) -> Dataset:
    """A graph dressed as a dataset for benchmarks: standard-normal float32 features,
    uniform random labels, :func:`standard_split`. Nothing to learn."""
    rng = np.random.default_rng([seed, 1])
    n = graph.num_nodes
    x = rng.standard_normal((n, feat_dim), dtype=np.float32)
    y = rng.integers(0, num_classes, n).astype(np.int64)
    train, val, test = standard_split(y, seed=seed)
    return Dataset(name, graph, x, y, train, val, test)


# ------------------------------------------------------------------------ split

def standard_split(y, *, per_class: int = 20, num_val: int = 500, num_test: int = 1000,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Planetoid-style random split: ``per_class`` training nodes of every class, then
    ``num_val`` validation and ``num_test`` test nodes from the rest.

    On small graphs it shrinks: a class gives at most half its nodes (at least one) to
    training; validation takes at most half of the rest and test at most what remains.
    """
    y = np.asarray(y)
    n = y.shape[0]
    rng = np.random.default_rng([seed, 2])
    train = np.zeros(n, dtype=bool)
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        take = min(per_class, max(1, members.shape[0] // 2))
        train[members[:take]] = True
    rest = rng.permutation(np.flatnonzero(~train))
    n_val = min(num_val, rest.shape[0] // 2)
    n_test = min(num_test, rest.shape[0] - n_val)
    val = np.zeros(n, dtype=bool)
    test = np.zeros(n, dtype=bool)
    val[rest[:n_val]] = True
    test[rest[n_val:n_val + n_test]] = True
    return train, val, test


# ------------------------------------------------------------------------ checks

def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _fmt_index(index: tuple[int, ...]) -> str:
    return ", ".join(str(i) for i in index)


def _check_node_arrays(source: str, n: int, x, y, masks: dict):
    """Dtype/shape/value checks of the per-node arrays; returns them converted."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise DatasetError(f"{source}: x: dtype {x.dtype}, expected numbers")
    if x.ndim != 2 or x.shape[0] != n:
        raise DatasetError(f"{source}: x: shape {x.shape}, expected (N, F) with N={n}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        index = _first_index(~np.isfinite(x))
        raise DatasetError(f"{source}: x[{_fmt_index(index)}] = {x[index]} is not finite")
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x32).all():
        index = _first_index(~np.isfinite(x32))
        raise DatasetError(f"{source}: x[{_fmt_index(index)}] = {x[index]} does not fit float32")

    y = np.asarray(y)
    if y.dtype.kind not in "iu":
        raise DatasetError(f"{source}: y: dtype {y.dtype}, expected integer class labels")
    if y.shape != (n,):
        raise DatasetError(f"{source}: y: shape {y.shape}, expected ({n},)")
    if y.size and y.min() < 0:
        i = int(np.flatnonzero(y < 0)[0])
        raise DatasetError(f"{source}: y[{i}] = {y[i]} is a negative class label")
    y64 = y.astype(np.int64)

    checked = {}
    for key, mask in masks.items():
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            if mask.dtype.kind not in "iu" or (mask.size and not np.isin(mask, (0, 1)).all()):
                raise DatasetError(f"{source}: {key}: dtype {mask.dtype}, expected bool")
            mask = mask.astype(bool)
        if mask.shape != (n,):
            raise DatasetError(f"{source}: {key}: shape {mask.shape}, expected ({n},)")
        checked[key] = mask
    return x32, y64, checked


def _check_edge_index(source: str, edge_index, n: int, field: str = "edge_index") -> np.ndarray:
    ei = np.asarray(edge_index)
    if ei.dtype.kind not in "iu":
        raise DatasetError(f"{source}: {field}: dtype {ei.dtype}, expected integer node ids")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DatasetError(f"{source}: {field}: shape {ei.shape}, expected (2, E)")
    bad = (ei < 0) | (ei >= n)
    if bad.any():
        row, col = _first_index(bad)
        raise DatasetError(f"{source}: {field}[{row}, {col}] = {ei[row, col]} is not a node id "
                           f"(N={n})")
    return ei.astype(np.int64)


def _check_edge_weight(source: str, weight, num_edges: int, field: str = "edge_weight"):
    if weight is None:
        return None
    w = np.asarray(weight)
    if w.dtype.kind not in "biuf":
        raise DatasetError(f"{source}: {field}: dtype {w.dtype}, expected numbers")
    if w.shape != (num_edges,):
        raise DatasetError(f"{source}: {field}: shape {w.shape}, expected ({num_edges},)")
    if w.dtype.kind == "f" and not np.isfinite(w).all():
        i = int(np.flatnonzero(~np.isfinite(w))[0])
        raise DatasetError(f"{source}: {field}[{i}] = {w[i]} is not finite")
    return w.astype(np.float64)


def _build(source: str, name: str, edge_index, n: int, x, y, masks: dict,
           edge_weight=None) -> Dataset:
    ei = _check_edge_index(source, edge_index, n)
    w = _check_edge_weight(source, edge_weight, ei.shape[1])
    x, y, masks = _check_node_arrays(source, n, x, y, masks)
    graph = CSRGraph.from_edge_index(ei, n, w)
    return Dataset(name, graph, x, y, masks["train_mask"], masks["val_mask"], masks["test_mask"])


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ------------------------------------------------------------------------ .npz

def load_npz(path, *, name: str | None = None) -> Dataset:
    """The shared layout: ``x`` [N, F], ``y`` [N], ``edge_index`` [2, E] (source, target),
    ``train_mask``/``val_mask``/``test_mask`` [N]; optional ``edge_weight`` [E]."""
    path = Path(path)
    source = path.name
    if not path.is_file():
        raise DatasetNotFoundError(f"{source}: no such file ({path})")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:   # bad zip, truncated file, not an archive at all
        raise DatasetError(f"{source}: not a readable .npz archive ({_one_line(exc)})") from None
    if not hasattr(archive, "files"):
        raise DatasetError(f"{source}: holds a single array, expected an .npz archive with "
                           f"keys {', '.join(NPZ_KEYS)}")
    with archive:
        missing = [k for k in NPZ_KEYS if k not in archive.files]
        if missing:
            raise DatasetError(f"{source}: missing key '{missing[0]}' (has: "
                               f"{', '.join(archive.files) or 'nothing'})")
        arrays = {}
        for key in NPZ_KEYS + (("edge_weight",) if "edge_weight" in archive.files else ()):
            try:
                arrays[key] = archive[key]
            except Exception as exc:
                raise DatasetError(f"{source}: {key}: cannot be read ({_one_line(exc)})") from None
    x = arrays["x"]
    if x.ndim != 2:
        raise DatasetError(f"{source}: x: shape {x.shape}, expected (N, F)")
    y = arrays["y"]
    if y.ndim >= 1 and y.shape[0] != x.shape[0]:
        # N comes from x: say so, rather than blame an edge or a mask for x's missing rows
        raise DatasetError(f"{source}: y: shape {y.shape}, expected ({x.shape[0]},): x has "
                           f"{x.shape[0]} rows, y {y.shape[0]}; both need one row per node")
    return _build(source, name or path.stem, arrays["edge_index"], x.shape[0], x, arrays["y"],
                  {k: arrays[k] for k in MASK_NAMES}, arrays.get("edge_weight"))


# ------------------------------------------------------------------------ text tables

class _ProgressReader(io.RawIOBase):
    """A raw byte stream that advances a progress bar by what it reads."""

    def __init__(self, raw, bar):
        self.raw, self.bar = raw, bar

    def readable(self):
        return True

    def readinto(self, buffer):
        count = self.raw.readinto(buffer)
        self.bar.update(count or 0)
        return count


@contextmanager
def _open_text(path: Path):
    """Text stream of a plain or gzip file, with a byte progress bar for big files."""
    size = path.stat().st_size
    with open(path, "rb") as raw, tqdm(total=size, desc=path.name, unit="B", unit_scale=True,
                                       leave=False, disable=size < _PROGRESS_MIN_BYTES) as bar:
        binary = io.BufferedReader(_ProgressReader(raw, bar))
        if path.suffix == ".gz":
            binary = gzip.GzipFile(fileobj=binary, mode="rb")
        yield io.TextIOWrapper(binary, encoding="utf-8", errors="replace")


def _data_lines(path: Path, delimiter):
    """(file line number, fields) of each data line: comments ('#') and blanks skipped."""
    with _open_text(path) as fh:
        for number, line in enumerate(fh, start=1):
            text = line.split("#", 1)[0].strip()
            if text:
                yield number, [f.strip() for f in text.split(delimiter)]


def _read_table(path: Path, display: str, dtype, delimiter=None, *, columns=None,
                skip_header: bool = False) -> np.ndarray:
    """A numeric text table as a 2-D array; errors name ``display`` and the file line.

    ``columns``: allowed column counts (None: any, but the same on every line).
    """
    try:
        with _open_text(path) as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # "input contained no data"
            table = np.loadtxt(fh, dtype=dtype, delimiter=delimiter, comments="#", ndmin=2,
                               skiprows=_header_line(path, delimiter) if skip_header else 0)
    except (ValueError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise DatasetError(_explain_table_error(path, display, dtype, delimiter, exc,
                                                skip_header)) from None
    if table.size == 0:
        table = table.reshape(0, columns[0] if columns else 0)
    if columns is not None and table.shape[1] not in columns:
        want = " or ".join(str(c) for c in columns)
        raise DatasetError(f"{display}: {table.shape[1]} columns, expected {want}")
    return table


def _header_line(path: Path, delimiter) -> int:
    """Number of lines up to and including a non-numeric first data line (0 if none)."""
    for number, fields in _data_lines(path, delimiter):
        try:
            float(fields[0])
            return 0
        except ValueError:
            return number
    return 0


def _explain_table_error(path, display, dtype, delimiter, exc, skip_header) -> str:
    """Find the offending line by re-reading in Python (error path only)."""
    if isinstance(exc, (OSError, EOFError)) and not isinstance(exc, ValueError):
        return f"{display}: cannot be read ({_one_line(exc)})"
    try:
        width = None
        header = _header_line(path, delimiter) if skip_header else 0
        for number, fields in _data_lines(path, delimiter):
            if number <= header:
                continue
            if width is None:
                width = len(fields)
            if len(fields) != width:
                return (f"{display}: line {number}: {len(fields)} columns, "
                        f"{width} on the first data line")
            for column, text in enumerate(fields, start=1):
                try:
                    np.array(text).astype(dtype)
                    if np.dtype(dtype).kind in "iu" and not re.fullmatch(r"[+-]?\d+", text):
                        raise ValueError
                except (ValueError, OverflowError):
                    kind = "an integer" if np.dtype(dtype).kind in "iu" else "a number"
                    return f"{display}: line {number}, column {column}: {text!r} is not {kind}"
    except (OSError, EOFError, gzip.BadGzipFile) as exc2:
        return f"{display}: cannot be read ({_one_line(exc2)})"
    return f"{display}: {_one_line(exc)}"


def _data_line_number(path: Path, delimiter, row: int, skip_header: bool = False) -> int:
    """File line number of data row ``row`` (0-based) — for error messages."""
    header = _header_line(path, delimiter) if skip_header else 0
    seen = -1
    for number, _ in _data_lines(path, delimiter):
        if number <= header:
            continue
        seen += 1
        if seen == row:
            return number
    return -1


# ------------------------------------------------------------------------ edge list

def _edge_list_delimiter(path: Path):
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return "," if suffixes and suffixes[-1] == ".csv" else None   # None: any whitespace


def featureless_inputs(n: int, *, seed: int = 0, features: str = "auto",
                       feat_dim: int = RANDOM_FEATURE_DIM) -> np.ndarray:
    """Features for a graph that has none: ``identity`` (one-hot node id, [N, N]) or
    ``random`` (standard normal [N, feat_dim]); ``auto`` picks identity up to
    :data:`IDENTITY_FEATURES_MAX_NODES` nodes."""
    if features == "auto":
        features = "identity" if n <= IDENTITY_FEATURES_MAX_NODES else "random"
    if features == "identity":
        return np.eye(n, dtype=np.float32)
    if features == "random":
        return np.random.default_rng([seed, 3]).standard_normal((n, feat_dim), dtype=np.float32)
    raise ValueError(f"features must be 'auto', 'identity' or 'random', got {features!r}")


def load_edge_list(path, *, num_nodes: int | None = None, features: str = "auto",
                   feat_dim: int = RANDOM_FEATURE_DIM, num_classes: int = 2,
                   seed: int = 0) -> Dataset:
    """A plain edge list: one ``src dst [weight]`` per line, 0-based node ids, ``#``
    comments and blank lines ignored, one optional header line. ``.csv`` is split at
    commas, anything else at whitespace; ``.gz`` is decompressed.

    Nodes: ``num_nodes`` or ``max id + 1``. An edge list has no node data, so the
    features come from :func:`featureless_inputs` and the labels are uniform random in
    ``num_classes`` (placeholders for benchmarks, nothing to learn), split with
    :func:`standard_split`.
    """
    path = Path(path)
    source = path.name
    if not path.is_file():
        raise DatasetNotFoundError(f"{source}: no such file ({path})")
    delimiter = _edge_list_delimiter(path)
    table = _read_table(path, source, np.float64, delimiter, columns=(2, 3), skip_header=True)
    ids = table[:, :2]
    not_int = (ids != np.floor(ids)) | (np.abs(ids) > 2**62)
    negative = ids < 0
    for bad, problem in ((not_int, "is not an integer node id"), (negative, "is a negative node id")):
        if bad.any():
            row, col = _first_index(bad)
            line = _data_line_number(path, delimiter, row, skip_header=True)
            raise DatasetError(f"{source}: line {line}, column {col + 1}: {ids[row, col]:g} "
                               f"{problem}")
    edge_index = ids.T.astype(np.int64)
    n = int(edge_index.max()) + 1 if edge_index.size else 0
    if num_nodes is not None:
        if edge_index.size and n > num_nodes:
            row, col = _first_index(edge_index.T >= num_nodes)
            line = _data_line_number(path, delimiter, row, skip_header=True)
            raise DatasetError(f"{source}: line {line}, column {col + 1}: "
                               f"{edge_index[col, row]} is not a node id (N={num_nodes})")
        n = num_nodes
    if n == 0:
        raise DatasetError(f"{source}: no edges and no num_nodes: the graph would have no nodes")
    weight = table[:, 2] if table.shape[1] == 3 else None
    if weight is not None and not np.isfinite(weight).all():
        row = int(np.flatnonzero(~np.isfinite(weight))[0])
        line = _data_line_number(path, delimiter, row, skip_header=True)
        raise DatasetError(f"{source}: line {line}, column 3: weight {weight[row]} is not finite")
    rng = np.random.default_rng([seed, 4])
    y = rng.integers(0, num_classes, n).astype(np.int64)
    x = featureless_inputs(n, seed=seed, features=features, feat_dim=feat_dim)
    train, val, test = standard_split(y, seed=seed)
    return _build(source, path.name.split(".")[0], edge_index, n, x, y,
                  dict(train_mask=train, val_mask=val, test_mask=test), weight)


# ------------------------------------------------------------------------ OGB folder

def _ogb_file(folder: Path, *parts: str) -> Path | None:
    for suffix in (".csv.gz", ".csv"):
        candidate = folder.joinpath(*parts[:-1], parts[-1] + suffix)
        if candidate.is_file():
            return candidate
    return None


def load_ogb(folder, *, split: str | None = None, add_inverse_edge: bool | None = None,
             seed: int = 0) -> Dataset:
    """An ogb node-property dataset folder as ``NodePropPredDataset`` lays it out::

        <folder>/raw/edge.csv.gz          E lines "src,dst"
        <folder>/raw/node-label.csv.gz    N lines, one integer label (single task only)
        <folder>/raw/node-feat.csv.gz     N lines of F floats (optional)
        <folder>/raw/num-node-list.csv.gz the node count (optional)
        <folder>/split/<scheme>/{train,valid,test}.csv.gz   node ids

    (plain ``.csv`` works too). ``add_inverse_edge``: also store every edge reversed, as
    ogb does for the datasets whose raw files hold one direction; None looks the folder
    name up in :data:`OGB_KNOWN` (ogbn-products/-proteins: yes) and defaults to no.
    ``split``: the scheme folder; None takes the known one or the only one there. Without
    node-feat the features come from :func:`featureless_inputs`.
    """
    folder = Path(folder)
    name = folder.resolve().name
    known = OGB_KNOWN.get(name.lower().replace("-", "_"), {})
    raw = folder / "raw"

    def display(path: Path) -> str:
        return f"{name}/{path.relative_to(folder).as_posix()}"

    edge_path = _ogb_file(folder, "raw", "edge")
    if edge_path is None:
        raise DatasetError(f"{name}/raw/edge.csv.gz: missing (not an OGB node-property folder: "
                           f"expected raw/edge.csv.gz, raw/node-label.csv.gz, split/<scheme>/)")
    label_path = _ogb_file(folder, "raw", "node-label")
    if label_path is None:
        raise DatasetError(f"{name}/raw/node-label.csv.gz: missing")
    edges = _read_table(edge_path, display(edge_path), np.int64, ",", columns=(2,))
    labels = _read_table(label_path, display(label_path), np.float64, ",")
    if labels.shape[1] != 1:
        raise DatasetError(f"{display(label_path)}: {labels.shape[1]} label columns; only "
                           f"single-task (multiclass) datasets are supported")
    labels = labels[:, 0]
    n = labels.shape[0]
    feat_path = _ogb_file(folder, "raw", "node-feat")
    count_path = _ogb_file(folder, "raw", "num-node-list")
    if count_path is not None:
        counts = _read_table(count_path, display(count_path), np.int64, ",")
        if counts.size != 1:
            raise DatasetError(f"{display(count_path)}: {counts.size} entries; only one graph "
                               f"is supported")
        if int(counts.flat[0]) != n:
            raise DatasetError(f"{display(label_path)}: {n} labels but "
                               f"{display(count_path)} says {int(counts.flat[0])} nodes")
    bad = ~np.isfinite(labels) | (labels != np.floor(labels)) | (labels < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        problem = "is a negative class label" if labels[i] < 0 else "is not a class label"
        raise DatasetError(f"{display(label_path)}: y[{i}] = {labels[i]:g} {problem} "
                           f"(line {_data_line_number(label_path, ',', i)})")
    y = labels.astype(np.int64)
    if feat_path is not None:
        x = _read_table(feat_path, display(feat_path), np.float32, ",")
        if x.shape[0] != n:
            raise DatasetError(f"{display(feat_path)}: {x.shape[0]} rows, expected N={n} "
                               f"(one per label in {display(label_path)})")
        if not np.isfinite(x).all():
            row, col = _first_index(~np.isfinite(x))
            raise DatasetError(f"{display(feat_path)}: x[{row}, {col}] = {x[row, col]} is not "
                               f"finite (line {_data_line_number(feat_path, ',', row)})")
    else:
        x = featureless_inputs(n, seed=seed)
    edge_index = edges.T
    bad = (edge_index < 0) | (edge_index >= n)
    if bad.any():
        row, col = _first_index(bad)
        raise DatasetError(f"{display(edge_path)}: edge_index[{row}, {col}] = "
                           f"{edge_index[row, col]} is not a node id (N={n}, line "
                           f"{_data_line_number(edge_path, ',', col)})")
    if add_inverse_edge is None:
        add_inverse_edge = known.get("add_inverse_edge", False)
    if add_inverse_edge:
        # ogb's order: each edge followed by its reverse
        edge_index = np.stack([edge_index, edge_index[::-1]], axis=2).reshape(2, -1)

    split_root = folder / "split"
    schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
    if split is None:
        if known.get("split") in schemes:
            split = known["split"]
        elif len(schemes) == 1:
            split = schemes[0]
        else:
            raise DatasetError(f"{name}/split: " + (f"several schemes ({', '.join(schemes)}); "
                                                      f"pass split=" if schemes else
                                                      "missing (expected split/<scheme>/)"))
    masks = {}
    for part, key in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
        part_path = _ogb_file(folder, "split", split, part)
        if part_path is None:
            raise DatasetError(f"{name}/split/{split}/{part}.csv.gz: missing")
        ids = _read_table(part_path, display(part_path), np.int64, ",", columns=(1,))[:, 0]
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(f"{display(part_path)}: [{i}] = {ids[i]} is not a node id "
                               f"(N={n}, line {_data_line_number(part_path, ',', i)})")
        mask = np.zeros(n, dtype=bool)
        mask[ids] = True
        masks[key] = mask
    return _build(name, name, edge_index, n, x, y, masks)


# ------------------------------------------------------------------------ in-memory

def from_scipy(adj, x, y, train_mask=None, val_mask=None, test_mask=None, *,
               name: str = "scipy", rows: str = "source", seed: int = 0) -> Dataset:
    """From a sparse (or dense) adjacency, features and labels.

    ``rows="source"`` (default, the convention of networkx and Planetoid): ``adj[u, v]``
    is the edge u -> v; ``rows="target"``: ``adj[v, u]`` is (as in :class:`CSRGraph`).
    Stored entries are edges (explicit zeros included, duplicates kept); their values
    become edge weights unless all are 1. Masks not given come from :func:`standard_split`.
    """
    if rows not in ("source", "target"):
        raise ValueError(f"rows must be 'source' or 'target', got {rows!r}")
    coo = sp.coo_matrix(adj)
    if coo.shape[0] != coo.shape[1]:
        raise DatasetError(f"{name}: adj: shape {coo.shape}, expected square (N, N)")
    n = coo.shape[0]
    src, dst = (coo.row, coo.col) if rows == "source" else (coo.col, coo.row)
    data = np.asarray(coo.data)
    if data.dtype.kind not in "biuf":
        raise DatasetError(f"{name}: adj: dtype {data.dtype}, expected numbers")
    weight = None if np.all(data == 1) else data
    masks = _masks_or_split(name, y, train_mask, val_mask, test_mask, seed)
    return _build(name, name, np.stack([src, dst]).astype(np.int64), n, x, y, masks, weight)


def _masks_or_split(name, y, train_mask, val_mask, test_mask, seed) -> dict:
    given = dict(train_mask=train_mask, val_mask=val_mask, test_mask=test_mask)
    if all(m is None for m in given.values()):
        train, val, test = standard_split(np.asarray(y).reshape(-1), seed=seed)
        return dict(train_mask=train, val_mask=val, test_mask=test)
    missing = [k for k, m in given.items() if m is None]
    if missing:
        raise DatasetError(f"{name}: {missing[0]}: missing (give all three masks or none)")
    return given


def from_pyg(data, *, name: str = "pyg", split: int = 0, seed: int = 0) -> Dataset:
    """From a ``torch_geometric.data.Data`` with ``edge_index``, ``x``, ``y`` and
    optionally ``edge_weight`` and masks. Labels of shape [N, 1] are squeezed; masks of
    shape [N, S] (several splits) use column ``split``; no masks: :func:`standard_split`."""
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        raise ImportError("from_pyg needs torch_geometric: pip install torch-geometric "
                          "(with torch, e.g. pip install 'gnnweave[gpu]')") from None

    def array(value):
        return None if value is None else value.detach().cpu().numpy()

    n = int(data.num_nodes)
    x = array(getattr(data, "x", None))
    if x is None:
        raise DatasetError(f"{name}: x: missing (the Data object has no node features)")
    y = array(getattr(data, "y", None))
    if y is None:
        raise DatasetError(f"{name}: y: missing (the Data object has no labels)")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    masks = {}
    for key in MASK_NAMES:
        mask = array(getattr(data, key, None))
        if mask is not None and mask.ndim == 2:
            if not 0 <= split < mask.shape[1]:
                raise DatasetError(f"{name}: {key}: has {mask.shape[1]} splits, asked for "
                                   f"split={split}")
            mask = mask[:, split]
        masks[key] = mask
    masks = _masks_or_split(name, y, *(masks[k] for k in MASK_NAMES), seed)
    weight = array(getattr(data, "edge_weight", None))
    return _build(name, name, array(data.edge_index), n, x, y, masks, weight)
