"""Supervised segmentation pieces shared by the fine-tuning bundles (finetune_seg, meanteacher_seg).

- :func:`load_pretrained`: initialise a U-Net from a ``pretrain_bim`` checkpoint (every tensor whose name and
  shape match), reporting what was and was not loaded;
- :func:`labelled_items`, :func:`evaluation_items`, :func:`task_slice_store`: the labelled training scans of a
  task as a :class:`~bim.data.SliceStore` of class indices on the device;
- :class:`SegmentationAugment`: the training augmentation (random crop/pad, flips, rotation, scaling as one
  matrix and one ``grid_sample`` per batch; image and label share the matrix; intensity jitter);
- :func:`supervised_loss`: augment a labelled batch, run the network under bf16 autocast, cross-entropy in fp32.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .data import SliceStore, read_items
from .engine import bf16_autocast
from .inference import is_prepared
from .gpu_augment import crop_matrices, random_affine_matrices, random_gamma, random_intensity_jitter, warp
from .tasks import SegmentationTask, get_task, labelled_key

logger = logging.getLogger("bim")

_PREFIXES = ("", "module.", "unet.", "cluster_net.unet.", "_orig_mod.", "model.", "network.")


def _unwrap(network: nn.Module) -> nn.Module:
    network = getattr(network, "module", network)  # DistributedDataParallel
    return getattr(network, "_orig_mod", network)  # torch.compile


def read_state_dict(path: str | os.PathLike, map_location="cpu") -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file: a plain state dict, or a dict with a ``"network"``, ``"state_dict"`` or
    ``"model"`` entry (e.g. a ``checkpoint_*.pt`` of a bundle). Loaded with ``weights_only=True``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"pretrained checkpoint {path} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle/zip errors come in many types
        raise ValueError(f"cannot read pretrained checkpoint {path} with torch.load(weights_only=True): {e}") from e
    if isinstance(obj, Mapping):
        for key in ("network", "state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(
            f"pretrained checkpoint {path} holds no state dict (expected a dict of tensors, or a dict with a "
            f"'network' / 'state_dict' entry)"
        )
    return {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def _summarise(keys: Sequence[str], limit: int = 12) -> str:
    if len(keys) <= limit:
        return ", ".join(keys)
    modules = sorted({k.rsplit(".", 1)[0] for k in keys})
    return f"{len(keys)} tensors in {', '.join(modules[:limit])}{' ...' if len(modules) > limit else ''}"


def load_pretrained(network: nn.Module, path: str | os.PathLike | None, map_location="cpu") -> nn.Module:
    """Copy into ``network`` every tensor of the checkpoint at ``path`` whose name and shape match (a common
    prefix such as ``module.`` or ``unet.`` is stripped when that matches more names) and log what was loaded
    and what was not. ``path`` None/"" keeps the random initialisation (the paper's Baseline).

    The report is kept as ``network.pretrained_report`` (``loaded``, ``not_loaded``, ``shape_mismatch``,
    ``unused``, ``path``). A checkpoint that matches no tensor of ``network`` (another architecture) raises a
    ``ValueError`` naming the file. Returns ``network``.
    """
    if path in (None, "", "None", "null", False):
        logger.info("pretrained: none, the network keeps its random initialisation")
        network.pretrained_report = {"path": None, "loaded": [], "not_loaded": list(_unwrap(network).state_dict()),
                                     "shape_mismatch": [], "unused": []}
        return network
    source = read_state_dict(path, map_location)
    target = _unwrap(network).state_dict()

    def matches(prefix: str) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in source.items():
            if k.startswith(prefix):
                name = k[len(prefix):]
                if name in target and tuple(target[name].shape) == tuple(v.shape):
                    out[name] = v
        return out

    def weights(d):  # BatchNorm's scalar counters match any BN network: they do not count as a match
        return [k for k in d if not k.endswith("num_batches_tracked")]

    prefix = max(_PREFIXES, key=lambda p: len(weights(matches(p))))
    loadable = matches(prefix)
    if not weights(loadable):
        raise ValueError(
            f"pretrained checkpoint {path} matches no tensor of the network (name and shape): it is not a "
            f"checkpoint of this U-Net (features / in_channels differ?). Checkpoint keys start with "
            f"{sorted(source)[:3]}, the network's with {sorted(target)[:3]}"
        )
    stripped = {k[len(prefix):]: v for k, v in source.items() if k.startswith(prefix)}
    shape_mismatch = sorted(k for k in stripped if k in target and k not in loadable)
    unused = sorted(k for k in stripped if k not in target)
    not_loaded = sorted(k for k in target if k not in loadable)
    _unwrap(network).load_state_dict(loadable, strict=False)
    logger.info(f"pretrained: loaded {len(loadable)}/{len(target)} tensors of the network from {path}"
                + (f" (prefix {prefix!r} stripped)" if prefix else ""))
    if not_loaded:
        logger.info(f"pretrained: not loaded (kept their initialisation): {_summarise(not_loaded)}")
    if shape_mismatch:
        logger.warning(f"pretrained: shape mismatch, skipped: {_summarise(shape_mismatch)}")
    if unused:
        logger.info(f"pretrained: checkpoint tensors without a place in the network: {_summarise(unused)}")
    network.pretrained_report = {"path": str(path), "loaded": sorted(loadable), "not_loaded": not_loaded,
                                 "shape_mismatch": shape_mismatch, "unused": unused}
    return network


# ----------------------------------------------------------------------------------------------------------- data


def labelled_items(dataset_dir: str | os.PathLike | None, split_seed: int, labelled_scans: int) -> list[dict]:
    """Items of the labelled subset ``labelled_seed{split_seed}_{labelled_scans}`` of the data set (the error
    names the missing key and lists the available subsets); every item must carry a label."""
    key = labelled_key(split_seed, labelled_scans)
    items = read_items(dataset_dir, key)
    if not items:
        raise ValueError(f"labelled subset {key!r} of {dataset_dir or 'the demo data set'} is empty")
    unlabelled = [it.get("scan", it.get("image")) for it in items if "label" not in it]
    if unlabelled:
        raise ValueError(f"labelled subset {key!r} lists scans without a label: {unlabelled[:5]}")
    return items


def evaluation_items(dataset_dir: str | os.PathLike | None, key: str) -> list[dict]:
    """Items of the ``validation`` or ``test`` list; each needs a label (clear error when empty/unlabelled)."""
    items = read_items(dataset_dir, key)
    if not items:
        raise ValueError(
            f"the {key!r} list of {dataset_dir or 'the demo data set'} is empty: 3D Dice needs labelled {key} scans "
            f"(prepare the data set with labels for some scans)"
        )
    unlabelled = [it.get("scan", it.get("image")) for it in items if "label" not in it]
    if unlabelled:
        raise ValueError(f"the {key!r} list has scans without a label: {unlabelled[:5]}")
    return items


def task_slice_store(dataset, task: str | SegmentationTask, device="cpu") -> SliceStore:
    """A :class:`SliceStore` of the labelled scans of ``dataset`` (a MONAI dataset of
    ``bim.data.volume_loader(with_label=True, task=...)``) whose labels are the class indices of ``task``: data_prep's
    label values of prepared scans mapped, raw scans' labels checked to hold the class indices already (see
    :meth:`~bim.tasks.SegmentationTask.map_labels`). Raw scans of different in-plane sizes are zero-padded to a
    common size."""
    task = get_task(task)
    store = SliceStore.from_dataset(dataset, device="cpu", pad_to_common=True)
    if store.label is None:
        raise ValueError("task_slice_store: the scans carry no labels")
    # map per scan so that an error names the scan's label file
    mapped = torch.empty_like(store.label)
    for i, scan in enumerate(store.scans):
        sl = store.scan_slices(i)
        item = store.items[i] if i < len(store.items) else {}
        mapped[sl] = task.map_labels(store.label[sl], source=item.get("label", scan), prepared=is_prepared(item))
    store.label = mapped
    counts = torch.bincount(mapped.flatten().long(), minlength=task.num_classes).tolist()
    logger.info(
        f"task {task.name}: {len(store.scans)} labelled scans ({', '.join(store.scans[:8])}"
        f"{' ...' if len(store.scans) > 8 else ''}), {store.num_slices} slices, voxels per class {counts}"
    )
    return store.to(device)


# --------------------------------------------------------------------------------------------------- augmentation


class SegmentationAugment:
    """Training augmentation of a labelled batch, on the batch's device.

    Per image: a random ``crop_size`` x ``crop_size`` window (the image is zero-padded at a random offset when
    smaller), horizontal/vertical flips (``flip_prob`` each), a rotation in ``±max_rotation_deg`` and a zoom in
    ``scale_range`` about the window centre -- composed into one 3x3 matrix and applied with one
    ``grid_sample`` (image bilinear, label nearest, same matrix) -- then, only with ``gamma_range`` (default
    off), a gamma correction ``x ** gamma`` with gamma log-uniform in that range, and contrast/brightness jitter
    ``x * (1 + c) + b`` with ``c`` in ±``contrast``, ``b`` in ±``brightness``. Padding is 0 in the image and
    background in the label. Random numbers come from ``generator`` (CPU), so runs are reproducible and resumable.
    """

    def __init__(
        self,
        crop_size: int = 224,
        max_rotation_deg: float = 15.0,
        scale_range: Sequence[float] = (0.9, 1.1),
        flip_prob: float = 0.5,
        brightness: float = 0.1,
        contrast: float = 0.1,
        generator: torch.Generator | None = None,
        gamma_range: Sequence[float] | None = None,
    ) -> None:
        if int(crop_size) < 16:
            raise ValueError(f"crop_size must be >= 16, got {crop_size}")
        if len(scale_range) != 2 or not 0 < scale_range[0] <= scale_range[1]:
            raise ValueError(f"scale_range must be (low, high) with 0 < low <= high, got {scale_range}")
        if not 0 <= flip_prob <= 1:
            raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob}")
        self.crop_size = int(crop_size)
        self.max_rotation_deg, self.scale_range = float(max_rotation_deg), tuple(float(s) for s in scale_range)
        if gamma_range is not None and (len(gamma_range) != 2 or not 0 < gamma_range[0] <= gamma_range[1]):
            raise ValueError(f"gamma_range must be null or (low, high) with 0 < low <= high, got {gamma_range}")
        self.flip_prob, self.brightness, self.contrast = float(flip_prob), float(brightness), float(contrast)
        self.gamma_range = tuple(float(g) for g in gamma_range) if gamma_range is not None else None
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def matrices(self, batch: int, in_hw: tuple[int, int]) -> torch.Tensor:
        """[B, 3, 3]: output grid -> window coordinates (flip, rotation, zoom) -> input coordinates (crop)."""
        out_hw = (self.crop_size, self.crop_size)
        crop = crop_matrices(batch, in_hw, out_hw, self.generator)
        affine = random_affine_matrices(
            batch, self.generator, self.scale_range, self.max_rotation_deg, 0.0, flip_prob=self.flip_prob
        )
        return crop @ affine

    def intensity(self, x: torch.Tensor) -> torch.Tensor:
        """The intensity part of the augmentation, after the warp: gamma (with ``gamma_range``), then
        contrast/brightness jitter. Semi-supervised views take theirs from here too."""
        if self.gamma_range is not None:
            x = random_gamma(x, self.generator, self.gamma_range)
        if self.brightness or self.contrast:
            x = random_intensity_jitter(x, self.generator, self.brightness, self.contrast)
        return x

    def __call__(self, image: torch.Tensor, label: torch.Tensor | None = None):
        """``image`` [B, C, H, W] float, ``label`` [B, 1, H, W] integer -> the augmented pair at crop size."""
        mats = self.matrices(image.shape[0], tuple(image.shape[-2:]))
        out_hw = (self.crop_size, self.crop_size)
        x = self.intensity(warp(image, mats, out_hw))
        if label is None:
            return x
        return x, warp(label, mats, out_hw, mode="nearest")


def labelled_cross_entropy(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The paper's fine-tuning loss: pixel-wise cross-entropy of ``logits`` [B, C, H, W] (fp32) against the class
    indices ``label`` [B, 1, H, W], MONAI's channel-first label layout. Any loss with this signature can take its
    place through the bundles' ``loss_function`` (e.g. ``monai.losses.DiceCELoss(to_onehot_y=True, softmax=True)``)."""
    return F.cross_entropy(logits, label[:, 0].long())


def supervised_loss(
    network: nn.Module,
    batch: Mapping[str, torch.Tensor],
    augment: SegmentationAugment,
    bf16: bool = True,
    loss_function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = labelled_cross_entropy,
) -> dict[str, torch.Tensor]:
    """One labelled step without the optimiser: augment ``batch`` (``image`` [B, 1, H, W], ``label``
    [B, 1, H, W] class indices), forward under bf16 autocast (CUDA only), ``loss_function(logits, label)`` in fp32
    (cross-entropy by default). Returns ``loss`` (scalar), ``image``, ``label`` ([B, 1, h, w] long) and ``pred``
    (logits, fp32)."""
    image, label = augment(batch["image"], batch["label"])
    with bf16_autocast(image.device, bf16):
        logits = network(image)
    logits = logits.float()
    label = label.long()
    loss = loss_function(logits, label)
    return {"loss": loss, "image": image, "label": label, "pred": logits}
