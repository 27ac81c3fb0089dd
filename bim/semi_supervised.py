"""Semi-supervised segmentation: Mean Teacher and the paper's semi-supervised baselines, one step on the device.

The paper (appendix "Detailed comparison methods") compares, from random initialisation and with the same
optimisation as fine-tuning, six semi-supervised methods; its best result is Mean Teacher initialised with BIM
pre-trained weights ("MT + Ours"). Each method is one class, registered under its name in :data:`METHODS` (the
bundle's ``method`` key; each variant config of ``meanteacher_seg`` names its class and sets its weight):

- ``supervised`` (:class:`Supervised`): cross-entropy on the labelled batch only (the paper's Baseline);
- ``mean_teacher`` (:class:`MeanTeacher`, Perone & Cohen-Adad 2018): CE + w(t) * L_MT (:func:`softmax_mse`),
  the teacher an exponential moving average (EMA, decay 0.99) of the student (:func:`ema_teacher`, torch's
  :class:`~torch.optim.swa_utils.AveragedModel`);
- ``ua_mt`` (:class:`UncertaintyAwareMeanTeacher`, Yu et al. 2019): Mean Teacher whose consistency keeps only
  pixels where the teacher's uncertainty (entropy of the mean of ``uncertainty_passes`` noisy passes) is below a
  threshold rising linearly from 3/4 ln C to ln C (:func:`uncertainty_threshold`);
- ``ict`` (:class:`InterpolationConsistency`, Verma et al. 2019): the student on a mixup of two unlabelled images
  (lambda ~ Beta(0.1, 0.1)) matches the same mixup of the teacher's predictions;
- ``entropy_min`` (:class:`EntropyMinimisation`, Grandvalet & Bengio 2005): CE + w(t) * mean pixel entropy of the
  unlabelled predictions (:func:`entropy_loss`);
- ``mixup`` (:class:`MixUp`, Zhang et al. 2018): CE + w(t) * soft-target CE on mixed labelled pairs
  (lambda ~ Beta(1, 1), :func:`soft_cross_entropy`);
- ``adversarial`` (:class:`Adversarial`, Zhang et al. 2017): CE + w(t) * BCE(D(softmax(student(x_u))), "labelled"),
  with a small CNN discriminator D trained to tell predictions on labelled from predictions on unlabelled images.

w(t) = weight * :func:`sigmoid_rampup` (t / rampup_iterations). What every method shares is
:class:`SemiSupervisedMethod` (the views, the forwards, the teacher's forward, the optimiser step) with the
objects of :class:`StepSettings`. Views: every image gets the fine-tuning augmentation
(:class:`~bim.segmentation.SegmentationAugment`: crop, flips, rotation, zoom as one matrix M, intensity jitter).
For Mean Teacher and UA-MT the teacher sees ``warp(x, M)`` and the student ``warp(x, M @ A)`` with a further random
similarity A and its own intensity jitter; since ``warp(warp(x, M), A) == warp(x, M @ A)``, warping the teacher's
prediction with A aligns it pixel by pixel with the student's, and the consistency is averaged over the pixels A
maps inside the teacher's view.

BatchNorm: the student runs one forward per batch (labelled, unlabelled), so each is normalised with its own batch
statistics and the labelled logits do not depend on the unlabelled images (one joint forward made every method
collapse with 1 labelled ACDC scan); the teacher runs in train mode (batch statistics) under ``no_grad``, one
forward per batch as the student does.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .data import RandomSliceSampler, SliceStore, read_items
from .engine import bf16_autocast, ensure_train_mode, uncompiled, unwrap
from .flags import as_flag
from .gpu_augment import host_to_device, random_affine_matrices, stage_on_device, warp
from .inference import is_prepared
from .pretrain.losses import _fp32_context, _prepare_mask, _require_4d, _require_same_shape, entropy
from .segmentation import labelled_cross_entropy

logger = logging.getLogger("bim")


# ------------------------------------------------------------------------------------------------- schedules


def sigmoid_rampup(iteration: float, rampup_iterations: float) -> float:
    """Laine & Aila's consistency ramp-up ``exp(-5 (1 - t)^2)``, ``t = clip(iteration / rampup_iterations, 0, 1)``:
    exp(-5) ~ 0.0067 at 0, 1 from ``rampup_iterations`` on; ``rampup_iterations <= 0`` gives 1 (no ramp-up)."""
    if rampup_iterations <= 0:
        return 1.0
    t = min(max(float(iteration) / float(rampup_iterations), 0.0), 1.0)
    return math.exp(-5.0 * (1.0 - t) ** 2)


def uncertainty_threshold(iteration: float, total_iterations: float, num_classes: int) -> float:
    """UA-MT's threshold on the teacher's predictive entropy, linear from ``3/4 ln C`` (iteration 0) to ``ln C``
    (``total_iterations``); ln C is the largest entropy of a C-class distribution (the paper: ln K, not ln 2)."""
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    t = 1.0 if total_iterations <= 0 else min(max(float(iteration) / float(total_iterations), 0.0), 1.0)
    return (0.75 + 0.25 * t) * math.log(num_classes)


# ----------------------------------------------------------------------------------------------------- teacher


class EMATeacher(AveragedModel):
    """torch's :class:`~torch.optim.swa_utils.AveragedModel` of the student with an EMA update that never waits for
    the GPU: AveragedModel's own ``update_parameters`` tests its ``n_averaged`` counter (a device tensor) on the host
    twice per call, two GPU-to-host synchronisations per training step. Same state dict, same arithmetic (one
    ``torch._foreach_lerp_`` of the parameters, one ``torch._foreach_copy_`` of the buffers)."""

    def update_parameters(self, model: nn.Module) -> None:
        """``teacher_t = decay * teacher_{t-1} + (1 - decay) * student_t`` for the parameters, the buffers copied
        (``use_buffers`` true, EMA-averaged buffers: AveragedModel's update). The first update (the copy) is done by
        :func:`ema_teacher`, so every call here is an EMA step."""
        if self.use_buffers:
            return super().update_parameters(model)
        with torch.no_grad():  # in place on the tensors themselves (detached copies of 272 tensors: host time)
            torch._foreach_lerp_(list(self.module.parameters()), list(model.parameters()), 1.0 - self.decay)
            torch._foreach_copy_(list(self.module.buffers()), list(model.buffers()))
            self.n_averaged += 1


def ema_teacher(network: nn.Module, decay: float = 0.99, average_buffers: bool = False) -> EMATeacher:
    """The Mean Teacher: an :class:`EMATeacher` (torch's :class:`~torch.optim.swa_utils.AveragedModel`) of ``network``
    (DDP/compile wrappers are unwrapped) holding ``teacher_t = decay * teacher_{t-1} + (1 - decay) * student_t`` for
    the parameters, updated by one vectorised ``torch._foreach_lerp_`` per call of ``teacher.update_parameters(student)``.

    BatchNorm: :class:`SemiSupervisedMethod` runs the teacher with *batch* statistics (as Tarvainen & Valpola's and
    SSL4MIS's Mean Teacher do), so its predictions never depend on running statistics. The buffers (running
    statistics) are copied from the student at every update (``average_buffers=False``, the default), so a saved
    teacher evaluated in eval mode uses the student's current statistics. ``average_buffers=True`` (the old
    behaviour) EMA-averages the buffers too: they then lag the student's running statistics, themselves an EMA of
    batch statistics, by ~1 / (1 - decay) iterations, which made an eval-mode teacher useless for hundreds of
    iterations (running variances from the initialisation, 1.0, against true variances ~0.01).

    It starts equal to the student (so a ``pretrained`` student initialises both networks): the first update, the
    copy, is AveragedModel's and is done here, so every later call is an EMA step. The teacher has no gradients and
    is kept in eval mode between steps."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
    student = unwrap(network)
    teacher = EMATeacher(student, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=bool(average_buffers))
    teacher.decay = float(decay)
    AveragedModel.update_parameters(teacher, student)  # n_averaged 0 -> 1: the copy
    teacher.requires_grad_(False)
    teacher.eval()
    return teacher


# ------------------------------------------------------------------------------------------------------ losses
# The conventions of bim.pretrain.losses: the docstring shows the equation, shapes and reduction; fp32 (autocast off);
# one ValueError naming a bad argument; its EPS inside every logarithm of a probability.


def softmax_mse(student_logits: torch.Tensor, teacher_prob: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""The paper's Mean Teacher consistency L_MT (appendix, "Mean Teacher"), also ICT's:

    .. math:: L_{MT} = \frac{1}{|D_u|\,|\Omega|} \sum_{x \in D_u} \sum_{i \in \Omega}
              \big\| \mathrm{softmax}(s(x))_i - p^t_i(x) \big\|^2

    the squared distance between the student's class probabilities and the teacher's, summed over the C classes
    and averaged over the images and pixels i (the paper prints a minus sign before the sum, a typo for a loss that
    is minimised). With ``mask`` the average runs over the masked-in pixels only (UA-MT's certain pixels, the pixels
    inside the teacher's view).

    Args:
        student_logits: ``[B, C, H, W]`` logits of the student.
        teacher_prob: ``[B, C, H, W]`` class probabilities, a target (detached).
        mask: ``[B, 1, H, W]`` in {0, 1}, or None (every pixel).

    Returns:
        A scalar, fp32.
    """
    _require_4d("student_logits", student_logits, "[B, C, H, W]")
    _require_4d("teacher_prob", teacher_prob, "[B, C, H, W]")
    _require_same_shape("student_logits", student_logits, "teacher_prob", teacher_prob)
    mask = _prepare_mask(mask, student_logits.float())
    with _fp32_context(student_logits):
        diff = torch.softmax(student_logits.float(), dim=1) - teacher_prob.detach().float()
        sq = diff.pow(2).sum(dim=1, keepdim=True)
        if mask is None:
            return sq.mean()
        return (sq * mask).sum() / mask.sum().clamp_min(1.0)


def pixel_entropy(prob: torch.Tensor) -> torch.Tensor:
    r"""The entropy of each pixel's class distribution, in nats (UA-MT's uncertainty; unscaled, unlike the
    min-max scaled :func:`~bim.pretrain.losses.normalised_entropy_map` of pre-training's L_CC):

    .. math:: H_i = -\sum_c p_{ic} \log(p_{ic} + \epsilon)

    Args:
        prob: ``[B, C, H, W]`` class probabilities.

    Returns:
        ``[B, 1, H, W]`` in [0, ln C], fp32.
    """
    _require_4d("prob", prob, "[B, C, H, W]")
    return entropy(prob, dim=1).unsqueeze(1)


def entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    r"""Entropy minimisation: the mean pixel entropy of the predictions ``p = softmax(logits)``,

    .. math:: L_{ent} = \frac{1}{B\,|\Omega|} \sum_{b} \sum_{i} -\sum_c p_{bic} \log p_{bic}

    with ``log p`` from ``log_softmax`` (exact: no epsilon needed).

    Args:
        logits: ``[B, C, H, W]``.

    Returns:
        A scalar in [0, ln C], fp32.
    """
    _require_4d("logits", logits, "[B, C, H, W]")
    with _fp32_context(logits):
        logits = logits.float()
        return -(torch.softmax(logits, 1) * torch.log_softmax(logits, 1)).sum(1).mean()


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    r"""Cross-entropy with a soft target (MixUp's regulariser):

    .. math:: L = \frac{1}{B\,|\Omega|} \sum_{b} \sum_{i} -\sum_c t_{bic} \log \mathrm{softmax}(z_{bi})_c

    Args:
        logits: ``[B, C, H, W]`` logits z.
        target: ``[B, C, H, W]`` target distributions t (each pixel sums to 1).

    Returns:
        A scalar, fp32.
    """
    _require_4d("logits", logits, "[B, C, H, W]")
    _require_4d("target", target, "[B, C, H, W]")
    _require_same_shape("logits", logits, "target", target)
    with _fp32_context(logits):
        return -(target.float() * torch.log_softmax(logits.float(), dim=1)).sum(1).mean()


def mix(a: torch.Tensor, b: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Mixup ``lam * a + (1 - lam) * b`` with one ``lam`` per sample ([B], broadcast over the other dims)."""
    if a.shape != b.shape or lam.shape != a.shape[:1]:
        raise ValueError(f"mix: expected a and b of one shape and lam [B], got {tuple(a.shape)}, {tuple(b.shape)}, "
                         f"{tuple(lam.shape)}")
    lam = host_to_device(lam, a.device, a.dtype).view(-1, *([1] * (a.ndim - 1)))
    return lam * a + (1 - lam) * b


def sample_beta(alpha: float, n: int) -> torch.Tensor:
    """``n`` draws of Beta(alpha, alpha) (CPU, torch's global generator, which checkpoints save)."""
    if not alpha > 0:
        raise ValueError(f"alpha: expected a float > 0, got {alpha!r}")
    a = torch.tensor(float(alpha), dtype=torch.float64)
    return torch.distributions.Beta(a, a).sample((n,)).float()


class PredictionDiscriminator(nn.Module):
    """The adversarial-training discriminator: a small CNN on softmax maps [B, C, H, W] -> one logit per image
    ("predicted on a labelled image"). Strided 4x4 convolutions with LeakyReLU(0.2), global average pooling,
    a linear layer.

    Kept rather than :class:`monai.networks.nets.Discriminator`, which ends in a linear layer over the flattened
    features of one fixed ``in_shape`` (tied to the crop size), adds residual units, instance norm, dropout and a
    sigmoid, and takes odd kernels only: this one is the method's small CNN, any input size."""

    def __init__(self, in_channels: int, features: Sequence[int] = (32, 64, 128, 256)) -> None:
        super().__init__()
        layers, c = [], in_channels
        for f in features:
            layers += [nn.Conv2d(c, f, kernel_size=4, stride=2, padding=1), nn.LeakyReLU(0.2, inplace=True)]
            c = f
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, 1)

    def forward(self, prob: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(prob).mean(dim=(2, 3))).squeeze(1)


# ------------------------------------------------------------------------------------------------------- data


class PairedSliceSampler:
    """Infinite iterator of one labelled and one unlabelled batch per step, both drawn uniformly with replacement
    from stores on the device: ``image`` [B_l, 1, H, W], ``label`` [B_l, 1, H, W] (class indices) and
    ``unlabelled`` [B_u, 1, H, W] (absent when ``unlabelled_batch_size`` is 0)."""

    def __init__(self, labelled: SliceStore, unlabelled: SliceStore | None, batch_size: int,
                 unlabelled_batch_size: int, generator: torch.Generator | None = None) -> None:
        if labelled.label is None:
            raise ValueError("the labelled store has no labels")
        if unlabelled_batch_size < 0:
            raise ValueError(f"unlabelled_batch_size must be >= 0, got {unlabelled_batch_size}")
        if unlabelled_batch_size and unlabelled is None:
            raise ValueError("unlabelled_batch_size > 0 needs an unlabelled store")
        if unlabelled is not None and unlabelled.spatial_size != labelled.spatial_size:
            # e.g. raw scans of a MONAI Label datastore beside a prepared unlabelled set: pad both to one size
            common = tuple(max(a, b) for a, b in zip(labelled.spatial_size, unlabelled.spatial_size))
            logger.info(f"labelled slices are {labelled.spatial_size}, unlabelled {unlabelled.spatial_size}: "
                        f"both zero-padded to {common}")
            labelled, unlabelled = labelled.padded(common), unlabelled.padded(common)
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.labelled = RandomSliceSampler(labelled, batch_size, generator)
        self.unlabelled = RandomSliceSampler(unlabelled, unlabelled_batch_size, generator) if unlabelled_batch_size else None

    def __iter__(self) -> Iterator[dict]:
        lab = iter(self.labelled)
        unl = iter(self.unlabelled) if self.unlabelled is not None else None
        while True:
            batch = next(lab)
            out = {"image": batch["image"], "label": batch["label"]}
            if unl is not None:
                out["unlabelled"] = next(unl)["image"]
            yield out


def unlabelled_items(dataset_dir, labelled: list[dict], enabled: bool = True) -> list[dict]:
    """The unlabelled scans: the ``training`` list of the data set at ``dataset_dir`` (data_prep's output; None:
    the demo data set). Taking them from the synthetic demo set is refused when the labelled scans are not the
    demo's own (raw scans, e.g. a MONAI Label datastore's): the demo phantoms are no unlabelled data for real
    scans. ``enabled`` false (methods without unlabelled data): none."""
    if not enabled:
        return []
    raw = [str(it.get("image")) for it in labelled if not is_prepared(it)]
    if dataset_dir in (None, "", "None", "null") and raw:
        raise ValueError(
            f"meanteacher_seg needs unlabelled scans but dataset_dir is null, which would take them from the "
            f"synthetic demo data set while the {len(raw)} labelled scans are raw scans from elsewhere (e.g. a MONAI "
            f"Label datastore: {raw[0]}). Set dataset_dir in configs/train.json to a data set prepared with "
            f"`python -m data_prep acdc|promise12|nifti SRC DST` whose 'training' list holds the unlabelled scans, "
            f"or set method to 'supervised'."
        )
    return read_items(dataset_dir, "training")


def unlabelled_store(dataset, enabled: bool = True, device="cpu") -> SliceStore | None:
    """All slices of ``dataset`` (a MONAI dataset of ``volume_loader(with_label=False)``: labels are not read)
    as a :class:`SliceStore` on ``device``; ``None`` when ``enabled`` is false (methods without unlabelled data)."""
    return SliceStore.from_dataset(dataset, device=device) if enabled else None


# ------------------------------------------------------------------------------------------------------ the step


class StepSettings:
    """What every method's step is built with, written once in the bundle (``train#step_settings``):

    ``augment`` (the fine-tuning :class:`~bim.segmentation.SegmentationAugment`, whose generator draws every view),
    ``optimizer`` (the student's), ``num_classes``, ``teacher`` (:func:`ema_teacher`; only Mean Teacher, UA-MT and ICT
    use it, every method's checkpoint holds it), ``rampup_iterations`` (the ramp-up of every regulariser weight, see
    :func:`sigmoid_rampup`), ``supervised_loss_function(logits, label)`` (the labelled term; default
    :func:`~bim.segmentation.labelled_cross_entropy`, the bundle passes its ``train#trainer#loss_function``),
    ``bf16`` and ``channels_last`` (the forwards' autocast and memory format, on CUDA only), ``compile_teacher``
    (run the teacher's forwards through ``torch.compile(teacher.module, mode=compile_mode)``: the compiled module
    shares the teacher's parameters, so the EMA update reaches it, and its train / eval mode), ``compile_step``
    (Mean Teacher: the views, both networks' forwards and the losses of a step as one function compiled with
    ``torch.compile``, mode ``compile_mode``; with CUDA graphs one graph for the forward and one for the backward
    instead of dozens of launches; see :meth:`MeanTeacher.step_terms`)."""

    def __init__(self, augment, optimizer: torch.optim.Optimizer, num_classes: int, teacher: EMATeacher | None = None,
                 rampup_iterations: int = 0, supervised_loss_function=None, bf16: bool = True,
                 channels_last: bool = True, compile_teacher: bool = False, compile_mode: str | None = None,
                 compile_step: bool = False) -> None:
        if int(num_classes) < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.augment, self.optimizer, self.num_classes, self.teacher = augment, optimizer, int(num_classes), teacher
        self.rampup_iterations = int(rampup_iterations)
        self.supervised_loss_function = supervised_loss_function or labelled_cross_entropy
        self.bf16, self.channels_last = as_flag(bf16, "bf16"), as_flag(channels_last, "channels_last")
        self.compile_teacher = as_flag(compile_teacher, "compile_teacher")
        self.compile_step, self.compile_mode = as_flag(compile_step, "compile_step"), compile_mode
        # with compile_teacher, what runs the teacher's forwards: its module compiled (same parameters, same mode)
        self.compiled_teacher = (torch.compile(teacher.module, mode=compile_mode) if self.compile_teacher and
                                 teacher is not None else None)


METHODS: dict[str, type[SemiSupervisedMethod]] = {}
"""The registry: each :class:`SemiSupervisedMethod` subclass under its ``name`` (the bundle's ``method`` key)."""


def method_class(method: str) -> type[SemiSupervisedMethod]:
    """The class registered as ``method``; a ``ValueError`` naming the key and the known methods otherwise."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    return METHODS[method]


def check_method(method: str, step: SemiSupervisedMethod) -> None:
    """The bundle's ``method`` names a known method, and the one that ``train#step`` is (each variant config sets
    both)."""
    cls = method_class(method)
    if type(step) is not cls:
        raise ValueError(f"method is {method!r} but train#step is {type(step).__name__} ({type(step).name!r}): run "
                         f"with configs/variants/{method}.json, which builds train#step as {cls.__name__}")


class SemiSupervisedMethod:
    """One training iteration of a semi-supervised method: ``step(student, batch, iteration)`` with the batch of
    :class:`PairedSliceSampler` and the 0-based ``iteration`` builds the views, runs the forwards (bf16 autocast on
    CUDA; the teacher under ``no_grad``), computes the loss terms in fp32 (:meth:`losses`), minimises
    ``loss_sup + w(t) * loss_reg`` with one optimiser step, then :meth:`after_step` (the teacher's EMA update, the
    discriminator's step). It returns the loss terms (detached), the ramped ``weight`` and ``ramp``, and the
    labelled student view's ``image``, ``label`` and ``pred``.

    A subclass sets ``name`` (``class X(SemiSupervisedMethod, name="x")`` registers it in :data:`METHODS`),
    ``uses_unlabelled`` and ``uses_teacher``, and implements :meth:`losses`. ``weight`` >= 0 is its regulariser's
    weight."""

    name: ClassVar[str]
    uses_unlabelled: ClassVar[bool] = True
    uses_teacher: ClassVar[bool] = False
    compiles_as_one_step: ClassVar[bool] = False  # the settings' compile_step: views, forwards and losses compiled

    def __init_subclass__(cls, name: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name = name
            METHODS[name] = cls

    def __init__(self, settings: StepSettings, weight: float) -> None:
        if not isinstance(settings, StepSettings):
            raise ValueError(f"settings must be a bim.semi_supervised.StepSettings, got {type(settings).__name__}")
        if weight < 0:
            raise ValueError(f"the regulariser weight must be >= 0, got {weight}")
        if self.uses_teacher and settings.teacher is None:
            raise ValueError(f"method {self.name!r} needs a teacher (bim.semi_supervised.ema_teacher)")
        if settings.compile_step and not self.compiles_as_one_step:
            raise ValueError(f"compile_step: method {self.name!r} cannot compile its views, forwards and losses as one "
                             f"function (only mean_teacher can; UA-MT draws random numbers inside its loss); set "
                             f"compile_step false")
        self.settings, self.weight = settings, float(weight)
        self.augment, self.optimizer, self.num_classes = settings.augment, settings.optimizer, settings.num_classes
        self.teacher = settings.teacher

    @property
    def generator(self) -> torch.Generator:
        return self.augment.generator

    @property
    def hyperparameters(self) -> dict:
        """The method's name and its own numbers (weight, views, alphas, ...): what a checkpoint's settings
        fingerprint (:func:`~bim.engine.settings_fingerprint`) records of the step."""
        own = {k: v for k, v in vars(self).items() if isinstance(v, (bool, int, float, str, tuple))}
        return {"method": self.name, **own}

    # ---- the step

    def __call__(self, student: nn.Module, batch: dict, iteration: int) -> dict:
        ensure_train_mode(student)  # after a validation
        ramp = sigmoid_rampup(iteration, self.settings.rampup_iterations)
        w = self.weight * ramp
        terms = self.losses(student, batch, iteration)
        loss = terms["loss_sup"] + w * terms["loss_reg"]
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        terms.update(self.after_step(student, terms))
        out = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in terms.items() if not k.startswith("_")}
        out.update(loss=loss.detach(), weight=w, ramp=ramp)
        return out

    def losses(self, student: nn.Module, batch: dict, iteration: int) -> dict:
        """``loss_sup`` (the labelled term), ``loss_reg`` (the regulariser), the labelled student view's ``image``,
        ``label``, ``pred``, and any term to report; keys starting with ``_`` are for :meth:`after_step` only."""
        raise NotImplementedError

    def after_step(self, student: nn.Module, terms: dict) -> dict:
        """What follows the optimiser step; returns terms to report. Here: the teacher's EMA update, for the methods
        that use the teacher."""
        if self.uses_teacher:
            self.update_teacher(student)
        return {}

    # ---- forwards

    def forward(self, network: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``network(x)`` as fp32 logits (bf16 autocast and channels_last on CUDA where the settings ask)."""
        if self.settings.channels_last and x.is_cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        with bf16_autocast(x.device, self.settings.bf16):
            return network(x).float()

    def student_logits(self, student: nn.Module, *parts: torch.Tensor) -> torch.Tensor:
        """The student's logits for the concatenation of ``parts`` (the labelled batch first), one forward per part:
        each is BatchNorm'd with its own batch statistics, so the labelled logits do not depend on the unlabelled
        images (see the module docstring); every forward updates the running statistics."""
        return torch.cat([self.forward(student, p) for p in parts])

    @contextlib.contextmanager
    def _teacher_mode(self):
        """The teacher in train mode (BatchNorm normalises with the statistics of its own batch, as the student's
        forward does), back to eval after; the running statistics it touches are overwritten by the next EMA update."""
        self._set_teacher_training(True)
        try:
            yield self.settings.compiled_teacher if self.settings.compiled_teacher is not None else self.teacher
        finally:
            self._set_teacher_training(False)

    def _set_teacher_training(self, mode: bool) -> None:
        """``teacher.train(mode)`` as one loop over the ``training`` flags of its modules, listed once: ``train()``
        recurses through the 140 modules and sets each flag through ``nn.Module.__setattr__``, about 50 times the
        host time of this loop (twice per step). A teacher with a module that overrides ``train`` gets ``train``."""
        if getattr(self, "_teacher_flags", None) is None:
            modules = list(self.teacher.modules())
            plain = all(type(m).train is nn.Module.train for m in modules)
            self._teacher_flags = [m.__dict__ for m in modules] if plain else []
        if not self._teacher_flags:
            self.teacher.train(mode)
            return
        for flags in self._teacher_flags:
            flags["training"] = mode

    @torch.no_grad()
    def teacher_prob(self, *xs: torch.Tensor) -> torch.Tensor:
        """The teacher's class probabilities [B, C, H, W] for ``x``, or for several batches (one forward each, as the
        student's) concatenated, under one switch of its mode (:meth:`_set_teacher_training`)."""
        with self._teacher_mode() as teacher:
            return self.teacher_prob_of(teacher, *xs)

    @torch.no_grad()
    def teacher_prob_of(self, teacher: nn.Module, *xs: torch.Tensor) -> torch.Tensor:
        """:meth:`teacher_prob` with the teacher network given, already in train mode."""
        return torch.cat([torch.softmax(self.forward(teacher, x), dim=1) for x in xs])

    def update_teacher(self, student: nn.Module) -> None:
        """One EMA step of the teacher towards the student (DDP / compile wrappers unwrapped)."""
        self.teacher.update_parameters(unwrap(student))

    # ---- views

    def _out_hw(self) -> tuple[int, int]:
        return (self.augment.crop_size, self.augment.crop_size)

    def _matrices(self, x: torch.Tensor) -> torch.Tensor:
        return self.augment.matrices(x.shape[0], tuple(x.shape[-2:]))

    def labelled_view(self, image: torch.Tensor, label: torch.Tensor):
        """The fine-tuning augmentation of a labelled batch (exactly ``SegmentationAugment``'s): ``(view, label)``."""
        return self.augment(image, label)

    def unlabelled_view(self, image: torch.Tensor) -> torch.Tensor:
        """The fine-tuning augmentation of an unlabelled batch: ``intensity(warp(x, M))``."""
        return self.augment(image)

    def _labelled_terms(self, logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict:
        """``loss_sup`` and the labelled view's ``image``, ``label``, ``pred`` from the logits of [labelled, ...]."""
        b_l = x.shape[0]
        return {"loss_sup": self.settings.supervised_loss_function(logits[:b_l], y), "image": x, "label": y,
                "pred": logits[:b_l]}


class Supervised(SemiSupervisedMethod, name="supervised"):
    """The paper's Baseline: cross-entropy on the labelled batch only (no regulariser: weight 0)."""

    uses_unlabelled = False

    def __init__(self, settings: StepSettings) -> None:
        super().__init__(settings, weight=0.0)

    def losses(self, student, batch, iteration):
        x, y = self.labelled_view(batch["image"], batch["label"])
        logits = self.forward(student, x)
        return {**self._labelled_terms(logits, x, y), "loss_reg": logits.new_zeros(())}


class MeanTeacher(SemiSupervisedMethod, name="mean_teacher"):
    """Mean Teacher: CE + w(t) * :func:`softmax_mse` between the student on ``warp(x, M @ A)`` and the EMA teacher
    on ``warp(x, M)`` warped by A, on the labelled and the unlabelled images (as Tarvainen & Valpola's), averaged
    over the pixels inside the teacher's view. The student's labelled view is warp(x, M @ A), its label warped
    alike. ``view_*`` set the extra random similarity A (rotation, zoom, flips; no translation): rotation 0, zoom
    [1, 1] and flip 0 make it the identity."""

    uses_teacher = True
    compiles_as_one_step = True

    def __init__(self, settings: StepSettings, weight: float, view_rotation_deg: float = 15.0,
                 view_scale_range: Sequence[float] = (0.9, 1.1), view_flip_prob: float = 0.5) -> None:
        super().__init__(settings, weight)
        self.view_rotation_deg, self.view_scale_range = float(view_rotation_deg), tuple(view_scale_range)
        self.view_flip_prob = float(view_flip_prob)
        self.compiled_step_terms = (torch.compile(self.step_terms, mode=settings.compile_mode) if settings.compile_step
                                    else None)

    def view_matrices(self, batch: int) -> torch.Tensor:
        """The student's extra similarity A [B, 3, 3] (rotation, zoom, flips; no translation)."""
        return random_affine_matrices(batch, self.generator, self.view_scale_range, self.view_rotation_deg, 0.0,
                                      flip_prob=self.view_flip_prob)

    def draw_views(self, image: torch.Tensor, prefix: str = "") -> dict[str, torch.Tensor]:
        """The random numbers of :meth:`teacher_student_views` for the batch ``image``, drawn on the host (float64)
        in the order the views use them: the augmentation M, the extra view A, M·A, the teacher view's and the
        student view's intensity parameters (keys ``prefix`` + ``M``, ``A``, ``MA``, ``teacher_intensity``,
        ``student_intensity``)."""
        mats = self._matrices(image)
        extra = self.view_matrices(image.shape[0])
        return {prefix + "M": mats, prefix + "A": extra, prefix + "MA": mats @ extra,
                prefix + "teacher_intensity": self.augment.draw_intensity(image.shape[0]),
                prefix + "student_intensity": self.augment.draw_intensity(image.shape[0])}

    def views_from(self, image: torch.Tensor, draws: dict, prefix: str = ""):
        """``(teacher_view, student_view)``: warp(x, M) and warp(x, M @ A), each with its own intensity draw (the
        draws of :meth:`draw_views`, on ``image``'s device)."""
        hw = self._out_hw()
        return (self.augment.apply_intensity(warp(image, draws[prefix + "M"], hw), draws[prefix + "teacher_intensity"]),
                self.augment.apply_intensity(warp(image, draws[prefix + "MA"], hw), draws[prefix + "student_intensity"]))

    def teacher_student_views(self, image: torch.Tensor):
        """``(teacher_view, student_view, M, A)``: warp(x, M) and warp(x, M @ A), each with its own intensity draw."""
        draws = stage_on_device(self.draw_views(image), image.device)
        return (*self.views_from(image, draws), draws["M"], draws["A"])

    def certain(self, teacher_views: Sequence[torch.Tensor], extra: torch.Tensor, iteration: int):
        """The pixels the consistency keeps besides those inside the teacher's view, and terms to report: here all
        (None)."""
        return None, {}

    def draw(self, batch: dict) -> dict[str, torch.Tensor]:
        """Every random number of one step on the host: :meth:`draw_views` of the labelled batch (``l_``), then of
        the unlabelled one (``u_``)."""
        return {**self.draw_views(batch["image"], "l_"), **self.draw_views(batch["unlabelled"], "u_")}

    def losses(self, student, batch, iteration):
        draws = stage_on_device(self.draw(batch), batch["image"].device)  # one host-to-device copy per step
        if self.compiled_step_terms is None:
            return self.step_terms(student, batch, draws, iteration)
        with self._teacher_mode():  # the iteration stays out of the compiled function (an int in it recompiles)
            return self.compiled_step_terms(uncompiled(student), batch, draws, None, self.teacher.module)

    def step_terms(self, student: nn.Module, batch: dict, draws: dict, iteration: int,
                   teacher: nn.Module | None = None) -> dict:
        """The step's views, forwards and loss terms from its random numbers (:meth:`draw`, on the device): what
        ``compile_step`` compiles as one function (``teacher`` given, in train mode; None: :meth:`teacher_prob`;
        ``iteration`` None there, as Mean Teacher's :meth:`certain` does not use it)."""
        t_l, s_l = self.views_from(batch["image"], draws, "l_")
        y = warp(batch["label"], draws["l_MA"], self._out_hw(), mode="nearest")  # the student's labelled view's label
        t_u, s_u = self.views_from(batch["unlabelled"], draws, "u_")
        logits = self.student_logits(student, s_l, s_u)
        extra = torch.cat([draws["l_A"], draws["u_A"]])
        prob = self.teacher_prob(t_l, t_u) if teacher is None else self.teacher_prob_of(teacher, t_l, t_u)
        prob_t = warp(prob, extra)  # aligned with the student
        inside = warp(torch.ones_like(torch.cat([t_l, t_u])[:, :1]), extra) > 0.999  # source inside the teacher's view
        mask = inside.float()
        certain, terms = self.certain((t_l, t_u), extra, iteration)
        if certain is not None:
            terms["certain_fraction"] = (certain * mask).sum() / mask.sum().clamp_min(1)
            mask = mask * certain
        return {**terms, **self._labelled_terms(logits, s_l, y), "loss_reg": softmax_mse(logits, prob_t, mask)}


class UncertaintyAwareMeanTeacher(MeanTeacher, name="ua_mt"):
    """UA-MT: Mean Teacher whose consistency keeps the pixels where the teacher's uncertainty (:meth:`teacher_uncertainty`)
    is below :func:`uncertainty_threshold` (paced by ``total_iterations``); reports ``threshold`` and
    ``certain_fraction`` (of the pixels inside the teacher's view)."""

    compiles_as_one_step = False  # its uncertainty passes draw noise inside the loss

    def __init__(self, settings: StepSettings, weight: float, total_iterations: int, uncertainty_passes: int = 4,
                 uncertainty_noise: float = 0.1, **view) -> None:
        super().__init__(settings, weight, **view)
        if int(uncertainty_passes) < 1:
            raise ValueError(f"uncertainty_passes must be >= 1, got {uncertainty_passes}")
        self.total_iterations = int(total_iterations)
        self.uncertainty_passes, self.uncertainty_noise = int(uncertainty_passes), float(uncertainty_noise)

    @torch.no_grad()
    def teacher_uncertainty(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`pixel_entropy` [B, 1, H, W] of the mean softmax of the teacher over ``uncertainty_passes`` copies of
        ``x`` with Gaussian noise (std ``uncertainty_noise``, clipped at 2 std), in one batched forward."""
        reps = x.repeat(self.uncertainty_passes, 1, 1, 1)
        sigma = self.uncertainty_noise
        noise = (torch.randn_like(reps) * sigma).clamp(-2 * sigma, 2 * sigma)
        with self._teacher_mode() as teacher:
            prob = torch.softmax(self.forward(teacher, reps + noise), dim=1)
        return pixel_entropy(prob.view(self.uncertainty_passes, *x.shape[:1], *prob.shape[1:]).mean(0))

    def certain(self, teacher_views, extra, iteration):
        unc = warp(torch.cat([self.teacher_uncertainty(v) for v in teacher_views]), extra)
        threshold = uncertainty_threshold(iteration, self.total_iterations, self.num_classes)
        return (unc < threshold).float(), {"threshold": threshold}


class MixingMethod(SemiSupervisedMethod):
    """A method that mixes pairs of samples (ICT, MixUp): lambda ~ Beta(``alpha``, ``alpha``) per sample, ``alpha``
    the method's ``default_alpha`` unless given."""

    default_alpha: ClassVar[float]

    def __init__(self, settings: StepSettings, weight: float, alpha: float | None = None) -> None:
        super().__init__(settings, weight)
        alpha = self.default_alpha if alpha is None else alpha
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)

    def mix_pairs(self, x: torch.Tensor, target: torch.Tensor, alpha: float):
        """Mixup of each sample with a random partner: ``(mix(x, x[perm], lam), mix(target, target[perm], lam),
        lam, perm)``, ``lam`` [B] ~ Beta(alpha, alpha), ``perm`` a random permutation of the batch."""
        perm = host_to_device(torch.randperm(x.shape[0], generator=self.generator), x.device)
        lam = host_to_device(sample_beta(alpha, x.shape[0]), x.device)
        return mix(x, x[perm], lam), mix(target, target[perm], lam), lam, perm


class InterpolationConsistency(MixingMethod, name="ict"):
    """ICT: CE + w(t) * :func:`softmax_mse` between the student on a mixup of two unlabelled views and the same
    mixup of the teacher's predictions on them (lambda ~ Beta(``alpha``, ``alpha``), per sample; ``alpha`` 0.1
    unless given)."""

    uses_teacher = True
    default_alpha = 0.1

    def losses(self, student, batch, iteration):
        x, y = self.labelled_view(batch["image"], batch["label"])
        x_u = self.unlabelled_view(batch["unlabelled"])
        x_mix, target, _, _ = self.mix_pairs(x_u, self.teacher_prob(x_u), self.alpha)
        logits = self.student_logits(student, x, x_mix)
        return {**self._labelled_terms(logits, x, y), "loss_reg": softmax_mse(logits[x.shape[0]:], target)}


class EntropyMinimisation(SemiSupervisedMethod, name="entropy_min"):
    """Entropy minimisation: CE + w(t) * :func:`entropy_loss` of the student's unlabelled predictions."""

    def losses(self, student, batch, iteration):
        x, y = self.labelled_view(batch["image"], batch["label"])
        logits = self.student_logits(student, x, self.unlabelled_view(batch["unlabelled"]))
        return {**self._labelled_terms(logits, x, y), "loss_reg": entropy_loss(logits[x.shape[0]:])}


class MixUp(MixingMethod, name="mixup"):
    """MixUp: CE + w(t) * :func:`soft_cross_entropy` of the student on mixed labelled pairs against the mix of
    their one-hot labels (lambda ~ Beta(``alpha``, ``alpha``), per sample; ``alpha`` 1 unless given). No unlabelled
    data."""

    uses_unlabelled = False
    default_alpha = 1.0

    def losses(self, student, batch, iteration):
        x, y = self.labelled_view(batch["image"], batch["label"])
        onehot = F.one_hot(y[:, 0].long(), self.num_classes).permute(0, 3, 1, 2).float()
        x_mix, target, _, _ = self.mix_pairs(x, onehot, self.alpha)
        logits = self.student_logits(student, x, x_mix)
        return {**self._labelled_terms(logits, x, y), "loss_reg": soft_cross_entropy(logits[x.shape[0]:], target)}


class Adversarial(SemiSupervisedMethod, name="adversarial"):
    """Adversarial training: CE + w(t) * BCE(D(softmax(student(x_u))), "labelled"), the generator term that pushes
    the unlabelled predictions to look labelled; after the student's step, one step of ``discriminator``
    (:class:`PredictionDiscriminator`) with ``discriminator_optimizer`` on the detached predictions (labelled -> 1,
    unlabelled -> 0), reported as ``loss_disc``."""

    def __init__(self, settings: StepSettings, weight: float, discriminator: nn.Module,
                 discriminator_optimizer: torch.optim.Optimizer) -> None:
        super().__init__(settings, weight)
        if discriminator is None or discriminator_optimizer is None:
            raise ValueError("method 'adversarial' needs a discriminator and a discriminator_optimizer")
        self.discriminator, self.discriminator_optimizer = discriminator, discriminator_optimizer

    def losses(self, student, batch, iteration):
        x, y = self.labelled_view(batch["image"], batch["label"])
        logits = self.student_logits(student, x, self.unlabelled_view(batch["unlabelled"]))
        b_l = x.shape[0]
        prob = torch.softmax(logits, dim=1)
        d_u = self.discriminator(prob[b_l:])
        return {**self._labelled_terms(logits, x, y),
                "loss_reg": F.binary_cross_entropy_with_logits(d_u, torch.ones_like(d_u)),
                "_prob_labelled": prob[:b_l].detach(), "_prob_unlabelled": prob[b_l:].detach()}

    def after_step(self, student, terms):
        """D learns labelled -> 1, unlabelled -> 0 on the (detached) predictions; one optimiser step."""
        prob_l, prob_u = terms["_prob_labelled"], terms["_prob_unlabelled"]
        self.discriminator.train()
        logits = self.discriminator(torch.cat([prob_l, prob_u]))
        target = torch.cat([torch.ones(prob_l.shape[0]), torch.zeros(prob_u.shape[0])]).to(logits)
        loss = F.binary_cross_entropy_with_logits(logits, target)
        self.discriminator_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.discriminator_optimizer.step()
        return {"loss_disc": loss.detach()}
