"""benchmarks/pipeline_depth.py: what it builds and how it refuses bad arguments (no
synthesis here; the figures are benchmark runs)."""
import pytest

from benchmarks import pipeline_depth
from gnnweave.hw.configs import get_pipeline_config
from gnnweave.hw.train_stage import TrainStage


def test_stage_part_is_one_stage_of_the_build():
    stage, top = pipeline_depth._component("stage", "small")
    c = get_pipeline_config("small")
    assert top == "train_stage" and isinstance(stage, TrainStage)
    assert (stage.max_in, stage.max_out, stage.max_rows, stage.slots) == (
        c.max_in, c.max_out, c.max_rows, c.slots)
    stage._MustUse__silence = stage.core._MustUse__silence = True   # never elaborated here


@pytest.mark.parametrize("argv,msg", [
    (["stage", "nosuch"], "unknown configuration 'nosuch'"),
    (["core", "small", "--keep", "x"], "--keep applies to stage, sgd and unit"),
    (["unit", "small", "--uram"], "--uram applies to core only"),
])
def test_bad_arguments_are_one_line_errors(argv, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        pipeline_depth.main(argv)
    assert exc.value.code == 2
    assert msg in capsys.readouterr().err


def test_a_build_without_pipeline_is_refused():
    with pytest.raises(SystemExit, match="has no Pipeline"):
        pipeline_depth._component("stage", "small-agg")
