"""Two processes (gloo on the CPU), as multi_gpu_train.json runs them: each rank holds its own share of the training
scans / slices, validates its share of the validation scans, and the combined Dice and cluster quality equal the
one-process values on every rank; a non-finite loss on one rank stops both at the same check."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from bundle_helpers import workflow

WORLD = 2
PRETRAIN = dict(features=[8, 8, 16, 16, 32, 8], num_clusters=10, num_subheads=1, progress_bar=False)
FINETUNE = dict(features=[8, 16, 32, 64, 128, 8], task="lv", progress_bar=False)


class Threshold(torch.nn.Module):
    """A fixed 'network' whose Dice differs from scan to scan: foreground where the intensity exceeds 0.6."""

    def forward(self, x):
        return torch.cat([0.6 - x, x - 0.6], dim=1)


class IntensityClusters(torch.nn.Module):
    """A fixed 'cluster network' whose clusters differ from scan to scan: 5 intensity bins."""

    def __init__(self):
        super().__init__()
        self.cluster_head = torch.nn.Module()
        self.cluster_head.num_clusters = 5
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # where the scans go

    def cluster_map_probs(self, x, ablate_levels=()):
        bins = (x * 5).clamp(0, 4).long()[:, 0]
        return torch.nn.functional.one_hot(bins, 5).permute(0, 3, 1, 2).float()


def _validation_dice(wf) -> dict:
    evaluator = wf.parser.get_parsed_content("validate#evaluator")
    evaluator.network = Threshold()
    evaluator.run()
    return {"dice": evaluator.state.metrics["val_mean_dice"],
            "details": evaluator.state.metric_details["val_mean_dice"], "scans": len(evaluator.data_loader)}


def _cluster_quality(demo: str, out: Path) -> dict:
    from bim.pretrain.cluster_quality import ClusterQualityHandler

    return ClusterQualityHandler(demo, str(out / "cq.json"), split="test").score(IntensityClusters())


def _non_finite_stop(rank: int) -> str:
    """Rank 1 sees a NaN loss at iteration 3, rank 0 none: both must stop at the check, naming iteration 3."""
    from types import SimpleNamespace

    from bim.engine import NonFiniteLossError, StopOnNonFiniteLoss

    stop = StopOnNonFiniteLoss(every=5)
    for it in (1, 2, 3, 4, 5):
        loss = torch.tensor(float("nan") if rank == 1 and it == 3 else 1.0)
        stop.record(SimpleNamespace(state=SimpleNamespace(output={"loss": loss}, iteration=it)))
    try:
        stop.check(SimpleNamespace(state=SimpleNamespace(iteration=5)))
    except NonFiniteLossError as e:
        return str(e)
    return "not stopped"


def _worker(rank: int, port: int, demo: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    out = Path(out)
    result = {}
    wf = workflow("pretrain_bim", ["train.json", "multi_gpu_train.json"], dataset_dir=demo,
                  output_dir=str(out / f"pre{rank}"), **PRETRAIN)  # its initialize starts the process group
    result["pretrain_scans"] = wf.parser.get_parsed_content("train#store").scans
    wf = workflow("finetune_seg", ["train.json", "multi_gpu_train.json"], dataset_dir=demo,
                  output_dir=str(out / f"ft{rank}"), **FINETUNE)
    labelled = wf.parser.get_parsed_content("train#sampler#store")
    result["labelled"] = [(labelled.scans[s], int(z)) for s, z in zip(labelled.scan_index, labelled.slice_index)]
    result["labelled_device"] = str(labelled.image.device)
    result.update(_validation_dice(wf))
    result["cluster_quality"] = _cluster_quality(demo, out)
    result["non_finite"] = _non_finite_stop(rank)
    torch.save(result, out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(demo_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(_free_port(), str(demo_dataset), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_each_rank_stores_its_own_training_scans_and_the_shares_cover_the_training_list(two_ranks, demo_dataset):
    from bim.data import read_items

    training = [item["scan"] for item in read_items(demo_dataset, "training")]
    shares = [r["pretrain_scans"] for r in two_ranks]
    assert not set(shares[0]) & set(shares[1]) and shares[0] + shares[1] == training
    assert abs(len(shares[0]) - len(shares[1])) <= 1


def test_each_rank_holds_half_of_the_labelled_slices(two_ranks, demo_dataset, tmp_path):
    one = workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp_path), **FINETUNE)
    store = one.parser.get_parsed_content("train#sampler#store")
    every = [(store.scans[s], int(z)) for s, z in zip(store.scan_index, store.slice_index)]
    shares = [r["labelled"] for r in two_ranks]
    assert shares[0] + shares[1] == every and not set(shares[0]) & set(shares[1])
    assert abs(len(shares[0]) - len(shares[1])) <= 1
    assert {r["labelled_device"] for r in two_ranks} == {"cpu"}  # built on the CPU, the share moved to @device


def test_the_combined_validation_dice_is_the_one_process_dice_on_every_rank(two_ranks, demo_dataset, tmp_path):
    one = _validation_dice(workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset),
                                    output_dir=str(tmp_path), **FINETUNE))
    assert one["scans"] == 2 and [r["scans"] for r in two_ranks] == [1, 1]  # each rank validated one scan
    assert 0 < one["dice"] < 1  # a value that could differ
    for r in two_ranks:
        assert r["dice"] == one["dice"]  # the same per-scan values, gathered in the one-process order
        assert torch.equal(r["details"], one["details"])


def test_the_combined_cluster_quality_is_the_one_process_score(two_ranks, demo_dataset, tmp_path):
    one = _cluster_quality(str(demo_dataset), tmp_path)
    assert one["scans"] == 4 and 0 < one["nmi"] < 1
    for r in two_ranks:
        assert r["cluster_quality"] == one


def test_a_non_finite_loss_on_one_rank_stops_every_rank_at_the_same_check(two_ranks):
    for r in two_ranks:
        assert r["non_finite"].startswith("the training loss is NaN or infinite from iteration 3 on (checked at "
                                          "iteration 5)")


def test_finetune_multi_gpu_config_trains_under_torchrun_on_cpu(demo_dataset, tmp_path):
    """finetune_seg's multi_gpu_train.json end to end (2 processes, gloo): each rank trains on half of the labelled
    slices, validates one of the two validation scans, and rank 0 writes the best model."""
    import subprocess

    from bundle_helpers import ROOT, bundle_run_command

    cmd = bundle_run_command("finetune_seg", ["train.json", "multi_gpu_train.json"], dataset_dir=demo_dataset,
                             output_dir=tmp_path, epochs=2, iters_per_epoch=2, batch_size=2, crop_size=64,
                             features="[8,16,32,64,128,8]", progress_bar=False)
    cmd = [cmd[0], "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *cmd[1:]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2: validation scans {rank}-{rank} of 2" in log
        assert f"rank {rank} of 2: labelled slices" in log
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "best_metric.json").is_file()
