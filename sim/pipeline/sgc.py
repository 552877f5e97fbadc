"""SGC's classifier training on the TrainStage RTL, against golden bit for bit."""
from __future__ import annotations

import time

import numpy as np

from .problems import PipelineProblem, compare_problem, problem_build, run_problem_rtl


# ---------------------------------------------------------------- SGC on the RTL

def sgc_problem(name: str, *, start_epoch: int = 0, rtl_epochs: int = 1, features: int | None = None,
                cfg=None, data_dir=None):
    """SGC's classifier training (golden/sgc.py) as a :class:`PipelineProblem` that starts
    from the golden master weights after ``start_epoch`` epochs and runs ``rtl_epochs``
    more (one pipeline step each: the training nodes in ``cfg.microbatches`` microbatches).

    ``features``: keep only the first ``features`` columns of ``S^2 X`` (plus the bias
    column); the golden training that produces the start weights then uses exactly the
    same slice. Returns ``(problem, info)``; ``info["velocity_zero"]`` says whether the
    golden momentum buffer was zero at ``start_epoch``; when it is not, the problem carries
    it (``velocities``) and the bench loads it through the stage's velocity port, so the
    RTL continues the golden trajectory from any epoch."""
    from gnnweave.golden.sgc import SGC_FORMAT, SgcConfig, make_pipeline, prepare_sgc
    cfg = cfg or SgcConfig()
    setup = prepare_sgc(name, cfg, data_dir)
    if features is not None:
        if not 1 <= features < setup.features_q.shape[1] - 1:
            raise ValueError(f"features must be in 1..{setup.features_q.shape[1] - 2}, got {features}")
        keep = list(range(features)) + [setup.features_q.shape[1] - 1]
        setup.features_q = setup.features_q[:, keep]
        setup.inputs = [x[:, keep] for x in setup.inputs]
    pipe = make_pipeline(setup.features_q.shape[1], setup.n_classes, cfg)
    loss_grad = setup.loss_grad(pipe.fmt)
    for _ in range(start_epoch):
        pipe.run(cfg.schedule, setup.inputs, loss_grad, microbatches=cfg.microbatches)
    st = pipe.stages[0]
    velocity_zero = st.velocity is None or not np.any(st.velocity)
    problem = PipelineProblem([st.master.copy()], list(setup.inputs) * rtl_epochs, setup.labels,
                              setup.loss_scale, cfg.schedule, cfg.microbatches, [False],
                              pipe.lr_q, pipe.wd_q, pipe.mu_q, SGC_FORMAT,
                              velocities=None if velocity_zero else [st.velocity.copy()])
    info = {"dataset": name, "start_epoch": start_epoch, "rtl_epochs": rtl_epochs,
            "d_in": int(setup.features_q.shape[1]), "classes": setup.n_classes,
            "microbatches": cfg.microbatches, "rows": [int(x.shape[0]) for x in setup.inputs],
            "velocity_zero": bool(velocity_zero), "golden_pipeline": pipe,
            "loss_grad": loss_grad, "setup": setup, "cfg": cfg}
    return problem, info


def verify_sgc_rtl(name: str = "cora", *, start_epoch: int = 0, rtl_epochs: int = 1,
                   features: int | None = None, lanes: int = 8, simulator: str = "verilator",
                   data_dir=None) -> dict:
    """Train SGC's classifier for ``rtl_epochs`` steps on the TrainStage RTL from the golden
    weights and SGD velocity at ``start_epoch`` (the velocity through the stage's velocity
    port) and compare every logit, input gradient and the final master weights bit for bit
    with golden. The golden reference is the golden pipeline started from the same masters
    and velocity; ``trajectory_match`` checks that it is the golden SGC training itself
    (the same masters as continuing the golden training for ``rtl_epochs`` epochs)."""
    problem, info = sgc_problem(name, start_epoch=start_epoch, rtl_epochs=rtl_epochs,
                                features=features, data_dir=data_dir)
    trace = problem.run_golden()
    pipe, cfg = info["golden_pipeline"], info["cfg"]
    for _ in range(rtl_epochs):
        pipe.run(cfg.schedule, info["setup"].inputs, info["loss_grad"], microbatches=cfg.microbatches)
    trajectory = bool(np.array_equal(pipe.stages[0].master, trace.masters[0]))
    build = problem_build(problem, lanes=lanes)
    t0 = time.time()
    run = run_problem_rtl(problem, build=build, simulator=simulator)
    wall = time.time() - t0
    mismatches = compare_problem(problem, trace, run)
    return {"dataset": name, "match": not mismatches, "mismatches": mismatches[:10],
            "start_epoch": start_epoch, "rtl_epochs": rtl_epochs, "rtl_microbatches":
            len(problem.inputs), "d_in": info["d_in"], "classes": info["classes"],
            "features": "all" if features is None else f"first {features} + bias",
            "rows_per_microbatch": info["rows"], "velocity_zero_at_start": info["velocity_zero"],
            "trajectory_match": trajectory, "velocity_loaded": problem.velocities is not None,
            "golden_reference": "golden pipeline from the same masters and velocity",
            "cycles": run.cycles, "sim_wall_s": round(run.wall_s, 1), "total_wall_s": round(wall, 1),
            "build": build, "lanes": lanes, "saturations": sum(c["saturations"] for c in run.counters),
            "golden_saturations": int(sum(trace.saturations))}
