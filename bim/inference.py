"""Slice-wise inference and 3D Dice evaluation shared by the segmentation bundles.

- :class:`CenterCropSlicesd`: the authors' evaluation field of view, an in-plane centre crop of image and label;
- :class:`SliceBatchInferer`: a MONAI :class:`~monai.inferers.Inferer` that runs a 2D network on all slices of
  a volume [B, C, H, W, D] as one batch (slices on the last axis, as data_prep writes them), padding each
  slice to a multiple of 16 (the U-Net's 4 down-samplings) and cropping back;
- :func:`dice_metric_handler`: MONAI's ``DiceMetric`` (3D, per scan, without background) as an Ignite metric;
- :class:`BestMetricSaver`: keeps the weights of the best validation epoch as ``model.pt`` + ``best_metric.json``;
- :class:`LastEpochValidationHandler`: MONAI's ``ValidationHandler``, also validating after the last epoch;
- :class:`ScanDiceWriter`: writes per-scan Dice (CSV) and its summary (JSON) of an evaluation run;
- :class:`PredictionPanelWriter`: a PNG of a few scans' label and prediction outlines after an evaluation run;
- :func:`scan_preprocessing` and :func:`label_map_postprocessing`: the inference configs' way from a NIfTI scan to the
  network's input and from its output back to a label map in the scan's geometry.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from ignite.engine import Engine, Events
from monai.config import KeysCollection
from monai.handlers import ValidationHandler
from monai.inferers import Inferer
from monai.transforms import InvertibleTransform, MapTransform

from .engine import _is_main_process, atomic_file, atomic_save, cpu_has_native_bf16, inference_autocast, unwrap
from .onnx_cpu import ONNX_SIZE_MULTIPLE, OnnxRuntimeNetwork, onnxruntime_available
from .options import CPU_BACKENDS, record_patiences

logger = logging.getLogger("bim")


class CenterCropSlicesd:
    """Dictionary transform: the centre ``size`` x ``size`` window of every slice of ``keys`` ([C, H, W, D] volumes,
    slices on the last axis), zero-padded where a slice is smaller: the authors' evaluation field of view on ACDC
    (``CenterCrop(224)``). ``size`` None leaves the data as it is (the whole slice, the bundles' default)."""

    def __init__(self, keys, size: int | None = None) -> None:
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"eval_center_crop must be null (the whole slice) or a positive int of pixels, got {size!r}")
        self.keys, self.size = ([keys] if isinstance(keys, str) else list(keys)), size

    def __call__(self, data: dict) -> dict:
        if self.size is None:
            return data
        from monai.data import MetaTensor
        from monai.transforms import ResizeWithPadOrCrop

        crop, out = ResizeWithPadOrCrop((self.size, self.size, -1)), dict(data)
        for k in self.keys:
            y = crop(data[k])
            out[k] = y if isinstance(data[k], MetaTensor) or not isinstance(y, MetaTensor) else y.as_tensor()
        return out


class SliceBatchInferer(Inferer):
    """Run a 2D network slice by slice on volumes, all slices of a scan in one batch.

    ``inputs`` [B, C, H, W, D] (slices on the last axis) -> outputs [B, C_out, H, W, D]; a 4D input
    [N, C, H, W] is treated as a batch of slices. Each slice is zero-padded symmetrically to a multiple of
    ``divisor`` and the output is cropped back. ``max_slices`` bounds the batch (None: all slices at once).
    On CUDA the network runs under bf16 autocast when ``amp``; on the CPU too when ``cpu_bf16`` and the CPU has
    native bf16, with the network and slices in channels-last layout (the network is converted in place; its
    weights are unchanged). Outputs are fp32. ``cpu_backend`` (CPU only): ``torch``; ``onnxruntime``, the network run
    in fp32 by ONNX Runtime (:class:`~bim.onnx_cpu.OnnxRuntimeNetwork`, 1.5-1.9x faster than torch's fp32 on an
    AVX2 CPU; needs ``divisor`` a multiple of 16); ``auto``, ONNX Runtime where torch would run fp32 (no bf16
    autocast) and onnx / onnxruntime are installed, else torch (an export that fails is logged and torch runs).

    Kept rather than MONAI's :class:`~monai.inferers.SliceInferer` (``roi_size=(-1, -1)``, ``spatial_dim=2``: a
    sliding window of whole slices, the same logits): that neither pads to a multiple of 16 nor runs bf16 channels-last
    on the CPU, and with both added around it it ran 2-8 % slower (10 x 384^2 slices, 2 CPU threads, bf16).
    """

    def __init__(self, divisor: int = 16, max_slices: int | None = None, amp: bool = True, cpu_bf16: bool = False,
                 cpu_backend: str = "torch") -> None:
        super().__init__()
        if divisor < 1:
            raise ValueError(f"divisor must be >= 1, got {divisor}")
        if cpu_backend not in CPU_BACKENDS:
            raise ValueError(f"cpu_backend must be one of {', '.join(CPU_BACKENDS)}, got {cpu_backend!r}")
        if cpu_backend == "onnxruntime" and divisor % ONNX_SIZE_MULTIPLE:
            raise ValueError(f"cpu_backend 'onnxruntime' needs divisor a multiple of {ONNX_SIZE_MULTIPLE}, got {divisor}")
        self.divisor, self.max_slices, self.amp, self.cpu_bf16 = int(divisor), max_slices, bool(amp), bool(cpu_bf16)
        self.cpu_backend = cpu_backend
        # the last network run on the CPU and its ONNX Runtime copy (None: torch runs it); one slot, so a server that
        # loads new networks keeps no old copies
        self._onnx: tuple[torch.nn.Module, OnnxRuntimeNetwork | None] | None = None

    def _cpu_bf16_active(self, x: torch.Tensor) -> bool:
        return self.amp and self.cpu_bf16 and x.device.type == "cpu" and cpu_has_native_bf16()

    def _onnx_network(self, x: torch.Tensor, network, extra_args: bool) -> OnnxRuntimeNetwork | None:
        """The ONNX Runtime copy of ``network`` that runs these slices, or None where torch runs them."""
        if x.device.type != "cpu" or self.cpu_backend == "torch":
            return None
        if self.cpu_backend == "auto" and (self._cpu_bf16_active(x) or self.divisor % ONNX_SIZE_MULTIPLE or extra_args
                                           or not isinstance(network, torch.nn.Module) or not onnxruntime_available()):
            return None
        if not isinstance(network, torch.nn.Module) or extra_args:
            raise ValueError("cpu_backend 'onnxruntime' runs a torch.nn.Module called with the slices alone; "
                             "set cpu_backend to torch")
        if self._onnx is None or self._onnx[0] is not network:
            self._onnx = (network, OnnxRuntimeNetwork(network, in_channels=x.shape[1]))
            logger.info(f"CPU inference through ONNX Runtime (fp32, {torch.get_num_threads()} threads)")
        return self._onnx[1]

    def runs_onnxruntime(self, network) -> bool:
        """Whether ONNX Runtime ran ``network``'s last slices (False: torch did, or it has not run yet)."""
        return self._onnx is not None and self._onnx[0] is network and self._onnx[1] is not None

    def _forward(self, network, onnx: OnnxRuntimeNetwork | None, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if onnx is not None and self._onnx[1] is onnx:  # not after a fallback earlier in this call
            try:
                return onnx(x)
            except Exception as e:  # noqa: BLE001 -- auto falls back to torch, naming the cause once
                if self.cpu_backend != "auto":
                    raise
                logger.warning(f"cpu_backend auto: ONNX Runtime could not run the network ({type(e).__name__}: {e}); "
                               f"torch runs it")
                self._onnx = (network, None)
        return network(x, *args, **kwargs)

    def run_slices(self, slices: torch.Tensor, network, *args, **kwargs) -> torch.Tensor:
        h, w = slices.shape[-2:]
        ph, pw = (-h) % self.divisor, (-w) % self.divisor
        pad = (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2)
        x = F.pad(slices, pad) if ph or pw else slices
        chunk = self.max_slices or x.shape[0]
        outs = []
        onnx = self._onnx_network(x, network, bool(args or kwargs))
        if onnx is None and self._cpu_bf16_active(x):
            if isinstance(network, torch.nn.Module):
                network = network.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        with inference_autocast(x.device, self.amp and onnx is None, self.cpu_bf16):
            for start in range(0, x.shape[0], chunk):
                outs.append(self._forward(network, onnx, x[start : start + chunk], *args, **kwargs))
        y = torch.cat(outs).float()
        return y[..., pad[2] : pad[2] + h, pad[0] : pad[0] + w]

    def __call__(self, inputs: torch.Tensor, network, *args, **kwargs) -> torch.Tensor:
        if inputs.ndim == 4:
            return self.run_slices(inputs, network, *args, **kwargs)
        if inputs.ndim != 5:
            raise ValueError(f"SliceBatchInferer expects [B, C, H, W, D] volumes or [N, C, H, W] slices, got {tuple(inputs.shape)}")
        b, c, h, w, d = inputs.shape
        slices = inputs.permute(0, 4, 1, 2, 3).reshape(b * d, c, h, w)
        if hasattr(slices, "as_tensor"):  # MetaTensor -> plain tensor for the network
            slices = slices.as_tensor()
        out = self.run_slices(slices, network, *args, **kwargs)
        out = out.reshape(b, d, out.shape[1], h, w).permute(0, 2, 3, 4, 1).contiguous()
        if hasattr(inputs, "meta"):  # keep the MetaTensor's meta data (Invertd needs it downstream)
            from monai.data import MetaTensor

            out = MetaTensor(out, meta=inputs.meta)
        return out


def dice_metric_handler(save_details: bool = True):
    """3D Dice per scan (MONAI ``DiceMetric`` on one-hot [1, C, H, W, D], background excluded, mean over the
    foreground classes and scans) as an Ignite metric reading ``pred``/``label`` from the engine output.

    ``ignore_empty=False``: where a structure is absent from a scan's ground truth, the scan's Dice for it is 1
    when the prediction is empty too and 0 otherwise (MONAI's convention), so every scan counts and a false
    positive is penalised; with ``True`` such scans would be NaN and dropped from the mean.
    """
    from monai.handlers import IgniteMetricHandler, from_engine
    from monai.metrics import DiceMetric

    return IgniteMetricHandler(
        metric_fn=DiceMetric(include_background=False, reduction="mean", ignore_empty=False),
        output_transform=from_engine(["pred", "label"]),
        save_details=save_details,
    )


def atomic_write_text(text: str, path: Path) -> Path:
    """Write ``text`` to ``path`` through :func:`~bim.engine.atomic_file`: never half-written, mode 0644."""
    with atomic_file(path) as tmp:
        Path(tmp).write_text(text)
    return Path(path)


class BestMetricSaver:
    """Attached to the validation evaluator: after each validation whose ``metric_name`` beats the best so far,
    writes the network's weights as a plain state dict to ``output_dir/model.pt`` (atomically; loadable with
    ``torch.load(..., weights_only=True)``) and ``output_dir/best_metric.json`` (metric, epoch, iteration and
    ``info``). ``state_dict``/``load_state_dict`` let a resumed run continue the comparison.

    A good model is never replaced by a worse one: when ``output_dir`` already holds a ``model.pt`` with its
    ``best_metric.json`` from an earlier run (a second MONAI Label train request, say), this run replaces it only
    with weights that score higher than that record; until then its best weights go to ``model_new.pt``
    (+ ``best_metric_new.json``) and each such validation logs a warning saying which model was kept.

    Kept rather than MONAI's ``CheckpointSaver(save_key_metric=True, key_metric_filename="model.pt")``: that deletes
    ``model.pt`` before writing the new one, not atomically (its ``DiskSaver`` has ``atomic=False``), cannot write
    ``best_metric.json`` nor keep a better model of an earlier run, and resumes its best only from state in model.pt."""

    def __init__(self, network, output_dir: str, metric_name: str = "val_mean_dice", info: dict | None = None,
                 filename: str = "model.pt") -> None:
        self.network, self.output_dir, self.metric_name = network, Path(output_dir), metric_name
        self.info, self.filename = dict(info or {}), filename
        self.best, self.best_epoch = -math.inf, -1
        self.previous = self.previous_record()
        self.saved: Path | None = None  # the file this run's best weights went to last

    def previous_record(self) -> dict | None:
        """``best_metric.json`` of the model already in ``output_dir`` (None when there is none)."""
        record_path = self.output_dir / "best_metric.json"
        if not (self.output_dir / self.filename).is_file() or not record_path.is_file():
            return None
        try:
            record = json.loads(record_path.read_text())
            float(record["value"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{record_path}: not a best_metric.json written by training ({e}); delete it or train "
                             f"into another output_dir") from e
        return record

    def state_dict(self) -> dict:
        return {"best": torch.tensor(self.best, dtype=torch.float64), "best_epoch": torch.tensor(self.best_epoch)}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_epoch = float(state["best"]), int(state["best_epoch"])

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        value = float(engine.state.metrics[self.metric_name])
        epoch = int(engine.state.epoch)
        if not (value > self.best or self.best_epoch < 0):
            logger.info(f"epoch {epoch}: {self.metric_name} {value:.4f} (best {self.best:.4f} at epoch {self.best_epoch})")
            return
        self.best, self.best_epoch = value, epoch
        filename, record_name = self.filename, "best_metric.json"
        previous = None if self.previous is None else float(self.previous["value"])
        if previous is not None and value <= previous:
            filename, record_name = f"{Path(self.filename).stem}_new.pt", "best_metric_new.json"
            logger.warning(
                f"epoch {epoch}: {self.metric_name} {value:.4f} is this run's best but not above the {previous:.4f} "
                f"of the {self.filename} already in {self.output_dir} (epoch {self.previous.get('epoch')} of an "
                f"earlier run, best_metric.json): keeping that model; this run's best weights go to {filename}"
            )
        else:
            logger.info(f"epoch {epoch}: {self.metric_name} {value:.4f} is the best so far, saving {self.output_dir / filename}")
        if not _is_main_process():
            return
        state = {k: v.detach().cpu() for k, v in unwrap(self.network).state_dict().items()}
        self.saved = atomic_save(state, self.output_dir / filename)
        record = {"metric": self.metric_name, "value": value, "epoch": epoch,
                  "checkpoint": (self.output_dir / filename).as_posix(), **self.info}
        atomic_write_text(json.dumps(record, indent=2) + "\n", self.output_dir / record_name)


class EarlyStopRecord:
    """Measures early stopping without stopping: a train handler that watches ``best_saver`` (the validator's
    :class:`BestMetricSaver`) and, for each of its ``patience`` values (a number of validations or a list of them), at
    the validation after which an ``EarlyStopHandler`` of that patience would have ended the run (that many
    validations in a row without a better metric), copies the best weights so far to ``model_patience{N}.pt`` and
    records that epoch and iteration, the seconds since training started, the best epoch and value in
    ``early_stop_record.json`` (a list, one record per patience, ascending). Training goes on; at its end each record
    adds the run's own seconds (null when the stop was recorded before a resume: seconds count from this process's
    start) and epochs. A run that ends before a patience runs out records ``"stopped": false`` for it and copies its
    best weights the same way, so ``model_patience{N}.pt`` is always the model an early-stopped run would have kept:
    a run of the full length gives all these results from one training trajectory. ``patience`` None leaves it
    off."""

    def __init__(self, patience, best_saver: BestMetricSaver, validator) -> None:
        self.patiences = record_patiences(patience)
        self.best_saver, self.validator = best_saver, validator
        self.waited, self.records, self.trainer, self.started, self.attempt = 0, {}, None, 0.0, None

    @property
    def path(self) -> Path:
        return self.best_saver.output_dir / "early_stop_record.json"

    def state_dict(self) -> dict:
        return {"waited": torch.tensor(self.waited), "recorded": torch.tensor(len(self.records))}

    def load_state_dict(self, state: dict) -> None:
        self.waited = int(state["waited"])
        if int(state["recorded"]) and self.path.is_file():
            saved = json.loads(self.path.read_text())
            saved = [saved] if isinstance(saved, dict) else saved  # a single-patience record of an earlier version
            self.records = {int(r["patience"]): r for r in saved if int(r["patience"]) in self.patiences}

    def attach(self, engine: Engine) -> None:
        if not self.patiences:
            return
        self.trainer = engine
        engine.add_event_handler(Events.STARTED, self._start)
        self.validator.add_event_handler(Events.EPOCH_COMPLETED, self._validated)  # after best_saver: attached later

    def _start(self, engine: Engine) -> None:
        self.started, self.attempt = time.perf_counter(), time.time()
        if not engine.has_event_handler(self._completed, Events.COMPLETED):  # after every handler, the last validation's too
            engine.add_event_handler(Events.COMPLETED, self._completed)

    def _validated(self, validator: Engine) -> None:
        self.waited = 0 if self.best_saver.best_epoch == int(validator.state.epoch) else self.waited + 1
        due = [p for p in self.patiences if p not in self.records and self.waited >= p]
        for p in due:
            self.records[p] = self._record(p, stopped=True)
        if due:
            self._write_json()

    def _completed(self, _engine: Engine) -> None:
        for p in self.patiences:
            if p not in self.records:
                self.records[p] = self._record(p, stopped=False)
        for record in self.records.values():
            same_attempt = record.get("attempt") == self.attempt  # else the stop was seen before a resume
            record.update(run_seconds=time.perf_counter() - self.started if same_attempt else None,
                          run_epochs=int(self.trainer.state.epoch))
        self._write_json()

    def _record(self, patience: int, stopped: bool) -> dict:
        state = self.trainer.state
        record = {"patience": patience, "stopped": stopped, "epoch": int(state.epoch),
                  "iteration": int(state.iteration), "seconds": time.perf_counter() - self.started, "attempt": self.attempt,
                  "best_epoch": self.best_saver.best_epoch, "best_value": self.best_saver.best,
                  "checkpoint": (self.best_saver.output_dir / f"model_patience{patience}.pt").as_posix()}
        if _is_main_process() and self.best_saver.saved is not None:
            with atomic_file(record["checkpoint"]) as tmp:
                shutil.copyfile(self.best_saver.saved, tmp)
        return record

    def _write_json(self) -> None:
        if _is_main_process():
            records = [self.records[p] for p in sorted(self.records)]
            atomic_write_text(json.dumps(records, indent=2) + "\n", self.path)


class LastEpochValidationHandler(ValidationHandler):
    """MONAI's :class:`~monai.handlers.ValidationHandler` (epoch level) that also validates when training completes,
    unless that epoch was validated already, so the best checkpoint always exists: it attaches on
    ``EPOCH_COMPLETED(every=interval) | COMPLETED`` (filtered to epochs that are not a multiple of ``interval``), where
    MONAI's attaches ``EPOCH_COMPLETED(every=interval)`` alone. An early stop ends at a validated epoch."""

    def __init__(self, interval: int, validator=None, exec_at_start: bool = False) -> None:
        if isinstance(interval, bool) or int(interval) < 1:
            raise ValueError(f"val_interval must be >= 1, got {interval}")
        super().__init__(int(interval), validator, epoch_level=True, exec_at_start=exec_at_start)

    def not_validated(self, engine: Engine, _event: int) -> bool:
        return engine.state.epoch % self.interval != 0

    def attach(self, engine: Engine) -> None:
        events = Events.EPOCH_COMPLETED(every=self.interval) | Events.COMPLETED(event_filter=self.not_validated)
        engine.add_event_handler(events, self)
        if self.exec_at_start:
            engine.add_event_handler(Events.STARTED, self)


class ScanDiceWriter:
    """Attached to an evaluator whose key metric is :func:`dice_metric_handler` (``save_details``): at the end
    writes ``output_dir/<prefix>_dice.csv`` (scan, dice = mean over foreground classes, one column per class)
    and ``output_dir/<prefix>_summary.json`` (mean, std over scans (ddof=0), n, per-class means and ``info``),
    both atomically. Scan ids come from the ``scan`` key of each batch.

    Kept rather than MONAI's :class:`~monai.handlers.MetricsSaver`: that writes fixed names (``<metric>_raw.csv``,
    ``<metric>_summary.csv``, no per-run prefix), columns ``class0``... and ``mean``, a 4-decimal summary table without
    ``n`` or the run's info, not atomically; tools/experiments reads these files' columns and JSON keys."""

    def __init__(self, output_dir: str, prefix: str, metric_name: str = "val_mean_dice",
                 class_names: list[str] | tuple[str, ...] = (), info: dict | None = None) -> None:
        self.output_dir, self.prefix, self.metric_name = Path(output_dir), prefix, metric_name
        self.class_names, self.info = list(class_names), dict(info or {})
        self.scans: list[str] = []

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, lambda e: self.scans.clear())
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.write)

    def collect(self, engine: Engine) -> None:
        batch = engine.state.batch
        items = batch if isinstance(batch, list) else [batch]
        for item in items:
            scan = item.get("scan", f"scan{len(self.scans)}")
            if isinstance(scan, (list, tuple)):
                self.scans.extend(str(s) for s in scan)
            else:
                self.scans.append(str(scan))

    def write(self, engine: Engine) -> dict:
        details = engine.state.metric_details[self.metric_name]
        per_class = torch.as_tensor(details).float().cpu().numpy().reshape(len(self.scans), -1)
        dice = per_class.mean(axis=1)
        names = self.class_names[1:] if len(self.class_names) == per_class.shape[1] + 1 else [
            f"class{i + 1}" for i in range(per_class.shape[1])
        ]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["scan", "dice"] + ([f"dice_{n}" for n in names] if per_class.shape[1] > 1 else []))
        for scan, d, row in zip(self.scans, dice, per_class):
            writer.writerow([scan, f"{d:.6f}"] + ([f"{v:.6f}" for v in row] if per_class.shape[1] > 1 else []))
        summary = {
            "mean": float(np.mean(dice)), "std": float(np.std(dice)), "n": int(len(dice)),
            "per_class_mean": {n: float(v) for n, v in zip(names, per_class.mean(axis=0))},
            "metric": "3D Dice per scan, background excluded, ignore_empty=False", **self.info,
        }
        if _is_main_process():
            csv_path = atomic_write_text(out.getvalue(), self.output_dir / f"{self.prefix}_dice.csv")
            atomic_write_text(json.dumps(summary, indent=2) + "\n", self.output_dir / f"{self.prefix}_summary.json")
            logger.info(f"test Dice {summary['mean']:.4f} ± {summary['std']:.4f} over {summary['n']} scans -> {csv_path}")
        return summary


class PredictionPanelWriter:
    """Attached to an evaluator (decollated outputs with one-hot ``pred`` and ``label`` [C, H, W, D] and
    ``image`` [1, H, W, D]): at the end writes ``output_dir/<prefix>_predictions.png``, one row per scan for
    ``max_scans`` scans: the slice with the most labelled foreground (the middle slice when the label is empty), plain
    and with the label's outline in green and the prediction's in red, captioned with the scan and its 3D Dice
    (from ``metric_name``'s per-scan details when the evaluator has them). ``order``: ``"first"`` shows the first
    scans in evaluation order; ``"worst"`` the scans with the lowest Dice, lowest first (where a model fails is what
    one looks for), or the first ones when the evaluator has no per-scan Dice. ``written_scans``: the scans shown.

    Kept rather than ``monai.visualize``: ``blend_images`` fills a label with a colour map scaled by its maximum (no
    outlines, no fixed colour per source), ``matshow3d`` and the TensorBoard image helpers draw one volume, and none
    picks the scans by Dice or captions them."""

    ORDERS = ("first", "worst")

    def __init__(self, output_dir: str, prefix: str, metric_name: str = "val_mean_dice", max_scans: int = 8,
                 order: str = "first") -> None:
        if int(max_scans) < 1:
            raise ValueError(f"max_scans must be >= 1, got {max_scans}")
        if order not in self.ORDERS:
            raise ValueError(f"order must be one of {self.ORDERS}, got {order!r}")
        self.output_dir, self.prefix = Path(output_dir), prefix
        self.metric_name, self.max_scans, self.order = metric_name, int(max_scans), order
        self.rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
        self.written_scans: list[str] = []
        self.seen = 0

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, self.reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.write)

    def reset(self, engine: Engine | None = None) -> None:
        self.rows.clear()
        self.seen = 0

    def collect(self, engine: Engine) -> None:
        outputs = engine.state.output if isinstance(engine.state.output, list) else [engine.state.output]
        batch = engine.state.batch if isinstance(engine.state.batch, list) else [engine.state.batch]
        for i, out in enumerate(outputs):
            self.seen += 1
            if self.order == "first" and len(self.rows) >= self.max_scans:
                continue  # "worst" keeps one slice per scan until the Dice are known
            scan = batch[i].get("scan", f"scan{self.seen - 1}") if i < len(batch) else f"scan{self.seen - 1}"
            scan = str(scan[0] if isinstance(scan, (list, tuple)) else scan)
            image = torch.as_tensor(out["image"]).detach().float().cpu()[0].numpy()
            label = torch.as_tensor(out["label"]).detach().cpu().argmax(0).numpy()
            pred = torch.as_tensor(out["pred"]).detach().cpu().argmax(0).numpy()
            fg = (label > 0).reshape(-1, label.shape[-1]).sum(0)
            z = int(fg.argmax()) if fg.max() > 0 else label.shape[-1] // 2
            self.rows.append((scan, image[..., z], label[..., z], pred[..., z]))

    def write(self, engine: Engine) -> Path | None:
        if not self.rows or not _is_main_process():
            return None
        from PIL import Image, ImageDraw

        from .images import gray_rgb, mask_outline, save_png

        details = getattr(engine.state, "metric_details", {}).get(self.metric_name)
        dice = None
        if details is not None:
            dice = torch.as_tensor(details).float().cpu().reshape(self.seen, -1).mean(1).tolist()[: len(self.rows)]
        keep = list(range(len(self.rows)))
        if self.order == "worst" and dice is not None:
            keep.sort(key=lambda k: dice[k])
        keep = keep[: self.max_scans]
        rows = [self.rows[k] for k in keep]
        dice = None if dice is None else [dice[k] for k in keep]
        self.written_scans = [r[0] for r in rows]
        h = max(r[1].shape[0] for r in rows)
        w = max(r[1].shape[1] for r in rows)
        panel = np.zeros((h * len(rows), 2 * w, 3), np.uint8)
        for k, (scan, image, label, pred) in enumerate(rows):
            plain = gray_rgb(image)
            overlay = plain.copy()
            for mask, colour in ((label, (0, 220, 0)), (pred, (255, 40, 40))):
                edge = np.zeros(mask.shape, bool)
                for c in np.unique(mask[mask > 0]):
                    edge |= mask_outline(mask == c)
                overlay[edge] = colour
            ih, iw = image.shape
            panel[k * h:k * h + ih, :iw] = plain
            panel[k * h:k * h + ih, w:w + iw] = overlay
        img = Image.fromarray(panel)
        draw = ImageDraw.Draw(img)
        for k, scan in enumerate(self.written_scans):
            caption = scan + (f"  Dice {dice[k]:.3f}" if dice is not None else "")
            draw.text((4, k * h + 4), caption, fill=(255, 255, 0))
        path = save_png(np.asarray(img), self.output_dir / f"{self.prefix}_predictions.png")
        which = "lowest Dice first" if self.order == "worst" and dice is not None else "first in evaluation order"
        logger.info(f"prediction panel ({len(rows)} of {self.seen} scans, {which}; label green, prediction red) -> {path}")
        return path


def require_checkpoint(path: str | os.PathLike, hint: str = "run the bundle's train.json first",
                       finished: str | os.PathLike | None = None, allow_unfinished: bool = False) -> str:
    """``path`` if it is a file, else a ``FileNotFoundError`` naming it and ``hint``.

    ``finished``: the file a finished training leaves (``checkpoint_final.pt``). When it is absent, ``path`` is the
    best model of a run that was stopped (or still runs): a ``ValueError`` saying so, unless ``allow_unfinished``,
    which evaluates it with a warning."""
    if not Path(path).expanduser().is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: {hint}")
    if finished is not None and not Path(finished).expanduser().is_file():
        what = (f"{path} comes from a training that did not finish: {finished} does not exist (the run was stopped "
                f"or is still running)")
        if not allow_unfinished:
            raise ValueError(f"{what}. Finish it (run train.json again with the same output_dir: it resumes), or pass "
                             f"--allow_unfinished True to evaluate these weights anyway")
        logger.warning(f"{what}; evaluating it as --allow_unfinished True asks")
    logger.info(f"evaluating the weights of {path}")
    return str(Path(path).expanduser())


class SingleScoreLog:
    """Attached to an evaluator that scores once (evaluate.json): drops MONAI's "Got new best metric of ..." line
    from the evaluator's log, which an evaluation is not; :class:`ScanDiceWriter` reports the score."""

    @staticmethod
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Got new best metric")

    def attach(self, engine: Engine) -> None:
        engine.logger.addFilter(self.keep)


# name endings of label files beside their images, as data_prep reads them (ACDC, its nifti default, PROMISE12)
LABEL_SUFFIXES = ("_gt", "_seg", "_segmentation")


def is_label_file(path: str | os.PathLike) -> bool:
    """Whether a NIfTI file's name ends like a label's (``NAME_gt.nii.gz``, ``NAME_seg.nii``, ...)."""
    name = Path(path).name
    stem = name[: -len(".nii.gz")] if name.endswith(".nii.gz") else Path(name).stem
    return stem.endswith(LABEL_SUFFIXES)


def nifti_items(path: str | os.PathLike | None) -> list[dict]:
    """``[{"image": file}, ...]`` for a NIfTI file or every ``*.nii`` / ``*.nii.gz`` in a folder (sorted), leaving
    out the folder's label files (:func:`is_label_file`: a patient folder holds them beside the images); a clear
    error when ``path`` is unset, missing or holds no NIfTI image."""
    if path in (None, "", "None", "null"):
        raise ValueError("set --dataset_dir to a NIfTI file or a folder of NIfTI volumes (*.nii, *.nii.gz)")
    p = Path(path).expanduser()
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith((".nii", ".nii.gz")))
        labels = [f for f in files if is_label_file(f)]
        if labels:
            files = [f for f in files if f not in labels]
            logger.info(f"{len(labels)} label file(s) in {p} left out ({', '.join(f.name for f in labels[:4])}"
                        f"{' ...' if len(labels) > 4 else ''}: names ending in {', '.join(LABEL_SUFFIXES)})")
    else:
        raise FileNotFoundError(f"dataset_dir {p} does not exist")
    if not files:
        raise FileNotFoundError(f"{p} holds no NIfTI image (*.nii, *.nii.gz, other than label files)")
    logger.info(f"segmenting {len(files)} scan(s) of {p}")
    return [{"image": f.resolve().as_posix()} for f in files]


class PredictionLog:
    """Attached to inference.json's evaluator: at the end, logs how many segmentations were written and where
    (``output_dir``, each as ``<name>_<postfix>.nii.gz``)."""

    def __init__(self, output_dir: str, postfix: str = "seg") -> None:
        self.output_dir, self.postfix, self.count = Path(output_dir), postfix, 0

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, lambda e: setattr(self, "count", 0))
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.report)

    def collect(self, engine: Engine) -> None:
        output = engine.state.output
        self.count += len(output) if isinstance(output, list) else 1

    def report(self, engine: Engine) -> None:
        logger.info(f"{self.count} segmentation(s) written to {self.output_dir.resolve()} "
                    f"(<name>_{self.postfix}.nii.gz)")


class InplaneResampled(MapTransform, InvertibleTransform):
    """The in-plane geometry step of data_prep as an invertible dictionary transform of ``keys`` (channel-first
    volumes [C, H, W, D]): resampling to ``pixdim`` x ``pixdim`` mm keeping the slice spacing (ACDC tasks), or
    resizing every slice to ``prostate_size`` x ``prostate_size`` keeping the slice count (``prostate``, as
    data_prep promise12). ``mode``: one interpolation per key (``bilinear`` for images, ``nearest`` for labels).

    Unlike MONAI's ``Spacingd`` it leaves the other entries of the item alone: ``Spacingd`` updates every
    ``<key>_*`` entry with the resampled meta data, which breaks on the string ``image_path`` that MONAI Label
    adds to an inference request and would give ``image_meta_dict`` (from which MONAI Label writes the mask's
    affine) the resampled geometry instead of the input's."""

    def __init__(self, keys: KeysCollection, task: str, pixdim: float = 1.0, prostate_size: int = 256,
                 mode="bilinear", allow_missing_keys: bool = False) -> None:
        from monai.transforms import Resize, Spacing
        from monai.utils import ensure_tuple_rep

        from .tasks import get_task

        super().__init__(keys, allow_missing_keys)
        self.mode = ensure_tuple_rep(mode, len(self.keys))
        if get_task(task).name == "prostate":
            self.resampler = Resize(spatial_size=(int(prostate_size), int(prostate_size), -1))
        else:
            self.resampler = Spacing(pixdim=(float(pixdim), float(pixdim), -1))

    def __call__(self, data):
        d = dict(data)
        for key, mode in self.key_iterator(d, self.mode):
            d[key] = self.resampler(d[key], mode=mode)
        return d

    def inverse(self, data):
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.resampler.inverse(d[key])
        return d


def inplane_resampling(keys, task: str, pixdim: float = 1.0, prostate_size: int = 256, mode="bilinear"):
    """The in-plane geometry step of data_prep for the scans of ``task`` (see :class:`InplaneResampled`)."""
    return InplaneResampled(keys, task, pixdim=pixdim, prostate_size=prostate_size, mode=mode)


def scan_preparation(keys, task: str, pixdim: float = 1.0, prostate_size: int = 256, label_keys=()):
    """data_prep's preparation of a raw scan as invertible MONAI transforms: the in-plane resampling of
    :class:`InplaneResampled` (images ``keys`` bilinear, ``label_keys`` nearest), then each image's own 1 % / 99 %
    intensity percentiles mapped to [0, 1] and clipped. inference.json and the training of raw scans
    (:class:`PrepareRawScand`) both use it, so a model sees the same input in training and in inference."""
    from monai.transforms import Compose, ScaleIntensityRangePercentilesd
    from monai.utils import ensure_tuple

    keys, label_keys = list(ensure_tuple(keys)), list(ensure_tuple(label_keys))
    modes = ["bilinear"] * len(keys) + ["nearest"] * len(label_keys)
    return Compose([
        InplaneResampled(keys + label_keys, task, pixdim=pixdim, prostate_size=prostate_size, mode=modes),
        ScaleIntensityRangePercentilesd(keys=keys, lower=1, upper=99, b_min=0.0, b_max=1.0, clip=True),
    ])


PREPARED_KEY = "prepared"


def is_prepared(item) -> bool:
    """Whether ``item`` is a scan written by data_prep (its datalists' items carry ``"prepared": True``, see
    :func:`bim.data.read_items`); any other item is a raw scan, e.g. one of a MONAI Label datastore."""
    value = item.get(PREPARED_KEY, False)
    if hasattr(value, "item"):  # collated into a tensor by a data loader
        value = bool(value.reshape(-1)[0])
    return bool(value)


class PrepareRawScand(MapTransform):
    """Applies :func:`scan_preparation` to the channel-first ``image`` (and ``label``) of a raw scan and leaves a
    scan prepared by data_prep (:func:`is_prepared`) as it is: training and validation then read a MONAI Label
    datastore's raw NIfTI scans as inference does, and data_prep's output unchanged."""

    def __init__(self, keys: KeysCollection, task: str, pixdim: float = 1.0, prostate_size: int = 256,
                 label_keys=(), allow_missing_keys: bool = False) -> None:
        super().__init__(keys, allow_missing_keys)
        self.prepare = scan_preparation(self.keys, task, pixdim, prostate_size, label_keys)

    def __call__(self, data):
        return dict(data) if is_prepared(data) else self.prepare(dict(data))


def scan_preprocessing(task: str, pixdim: float = 1.0, prostate_size: int = 256, keys: str = "image"):
    """A NIfTI scan (its path under ``keys``) as the network's input, every step invertible (``Invertd``): load
    (checked: :class:`bim.data.LoadScand`, a 3D scan, finite, not constant), channel first, :func:`scan_preparation`
    (data_prep's in-plane resampling and 1 % / 99 % percentile scaling), float32. The inference configs'
    ``preprocessing``; :class:`SliceBatchInferer` pads each slice to a multiple of 16 for the network and crops back."""
    from monai.transforms import Compose, EnsureChannelFirstd, EnsureTyped

    from .data import LoadScand

    return Compose([
        LoadScand(keys=keys, reader="NibabelReader"),
        EnsureChannelFirstd(keys=keys),
        scan_preparation(keys, task, pixdim=pixdim, prostate_size=prostate_size),
        EnsureTyped(keys=keys, dtype=torch.float32),
    ])


def label_map_postprocessing(preprocessing, output_dir: str, output_postfix: str = "seg", before_inverse=(),
                             keys: str = "pred", orig_keys: str = "image"):
    """The network's logits under ``keys`` [C, H, W, D] as a label map in the input scan's geometry, written as NIfTI
    ``output_dir/<scan>_<output_postfix>.nii.gz`` (uint8): softmax over C, ``before_inverse`` (transforms that see
    the probabilities in the network's geometry, e.g. a panel writer), the inverse of ``preprocessing`` (bilinear on
    the probabilities), argmax. The inference configs' ``postprocessing``."""
    from monai.transforms import Activationsd, AsDiscreted, Compose, Invertd, SaveImaged

    return Compose([
        Activationsd(keys=keys, softmax=True),
        *before_inverse,
        Invertd(keys=keys, transform=preprocessing, orig_keys=orig_keys, nearest_interp=False, to_tensor=True),
        AsDiscreted(keys=keys, argmax=True),
        SaveImaged(keys=keys, output_dir=output_dir, output_postfix=output_postfix, output_dtype=np.uint8,
                   resample=False, separate_folder=False, print_log=False),
    ])
