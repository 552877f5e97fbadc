"""``gnnweave predict``: inference with a model saved by ``gnnweave train --save-model``."""
from __future__ import annotations

import json

from gnnweave.clitools import device_list, emit, json_default, output_folder


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="model file (.npz) from train --save-model")
    parser.add_argument("--dataset", default=None,
                        help="dataset spec as train takes it (default: the one it was trained on)")
    parser.add_argument("--device", default=None,
                        help="device of the dense ops (default: the training run's)")
    parser.add_argument("--devices", nargs="+", default=None, metavar="NAME[*COUNT]",
                        help="aggregation devices, separated by commas or spaces (default: the "
                             "training run's)")
    parser.add_argument("--out", default=None,
                        help="folder for predictions.csv (node, predicted class) and "
                             "prediction.json (default: nothing written)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    import numpy as np

    from gnnweave.host.modelfile import load_model
    from gnnweave.host.predict import predict
    out = output_folder("--out", args.out) if args.out else None
    saved = load_model(args.model)
    devices = device_list("--devices", args.devices)
    res = predict(saved, args.dataset if args.dataset else saved.dataset, device=args.device,
                  devices=devices)
    report = dict(res.summary(), model=str(args.model), trained_test_acc=saved.test_acc)
    if out is not None:
        path = out / "predictions.csv"
        rows = np.stack([np.arange(res.predictions.shape[0]), res.predictions], axis=1)
        np.savetxt(path, rows, fmt="%d", delimiter=",", header="node,predicted_class",
                   comments="")
        report["predictions_csv"] = str(path)
        (out / "prediction.json (default: nothing written)").write_text(json.dumps(report, indent=1, default=json_default))
    emit(report, args.json, ("dataset", "nodes", "test_acc", "trained_test_acc",
                             "dataset_matches_training", "device", "devices", "predictions_csv"))
    return 0
