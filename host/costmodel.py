"""Per-device cost models: linear in size features, non-negative coefficients, fitted by NNLS.

For every (device, op) the predicted time is ``sum_i coef_i * feature_i(sizes)`` with

==================  ==============================================  =======================
op                  features                                        sizes
==================  ==============================================  =======================
aggregate           1, edges, edges*F, rows*F, rows,                 edges, rows, feat, nodes
                    edges*miss, edges*F*miss
dense_forward       1, m*k*n, m*k, m*n, k*n                          x [m,k] @ w [k,n]
dense_input_grad    1, m*k*n, m*k, m*n, k*n                          dy [m,n] @ w.T -> [m,k]
dense_weight_grad   1, m*k*n, m*k, m*n, k*n                          x.T [k,m] @ dy [m,n]
transfer_in/out     1, bytes                                         nbytes
==================  ==============================================  =======================

The constant is the fixed overhead of a launch (or a transfer's latency), the other terms
the work (gathers, MACs) and the bytes moved; ``1 / coef['bytes']`` of a transfer model is
the link bandwidth. ``miss = max(0, 1 - cache_bytes / x_bytes)`` (``x_bytes = nodes * F * 4``,
the gathered feature matrix) is the share of random row gathers that cannot hit in a cache of
``cache_bytes``: measured on the dev machine, a CPU gather costs 0.3 ns per element while
``x`` fits in L2 and 2-7 ns when it does not, which no linear model in edges and F can follow.
``cache_bytes`` is chosen from powers of two by the fit error on the fit set. Coefficients are fitted with :func:`scipy.optimize.nnls` on *relative*
residuals (each row divided by its measured time), because sizes span orders of magnitude and
what matters to the partitioner is the ratio of predicted times. Each model also stores its
median relative error on the sizes it was fitted on and on held-out sizes it never saw.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from gnnweave.errors import InputError

FEATURES: dict[str, tuple[str, ...]] = {
    "aggregate": ("fixed", "edges", "edge_feats", "row_feats", "rows", "edges_miss",
                  "edge_feats_miss"),
    "dense_forward": ("fixed", "mkn", "mk", "mn", "kn"),
    "dense_input_grad": ("fixed", "mkn", "mk", "mn", "kn"),
    "dense_weight_grad": ("fixed", "mkn", "mk", "mn", "kn"),
    "transfer_in": ("fixed", "bytes"),
    "transfer_out": ("fixed", "bytes"),
}
SIZE_KEYS = {
    "aggregate": ("edges", "rows", "feat", "nodes"),
    "dense_forward": ("m", "k", "n"),
    "dense_input_grad": ("m", "k", "n"),
    "dense_weight_grad": ("m", "k", "n"),
    "transfer_in": ("nbytes",),
    "transfer_out": ("nbytes",),
}
FORMAT_VERSION = 1
CACHE_CANDIDATES = tuple(1 << k for k in range(14, 28))   # 16 KiB .. 128 MiB
X_ITEMSIZE = 4   # bytes per gathered feature element in the cache model (float32 host arrays)


class CostModelError(InputError):
    """A cost model file or query that cannot be used; the message says which field."""


def miss_fraction(x_bytes: float, cache_bytes: float | None) -> float:
    if not cache_bytes:
        return 0.0
    return max(0.0, 1.0 - cache_bytes / x_bytes) if x_bytes > 0 else 0.0


def op_features(op: str, sizes: dict, params: dict | None = None) -> np.ndarray:
    """The feature vector of ``op`` at ``sizes`` (see the table in the module docstring)."""
    if op not in FEATURES:
        raise CostModelError(f"unknown op {op!r}; known: {', '.join(FEATURES)}")
    missing = [k for k in SIZE_KEYS[op] if k not in sizes]
    if missing:
        raise CostModelError(f"{op}: missing size(s) {', '.join(missing)} "
                             f"(needs {', '.join(SIZE_KEYS[op])})")
    s = {k: float(sizes[k]) for k in SIZE_KEYS[op]}
    if op == "aggregate":
        e, r, f = s["edges"], s["rows"], s["feat"]
        miss = miss_fraction(s["nodes"] * f * X_ITEMSIZE, (params or {}).get("cache_bytes"))
        return np.array([1.0, e, e * f, r * f, r, e * miss, e * f * miss])
    if op.startswith("dense"):
        m, k, n = s["m"], s["k"], s["n"]
        return np.array([1.0, m * k * n, m * k, m * n, k * n])
    return np.array([1.0, s["nbytes"]])


@dataclass
class OpModel:
    op: str
    coef: dict[str, float]
    time_source: str = "wall"          # 'wall' (host clock) or 'device' (device_seconds)
    fit_median_rel_err: float | None = None
    heldout_median_rel_err: float | None = None
    heldout_p90_rel_err: float | None = None
    n_fit: int = 0
    n_heldout: int = 0
    params: dict = field(default_factory=dict)     # e.g. {"cache_bytes": ...} for aggregate

    def predict(self, **sizes) -> float:
        x = op_features(self.op, sizes, self.params)
        return float(x @ np.array([self.coef[name] for name in FEATURES[self.op]]))

    def to_dict(self) -> dict:
        return {"op": self.op, "coef": self.coef, "time_source": self.time_source,
                "fit_median_rel_err": self.fit_median_rel_err,
                "heldout_median_rel_err": self.heldout_median_rel_err,
                "heldout_p90_rel_err": self.heldout_p90_rel_err,
                "n_fit": self.n_fit, "n_heldout": self.n_heldout, "params": self.params}

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "OpModel":
        op = d.get("op")
        if op not in FEATURES:
            raise CostModelError(f"{where}.op = {op!r}: unknown op")
        coef = d.get("coef")
        if not isinstance(coef, dict):
            raise CostModelError(f"{where}.coef: missing or not an object")
        out = {}
        for name in FEATURES[op]:
            v = coef.get(name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise CostModelError(f"{where}.coef.{name} = {v!r}: must be a number >= 0")
            out[name] = float(v)
        return cls(op, out, d.get("time_source", "wall"), d.get("fit_median_rel_err"),
                   d.get("heldout_median_rel_err"), d.get("heldout_p90_rel_err"),
                   int(d.get("n_fit", 0)), int(d.get("n_heldout", 0)),
                   dict(d.get("params") or {}))


def rel_errors(model: OpModel, samples) -> np.ndarray:
    return np.array([abs(model.predict(**s) - t) / t for s, t in samples])


def _nnls_fit(op, fit_samples, params):
    A = np.array([op_features(op, s, params) for s, _ in fit_samples])
    y = np.array([t for _, t in fit_samples])
    # relative residuals; columns scaled to unit norm for conditioning, scaled back after
    Aw = A / y[:, None]
    norms = np.linalg.norm(Aw, axis=0)
    norms[norms == 0] = 1.0
    sol, _ = nnls(Aw / norms, np.ones_like(y), maxiter=50 * A.shape[1])
    return {name: float(c) for name, c in zip(FEATURES[op], sol / norms)}


def fit_op(op: str, fit_samples, heldout_samples=(), *, time_source="wall") -> OpModel:
    """Fit ``op`` on ``[(sizes, seconds), ...]``; score it on ``heldout_samples``."""
    fit_samples = [(s, float(t)) for s, t in fit_samples]
    if not fit_samples:
        raise CostModelError(f"{op}: no samples to fit")
    bad = [t for _, t in fit_samples if not (math.isfinite(t) and t > 0)]
    if bad:
        raise CostModelError(f"{op}: measured time {bad[0]} is not > 0")
    candidates = [{}]
    if op == "aggregate":
        candidates += [{"cache_bytes": c} for c in CACHE_CANDIDATES]
    best = None
    for params in candidates:
        model = OpModel(op, _nnls_fit(op, fit_samples, params), time_source,
                        n_fit=len(fit_samples), n_heldout=len(heldout_samples), params=params)
        err = float(np.median(rel_errors(model, fit_samples)))
        if best is None or err < best.fit_median_rel_err * (1 - 1e-9):
            model.fit_median_rel_err = err
            best = model
    model = best
    if heldout_samples:
        err = rel_errors(model, heldout_samples)
        model.heldout_median_rel_err = float(np.median(err))
        model.heldout_p90_rel_err = float(np.percentile(err, 90))
    return model


@dataclass
class DeviceModel:
    device: str
    kind: str
    ops: dict[str, OpModel] = field(default_factory=dict)

    def op(self, op: str) -> OpModel:
        if op not in self.ops:
            raise CostModelError(f"device {self.device!r} has no model for {op!r} "
                                 f"(has {', '.join(self.ops) or 'none'})")
        return self.ops[op]

    @property
    def link(self) -> dict | None:
        """``{'latency_s', 'bandwidth_bytes_per_s'}`` per direction (bandwidth None: no
        measurable cost per byte), None for a device working in host memory."""
        if "transfer_in" not in self.ops:
            return None
        out = {}
        for op in ("transfer_in", "transfer_out"):
            if op in self.ops:
                c = self.ops[op].coef
                out[op] = {"latency_s": c["fixed"],
                           "bandwidth_bytes_per_s": (1.0 / c["bytes"]) if c["bytes"] > 0 else None}
        return out


@dataclass
class CostModel:
    devices: dict[str, DeviceModel] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def device(self, name: str) -> DeviceModel:
        if name not in self.devices:
            raise CostModelError(f"no cost model for device {name!r} "
                                 f"(have {', '.join(self.devices) or 'none'})")
        return self.devices[name]

    def predict(self, device: str, op: str, **sizes) -> float:
        return self.device(device).op(op).predict(**sizes)

    def share_cost(self, device: str, *, feat_dim: int, num_nodes: int,
                   out_dim: int | None = None, itemsize: int = 4, transfers: bool = True):
        """The :class:`~gnnweave.host.partition.ShareCost` of aggregating (and, with
        ``out_dim``, transforming) destination rows on ``device``, including moving the input
        features in and the result rows out where the device has a link model."""
        from gnnweave.host.partition import ShareCost

        dm = self.device(device)
        agg = dm.op("aggregate")
        c = agg.coef
        miss = miss_fraction(num_nodes * feat_dim * X_ITEMSIZE, agg.params.get("cache_bytes"))
        fixed = c["fixed"]
        per_edge = (c["edges"] + c["edge_feats"] * feat_dim
                    + miss * (c["edges_miss"] + c["edge_feats_miss"] * feat_dim))
        per_row = c["row_feats"] * feat_dim + c["rows"]
        width = feat_dim
        if out_dim is not None:
            g = dm.op("dense_forward").coef
            fixed += g["fixed"] + g["kn"] * feat_dim * out_dim
            per_row += g["mkn"] * feat_dim * out_dim + g["mk"] * feat_dim + g["mn"] * out_dim
            width = out_dim
        if transfers and "transfer_in" in dm.ops:
            tin, tout = dm.op("transfer_in").coef, dm.op("transfer_out").coef
            fixed += tin["fixed"] + tin["bytes"] * num_nodes * feat_dim * itemsize + tout["fixed"]
            per_row += tout["bytes"] * width * itemsize
        return ShareCost(fixed, per_edge, per_row)

    def heldout_median_rel_err(self) -> float | None:
        vals = [m.heldout_median_rel_err for d in self.devices.values() for m in d.ops.values()
                if m.heldout_median_rel_err is not None]
        return float(np.median(vals)) if vals else None

    # -- persistence

    def to_dict(self) -> dict:
        return {"format": "gnnweave-costmodel", "version": FORMAT_VERSION, "meta": self.meta,
                "devices": {name: {"kind": d.kind,
                                   "ops": {op: m.to_dict() for op, m in d.ops.items()},
                                   "link": d.link}
                            for name, d in self.devices.items()}}

    @classmethod
    def from_dict(cls, data: dict, where: str = "costmodel") -> "CostModel":
        if not isinstance(data, dict) or data.get("format") != "gnnweave-costmodel":
            raise CostModelError(f"{where}: not a gnnweave cost model (field 'format')")
        if data.get("version") != FORMAT_VERSION:
            raise CostModelError(f"{where}: version {data.get('version')!r}, "
                                 f"expected {FORMAT_VERSION}")
        devs = data.get("devices")
        if not isinstance(devs, dict):
            raise CostModelError(f"{where}.devices: missing or not an object")
        out = cls(meta=data.get("meta", {}))
        for name, d in devs.items():
            ops = d.get("ops") if isinstance(d, dict) else None
            if not isinstance(ops, dict):
                raise CostModelError(f"{where}.devices.{name}.ops: missing or not an object")
            out.devices[name] = DeviceModel(
                name, d.get("kind", name),
                {op: OpModel.from_dict(m, f"{where}.devices.{name}.ops.{op}")
                 for op, m in ops.items()})
        return out

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, default=_json_default))
        return path

    @classmethod
    def load(cls, path) -> "CostModel":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CostModelError(f"{path}: no such cost model file (run `gnnweave profile`)") from None
        except IsADirectoryError:
            raise CostModelError(f"{path}: is a folder, not a cost model JSON file (gnnweave "
                                 f"profile --out writes DIR/cost_model.json)") from None
        except UnicodeDecodeError:
            raise CostModelError(f"{path}: not a cost model JSON file (not text)") from None
        except json.JSONDecodeError as e:
            raise CostModelError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        if isinstance(data, dict) and "cost_model" in data and "format" not in data:
            data = data["cost_model"]    # a profile_main report holds the model under this key
        return cls.from_dict(data, where=str(path))


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
