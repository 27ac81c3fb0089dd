"""Regression: every semi-supervised method's losses and the networks it leaves after 3 steps, pinned.

The numbers were recorded on the CPU in fp32 with the implementation before the one-class-per-method refactor
(``SemiSupervisedStep``, commit 1b022e1), with a fixed seed, a tiny U-Net (3 classes) and a synthetic
batch (2 labelled + 3 unlabelled 40 x 40 slices, 32 x 32 crops, rotation, zoom, gamma, jitter, the student's
extra view, ramp-up over 2 iterations so the weights 0.5 x (exp(-5), exp(-1.25), 1) all occur). The methods must
reproduce them: same random draws in the same order, same forwards, same losses, same optimiser and teacher
updates. Tolerance: relative 1e-5, fp32 arithmetic over a few thousand terms (a reordered sum moves the 7th
digit, a changed draw or forward moves the 2nd). ``*_moved`` is the L1 distance the student's parameters, the
student's BatchNorm running statistics and the teacher's parameters moved from their initial values (0: the
teacher of a method without one stays as it started). The supervised method has no regulariser and reports weight 0
(the bundle gave it 0; the recording gave it 0.5, which multiplied a loss_reg of 0)."""

from __future__ import annotations

import pytest
import torch

from bim import semi_supervised as ss
from bim.network import build_unet
from bim.segmentation import SegmentationAugment

TINY = (4, 8, 8, 16, 16, 4)
CLASSES = 3
REL = 1e-5  # losses: fp32 sums over a few thousand terms
# the networks' movements: the first convolutions' gradients are sums of ~10^4 products that largely cancel, so any
# other order of summation (the compiled step, or another CPU's convolution kernels: AVX2 against AVX-512) moves
# them by up to ~1e-3 of themselves; a changed draw or forward moves the movements' 2nd digit
MOVED_REL = 1e-4

EXPECTED = {
    'supervised': {
        'steps': [
            {'loss_sup': 1.1647242307662964, 'loss_reg': 0.0, 'loss': 1.1647242307662964, 'weight': 0.0, 'ramp': 0.006737946999085467},
            {'loss_sup': 1.153660774230957, 'loss_reg': 0.0, 'loss': 1.153660774230957, 'weight': 0.0, 'ramp': 0.2865047968601901},
            {'loss_sup': 1.1559319496154785, 'loss_reg': 0.0, 'loss': 1.1559319496154785, 'weight': 0.0, 'ramp': 1.0},
        ],
        'student_sum': 179.97176379480595, 'student_moved': 6.312388244478484, 'running_moved': 50.878576634277124, 'teacher_moved': 0.0,
    },
    'mean_teacher': {
        'steps': [
            {'loss_sup': 1.1931499242782593, 'loss_reg': 0.03261208534240723, 'loss': 1.193259835243225, 'weight': 0.0033689734995427335, 'ramp': 0.006737946999085467},
            {'loss_sup': 1.1484642028808594, 'loss_reg': 0.028892777860164642, 'loss': 1.1526031494140625, 'weight': 0.14325239843009505, 'ramp': 0.2865047968601901},
            {'loss_sup': 1.1485381126403809, 'loss_reg': 0.02555244415998459, 'loss': 1.1613143682479858, 'weight': 0.5, 'ramp': 1.0},
        ],
        'student_sum': 179.95505633367839, 'student_moved': 6.897030833214444, 'running_moved': 87.58905863075051, 'teacher_moved': 1.1736054099720903,
    },
    'ua_mt': {
        'steps': [
            {'threshold': 0.8239592165010823, 'certain_fraction': 0.004434121772646904, 'loss_sup': 1.1931499242782593, 'loss_reg': 0.08533346652984619, 'loss': 1.1934374570846558, 'weight': 0.0033689734995427335, 'ramp': 0.006737946999085467},
            {'threshold': 0.8697347285289202, 'certain_fraction': 0.009631848894059658, 'loss_sup': 1.1483925580978394, 'loss_reg': 0.09586484730243683, 'loss': 1.1621254682540894, 'weight': 0.14325239843009505, 'ramp': 0.2865047968601901},
            {'threshold': 0.9155102405567582, 'certain_fraction': 0.02491181716322899, 'loss_sup': 1.1485203504562378, 'loss_reg': 0.06308691203594208, 'loss': 1.1800638437271118, 'weight': 0.5, 'ramp': 1.0},
        ],
        'student_sum': 179.90007934058676, 'student_moved': 7.165190312831633, 'running_moved': 87.58784750115592, 'teacher_moved': 1.207646185509283,
    },
    'ict': {
        'steps': [
            {'loss_sup': 1.1647242307662964, 'loss_reg': 0.0005838838405907154, 'loss': 1.1647262573242188, 'weight': 0.0033689734995427335, 'ramp': 0.006737946999085467},
            {'loss_sup': 1.1549392938613892, 'loss_reg': 0.00018446297326590866, 'loss': 1.1549657583236694, 'weight': 0.14325239843009505, 'ramp': 0.2865047968601901},
            {'loss_sup': 1.1450165510177612, 'loss_reg': 0.0011283840285614133, 'loss': 1.145580768585205, 'weight': 0.5, 'ramp': 1.0},
        ],
        'student_sum': 179.9509991331965, 'student_moved': 6.626026674109141, 'running_moved': 87.7254169548396, 'teacher_moved': 1.1352389299099315,
    },
    'entropy_min': {
        'steps': [
            {'loss_sup': 1.1647242307662964, 'loss_reg': 1.0314470529556274, 'loss': 1.1681991815567017, 'weight': 0.0033689734995427335, 'ramp': 0.006737946999085467},
            {'loss_sup': 1.1434807777404785, 'loss_reg': 1.038789987564087, 'loss': 1.2922899723052979, 'weight': 0.14325239843009505, 'ramp': 0.2865047968601901},
            {'loss_sup': 1.1538171768188477, 'loss_reg': 1.0464409589767456, 'loss': 1.6770377159118652, 'weight': 0.5, 'ramp': 1.0},
        ],
        'student_sum': 179.90652063924472, 'student_moved': 6.008152881127089, 'running_moved': 87.51037974617793, 'teacher_moved': 0.0,
    },
    'mixup': {
        'steps': [
            {'loss_sup': 1.1647242307662964, 'loss_reg': 1.1634982824325562, 'loss': 1.1686440706253052, 'weight': 0.0033689734995427335, 'ramp': 0.006737946999085467},
            {'loss_sup': 1.1532788276672363, 'loss_reg': 1.1526457071304321, 'loss': 1.318398118019104, 'weight': 0.14325239843009505, 'ramp': 0.2865047968601901},
            {'loss_sup': 1.1357887983322144, 'loss_reg': 1.1335844993591309, 'loss': 1.7025810480117798, 'weight': 0.5, 'ramp': 1.0},
        ],
        'student_sum': 180.00581244607116, 'student_moved': 6.866920199304602, 'running_moved': 87.6264716682781, 'teacher_moved': 0.0,
    },
    'adversarial': {
        'steps': [
            {'loss_sup': 1.1647242307662964, 'loss_reg': 0.562809407711029, 'loss_disc': 0.7311480641365051, 'loss': 1.1666203737258911, 'weight': 0.0033689734995427335, 'ramp': 0.006737946999085467},
            {'loss_sup': 1.1434656381607056, 'loss_reg': 0.566961944103241, 'loss_disc': 0.729209303855896, 'loss': 1.224684238433838, 'weight': 0.14325239843009505, 'ramp': 0.2865047968601901},
            {'loss_sup': 1.1531543731689453, 'loss_reg': 0.569974958896637, 'loss_disc': 0.7282732129096985, 'loss': 1.4381418228149414, 'weight': 0.5, 'ramp': 1.0},
        ],
        'student_sum': 179.8945017440278, 'student_moved': 6.116134726725274, 'running_moved': 87.51037465623813, 'teacher_moved': 0.0,
    },
}


def _batch(step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    return {"image": torch.rand(2, 1, 40, 40, generator=g),
            "label": torch.randint(0, CLASSES, (2, 1, 40, 40), generator=g).to(torch.uint8),
            "unlabelled": torch.rand(3, 1, 40, 40, generator=g)}


def _method(name: str, net: torch.nn.Module, teacher, compile_step: bool = False):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    augment = SegmentationAugment(crop_size=32, max_rotation_deg=30.0, scale_range=(0.9, 1.2), gamma_range=(0.7, 1.5),
                                  generator=torch.Generator().manual_seed(7))
    settings = ss.StepSettings(augment, optimizer, CLASSES, teacher=teacher, rampup_iterations=2, bf16=False,
                               channels_last=False, compile_step=compile_step)
    cls = ss.method_class(name)
    if name == "supervised":
        return cls(settings)
    if name == "adversarial":
        disc = ss.PredictionDiscriminator(CLASSES, features=(4, 8))
        return cls(settings, 0.5, discriminator=disc, discriminator_optimizer=torch.optim.Adam(disc.parameters(), lr=1e-3))
    if name == "ua_mt":
        return cls(settings, 0.5, total_iterations=6)
    return cls(settings, 0.5)


@pytest.mark.parametrize("name, compile_step", [(name, False) for name in EXPECTED] + [("mean_teacher", True)])
def test_three_steps_reproduce_the_recorded_losses_and_networks(name, compile_step, request):
    """(Mean Teacher with ``compile_step``: its views, forwards and losses as one compiled function, the same numbers.
    The compiled code reorders sums, which moves the losses' 7th digit; the networks' movements are compared at
    ``MOVED_REL`` for every method. A changed draw or forward moves the losses' 2nd digit. The step is traced as on a
    GPU and its graphs run eagerly: fixture ``compile_without_codegen``.)"""
    from torch._dynamo.utils import counters

    if compile_step:
        request.getfixturevalue("compile_without_codegen")
        counters.clear()
    torch.manual_seed(0)
    net = build_unet(out_channels=CLASSES, features=TINY)
    teacher = ss.ema_teacher(net, 0.9)
    step = _method(name, net, teacher, compile_step)
    initial = {k: v.detach().clone() for k, v in net.state_dict().items() if v.is_floating_point()}
    params = {k for k, _ in net.named_parameters()}
    for it, expected in enumerate(EXPECTED[name]["steps"]):
        out = step(net, _batch(it), it)
        got = {k: float(v) for k, v in out.items() if k not in ("image", "label", "pred")}
        assert set(got) == set(expected), it
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=REL, abs=1e-12), (it, key)
    if compile_step:  # the numbers came from the traced graphs
        assert step.compiled_step_terms is not None and counters["stats"]["unique_graphs"] >= 1

    def moved(state, keys):
        return float(sum((state[k].double() - initial[k].double()).abs().sum() for k in keys))

    student, teacher_state = net.state_dict(), teacher.module.state_dict()
    got = {"student_sum": float(sum(student[k].double().sum() for k in params)),
           "student_moved": moved(student, params), "running_moved": moved(student, set(initial) - params),
           "teacher_moved": moved(teacher_state, params)}
    for key, value in got.items():
        assert value == pytest.approx(EXPECTED[name][key], rel=MOVED_REL, abs=1e-12), key


@pytest.mark.parametrize("name", [name for name in EXPECTED if name != "mean_teacher"])
def test_compile_step_is_refused_by_every_method_but_mean_teacher(name):
    net = build_unet(out_channels=CLASSES, features=TINY)
    with pytest.raises(ValueError, match=f"compile_step: method '{name}'"):
        _method(name, net, ss.ema_teacher(net, 0.9), compile_step=True)

