"""multi_gpu_train.json of every bundle: the handlers that only rank 0 runs are chosen by class name
(bim.engine.handlers_for_rank), not by position in train#handlers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bim.engine import handlers_for_rank

ROOT = Path(__file__).resolve().parents[1]


def _handler(name):
    return type(name, (), {})()


def test_other_ranks_get_every_handler_but_the_named_ones_in_order():
    handlers = [_handler(n) for n in ("Resume", "Stats", "Checkpoint", "Progress", "NewOne")]
    assert handlers_for_rank(handlers, ["Stats", "Progress"], rank=0) == handlers
    assert handlers_for_rank(handlers, ["Stats", "Progress"], rank=1) == [handlers[0], handlers[2], handlers[4]]
    assert handlers_for_rank(handlers, ["Stats"]) == handlers  # not distributed: rank 0
    with pytest.raises(ValueError, match=r"^rank0_only names \['Gone'\], which are not among the handlers"):
        handlers_for_rank(handlers, ["Stats", "Gone"], rank=1)


@pytest.mark.parametrize("bundle", ["pretrain_bim", "finetune_seg", "meanteacher_seg"])
def test_each_bundle_names_its_rank0_handlers_and_keeps_resume_and_schedule_on_every_rank(bundle):
    configs = ROOT / "bundles" / bundle / "configs"
    train = json.loads((configs / "train.json").read_text())
    multi = json.loads((configs / "multi_gpu_train.json").read_text())
    chosen = multi["train#trainer#train_handlers"]
    assert chosen["_target_"] == "bim.engine.handlers_for_rank" and chosen["handlers"] == "@train#handlers"
    names = [h["_target_"].rsplit(".", 1)[-1] for h in train["train"]["handlers"]]
    assert set(chosen["rank0_only"]) <= set(names)
    every_rank = [n for n in names if n not in chosen["rank0_only"]]
    # each rank resumes, steps its LR and stops on a non-finite loss of its own
    assert {"ResumeFromCheckpoint", "LrScheduleHandler", "StopOnNonFiniteLoss"} <= set(every_rank)
    assert {"StatsHandler", "TensorBoardStatsHandler", "IterationProgressBar"} <= set(chosen["rank0_only"])
