"""Each process of a multi-GPU run (``multi_gpu_train.json`` under ``torchrun``) works on its own share of the data.

- :func:`scan_share`: the rank's contiguous block of a list of scans (or of a dataset), before anything is read, so
  that a rank reads and stores only its scans. Pre-training draws whole scans (:class:`~bim.data.PartitionBatchSampler`
  picks scans uniformly), so equal scan counts give every scan the same chance on every rank count; the validation
  lists are shared the same way, and MONAI's metric handlers gather the per-scan values of all ranks into one metric.
- :func:`slice_share`: the rank's contiguous block of the slices of a store, for samplers that draw slices uniformly
  (:class:`~bim.data.RandomSliceSampler`) and for stores of fewer scans than ranks (fine-tuning from one scan).

Blocks are contiguous and their sizes differ by at most one (the first ``n % world`` ranks hold one more), so the
shares are disjoint, cover everything, and the gathered per-scan results come back in the one-process order.
Without an initialised process group (one process) every function gives everything: one-process runs are unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset, Subset

from .flags import require_choice

logger = logging.getLogger("bim")


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes (0, 1 without an initialised process group)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def share_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Start and stop of ``rank``'s block when ``n`` things are cut into ``world`` contiguous blocks whose sizes
    differ by at most one (the first ``n % world`` blocks are the longer ones)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} processes")
    base, extra = divmod(int(n), world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def _check_enough(n: int, world: int, what: str, unit: str) -> None:
    if n < world:
        raise ValueError(f"{what}: {n} {unit} cannot be shared by {world} processes (each needs at least one): "
                         f"run on at most {n} GPUs, or add {unit}")


def scan_share(items: Sequence | Dataset, what: str = "scans", rank: int | None = None, world: int | None = None,
               fewer: str = "error"):
    """This rank's contiguous block of ``items`` (a list of datalist items: a list; a dataset: a
    :class:`torch.utils.data.Subset` of it). When ``items`` holds fewer entries than there are processes, ``fewer``
    ``"error"`` raises an error naming the list (``what``); ``"all"`` gives every rank all of them, with a warning
    (a validation list: the gathered metric then counts each scan once per rank, the same mean up to rounding).
    ``rank`` / ``world``: ``torch.distributed``'s when None."""
    require_choice("fewer", fewer, ("error", "all"))
    if rank is None or world is None:
        rank, world = rank_and_world()
    if world == 1:
        return items
    n = len(items)
    if n < world and fewer == "all":
        logger.warning(f"{what}: {n} scans for {world} processes: every rank takes all of them")
        return items
    _check_enough(n, world, what, "scans")
    start, stop = share_bounds(n, rank, world)
    logger.info(f"rank {rank} of {world}: {what} scans {start}-{stop - 1} of {n}")
    if isinstance(items, Dataset) and not isinstance(items, list):
        return Subset(items, range(start, stop))
    return list(items)[start:stop]


def slice_share(store, device=None, what: str = "slices", rank: int | None = None, world: int | None = None):
    """This rank's contiguous block of the slices of ``store`` (a :class:`~bim.data.SliceStore`; None stays None),
    moved to ``device`` when given (build the store on the CPU and pass the training device: only the share reaches
    the device). ``what`` names the store in the error raised when it holds fewer slices than there are processes."""
    if store is None:
        return None
    if rank is None or world is None:
        rank, world = rank_and_world()
    if world > 1:
        n = store.num_slices
        _check_enough(n, world, what, "slices")
        start, stop = share_bounds(n, rank, world)
        store = store.slice_range(start, stop)
        logger.info(f"rank {rank} of {world}: {what} {start}-{stop - 1} of {n} (from {len(store.scans)} scans)")
    return store if device is None else store.to(device)


def all_gather_objects(obj) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` in one process)."""
    rank, world = rank_and_world()
    if world == 1:
        return [obj]
    out = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out
