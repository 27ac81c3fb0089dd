"""Slice stores larger than the GPU's memory: kept in (pinned) host memory, each batch gathered there and copied to
the GPU while the previous step still runs.

Where a store lives is decided once, when it is built (:func:`choose_placement`): on the training device when its
bytes fit ``data_memory_budget_gb`` (``"auto"``: half of the device's free memory at that moment), otherwise in
host memory ("streamed"); ``data_store`` ``"device"`` / ``"host"`` forces either.

Why a store in host memory and not a ``DataLoader`` with workers: the samplers draw each batch's slice indices from
the generator that then draws the batch's augmentation, so indices cannot be drawn ahead of the step without
changing the random stream (a ``DataLoader`` prefetches indices ahead). Drawing them when the step asks, as on
the device, keeps the batches identical on both paths for the same seed. What the host path adds per step is the
gather of ``B`` slices into a pinned staging buffer (``B x H x W x 4`` bytes, about 10 MB for 18 slices of 384 x 384;
row by row in the calling thread, :func:`gather_rows`) and one host-to-device copy on a side stream; the CPU issues both while the GPU still runs the previous step's
kernels, so the copy overlaps that step. ``tools/benchmark_streaming.py`` measures throughput and GPU busy time on
both paths, and each part of a streamed batch on its own.
"""

from __future__ import annotations

import logging

import torch

from .flags import require_choice

logger = logging.getLogger("bim")

PLACEMENTS = ("auto", "device", "host")
AUTO_BUDGET_SHARE = 0.5  # of the device's free memory when the store is built: the step needs the rest


def memory_budget_bytes(device: torch.device | str, budget_gb="auto") -> float:
    """``data_memory_budget_gb`` in bytes: a positive number of GB (10^9 bytes), or ``"auto"``: half of the free
    memory of a CUDA ``device`` now (on any other device unlimited)."""
    device = torch.device(device)
    if budget_gb == "auto":
        if device.type != "cuda":
            return float("inf")
        free, _ = torch.cuda.mem_get_info(device)
        return AUTO_BUDGET_SHARE * free
    if isinstance(budget_gb, bool) or not isinstance(budget_gb, (int, float)) or not budget_gb > 0:
        raise ValueError(f"data_memory_budget_gb must be 'auto' or a positive number of GB, got {budget_gb!r}")
    return float(budget_gb) * 1e9


def choose_placement(nbytes: int, device: torch.device | str, data_store: str = "auto", budget_gb="auto") -> str:
    """``"device"`` or ``"host"`` for a store of ``nbytes`` trained on ``device`` (see the module docstring); logs
    the choice and why. On a CPU device ``"auto"`` is ``"device"`` (host and device are one memory)."""
    require_choice("data_store", data_store, PLACEMENTS)
    device = torch.device(device)
    budget = memory_budget_bytes(device, budget_gb)  # checked even when data_store forces the choice
    if data_store == "device":
        return data_store  # the default of every store: no log line
    if data_store == "host":
        why = "data_store host"
        placement = data_store
    else:
        placement = "device" if nbytes <= budget or device.type != "cuda" else "host"
        if device.type != "cuda":
            why = f"{device}: the host is the device"
        else:
            why = f"budget {budget / 1e9:.2f} GB, " + (f"half the free memory of {device}" if budget_gb == "auto"
                                                       else "data_memory_budget_gb")
    logger.info(f"slice store of {nbytes / 1e9:.2f} GB ({why}): "
                + ("kept on the device" if placement == "device" else "kept in host memory, batches streamed"))
    return placement


def pinned(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in page-locked host memory when CUDA is available (so copies to the GPU run asynchronously), else
    ``t`` on the CPU."""
    if t is None:
        return None
    t = t.cpu()
    return t.pin_memory() if torch.cuda.is_available() and not t.is_pinned() else t


def gather_rows(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = src[idx[i]]`` for host tensors (``idx``: CPU indices of rows of ``src``), one row copy after the
    other in the calling thread (through NumPy views of both tensors), and ``out``.

    Why not ``torch.index_select(src, 0, idx, out=out)``: a row of more than 32,768 elements (a 384 x 384 slice has
    147,456) makes each row's copy a parallel region of PyTorch's OpenMP pool. That pool has as many threads as
    the cores OpenMP sees, which on a GPU server can be many more than the process may run at once (a container's
    CPU quota, other processes on the same cores); the threads then wait for each other at every region, 18 times
    per batch. On a 2-core machine, 32 threads made the gather of 18 such rows 18x slower (6.6 ms instead of 0.37 ms
    with 2), and under a CPU quota, threads that wait by spinning use it up and the whole process can be held until
    the next quota period (100 ms by default). One thread copies the ~10 MB of a batch in about 0.5 ms (same
    machine), whatever the pool's size. Dtypes NumPy does not have (bfloat16) fall back to ``index_select``.
    Indices are checked as ``index_select`` checks them (NumPy would wrap negative ones)."""
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= src.shape[0]):
        raise IndexError(f"gather_rows: indices in [{int(idx.min())}, {int(idx.max())}], rows 0-{src.shape[0] - 1}")
    try:
        rows, into = src.numpy(), out.numpy()
    except (TypeError, RuntimeError):  # no NumPy dtype, or a tensor NumPy cannot view
        return torch.index_select(src, 0, idx, out=out)
    for i, j in enumerate(idx.tolist()):
        into[i] = rows[j]
    return out


class HostToDevice:
    """Gathers rows of host tensors and copies them to ``device``.

    On CUDA each call gathers into one of ``slots`` pinned staging buffers (:meth:`gather`, :func:`gather_rows`),
    copies them with ``non_blocking`` on a side stream, and makes the current stream wait for that copy on the GPU
    (the CPU does not wait). A staging buffer is reused ``slots`` calls later, after its copy has finished (one
    event per slot, made once). Elsewhere it is plain indexing."""

    def __init__(self, device: torch.device | str, slots: int = 3) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.buffers: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self.done: list[torch.cuda.Event | None] = [None] * slots
        self.calls = 0

    def _staging(self, slot: int, key: str, like: torch.Tensor, rows: int) -> torch.Tensor:
        shape = (rows, *like.shape[1:])
        buf = self.buffers[slot].get(key)
        if buf is None or tuple(buf.shape) != shape or buf.dtype != like.dtype:
            buf = self.buffers[slot][key] = torch.empty(shape, dtype=like.dtype, pin_memory=self.cuda)
        return buf

    def gather(self, sources: dict[str, torch.Tensor], idx: torch.Tensor, slot: int = 0) -> dict[str, torch.Tensor]:
        """``{key: source[idx]}`` in the host staging buffers of ``slot`` (pinned on CUDA; allocated once per slot,
        key and shape). The caller makes sure no copy still reads them."""
        return {key: gather_rows(src, idx, self._staging(slot, key, src, len(idx))) for key, src in sources.items()}

    def __call__(self, sources: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{key: source[idx]}`` on ``device`` (``idx``: CPU indices of rows of the host ``sources``)."""
        if not self.cuda:
            return {k: t[idx].to(self.device) for k, t in sources.items()}
        slot = self.calls % len(self.buffers)
        self.calls += 1
        done = self.done[slot]
        if done is not None:
            done.synchronize()  # the copy that read this slot's buffers has finished
        else:
            done = self.done[slot] = torch.cuda.Event()
        staged = self.gather(sources, idx, slot)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = {key: buf.to(self.device, non_blocking=True) for key, buf in staged.items()}
            done.record(self.stream)
        compute.wait_event(done)
        for t in out.values():
            t.record_stream(compute)  # allocated on the side stream, used on the current one
        return out
