"""Time the training iteration of finetune_seg or meanteacher_seg as the bundle runs it.

    python tools/benchmark_finetune.py [--bundle finetune_seg] [--variant mean_teacher] [--dataset_dir DIR]
                                       [--iterations 200] [--warmup 50] [--profile PATH --profile_steps 20]
                                       [--out PATH] [--KEY VALUE ...]

Builds the bundle's own ``train#trainer`` from its ``configs/train.json`` (meanteacher_seg: plus
``configs/variants/<variant>.json``) with ``monai.bundle``'s ConfigWorkflow, exactly as ``monai.bundle run``
does, and runs one epoch of ``warmup + iterations`` iterations; the clock covers the last ``iterations`` (after
``torch.cuda.synchronize``), so compilation and CUDA-graph recording stay out of it, and validation (at the end of
the epoch) and checkpoints (``save_every`` is set past the last iteration, a multiple of ``log_every``, unless
given) too. Every other ``--KEY VALUE`` is a bundle option (``--compile False``, ``--pretrained PATH``,
``--features "[8, 8, 16, 16, 32, 8]"``). Without ``--dataset_dir`` it runs on the demo phantoms.

Prints one JSON line: device, ``ms_per_iteration``, labelled (and unlabelled) images per iteration and per
second, and the training loss of the first 5 timed iterations (equal seeds give equal losses, up to bf16 noise,
so two versions of a bundle can be compared on the same run: copy this file into the other checkout).
``--profile PATH [--profile_steps 20]``: after the timed iterations, ``profile_steps`` more under
``torch.profiler`` (they run without ``--profile`` too, unprofiled, so that the LR schedule and the timed
iterations are the same either way); PATH gets the operator tables (by device time on a GPU, then by host time) and the JSON a
``profile`` entry with ``gpu_busy_share``, the share of the profiled wall time the GPU spent in kernels (as
``benchmark_pretrain.py --profile``; below 1, the iteration waits on the host).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = ("finetune_seg", "meanteacher_seg")


def config_files(bundle: str, variant: str | None) -> list[str]:
    """The bundle's train.json, plus meanteacher_seg's ``variant`` file."""
    if bundle not in BUNDLES:
        raise SystemExit(f"--bundle must be one of {', '.join(BUNDLES)}, got {bundle!r}")
    configs = ROOT / "bundles" / bundle / "configs"
    files = [configs / "train.json"]
    if bundle == "meanteacher_seg":
        files.append(configs / "variants" / f"{variant}.json")
    elif variant:
        raise SystemExit("--variant is an option of meanteacher_seg only")
    for f in files:
        if not f.is_file():
            raise SystemExit(f"{f} does not exist (--variant: one of configs/variants/*.json)")
    return [str(f) for f in files]


class IterationClock:
    """Ignite handlers: synchronise and start the clock after iteration ``warmup``, stop it after ``warmup +
    iterations``, keep the loss of the first 5 timed iterations (read once the clock has stopped); with ``prof``
    (a ``torch.profiler.profile``), run it over the ``profile_steps`` iterations after those
    (``profiled_s``: their wall time)."""

    def __init__(self, warmup: int, iterations: int, prof=None, profile_steps: int = 0) -> None:
        self.warmup, self.iterations, self.start, self.seconds, self.losses = warmup, iterations, None, None, []
        self.prof, self.profile_steps, self.profiled_s = prof, profile_steps, None

    def attach(self, engine) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_COMPLETED, self)

    def __call__(self, engine) -> None:
        it = engine.state.iteration
        if it == self.warmup:
            _sync()
            self.start = time.perf_counter()
        elif self.start is not None and len(self.losses) < 5:
            self.losses.append(engine.state.output["loss"].detach())
        if it == self.warmup + self.iterations:
            _sync()
            self.seconds = time.perf_counter() - self.start
            if self.prof is not None:
                self.prof.start()
        if self.prof is not None and it == self.warmup + self.iterations + self.profile_steps:
            _sync()
            self.prof.stop()
            self.profiled_s = time.perf_counter() - self.start - self.seconds


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(bundle: str = "finetune_seg", variant: str | None = None, dataset_dir: str | None = None,
            iterations: int = 200, warmup: int = 50, profile: str | None = None, profile_steps: int = 20,
            **options) -> dict:
    """The result (see the module docstring) of timing ``bundle``'s iteration."""
    from benchmark_pretrain import device_profiler, profile_summary
    from monai.bundle import ConfigWorkflow

    from bim.engine import cudagraph_skips

    if int(iterations) < 1 or int(warmup) < 1:
        raise SystemExit(f"--iterations and --warmup must be >= 1, got {iterations} and {warmup}")
    profile_steps = int(profile_steps)
    if profile_steps < (1 if profile else 0):
        raise SystemExit(f"--profile_steps must be >= 1 with --profile (>= 0 without), got {profile_steps}")
    if bundle == "meanteacher_seg":
        variant = variant or "mean_teacher"
    files = config_files(bundle, variant)
    with tempfile.TemporaryDirectory(prefix="bim_benchmark_finetune_") as tmp:
        if dataset_dir is None:
            from data_prep import ensure_demo_dataset

            dataset_dir = str(ensure_demo_dataset(Path(tmp) / "demo"))
        log_every = int(options.get("log_every", 20))  # the bundle's default; a checkpoint-free window below
        length = int(warmup) + int(iterations) + profile_steps
        options.setdefault("save_every", log_every * (length // log_every + 1))
        workflow = ConfigWorkflow(config_file=files, workflow_type="train", bundle_root=str(ROOT / "bundles" / bundle),
                                  dataset_dir=str(dataset_dir), output_dir=str(Path(tmp) / "run"), epochs=1,
                                  iters_per_epoch=length, progress_bar=False, **options)
        workflow.initialize()
        trainer = workflow.parser.get_parsed_content("train#trainer")
        prof = device_profiler(workflow.parser.get_parsed_content("device")) if profile else None
        clock = IterationClock(int(warmup), int(iterations), prof, profile_steps)
        clock.attach(trainer)
        trainer.run()
        labelled = int(workflow.parser.get_parsed_content("batch_size"))
        unlabelled = int(workflow.parser.get_parsed_content("unlabelled_per_step")) if bundle == "meanteacher_seg" else 0
        device = trainer.state.device
    ms = 1000 * clock.seconds / int(iterations)
    result = {
        "bundle": bundle, "variant": variant if bundle == "meanteacher_seg" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "ms_per_iteration": round(ms, 3), "labelled_per_iteration": labelled, "unlabelled_per_iteration": unlabelled,
        "images_per_s": round((labelled + unlabelled) * 1000 / ms, 1),
        "first_losses": [round(float(x), 5) for x in clock.losses], "iterations": int(iterations),
        "warmup": int(warmup), "options": options, "cudagraph_skips": cudagraph_skips(), "torch": torch.__version__,
        "command": " ".join(["python", "tools/benchmark_finetune.py", *sys.argv[1:]]),
    }
    if prof is not None:
        result["profile"] = {**profile_summary(prof, clock.profiled_s, device, profile), "steps": profile_steps}
    return result



def main(out: str | None = None, **kwargs) -> None:
    """Print the JSON line of :func:`measure`; ``--out PATH`` writes it to PATH too."""
    result = measure(**kwargs)
    print(json.dumps(result))
    if out:
        from bim.files import atomic_file

        with atomic_file(out) as tmp:
            Path(tmp).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import fire

    fire.Fire(main)
