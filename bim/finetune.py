"""The fine-tuning trainer: cross-entropy on augmented labelled slices (the paper's "Baseline" step)."""

from __future__ import annotations

import torch
from monai.engines import SupervisedTrainer

from .flags import as_flag
from .segmentation import SegmentationAugment


class AugmentBatch:
    """MONAI's ``prepare_batch`` of the fine-tuning step: the sampler's batch of full labelled slices, already on the
    device, augmented there by :class:`~bim.segmentation.SegmentationAugment` (crop, flips, rotation, zoom as one
    matrix, intensity jitter): ``(image [B, 1, h, w], label [B, 1, h, w] long class indices)``."""

    def __init__(self, augment: SegmentationAugment) -> None:
        self.augment = augment

    def __call__(self, batchdata: dict, device=None, non_blocking: bool = False, **kwargs):
        image, label = self.augment(batchdata["image"], batchdata["label"])
        return image, label.long()


class FineTuneTrainer(SupervisedTrainer):
    """MONAI's :class:`~monai.engines.SupervisedTrainer` iteration, all on the device: the sampler gives
    ``batch_size`` full labelled slices (class indices), :class:`AugmentBatch` (the ``prepare_batch``) augments
    them, the U-Net runs and ``loss_function(logits, label [B, 1, H, W])`` is computed (the config's default:
    cross-entropy, the paper's) under bf16 autocast on CUDA (``bf16``: MONAI's ``amp`` with
    ``amp_kwargs={"dtype": torch.bfloat16}``; torch's autocast runs losses such as cross-entropy in fp32), then the
    optimiser steps (RAdam in the bundles). The LR schedule is stepped per iteration by an ``LrScheduleHandler``.

    On the CPU ``bf16`` is off (bf16 convolutions without hardware support run ~50x slower than fp32). With bf16 the
    trainer's GradScaler is a disabled one: bf16 needs no loss scaling, and an enabled scaler reads its inf check
    back from the GPU at every step."""

    def __init__(self, *args, augment: SegmentationAugment, bf16: bool = True, **kwargs) -> None:
        kwargs.setdefault("decollate", False)
        kwargs.setdefault("optim_set_to_none", True)
        kwargs.setdefault("prepare_batch", AugmentBatch(augment))
        device = torch.device(kwargs["device"] if "device" in kwargs else args[0])
        amp = as_flag(bf16, "bf16") and device.type == "cuda"
        super().__init__(*args, amp=amp, amp_kwargs={"dtype": torch.bfloat16}, **kwargs)
        self.augment, self.bf16 = augment, amp
        if amp:  # MONAI autocasts only when a scaler is set; a disabled one scales nothing and never synchronises
            self.scaler = torch.amp.GradScaler("cuda", enabled=False)
