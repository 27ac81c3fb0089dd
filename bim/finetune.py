"""The fine-tuning trainer: cross-entropy on augmented labelled slices (the paper's "Baseline" step)."""

from __future__ import annotations

from monai.engines import SupervisedTrainer
from monai.utils import CommonKeys as Keys

from .segmentation import SegmentationAugment, supervised_loss


class FineTuneTrainer(SupervisedTrainer):
    """One iteration, all on the device: the sampler gives ``batch_size`` full labelled slices (class indices);
    :class:`~bim.segmentation.SegmentationAugment` crops/flips/rotates/zooms image and label with one
    matrix and jitters the intensities; the U-Net runs under bf16 autocast (CUDA); ``loss_function(logits,
    label [B, 1, H, W])`` in fp32 (the config's default: cross-entropy, the paper's); RAdam step. The LR schedule is stepped per iteration by an ``LrScheduleHandler``."""

    def __init__(self, *args, augment: SegmentationAugment, bf16: bool = True, **kwargs) -> None:
        kwargs.setdefault("decollate", False)
        super().__init__(*args, **kwargs)
        self.augment, self.bf16 = augment, bool(bf16)

    def _iteration(self, engine, batchdata: dict) -> dict:
        engine.network.train()
        engine.optimizer.zero_grad(set_to_none=True)
        out = supervised_loss(engine.network, batchdata, self.augment, self.bf16, engine.loss_function)
        out["loss"].backward()
        engine.optimizer.step()
        return {Keys.LOSS: out["loss"].detach(), Keys.IMAGE: out["image"], Keys.LABEL: out["label"],
                Keys.PRED: out["pred"].detach()}
