"""Data of the BIM bundles: datalists written by ``data_prep``, loaded once into a slice store on the device.

Pre-processed scans are 3D NIfTI volumes (H, W, D) with the slices on the last axis. They are read once with
MONAI's ``LoadImaged`` through a :class:`monai.data.Dataset` and stacked into a :class:`SliceStore` of 2D
slices kept on the training device; samplers then build each batch by indexing that store, so no CPU data
loader runs in the training loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from monai.data import Dataset
from monai.transforms import Compose, EnsureTyped, LoadImaged

logger = logging.getLogger("bim")


def data_prep():
    """The ``data_prep`` package: installed beside ``bim`` (``pip install -e .``), or the copy that
    ``python -m bim.export_bundle`` writes into an exported bundle's ``scripts/bim/data_prep``."""
    try:
        from . import data_prep as vendored  # an exported bundle carries its own copy
    except ImportError:
        import data_prep as installed

        return installed
    return vendored


def resolve_dataset_dir(dataset_dir: str | Path | None) -> Path:
    """``dataset_dir`` as an absolute path; ``None`` (or "") means the embedded synthetic demo data set,
    generated on first use by :func:`data_prep.ensure_demo_dataset`."""
    if dataset_dir in (None, "", "None", "null"):
        return Path(data_prep().ensure_demo_dataset()).resolve()
    path = Path(dataset_dir).expanduser().resolve()
    if not (path / "datalist.json").is_file():
        raise FileNotFoundError(
            f"dataset_dir {path} has no datalist.json: prepare the data first with "
            f"`python -m data_prep acdc|promise12|nifti SRC {path}` (see data_prep/README.md)"
        )
    return path


def read_items(dataset_dir: str | Path | None, key: str) -> list[dict]:
    """Items of ``key`` in ``dataset_dir/datalist.json`` with absolute paths (clear error if absent), each marked
    ``"prepared": True`` (see :func:`bim.inference.is_prepared`): data_prep wrote these scans."""
    from .inference import PREPARED_KEY

    return [{**item, PREPARED_KEY: True} for item in data_prep().read_datalist(resolve_dataset_dir(dataset_dir), key)]


def volume_loader(with_label: bool, task: str | None = None, pixdim: float = 1.0, prostate_size: int = 256) -> Compose:
    """The deterministic pre-processing that reads one scan: image (and label) as float32 / uint8 arrays of shape
    (H, W, D). With ``task``, a raw scan (an item not from a data_prep datalist, e.g. of a MONAI Label datastore)
    first gets data_prep's in-plane resampling (``pixdim`` mm, or ``prostate_size`` pixels for ``prostate``) and
    intensity normalisation, as in inference (:class:`bim.inference.PrepareRawScand`); prepared scans are read
    as they are."""
    keys = ["image", "label"] if with_label else ["image"]
    prepare = []
    if task is not None:
        from monai.transforms import EnsureChannelFirstd, SqueezeDimd

        from .inference import PrepareRawScand

        prepare = [
            EnsureChannelFirstd(keys=keys, channel_dim="no_channel"),
            PrepareRawScand(keys="image", task=task, pixdim=pixdim, prostate_size=prostate_size,
                            label_keys=keys[1:]),
            SqueezeDimd(keys=keys, dim=0),
        ]
    return Compose(
        [
            LoadImaged(keys=keys, image_only=True, reader="NibabelReader"),
            *prepare,
            EnsureTyped(keys=["image"], dtype=torch.float32, track_meta=False),
            *([EnsureTyped(keys=["label"], dtype=torch.uint8, track_meta=False)] if with_label else []),
        ]
    )


def scan_dataset(items: Sequence[dict], with_label: bool) -> Dataset:
    """A MONAI dataset yielding one pre-processed scan per item."""
    if with_label:
        missing = [it.get("scan", it.get("image")) for it in items if "label" not in it]
        if missing:
            raise ValueError(f"these scans have no label but labels are required: {missing[:5]}")
    return Dataset(data=list(items), transform=volume_loader(with_label))


@dataclass
class SliceStore:
    """All 2D slices of a list of scans, stacked: ``image`` [S, 1, H, W] float32, ``label`` [S, 1, H, W] uint8
    (or None), and per slice ``scan_index``, ``slice_index`` and ``partition`` (its meta-label)."""

    image: torch.Tensor
    label: torch.Tensor | None
    scan_index: torch.Tensor
    slice_index: torch.Tensor
    partition: torch.Tensor
    scans: list[str]
    items: list[dict] = field(default_factory=list)
    num_partitions: int = 1

    @property
    def num_slices(self) -> int:
        return int(self.image.shape[0])

    @property
    def spatial_size(self) -> tuple[int, int]:
        return tuple(self.image.shape[-2:])

    def scan_slices(self, scan: int) -> slice:
        idx = torch.nonzero(self.scan_index == scan).flatten()
        return slice(int(idx[0]), int(idx[-1]) + 1)

    def padded(self, size: tuple[int, int]) -> SliceStore:
        """This store with its slices zero-padded symmetrically to ``size`` (labels with background)."""
        lab = None if self.label is None else pad_slices(self.label, size)
        return SliceStore(pad_slices(self.image, size), lab, self.scan_index, self.slice_index, self.partition,
                          self.scans, self.items, self.num_partitions)

    def to(self, device: torch.device | str) -> SliceStore:
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return SliceStore(
            move(self.image), move(self.label), move(self.scan_index), move(self.slice_index),
            move(self.partition), self.scans, self.items, self.num_partitions,
        )

    @classmethod
    def from_dataset(cls, dataset: Dataset, num_partitions: int | None = None, device="cpu",
                     pad_to_common: bool = False) -> SliceStore:
        """Read every scan of ``dataset`` (items as written by data_prep) and stack its slices. Scans of different
        in-plane sizes are an error, or with ``pad_to_common`` (raw scans resampled to 1 mm differ in size) are
        zero-padded symmetrically (labels with background) to the largest height and width."""
        images, labels, scan_idx, slice_idx, parts, scans = [], [], [], [], [], []
        items = list(dataset.data)
        if not items:
            raise ValueError("the dataset holds no scans")
        size = None
        for i, item in enumerate(items):
            sample = dataset[i]
            img = torch.as_tensor(sample["image"])
            if img.ndim != 3:
                raise ValueError(f"{item.get('image')}: expected a 3D (H, W, D) volume, got shape {tuple(img.shape)}")
            if size is None:
                size = img.shape[:2]
            elif img.shape[:2] != size and not pad_to_common:
                raise ValueError(
                    f"{item.get('image')}: in-plane size {tuple(img.shape[:2])} differs from the first scan's "
                    f"{tuple(size)}; prepare all scans with the same --size"
                )
            depth = img.shape[2]
            images.append(img.permute(2, 0, 1).unsqueeze(1))
            if "label" in sample and not isinstance(sample["label"], (str, Path)):  # loaded, not just a path
                lab = torch.as_tensor(sample["label"])
                if lab.shape != img.shape:
                    raise ValueError(f"{item.get('label')}: label shape {tuple(lab.shape)} != image shape {tuple(img.shape)}")
                labels.append(lab.permute(2, 0, 1).unsqueeze(1).to(torch.uint8))
            part = item.get("slice_partition")
            if part is None or len(part) != depth:
                p = num_partitions or 1
                part = [min(p - 1, (z * p) // depth) for z in range(depth)]
            parts.append(torch.as_tensor(part, dtype=torch.long))
            scan_idx.append(torch.full((depth,), i, dtype=torch.long))
            slice_idx.append(torch.arange(depth))
            scans.append(item.get("scan", Path(str(item.get("image"))).name))
        common = (max(i.shape[-2] for i in images), max(i.shape[-1] for i in images))
        if any(tuple(i.shape[-2:]) != common for i in images):
            logger.info(f"scans of different in-plane sizes: slices zero-padded to {common[0]} x {common[1]}")
            images, labels = [pad_slices(i, common) for i in images], [pad_slices(lab, common) for lab in labels]
        label = torch.cat(labels) if len(labels) == len(images) else None
        store = cls(
            image=torch.cat(images).float().contiguous(),
            label=label,
            scan_index=torch.cat(scan_idx),
            slice_index=torch.cat(slice_idx),
            partition=torch.cat(parts),
            scans=scans,
            items=items,
            num_partitions=int(num_partitions or (int(torch.cat(parts).max()) + 1)),
        )
        return store.to(device)


def pad_slices(slices: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[S, C, h, w] slices zero-padded symmetrically to [S, C, *size]."""
    ph, pw = size[0] - slices.shape[-2], size[1] - slices.shape[-1]
    return torch.nn.functional.pad(slices, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))


def partition_table(store: SliceStore) -> tuple[torch.Tensor, torch.Tensor]:
    """Start index and count [num_scans, P] of the slices of each (scan, partition); empty partitions of a
    short scan fall back to the whole scan."""
    n, p = len(store.scans), store.num_partitions
    scan_cpu, part_cpu = store.scan_index.cpu(), store.partition.cpu()
    start = torch.zeros(n, p, dtype=torch.long)
    count = torch.zeros(n, p, dtype=torch.long)
    for s in range(n):
        in_scan = torch.nonzero(scan_cpu == s).flatten()
        for k in range(p):
            sel = in_scan[part_cpu[in_scan] == k]
            if sel.numel() == 0:
                sel = in_scan
            start[s, k], count[s, k] = int(sel[0]), int(sel.numel())
    return start, count


class PartitionBatchSampler:
    """Infinite iterator of batches for the meta-label contrastive loss: ``scans_per_batch`` scans drawn at
    random (with replacement across batches, distinct within a batch when possible), one random slice from
    each of the P partitions of every scan -> ``scans_per_batch * P`` slices (the authors: 6 x 3 = 18).

    Yields dicts of device tensors: ``image`` [B, 1, H, W], ``partition`` [B], ``scan`` [B].
    """

    def __init__(self, store: SliceStore, scans_per_batch: int = 6, generator: torch.Generator | None = None):
        if scans_per_batch < 1:
            raise ValueError(f"scans_per_batch must be >= 1, got {scans_per_batch}")
        self.store = store
        self.scans_per_batch = scans_per_batch
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.start, self.count = partition_table(store)

    @property
    def batch_size(self) -> int:
        return self.scans_per_batch * self.store.num_partitions

    def sample_indices(self) -> torch.Tensor:
        n = len(self.store.scans)
        if n >= self.scans_per_batch:
            scans = torch.randperm(n, generator=self.generator)[: self.scans_per_batch]
        else:
            scans = torch.randint(0, n, (self.scans_per_batch,), generator=self.generator)
        u = torch.rand(self.scans_per_batch, self.store.num_partitions, generator=self.generator)
        idx = self.start[scans] + (u * self.count[scans]).long().clamp_max(self.count[scans] - 1)
        return idx.flatten()

    def __iter__(self) -> Iterator[dict]:
        while True:
            idx = self.sample_indices().to(self.store.image.device)
            yield {
                "image": self.store.image[idx],
                "partition": self.store.partition[idx],
                "scan": self.store.scan_index[idx],
            }


class RandomSliceSampler:
    """Infinite iterator of ``batch_size`` slices drawn uniformly with replacement (the paper's epochs of N
    iterations "with replacement"). Yields ``image`` and, when the store has labels, ``label``."""

    def __init__(self, store: SliceStore, batch_size: int, generator: torch.Generator | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.store, self.batch_size = store, batch_size
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def __iter__(self) -> Iterator[dict]:
        while True:
            idx = torch.randint(0, self.store.num_slices, (self.batch_size,), generator=self.generator)
            idx = idx.to(self.store.image.device)
            batch = {"image": self.store.image[idx], "scan": self.store.scan_index[idx]}
            if self.store.label is not None:
                batch["label"] = self.store.label[idx]
            yield batch


def to_numpy_volume(slices: torch.Tensor) -> np.ndarray:
    """[D, C, H, W] slices back to an (H, W, D) (C == 1) or (C, H, W, D) volume."""
    arr = slices.detach().cpu().permute(1, 2, 3, 0).numpy()
    return arr[0] if arr.shape[0] == 1 else arr


def dataset_summary(dataset_dir: str | Path | None) -> dict:
    """The prepared data set at ``dataset_dir`` (``None``: the embedded demo): its folder, its metadata
    (``dataset``, ``num_partitions``, ``spatial_size``, ``labels``) and its ``training`` items."""
    import json

    path = resolve_dataset_dir(dataset_dir)
    meta = json.loads((path / "datalist.json").read_text())
    return {
        "dir": path.as_posix(),
        "dataset": meta.get("dataset"),
        "num_partitions": int(meta.get("num_partitions", 1)),
        "spatial_size": meta.get("spatial_size"),
        "labels": meta.get("labels", {}),
        "training": read_items(path, "training"),
    }
