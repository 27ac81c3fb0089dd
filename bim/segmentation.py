"""Supervised segmentation pieces shared by the fine-tuning bundles (finetune_seg, meanteacher_seg).

- :func:`resolve_unet`: the U-Net style and widths to build, ``auto`` taking them from the weights the run starts from;
- :func:`load_pretrained`: initialise a U-Net from a ``pretrain_bim`` checkpoint (every tensor whose name and
  shape match), reporting what was and was not loaded;
- :func:`labelled_items`, :func:`evaluation_items`, :func:`task_slice_store`: the labelled training scans of a
  task as a :class:`~bim.data.SliceStore` of class indices on the device;
- :class:`SegmentationAugment`: the training augmentation (random crop/pad, flips, rotation, scaling as one
  matrix and one ``grid_sample`` per batch; image and label share the matrix; intensity jitter);
- :func:`labelled_cross_entropy`: the fine-tuning loss.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from monai.networks.utils import copy_model_state
from torch import nn

from .data import SliceStore, read_items
from .engine import load_weights, unwrap
from .inference import is_prepared
from .network import PAPER_FEATURES, UNET_STYLES, unet_features_of, unet_style_of
from .gpu_augment import (apply_gamma, apply_intensity_jitter, crop_matrices, draw_gamma, draw_intensity_jitter,
                          random_affine_matrices, stage_on_device, warp)
from .tasks import SegmentationTask, get_task, labelled_key

logger = logging.getLogger("bim")

_PREFIXES = ("", "module.", "unet.", "cluster_net.unet.", "_orig_mod.", "model.", "network.")


_HINTS = {"--pretrained": "pass a pretrain_bim model.pt or a bundle checkpoint",
          "--checkpoint": "pass the model.pt of a training run of this bundle",
          "--ckpt_path": "pass the model.pt of a training run of this bundle"}


def read_state_dict(path: str | os.PathLike, map_location="cpu", what: str = "--pretrained") -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file: a plain state dict, or a dict with a ``"network"``, ``"state_dict"`` or
    ``"model"`` entry (e.g. a ``checkpoint_*.pt`` of a bundle). Loaded with ``weights_only=True``; an error names
    ``what`` (the option that gave the file) and the file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"pretrained checkpoint {path} does not exist" if what == "--pretrained" else
                                f"{what} {path}: no such file; {_HINTS.get(what, 'pass a weights file')}")
    obj = load_weights(path, what, _HINTS.get(what, "pass a weights file"), map_location)
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


def _no_path(path) -> bool:
    return path in (None, "", "None", "null", False)


def resolve_unet(unet_style: str = "auto", features="auto", path: str | os.PathLike | None = None,
                 what: str = "--pretrained", required: bool = True) -> dict:
    """``{"unet_style": ..., "features": [...]}`` of the U-Net a segmentation bundle builds, for weights at ``path``
    (``what``: the option that gives them: ``--pretrained``, ``--checkpoint``, ``--ckpt_path``).

    ``unet_style`` / ``features`` "auto" take the style (:func:`bim.network.unet_style_of`) and widths
    (:func:`~bim.network.unet_features_of`) of the weights, read once with ``weights_only=True``; without weights
    (``path`` null, or absent and not ``required``: the network alone, e.g. MONAI's ``verify_net_in_out``) "monai" and
    :data:`~bim.network.PAPER_FEATURES`. An explicit style must be the weights' (a ``ValueError`` naming the file,
    both styles and the fix); explicit widths are used as given. A missing ``required`` or unreadable file, or one
    without U-Net weights when "auto" needs them, is an error naming ``what`` and the file."""
    if unet_style not in ("auto", *UNET_STYLES):
        raise ValueError(f"unet_style must be one of 'auto', {', '.join(map(repr, UNET_STYLES))}, got {unet_style!r}")
    style, widths, source = unet_style, features, None
    if not _no_path(path) and (required or Path(path).expanduser().is_file()):
        state, source = read_state_dict(path, "cpu", what), f"{what} {path}"
        try:
            found = unet_style_of(state)
            found_widths = unet_features_of(state) if features == "auto" else None
        except ValueError as e:  # two networks in one file
            raise ValueError(f"{source}: {e}: pass the weights of one network") from None
        if found is None and "auto" in (unet_style, features):
            raise ValueError(f"{source}: holds no U-Net weights of this project (no upcat_<k>.upsample weight; keys "
                             f"start with {sorted(state)[:3]}): {_HINTS.get(what, 'pass a weights file')}")
        if unet_style != "auto" and found is not None and found != unet_style:
            raise ValueError(f"{source}: holds a U-Net of style '{found}', but unet_style is '{unet_style}': drop "
                             f"--unet_style (its default, auto, takes the style of the weights) or pass "
                             f"--unet_style {found}")
        style = found if unet_style == "auto" else unet_style
        widths = (found_widths or list(PAPER_FEATURES)) if features == "auto" else features
    elif not _no_path(path):
        logger.warning(f"{what} {path} does not exist: the U-Net is built without weights"
                       + (" (unet_style auto: monai)" if unet_style == "auto" else ""))
    style = "monai" if style == "auto" else style
    widths = list(PAPER_FEATURES) if widths == "auto" else widths
    if "auto" in (unet_style, features):
        logger.info(f"U-Net: style {style}, widths {list(widths)}" + (f" (auto: from {source})" if source else ""))
    return {"unet_style": style, "features": widths}


def _summarise(keys: Sequence[str], limit: int = 12) -> str:
    if len(keys) <= limit:
        return ", ".join(keys)
    modules = sorted({k.rsplit(".", 1)[0] for k in keys})
    return f"{len(keys)} tensors in {', '.join(modules[:limit])}{' ...' if len(modules) > limit else ''}"


def _strip_prefix(source: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in source.items() if k.startswith(prefix)}


def _weight_matches(source: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]) -> int:
    """How many tensors of ``source`` ``target`` has under the same name and shape, BatchNorm's scalar counters left
    out (they match any BatchNorm network)."""
    return sum(1 for k, v in source.items() if not k.endswith("num_batches_tracked") and k in target
               and tuple(target[k].shape) == tuple(v.shape))


def load_pretrained(network: nn.Module, path: str | os.PathLike | None, map_location="cpu") -> nn.Module:
    """Copy into ``network`` every tensor of the checkpoint at ``path`` whose name and shape match (MONAI's
    :func:`~monai.networks.utils.copy_model_state`), after stripping the common prefix (``module.``, ``unet.``, ...)
    that matches the most names, and log what was loaded and what was not. ``path`` None/"" keeps the random
    initialisation (the paper's Baseline).

    The report is kept as ``network.pretrained_report`` (``loaded``, ``not_loaded``, ``shape_mismatch``,
    ``unused``, ``path``). A missing file is a ``FileNotFoundError``; a checkpoint that matches no tensor of
    ``network`` (another architecture or other widths) a ``ValueError`` naming the file and the ``--features`` option.
    Returns ``network``.
    """
    net = unwrap(network)
    if _no_path(path):
        logger.info("pretrained: none, the network keeps its random initialisation")
        network.pretrained_report = {"path": None, "loaded": [], "not_loaded": list(net.state_dict()),
                                     "shape_mismatch": [], "unused": []}
        return network
    source, target = read_state_dict(path, map_location), net.state_dict()
    prefix = max(_PREFIXES, key=lambda p: _weight_matches(_strip_prefix(source, p), target))
    stripped = _strip_prefix(source, prefix)
    if not _weight_matches(stripped, target):
        raise ValueError(
            f"pretrained checkpoint {path} matches no tensor of the network (name and shape): it is not a "
            f"checkpoint of this U-Net; pass the --features (and --unet_style, in_channels) it was trained with. "
            f"Checkpoint keys start with {sorted(source)[:3]}, the network's with {sorted(target)[:3]}"
        )
    _, loaded, not_loaded = copy_model_state(net, stripped, inplace=True)
    network.pretrained_report = {
        "path": str(path), "loaded": loaded, "not_loaded": not_loaded,
        "shape_mismatch": sorted(k for k in stripped if k in target and k not in loaded),
        "unused": sorted(k for k in stripped if k not in target)}
    _log_pretrained(network.pretrained_report, len(target), prefix)
    return network


def _log_pretrained(report: dict, size: int, prefix: str) -> None:
    logger.info(f"pretrained: loaded {len(report['loaded'])}/{size} tensors of the network from {report['path']}"
                + (f" (prefix {prefix!r} stripped)" if prefix else ""))
    if report["not_loaded"]:
        logger.info(f"pretrained: not loaded (kept their initialisation): {_summarise(report['not_loaded'])}")
    if report["shape_mismatch"]:
        logger.warning(f"pretrained: shape mismatch, skipped: {_summarise(report['shape_mismatch'])}")
    if report["unused"]:
        logger.info(f"pretrained: checkpoint tensors without a place in the network: {_summarise(report['unused'])}")


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

    def draw_intensity(self, batch: int) -> torch.Tensor:
        """The intensity parameters of ``batch`` images, drawn on the host (float64) in the order they are applied:
        [B, k], per image the gamma (with ``gamma_range``), then the contrast change and the brightness shift (when
        either is on); k = 0 when the intensity augmentation is off."""
        columns = []
        if self.gamma_range is not None:
            columns.append(draw_gamma(batch, self.generator, self.gamma_range)[:, None])
        if self.brightness or self.contrast:
            columns.append(draw_intensity_jitter(batch, self.generator, self.brightness, self.contrast))
        return torch.cat(columns, dim=1) if columns else torch.zeros(batch, 0, dtype=torch.float64)

    def apply_intensity(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """The intensity part of the augmentation, after the warp, with its parameters given (:meth:`draw_intensity`'s,
        on ``x``'s device): gamma (with ``gamma_range``), then contrast/brightness jitter. Semi-supervised views take
        theirs from here too."""
        if self.gamma_range is not None:
            x, params = apply_gamma(x, params[:, 0]), params[:, 1:]
        if self.brightness or self.contrast:
            x = apply_intensity_jitter(x, params)
        return x

    def __call__(self, image: torch.Tensor, label: torch.Tensor | None = None):
        """``image`` [B, C, H, W] float, ``label`` [B, 1, H, W] integer -> the augmented pair at crop size. The
        random numbers (matrix, then intensity) are drawn on the host and copied to the device in one transfer."""
        draws = stage_on_device({"matrices": self.matrices(image.shape[0], tuple(image.shape[-2:])),
                                 "intensity": self.draw_intensity(image.shape[0])}, image.device)
        out_hw = (self.crop_size, self.crop_size)
        x = self.apply_intensity(warp(image, draws["matrices"], out_hw), draws["intensity"])
        if label is None:
            return x
        return x, warp(label, draws["matrices"], out_hw, mode="nearest")


def labelled_cross_entropy(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """The paper's fine-tuning loss: pixel-wise cross-entropy of ``logits`` [B, C, H, W] (fp32) against the class
    indices ``label`` [B, 1, H, W], MONAI's channel-first label layout. Any loss with this signature can take its
    place through the bundles' ``loss_function`` (e.g. ``monai.losses.DiceCELoss(to_onehot_y=True, softmax=True)``)."""
    return F.cross_entropy(logits, label[:, 0].long())
