"""Export a trained model's weights to torch_geometric's layer names.

The models compute what PyG's layers compute, with the weights stored ``[in, out]``
(``h @ W``) where ``torch.nn.Linear`` stores ``[out, in]``:

* gcn: layer ``i`` is ``GCNConv(d_i, d_{i+1})`` (self loops, symmetric normalisation):
  ``convs.<i>.lin.weight = W<i>^T``, ``convs.<i>.bias = b<i>``;
* sage: ``SAGEConv(d_i, d_{i+1}, aggr="mean")``: ``h_v Ws + b + mean_u(h_u Wn)``, so
  ``convs.<i>.lin_l.weight = Wn<i>^T``, ``convs.<i>.lin_l.bias = b<i>``,
  ``convs.<i>.lin_r.weight = Ws<i>^T``;
* sgc: ``SGConv(F, C, K)``: ``conv.lin.weight = W0^T``, ``conv.lin.bias = b0``.

ReLU between layers and no activation after the last, as in the models.
"""
from __future__ import annotations

import numpy as np

from gnnweave.errors import GnnweaveError


def pyg_state_dict(saved) -> dict:
    """``{name: torch.Tensor}`` for a ``torch.nn.Module`` holding ``convs`` (a ModuleList of
    the layers above) or, for SGC, ``conv``."""
    try:
        import torch
    except ImportError:
        raise GnnweaveError("exporting to PyG needs torch: pip install -e '.[gpu]'") from None
    p = saved.params
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    out = {}
    if saved.model == "gcn":
        for i in range(saved.layers):
            out[f"convs.{i}.lin.weight"] = t(p[f"W{i}"].T)
            out[f"convs.{i}.bias"] = t(p[f"b{i}"])
    elif saved.model == "sage":
        for i in range(saved.layers):
            out[f"convs.{i}.lin_l.weight"] = t(p[f"Wn{i}"].T)
            out[f"convs.{i}.lin_l.bias"] = t(p[f"b{i}"])
            out[f"convs.{i}.lin_r.weight"] = t(p[f"Ws{i}"].T)
    elif saved.model == "sgc":
        out["conv.lin.weight"] = t(p["W0"].T)
        out["conv.lin.bias"] = t(p["b0"])
    else:
        raise GnnweaveError(f"no PyG export for model {saved.model!r}")
    return out
