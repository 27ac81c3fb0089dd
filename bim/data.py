"""Data of the BIM bundles: datalists written by ``data_prep``, loaded once into a slice store on the device.

Pre-processed scans are 3D NIfTI volumes (H, W, D) with the slices on the last axis. They are read once with
MONAI's ``LoadImaged`` (checked: :class:`LoadScand`) through a :class:`monai.data.Dataset` and stacked into a :class:`SliceStore` of 2D
slices kept on the training device; samplers then build each batch by indexing that store, so no CPU data
loader runs in the training loop. A store larger than the device's memory budget stays in pinned host memory and
each batch is copied to the device as the step asks for it (:mod:`bim.streaming`): the same batches either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from monai.config import KeysCollection
from monai.data import CacheDataset, Dataset
from monai.transforms import Compose, EnsureTyped, LoadImaged

from .gpu_augment import host_to_device
from .streaming import HostToDevice, choose_placement, pinned

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


class LoadScand(LoadImaged):
    """Where data enters a bundle: MONAI's ``LoadImaged`` (a subclass, so MONAI Label treats it as its loader),
    followed by checks of what it read, so that a bad file stops the run with one error naming it:

    - a file that cannot be read (truncated, not NIfTI): ``ValueError`` naming the file and the reader's error;
    - a volume that is not ``ndim``-dimensional (a 4D series or a 2D slice where a 3D scan (H, W, D) is expected);
    - for ``image_keys``: a NaN or infinite voxel, or a constant image (nothing to learn from or segment).

    Label values are checked against the task by :class:`bim.tasks.MapTaskLabelsd` and
    :func:`bim.segmentation.task_slice_store`."""

    def __init__(self, keys: KeysCollection, reader: str = "NibabelReader", ndim: int = 3,
                 image_keys: KeysCollection = ("image",), image_only: bool = True, **kwargs) -> None:
        super().__init__(keys, reader=reader, image_only=image_only, **kwargs)
        self.ndim = int(ndim)
        self.image_keys = {image_keys} if isinstance(image_keys, str) else set(image_keys)

    def __call__(self, data, reader=None):
        try:
            d = super().__call__(data, reader)
        except Exception as e:  # noqa: BLE001 - nibabel, gzip and zlib raise many types
            key, path = self._unreadable(data)
            raise ValueError(
                f"{path}: cannot read this {key} file ({type(e).__name__}: {e}); it is truncated or not a NIfTI "
                f"volume: write it again (python -m data_prep ...) or remove it from the data set"
            ) from e
        for key in self.key_iterator(d):
            check_volume(d[key], data[key], key, self.ndim, key in self.image_keys)
        return d

    def _unreadable(self, data) -> tuple[str, object]:
        """The first of ``keys`` whose file the loader cannot read (all of them when each reads alone)."""
        keys = list(self.key_iterator(dict(data)))
        for key in keys:
            try:
                self._loader(data[key])
            except Exception:  # noqa: BLE001
                return key, data[key]
        return "/".join(keys), ", ".join(str(data[k]) for k in keys)


def check_volume(volume, path, key: str = "image", ndim: int = 3, image: bool = True) -> None:
    """A ``ValueError`` naming ``path`` when ``volume`` is not ``ndim``-dimensional or, for an ``image``, holds
    NaN / infinite voxels or one value only (see :class:`LoadScand`)."""
    shape = tuple(volume.shape)
    if len(shape) != ndim:
        expected = "a 3D scan (H, W, D)" if ndim == 3 else f"a {ndim}D volume"
        raise ValueError(f"{path}: expected {key} to be {expected}, got shape {shape}")
    if not image:
        return
    t = torch.as_tensor(volume)
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise ValueError(f"{path}: the image has {bad} NaN or infinite voxel(s) of {t.numel()}; fix or remove this scan")
    if t.numel() and bool(t.max() == t.min()):
        raise ValueError(f"{path}: the image is constant (every voxel {float(t.max())}): an empty or broken scan; "
                         f"fix or remove it")


def volume_loader(with_label: bool, task: str | None = None, pixdim: float = 1.0, prostate_size: int = 256) -> Compose:
    """The deterministic pre-processing that reads one scan: image (and label) as float32 / uint8 arrays of shape
    (H, W, D), checked where they enter (:class:`LoadScand`). With ``task``, a raw scan (an item not from a data_prep datalist, e.g. of a MONAI Label datastore)
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
            LoadScand(keys=keys),
            *prepare,
            EnsureTyped(keys=["image"], dtype=torch.float32, track_meta=False),
            *([EnsureTyped(keys=["label"], dtype=torch.uint8, track_meta=False)] if with_label else []),
        ]
    )


class SerialCacheDataset(CacheDataset):
    """MONAI's ``CacheDataset`` filled in the calling thread. MONAI fills it in a thread pool (at least one thread,
    whatever ``num_workers``); when an item fails (a bad scan), the pool's thread keeps reading while the process
    exits, and the interpreter aborts (rc 134, "terminate called without an active exception") after the error."""

    def _fill_cache(self, indices=None) -> list:
        if self.cache_num <= 0:
            return []
        return [self._load_cache_item(i) for i in (range(self.cache_num) if indices is None else indices)]


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
    (or None), and per slice ``scan_index``, ``slice_index`` and ``partition`` (its meta-label). With ``stream``
    (:meth:`placed` on ``"host"``) the tensors stay in host memory and :meth:`take` copies each batch to the device."""

    image: torch.Tensor
    label: torch.Tensor | None
    scan_index: torch.Tensor
    slice_index: torch.Tensor
    partition: torch.Tensor
    scans: list[str]
    items: list[dict] = field(default_factory=list)
    num_partitions: int = 1
    stream: HostToDevice | None = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        tensors = (self.image, self.label, self.scan_index, self.slice_index, self.partition)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def take(self, idx: torch.Tensor, fields: dict[str, str]) -> dict[str, torch.Tensor]:
        """``{key: getattr(self, name)[idx]}`` for ``fields`` ``{key: name}``, on the training device (``idx``: CPU
        indices; on a streamed store gathered on the host and copied, see :class:`bim.streaming.HostToDevice`)."""
        if self.stream is not None:
            return self.stream({k: getattr(self, name) for k, name in fields.items()}, idx)
        idx = host_to_device(idx, self.image.device)
        return {k: getattr(self, name)[idx] for k, name in fields.items()}

    def slice_range(self, start: int, stop: int) -> SliceStore:
        """The slices ``start:stop`` as a store of the scans they come from (scan indices renumbered from 0)."""
        scan = self.scan_index[start:stop]
        kept = torch.unique(scan.cpu())  # sorted
        renumber = torch.full((len(self.scans),), -1, dtype=torch.long)
        renumber[kept] = torch.arange(len(kept))
        part = lambda t: None if t is None else t[start:stop]  # noqa: E731
        return replace(self, image=part(self.image), label=part(self.label), scan_index=renumber.to(scan.device)[scan],
                       slice_index=part(self.slice_index), partition=part(self.partition),
                       scans=[self.scans[i] for i in kept.tolist()],
                       items=[self.items[i] for i in kept.tolist()] if self.items else [])

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
        return replace(self, image=pad_slices(self.image, size), label=lab)

    def _moved(self, move, stream: HostToDevice | None) -> SliceStore:
        return replace(self, image=move(self.image), label=move(self.label), scan_index=move(self.scan_index),
                       slice_index=move(self.slice_index), partition=move(self.partition), stream=stream)

    def to(self, device: torch.device | str) -> SliceStore:
        """This store on ``device`` (not streamed)."""
        return self._moved(lambda t: None if t is None else t.to(device, non_blocking=True), None)

    def placed(self, device: torch.device | str, data_store: str = "device", memory_budget_gb="auto") -> SliceStore:
        """This store on ``device``, or (``data_store`` ``"host"``, or ``"auto"`` and more bytes than
        ``memory_budget_gb``: :func:`bim.streaming.choose_placement`) in pinned host memory, streamed to ``device``
        batch by batch."""
        if choose_placement(self.nbytes, device, data_store, memory_budget_gb) == "device":
            return self.to(device)
        return self._moved(pinned, HostToDevice(device))

    @classmethod
    def from_dataset(cls, dataset: Dataset, num_partitions: int | None = None, device="cpu",
                     pad_to_common: bool = False, data_store: str = "device", memory_budget_gb="auto") -> SliceStore:
        """Read every scan of ``dataset`` (items as written by data_prep) and stack its slices. Scans of different
        in-plane sizes are an error, or with ``pad_to_common`` (raw scans resampled to 1 mm differ in size) are
        zero-padded symmetrically (labels with background) to the largest height and width. ``data_store`` and
        ``memory_budget_gb``: where the store lives (:meth:`placed`)."""
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
        del images, labels  # the per-scan copies go before the store is placed (pinned: copied again)
        return store.placed(device, data_store, memory_budget_gb)


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
            yield self.store.take(self.sample_indices(), {"image": "image", "partition": "partition", "scan": "scan_index"})


class RandomSliceSampler:
    """Infinite iterator of ``batch_size`` slices drawn uniformly with replacement (the paper's epochs of N
    iterations "with replacement"). Yields ``image`` and, when the store has labels, ``label``."""

    def __init__(self, store: SliceStore, batch_size: int, generator: torch.Generator | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.store, self.batch_size = store, batch_size
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def __iter__(self) -> Iterator[dict]:
        fields = {"image": "image", "scan": "scan_index", **({"label": "label"} if self.store.label is not None else {})}
        while True:
            yield self.store.take(torch.randint(0, self.store.num_slices, (self.batch_size,), generator=self.generator),
                                  fields)


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
