"""The training utilities of bim.engine that the library now provides: the LR schedule (MONAI's
WarmupCosineSchedule), the wrapper unwrapping, the fine-tuning trainer's MONAI iteration settings."""

from __future__ import annotations

import math

import pytest
import torch

from bim.engine import unwrap, warmup_cosine_scheduler

PEAK = 3e-4


def paper_schedule(t: int, total: int, warmup: int, ratio: float) -> float:
    """The paper's LR at iteration t (0-based), written from the equation: linear warm-up from ratio x peak over
    ``warmup`` iterations, then a cosine to 0 at ``total``."""
    if t < warmup:
        return PEAK * (ratio + (1 - ratio) * t / warmup)
    return PEAK * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))


def lrs(scheduler, optimizer, steps: int) -> list[float]:
    """The LR each of ``steps`` iterations runs with, stepping as the bundles' LrScheduleHandler (per iteration)."""
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def _optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)


@pytest.mark.parametrize("epochs, iters, warmup_epochs, ratio", [(10, 30, 2, 1 / 400), (5, 7, 1, 1 / 200),
                                                                  (3, 4, 0, 0.5), (2, 5, 2, 0.0025)])
def test_the_lr_of_every_iteration_is_the_papers_warm_up_and_cosine(epochs, iters, warmup_epochs, ratio):
    """The tolerance is rounding: the warm-up's ``r + (1 - r) t / T_w`` grouped otherwise, and near the cosine's end
    ``1 + cos`` of an argument an ulp off; an iteration off by one moves the LR by >= 1e-3 relative."""
    total, warmup = epochs * iters, min(warmup_epochs * iters, epochs * iters)
    optimizer = _optimizer()
    got = lrs(warmup_cosine_scheduler(optimizer, epochs, iters, warmup_epochs, ratio), optimizer, total)
    expected = [paper_schedule(t, total, warmup, ratio) for t in range(total)]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12 * PEAK)
    assert got[0] == pytest.approx(PEAK * (ratio if warmup else 1.0), rel=1e-15)
    if warmup < total:  # 0 after the last iteration (a run that is all warm-up ends at the peak)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-15 * PEAK)


def test_a_resumed_schedule_continues_with_the_same_lrs():
    optimizer = _optimizer()
    scheduler = warmup_cosine_scheduler(optimizer, 4, 10, 1, 0.0025)
    head = lrs(scheduler, optimizer, 15)
    state = scheduler.state_dict()
    tail = lrs(scheduler, optimizer, 25)
    resumed_optimizer = _optimizer()
    resumed = warmup_cosine_scheduler(resumed_optimizer, 4, 10, 1, 0.0025)
    resumed.load_state_dict(state)
    resumed_optimizer.param_groups[0]["lr"] = state["_last_lr"][0]  # the optimiser's own state, restored alongside
    assert lrs(resumed, resumed_optimizer, 25) == tail and len(head) == 15


@pytest.mark.parametrize("kwargs, message", [(dict(epochs=0, iters_per_epoch=10), "needs >= 1 iteration"),
                                             (dict(start_ratio=0.0), r"warmup_start_ratio must be in \(0, 1\]"),
                                             (dict(start_ratio=1.5), r"warmup_start_ratio must be in \(0, 1\]")])
def test_a_schedule_of_no_iterations_or_a_bad_start_ratio_is_named(kwargs, message):
    args = dict(epochs=2, iters_per_epoch=3, warmup_epochs=1, start_ratio=0.01)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        warmup_cosine_scheduler(_optimizer(), **args)


def test_unwrap_takes_the_module_out_of_ddp_compile_and_averaged_model_wrappers():
    from torch.optim.swa_utils import AveragedModel

    net = torch.nn.Linear(2, 2)

    class FakeDDP(torch.nn.Module):  # DistributedDataParallel's attribute, without a process group
        def __init__(self, module):
            super().__init__()
            self.module = module

    compiled = torch.compile(net)
    assert unwrap(net) is net
    assert unwrap(FakeDDP(net)) is net and unwrap(compiled) is net
    assert unwrap(FakeDDP(compiled)) is net and unwrap(torch.compile(FakeDDP(net))) is net
    assert unwrap(AveragedModel(net)) is not net and isinstance(unwrap(AveragedModel(net)), torch.nn.Linear)


@pytest.mark.parametrize("device, bf16, autocast", [("cpu", True, False), ("cuda", True, True), ("cuda", False, False),
                                                    ("cuda", "False", False)])
def test_the_fine_tuning_trainer_autocasts_in_bf16_on_cuda_only(device, bf16, autocast):
    """The fine-tuning step runs the network under bf16 autocast on CUDA only (``bf16``), the loss on fp32 logits;
    on the CPU, fp32 throughout."""
    from bim.finetune import AugmentBatch, FineTuneTrainer
    from bim.segmentation import SegmentationAugment

    net = torch.nn.Conv2d(1, 2, 1)
    trainer = FineTuneTrainer(device=device, max_epochs=1, train_data_loader=[], epoch_length=1, network=net,
                              optimizer=torch.optim.SGD(net.parameters(), lr=0.1), loss_function=None,
                              augment=SegmentationAugment(crop_size=16), bf16=bf16)
    assert trainer.bf16 is autocast and isinstance(trainer.prepare_batch, AugmentBatch)
    assert trainer.optim_set_to_none


@pytest.mark.parametrize("skips, warned", [(0, False), (2, True)])
def test_a_run_that_asked_for_cuda_graphs_and_runs_without_them_is_warned_once(caplog, monkeypatch, skips, warned):
    import bim.engine as engine_module
    from ignite.engine import Engine

    counts = iter([5, 5 + skips])  # the counter at the start of the run, then after 3 iterations
    monkeypatch.setattr(engine_module, "cudagraph_skips", lambda: next(counts))
    check = engine_module.CudaGraphsCheck("reduce-overhead", "cuda", compiled=True, after=3)
    trainer = Engine(lambda engine, batch: None)
    check.attach(trainer)
    with caplog.at_level("WARNING", logger="bim"):
        trainer.run(range(8), max_epochs=2)
    messages = [r.getMessage() for r in caplog.records if "CUDA graphs" in r.getMessage()]
    assert len(messages) == (1 if warned else 0)
    if warned:
        assert "2 compiled graph(s)" in messages[0] and "iteration 3" in messages[0] and "TORCH_LOGS=cudagraphs" in messages[0]


@pytest.mark.parametrize("mode, device, compiled", [(None, "cuda", True), ("default", "cuda", True),
                                                    ("reduce-overhead", "cpu", True), ("reduce-overhead", "cuda", False)])
def test_the_cuda_graphs_check_is_off_where_no_cuda_graphs_were_asked_for(mode, device, compiled):
    from bim.engine import CudaGraphsCheck

    assert not CudaGraphsCheck(mode, device, compiled=compiled).enabled
    assert CudaGraphsCheck("max-autotune", "cuda:0").enabled


def test_the_skip_counter_is_inductors():
    from torch._dynamo.utils import counters

    from bim.engine import cudagraph_skips

    before = cudagraph_skips()
    counters["inductor"]["cudagraph_skips"] += 1
    try:
        assert cudagraph_skips() == before + 1
    finally:
        counters["inductor"]["cudagraph_skips"] -= 1


def _radam_run(compile_when: str | None, steps: int = 12):
    """A tiny network trained ``steps`` RAdam steps under the bundles' warm-up + cosine schedule (the LR changes every
    step), the step compiled before or after the scheduler wraps it (None: eager); returns the parameters and how
    many graphs torch.compile had made after half and after all of the steps."""
    from torch._dynamo.utils import counters

    from bim.engine import compile_optimizer_step

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.RAdam(net.parameters(), lr=1e-2, weight_decay=1e-4)
    if compile_when == "before":
        compile_optimizer_step(opt)
    scheduler = warmup_cosine_scheduler(opt, epochs=4, iters_per_epoch=3, warmup_epochs=1, start_ratio=0.1)
    if compile_when == "after":
        compile_optimizer_step(opt)
    g, graphs = torch.Generator().manual_seed(1), []
    counters.clear()
    for i in range(steps):
        loss = net(torch.randn(5, 6, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        scheduler.step()
        if i + 1 in (steps // 2, steps):
            graphs.append(counters["stats"]["unique_graphs"])
    return [p.detach().clone() for p in net.parameters()], graphs


@pytest.mark.parametrize("compile_when", ["before", "after"])
def test_the_compiled_optimizer_step_is_the_eager_step_and_follows_the_lr_schedule_without_recompiling(
        compile_when, compile_without_codegen):
    import warnings

    eager, _ = _radam_run(None)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lr_scheduler.*")  # the scheduler still sees the optimiser's step
        compiled, graphs = _radam_run(compile_when)
    # The compiled step computes RAdam's bias corrections in float32 (eager: Python floats): 1 - 0.999^t is off by
    # up to 2^-24 / 1e-3 ~ 6e-5 relative, so each step (<= lr = 1e-2 per weight) may differ by ~1e-4 of itself:
    # over 12 steps <= 12 * 1e-2 * 1e-4 = 1.2e-5. A step that missed the LR schedule differs by ~1e-3.
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-5)
    assert graphs[0] >= 1 and graphs[1] == graphs[0]  # the LR changed at every step; no new graph for it


def test_the_compiled_steps_lr_is_a_tensor_the_scheduler_updates_in_place_also_after_loading_a_float_lr():
    from bim.engine import compile_optimizer_step

    net = torch.nn.Linear(3, 2)
    opt = compile_optimizer_step(torch.optim.RAdam(net.parameters(), lr=1e-2))
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dim() == 0 and float(lr) == pytest.approx(1e-2)
    scheduler = warmup_cosine_scheduler(opt, epochs=2, iters_per_epoch=2, warmup_epochs=1, start_ratio=0.5)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(5e-3)  # filled in place
    scheduler.step()
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(7.5e-3)
    state = opt.state_dict()
    state["param_groups"][0]["lr"] = 2e-3  # a checkpoint of an eager run holds a float
    opt.load_state_dict(state)
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) and float(opt.param_groups[0]["lr"]) == pytest.approx(2e-3)


def test_compile_optimizer_step_off_leaves_the_optimizer_as_it_was():
    from bim.engine import compile_optimizer_step

    opt = torch.optim.RAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    step = opt.step
    assert compile_optimizer_step(opt, False) is opt and opt.step == step
    with pytest.raises(ValueError, match="compile_optimizer"):
        compile_optimizer_step(opt, "yes")


def test_ensure_train_mode_switches_only_a_network_left_in_eval_mode():
    from modules import TrainCounted

    from bim.engine import ensure_train_mode

    net = TrainCounted()
    ensure_train_mode(net)
    assert net.calls == 0 and net.training  # a network in train mode is left alone (no walk of its modules)
    wrapped = torch.optim.swa_utils.AveragedModel(net)  # a wrapper in train mode around a module in eval mode
    wrapped.module.eval()
    ensure_train_mode(wrapped)
    assert wrapped.training and wrapped.module.training and wrapped.module.conv.training
