"""CPU diagnosis for meanteacher_seg's ``joint_teacher_batch`` (0.6.0): how much do the teacher's targets on the
unlabelled views change when the labelled scan's views share its train-mode BatchNorm batch (``joint_teacher_batch``
true, the default with ``consistency_on_labelled`` true) instead of a forward of their own (false, as the student's
separate forwards)? Measured with one network for each seed's labelled scan (ACDC, 1 labelled scan), on the same
unlabelled views: the fraction of unlabelled pixels whose teacher class flips, the mean absolute change of the
foreground probability, and the foreground fraction under each.

    python docs/results/cpu_proxy_teacher_bn.py --dataset_dir DST --checkpoint RUN/model.pt --task lv --seeds 0,1,2

``DST``: the full ACDC set prepared by ``python -m data_prep acdc``; ``RUN``: a ``finetune_seg`` (or
``meanteacher_seg``) run of the paper's U-Net. ``docs/results/cpu_proxy_teacher_bn.sh`` trains two such networks on
the CPU and runs this for each. Prints one JSON line per labelled scan.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bundles")]  # data_prep, and the bundles' shared code

from data_prep.common import parse_int_list  # noqa: E402
from bim_common.data import RandomSliceSampler, read_items, scan_dataset  # noqa: E402
from bim_common.flags import as_flag  # noqa: E402
from bim_common.network import build_unet  # noqa: E402
from bim_common.segmentation import SegmentationAugment, labelled_items, load_pretrained, task_slice_store  # noqa: E402
from bim_common.semi_supervised import unlabelled_store  # noqa: E402
from bim_common.tasks import get_task  # noqa: E402


@torch.no_grad()
def teacher_prob(network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The teacher's forward as ``SemiSupervisedStep.teacher_prob`` with ``teacher_batch_stats``: train-mode
    BatchNorm (the batch's own statistics), softmax."""
    network.train()
    return torch.softmax(network(x).float(), dim=1)


def main(dataset_dir: str, checkpoint: str, task: str = "lv", seeds: str = "0,1,2", batches: int = 20,
         batch_size: int = 5, unlabelled_batch_size: int = 5, crop_size: int = 224, max_unlabelled_scans: int = 60,
         threads: int = 2, bf16: bool = False) -> None:
    """Prints one JSON line per labelled scan (see the module docstring)."""
    torch.set_num_threads(threads)
    spec = get_task(task)
    network = load_pretrained(build_unet(out_channels=spec.num_classes), checkpoint)
    training = read_items(dataset_dir, "training")[:max_unlabelled_scans]
    unl = unlabelled_store(scan_dataset(training, with_label=False))
    # the same unlabelled views for every labelled scan: their own sampler and augmentation, seeded alike
    unl_batches = [b["image"] for b, _ in zip(RandomSliceSampler(unl, unlabelled_batch_size, torch.Generator().manual_seed(0)),
                                              range(batches))]
    aug_kwargs = dict(crop_size=crop_size, max_rotation_deg=spec.max_rotation_deg, scale_range=spec.scale_range,
                      gamma_range=spec.gamma_range)
    unl_views = [SegmentationAugment(**aug_kwargs, generator=torch.Generator().manual_seed(1 + i))(x)
                 for i, x in enumerate(unl_batches)]
    for seed in parse_int_list(seeds, "seeds"):  # fire hands 0,1,2 over as a tuple
        items = labelled_items(dataset_dir, seed, 1)
        lab = task_slice_store(scan_dataset(items, with_label=True), spec)
        lab_aug = SegmentationAugment(**aug_kwargs, generator=torch.Generator().manual_seed(100 + seed))
        flips = change = fg_joint = fg_sep = 0.0
        for x_u, lab_batch in zip(unl_views, RandomSliceSampler(lab, batch_size, torch.Generator().manual_seed(seed))):
            x_l, _ = lab_aug(lab_batch["image"], lab_batch["label"])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=as_flag(bf16, "bf16")):
                joint = teacher_prob(network, torch.cat([x_l, x_u]))[x_l.shape[0]:]
                separate = teacher_prob(network, x_u)
            flips += (joint.argmax(1) != separate.argmax(1)).float().mean().item()
            change += (joint[:, 1:] - separate[:, 1:]).abs().mean().item()
            fg_joint += (joint.argmax(1) > 0).float().mean().item()
            fg_sep += (separate.argmax(1) > 0).float().mean().item()
        n = len(unl_views)
        print(json.dumps({"labelled_scan": lab.scans[0], "seed": seed, "checkpoint": checkpoint,
                          "unlabelled_pixels_whose_class_flips": round(flips / n, 4),
                          "mean_abs_foreground_prob_change": round(change / n, 4),
                          "foreground_fraction_joint": round(fg_joint / n, 4),
                          "foreground_fraction_separate": round(fg_sep / n, 4)}), flush=True)


if __name__ == "__main__":
    import fire

    fire.Fire(main)
