"""Semi-supervised segmentation: Mean Teacher and the paper's semi-supervised baselines, one step on the device.

The paper (appendix "Detailed comparison methods") compares, from random initialisation and with the same
optimisation as fine-tuning, six semi-supervised methods; its best result is Mean Teacher initialised with BIM
pre-trained weights ("MT + Ours"). Each method is a value of ``method`` of :class:`SemiSupervisedStep`:

- ``supervised``: cross-entropy on the labelled batch only (the paper's Baseline, for comparison);
- ``mean_teacher`` (Perone & Cohen-Adad 2018): CE + w(t) * L_MT (:func:`softmax_mse`), the teacher
  an exponential moving average (EMA, decay 0.99) of the student (:func:`ema_teacher`, torch's
  :class:`~torch.optim.swa_utils.AveragedModel`);
- ``ua_mt`` (Yu et al. 2019): Mean Teacher whose consistency keeps only pixels where the teacher's uncertainty
  (entropy of the mean of ``uncertainty_passes`` noisy passes) is below a threshold rising linearly from
  3/4 ln C to ln C (:func:`uncertainty_threshold`);
- ``ict`` (Verma et al. 2019): the student on a mixup of two unlabelled images (lambda ~ Beta(0.1, 0.1)) matches
  the same mixup of the teacher's predictions;
- ``entropy_min`` (Grandvalet & Bengio 2005): CE + w(t) * mean pixel entropy of the unlabelled predictions;
- ``mixup`` (Zhang et al. 2018): CE + w(t) * soft-target CE on mixed labelled pairs (lambda ~ Beta(1, 1));
- ``adversarial`` (Zhang et al. 2017): CE + w(t) * BCE(D(softmax(student(x_u))), "labelled"), with a small CNN
  discriminator D trained to tell predictions on labelled from predictions on unlabelled images.

w(t) = weight * :func:`sigmoid_rampup` (t / rampup_iterations). Views: every image gets the fine-tuning
augmentation (:class:`~bim.segmentation.SegmentationAugment`: crop, flips, rotation, zoom as one matrix
M, intensity jitter). For the teacher-student methods the teacher sees ``warp(x, M)`` and the student
``warp(x, M @ A)`` with a further random similarity A and its own intensity jitter; since
``warp(warp(x, M), A) == warp(x, M @ A)``, warping the teacher's prediction with A aligns it pixel by pixel with
the student's, and the consistency is averaged over the pixels A maps inside the teacher's view.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .data import RandomSliceSampler, SliceStore, read_items
from .engine import bf16_autocast
from .flags import as_flag
from .gpu_augment import random_affine_matrices, warp
from .inference import is_prepared
from .segmentation import labelled_cross_entropy

logger = logging.getLogger("bim")

METHODS = ("supervised", "mean_teacher", "ua_mt", "ict", "entropy_min", "mixup", "adversarial")
TEACHER_METHODS = ("mean_teacher", "ua_mt", "ict")
EPS = 1e-8


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


def ema_teacher(network: nn.Module, decay: float = 0.99, average_buffers: bool = False) -> AveragedModel:
    """The Mean Teacher: an :class:`~torch.optim.swa_utils.AveragedModel` of ``network`` (DDP/compile wrappers are
    unwrapped) holding ``teacher_t = decay * teacher_{t-1} + (1 - decay) * student_t`` for the parameters, updated
    by one vectorised ``torch._foreach_lerp_`` per call of ``teacher.update_parameters(student)``.

    BatchNorm: :class:`SemiSupervisedStep` runs the teacher with *batch* statistics (as Tarvainen & Valpola's and
    SSL4MIS's Mean Teacher do), so its predictions never depend on running statistics. The buffers (running
    statistics) are copied from the student at every update (``average_buffers=False``, the default), so a saved
    teacher evaluated in eval mode uses the student's current statistics. ``average_buffers=True`` (the old
    behaviour) EMA-averages the buffers too: they then lag the student's running statistics, themselves an EMA of
    batch statistics, by ~1 / (1 - decay) iterations, which made an eval-mode teacher useless for hundreds of
    iterations (running variances from the initialisation, 1.0, against true variances ~0.01).

    It starts equal to the student (so a ``pretrained`` student initialises both networks): the first
    ``update_parameters`` of AveragedModel copies, and is done here, so every later call is an EMA step. The
    teacher has no gradients and is kept in eval mode between steps."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
    student = _unwrap(network)
    teacher = AveragedModel(student, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=bool(average_buffers))
    teacher.update_parameters(student)  # n_averaged 0 -> 1: the copy
    teacher.requires_grad_(False)
    teacher.eval()
    teacher.decay = float(decay)
    return teacher


def bn_statistics(network: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A snapshot of the running statistics (mean, variance, batches tracked) of ``network``'s BatchNorm layers:
    (buffer, copy) pairs for :func:`restore_bn_statistics`."""
    return [(b, b.detach().clone()) for m in _unwrap(network).modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]


@torch.no_grad()
def restore_bn_statistics(snapshot: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Put the running statistics of a :func:`bn_statistics` snapshot back, in place. Call it after the backward
    pass: autograd keeps the buffers of a train-mode BatchNorm forward and refuses them modified before."""
    for buffer, saved in snapshot:
        buffer.copy_(saved)


def _unwrap(network: nn.Module) -> nn.Module:
    network = getattr(network, "module", network)  # DistributedDataParallel
    return getattr(network, "_orig_mod", network)  # torch.compile


def to_channels_last(network: nn.Module, enabled: bool = True) -> nn.Module:
    """``network`` in channels_last memory format when ``enabled`` and on CUDA (tensor cores' layout); as is
    otherwise (on the CPU, channels_last convolutions bring nothing here)."""
    param = next(network.parameters(), None)
    if enabled and param is not None and param.device.type == "cuda":
        network.to(memory_format=torch.channels_last)
    return network


# ------------------------------------------------------------------------------------------------------ losses


def softmax_mse(student_logits: torch.Tensor, teacher_prob: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The paper's Mean Teacher consistency (appendix, "Mean Teacher"):

        L_MT = 1 / (|D_u| |Omega|) * sum_{x in D_u} sum_{i in Omega} || p^s_i(x) - p^t_i(x) ||^2,

    the squared distance between the student's class probabilities ``softmax(s)_i`` and the teacher's ``p^t_i``
    summed over the C classes and averaged over the images and pixels i (the paper prints a minus sign before the
    sum, a typo for a loss that is minimised). With ``mask`` [B, 1, H, W] in {0, 1} (UA-MT's certain pixels, the
    pixels inside the teacher's view) the average runs over the masked-in pixels only. fp32. ``student_logits`` and
    ``teacher_prob`` are [B, C, H, W]; the teacher is a target (no gradient). Before ``meanteacher_seg`` 0.4.0 this
    averaged over the classes too, i.e. it was L_MT / C."""
    sq = (torch.softmax(student_logits.float(), dim=1) - teacher_prob.detach().float()).pow(2).sum(dim=1, keepdim=True)
    if mask is None:
        return sq.mean()
    mask = mask.float()
    return (sq * mask).sum() / mask.sum().clamp_min(1.0)


def entropy_map(prob: torch.Tensor) -> torch.Tensor:
    """Pixel entropy ``-sum_c p_c ln p_c`` of class probabilities [B, C, H, W] -> [B, 1, H, W] (in nats)."""
    prob = prob.float()
    return -(prob * torch.log(prob + EPS)).sum(dim=1, keepdim=True)


def entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    """Entropy minimisation: the mean over pixels of ``-sum_c p_c ln p_c``, ``p = softmax(logits)`` (fp32)."""
    logits = logits.float()
    return -(torch.softmax(logits, 1) * torch.log_softmax(logits, 1)).sum(1).mean()


def mix(a: torch.Tensor, b: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Mixup ``lam * a + (1 - lam) * b`` with one ``lam`` per sample ([B], broadcast over the other dims)."""
    lam = lam.to(device=a.device, dtype=a.dtype).view(-1, *([1] * (a.ndim - 1)))
    return lam * a + (1 - lam) * b


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with a soft target: mean over pixels of ``-sum_c t_c log softmax(logits)_c`` (fp32)."""
    return -(target.float() * torch.log_softmax(logits.float(), dim=1)).sum(1).mean()


def sample_beta(alpha: float, n: int) -> torch.Tensor:
    """``n`` draws of Beta(alpha, alpha) (CPU, torch's global generator, which checkpoints save)."""
    a = torch.tensor(float(alpha), dtype=torch.float64)
    return torch.distributions.Beta(a, a).sample((n,)).float()


class PredictionDiscriminator(nn.Module):
    """The adversarial-training discriminator: a small CNN on softmax maps [B, C, H, W] -> one logit per image
    ("predicted on a labelled image"). Strided 4x4 convolutions with LeakyReLU(0.2), global average pooling,
    a linear layer."""

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


class SemiSupervisedStep:
    """One training iteration of ``method`` (see the module docstring): views, forwards (bf16 autocast on CUDA;
    the teacher under ``no_grad``), losses in fp32, the optimiser step(s) and the teacher's EMA update.

    ``weight`` is the method's regulariser weight (ramped up by :func:`sigmoid_rampup` over
    ``rampup_iterations``); ``total_iterations`` paces UA-MT's threshold. ``view_*`` set the student's extra
    random similarity A (rotation, zoom, flips). ``consistency_on_labelled`` adds the labelled images to the
    Mean Teacher / UA-MT consistency (as in Tarvainen & Valpola's Mean Teacher); false takes it on the unlabelled
    images only (the paper's L_MT sums over D_u), and the labelled images then get the supervised method's view,
    so that at weight 0 the labelled term trains as the baseline's does. ``joint_teacher_batch`` true gives the
    teacher the labelled and unlabelled views of the consistency in one forward; false (the default since
    meanteacher_seg 0.7.0), one forward each, so that with
    ``teacher_batch_stats`` each part is BatchNorm'd with its own batch statistics, as the student's separate
    forwards are (see :meth:`teacher_of`). Call it with ``student``, the
    batch of :class:`PairedSliceSampler` and the 0-based ``iteration``; it returns the loss terms (detached).
    ``supervised_loss_function(logits, label)`` is the labelled term (default :func:`labelled_cross_entropy`; the
    bundle passes its ``train#trainer#loss_function``). ``compile_teacher`` runs the teacher's forwards through
    ``torch.compile(teacher.module, mode=compile_mode)`` (the student is compiled by the bundle's ``compile``); the
    compiled module shares the teacher's parameters, so the EMA update reaches it, and its train / eval mode.
    """

    def __init__(
        self,
        method: str,
        augment,
        optimizer: torch.optim.Optimizer,
        num_classes: int,
        teacher: AveragedModel | None = None,
        weight: float = 1.0,
        rampup_iterations: int = 0,
        total_iterations: int = 1,
        consistency_on_labelled: bool = True,
        view_rotation_deg: float = 15.0,
        view_scale_range: Sequence[float] = (0.9, 1.1),
        view_flip_prob: float = 0.5,
        uncertainty_passes: int = 4,
        uncertainty_noise: float = 0.1,
        ict_alpha: float = 0.1,
        mixup_alpha: float = 1.0,
        discriminator: nn.Module | None = None,
        discriminator_optimizer: torch.optim.Optimizer | None = None,
        bf16: bool = True,
        channels_last: bool = True,
        teacher_batch_stats: bool = True,
        joint_student_batch: bool = False,
        unlabelled_bn_stats: bool = True,
        supervised_loss_function=None,
        joint_teacher_batch: bool = False,
        compile_teacher: bool = False,
        compile_mode: str | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
        if method in TEACHER_METHODS and teacher is None:
            raise ValueError(f"method {method!r} needs a teacher (bim.semi_supervised.ema_teacher)")
        if method == "adversarial" and (discriminator is None or discriminator_optimizer is None):
            raise ValueError("method 'adversarial' needs a discriminator and a discriminator_optimizer")
        if weight < 0:
            raise ValueError(f"the regulariser weight must be >= 0, got {weight}")
        if uncertainty_passes < 1:
            raise ValueError(f"uncertainty_passes must be >= 1, got {uncertainty_passes}")
        if ict_alpha <= 0 or mixup_alpha <= 0:
            raise ValueError(f"mixup alphas must be > 0, got ict_alpha={ict_alpha}, mixup_alpha={mixup_alpha}")
        self.method, self.augment, self.optimizer, self.num_classes = method, augment, optimizer, int(num_classes)
        self.teacher, self.weight = teacher, float(weight)
        self.rampup_iterations, self.total_iterations = int(rampup_iterations), int(total_iterations)
        self.consistency_on_labelled = as_flag(consistency_on_labelled, "consistency_on_labelled")
        self.view_rotation_deg, self.view_scale_range = float(view_rotation_deg), tuple(view_scale_range)
        self.view_flip_prob = float(view_flip_prob)
        self.uncertainty_passes, self.uncertainty_noise = int(uncertainty_passes), float(uncertainty_noise)
        self.ict_alpha, self.mixup_alpha = float(ict_alpha), float(mixup_alpha)
        self.discriminator, self.discriminator_optimizer = discriminator, discriminator_optimizer
        self.bf16, self.channels_last = as_flag(bf16, "bf16"), as_flag(channels_last, "channels_last")
        self.teacher_batch_stats = as_flag(teacher_batch_stats, "teacher_batch_stats")
        self.joint_student_batch = as_flag(joint_student_batch, "joint_student_batch")
        self.joint_teacher_batch = as_flag(joint_teacher_batch, "joint_teacher_batch")
        self.unlabelled_bn_stats = as_flag(unlabelled_bn_stats, "unlabelled_bn_stats")
        self._bn_after_labelled = None
        self.supervised_loss_function = supervised_loss_function or labelled_cross_entropy
        self.compile_teacher = as_flag(compile_teacher, "compile_teacher")
        # with compile_teacher, what runs the teacher's forwards: its module compiled (same parameters, same mode)
        self._compiled_teacher = (torch.compile(teacher.module, mode=compile_mode) if self.compile_teacher and
                                  teacher is not None else None)

    # ---- helpers

    @property
    def generator(self) -> torch.Generator:
        return self.augment.generator

    def _forward(self, network: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.is_cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        with bf16_autocast(x.device, self.bf16):
            return network(x).float()

    def _student(self, student: nn.Module, *parts: torch.Tensor) -> torch.Tensor:
        """The student's logits for the concatenation of ``parts`` (labelled batch first).

        Default (``joint_student_batch`` false): one forward per part, each BatchNorm'd with its own batch
        statistics, so the labelled logits do not depend on the unlabelled images. ``joint_student_batch`` true:
        one forward of the concatenated batch (as SSL4MIS does). With 1 labelled ACDC scan the joint forward made
        every method collapse in eval mode (predicting foreground everywhere, 3D Dice ~0.03), even with the
        regulariser weight at 0: through the shared batch statistics the labelled cross-entropy steers the
        activations of the unlabelled images, which it does not supervise, and validation images look like the
        unlabelled ones. See ``bundles/meanteacher_seg/docs/README.md``.

        ``unlabelled_bn_stats`` false (separate forwards only): the step puts BatchNorm's running statistics back to
        what the labelled forward left, so the unlabelled images do not move them and the eval-mode student
        normalises with the labelled batches' statistics alone, as a fine-tuned network does; true (default): every
        forward updates them."""
        if self.joint_student_batch:
            return self._forward(student, torch.cat(parts))
        logits = [self._forward(student, parts[0])]
        if not self.unlabelled_bn_stats and len(parts) > 1:  # put back by __call__ after the backward pass
            self._bn_after_labelled = bn_statistics(student)
        return torch.cat(logits + [self._forward(student, p) for p in parts[1:]])

    def _intensity(self, x: torch.Tensor) -> torch.Tensor:
        """The augmentation's intensity part (gamma, then contrast/brightness), drawn anew for every view."""
        return self.augment.intensity(x)

    def _matrices(self, x: torch.Tensor) -> torch.Tensor:
        return self.augment.matrices(x.shape[0], tuple(x.shape[-2:]))

    def view_matrices(self, batch: int) -> torch.Tensor:
        """The student's extra similarity A [B, 3, 3] (rotation, zoom, flips; no translation)."""
        return random_affine_matrices(batch, self.generator, self.view_scale_range, self.view_rotation_deg, 0.0,
                                      flip_prob=self.view_flip_prob)

    def _out_hw(self) -> tuple[int, int]:
        return (self.augment.crop_size, self.augment.crop_size)

    def labelled_view(self, image: torch.Tensor, label: torch.Tensor, extra: torch.Tensor | None = None):
        mats = self._matrices(image)
        if extra is not None:
            mats = mats @ extra
        return self._intensity(warp(image, mats, self._out_hw())), warp(label, mats, self._out_hw(), mode="nearest")

    def teacher_student_views(self, image: torch.Tensor):
        """``(teacher_view, student_view, M, A)``: warp(x, M) and warp(x, M @ A), each with its own intensity draw."""
        mats = self._matrices(image)
        extra = self.view_matrices(image.shape[0])
        teacher_view = self._intensity(warp(image, mats, self._out_hw()))
        student_view = self._intensity(warp(image, mats @ extra, self._out_hw()))
        return teacher_view, student_view, mats, extra

    @contextlib.contextmanager
    def _teacher_mode(self):
        """The teacher's forward mode: train mode (BatchNorm normalises with the statistics of the teacher's own
        batch, like the student's forward) when ``teacher_batch_stats``, eval mode otherwise; back to eval after.
        The running statistics its train-mode forward touches are overwritten by the next EMA update."""
        self.teacher.train(self.teacher_batch_stats)
        try:
            yield self._compiled_teacher if self._compiled_teacher is not None else self.teacher
        finally:
            self.teacher.eval()

    def teacher_of(self, fn, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``fn`` (:meth:`teacher_prob` or :meth:`teacher_uncertainty`) of the concatenation of ``parts`` (the
        labelled views first): one teacher forward of the joint batch (``joint_teacher_batch`` true), or one per part
        (false). In train mode (``teacher_batch_stats``) a joint forward normalises the unlabelled views with
        statistics that the labelled scan's slices share, while the student (``joint_student_batch`` false) normalises
        them with their own: the targets and the student's predictions then see different normalisations."""
        if self.joint_teacher_batch or len(parts) == 1:
            return fn(torch.cat(list(parts)))
        return torch.cat([fn(p) for p in parts])

    @torch.no_grad()
    def teacher_prob(self, x: torch.Tensor) -> torch.Tensor:
        with self._teacher_mode() as teacher:
            return torch.softmax(self._forward(teacher, x), dim=1)

    @torch.no_grad()
    def teacher_uncertainty(self, x: torch.Tensor) -> torch.Tensor:
        """UA-MT: entropy [B, 1, H, W] of the mean softmax of the teacher over ``uncertainty_passes`` copies of
        ``x`` with Gaussian noise (std ``uncertainty_noise``, clipped at 2 std), in one batched forward."""
        reps = x.repeat(self.uncertainty_passes, 1, 1, 1)
        noise = (torch.randn_like(reps) * self.uncertainty_noise).clamp(-2 * self.uncertainty_noise, 2 * self.uncertainty_noise)
        with self._teacher_mode() as teacher:
            prob = torch.softmax(self._forward(teacher, reps + noise), dim=1)
        return entropy_map(prob.view(self.uncertainty_passes, *x.shape[:1], *prob.shape[1:]).mean(0))

    # ---- the step

    def __call__(self, student: nn.Module, batch: dict, iteration: int) -> dict:
        student.train()
        ramp = sigmoid_rampup(iteration, self.rampup_iterations)
        w = self.weight * ramp
        terms = getattr(self, f"_{self.method}")(student, batch, iteration, w)
        loss = terms["loss_sup"] + w * terms["loss_reg"]
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if self._bn_after_labelled is not None:  # unlabelled_bn_stats false: see _student
            restore_bn_statistics(self._bn_after_labelled)
            self._bn_after_labelled = None
        if self.method in TEACHER_METHODS:
            self.teacher.update_parameters(_unwrap(student))
        if self.method == "adversarial":
            terms["loss_disc"] = self._discriminator_step(terms.pop("_prob_labelled"), terms.pop("_prob_unlabelled"))
        out = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in terms.items() if not k.startswith("_")}
        out.update(loss=loss.detach(), weight=w, ramp=ramp)
        return out

    def _supervised(self, student, batch, iteration, w):
        x, y = self.labelled_view(batch["image"], batch["label"])
        logits = self._forward(student, x)
        return {"loss_sup": self.supervised_loss_function(logits, y), "loss_reg": logits.new_zeros(()),
                "image": x, "label": y, "pred": logits}

    def _consistency(self, student, batch, iteration, uncertainty: bool):
        b_l = batch["image"].shape[0]
        if self.consistency_on_labelled:
            t_l, s_l, m_l, a_l = self.teacher_student_views(batch["image"])
            # the student's labelled view is warp(x, M @ A): the same matrix warps the label
            y = warp(batch["label"], m_l @ a_l, self._out_hw(), mode="nearest")
        else:  # the labelled images only feed the supervised term: the supervised method's view, drawn first as there
            s_l, y = self.labelled_view(batch["image"], batch["label"])
        t_u, s_u, _, a_u = self.teacher_student_views(batch["unlabelled"])
        logits = self._student(student, s_l, s_u)
        if self.consistency_on_labelled:
            teacher_parts, extra, student_logits = [t_l, t_u], torch.cat([a_l, a_u]), logits
        else:
            teacher_parts, extra, student_logits = [t_u], a_u, logits[b_l:]
        teacher_in = torch.cat(teacher_parts)
        prob_t = warp(self.teacher_of(self.teacher_prob, teacher_parts), extra)  # aligned with the student's views
        mask = (warp(torch.ones_like(teacher_in[:, :1]), extra) > 0.999).float()  # source inside the teacher's view
        terms = {}
        if uncertainty:
            unc = warp(self.teacher_of(self.teacher_uncertainty, teacher_parts), extra)
            threshold = uncertainty_threshold(iteration, self.total_iterations, self.num_classes)
            certain = (unc < threshold).float()
            terms.update(threshold=threshold, certain_fraction=(certain * mask).sum() / mask.sum().clamp_min(1))
            mask = mask * certain
        terms.update(
            loss_sup=self.supervised_loss_function(logits[:b_l], y),
            loss_reg=softmax_mse(student_logits, prob_t, mask),
            image=s_l, label=y, pred=logits[:b_l],
        )
        return terms

    def _mean_teacher(self, student, batch, iteration, w):
        return self._consistency(student, batch, iteration, uncertainty=False)

    def _ua_mt(self, student, batch, iteration, w):
        return self._consistency(student, batch, iteration, uncertainty=True)

    def mix_pairs(self, x: torch.Tensor, target: torch.Tensor, alpha: float):
        """Mixup of each sample with a random partner: ``(mix(x, x[perm], lam), mix(target, target[perm], lam),
        lam, perm)``, ``lam`` [B] ~ Beta(alpha, alpha), ``perm`` a random permutation of the batch."""
        perm = torch.randperm(x.shape[0], generator=self.generator).to(x.device)
        lam = sample_beta(alpha, x.shape[0]).to(x.device)
        return mix(x, x[perm], lam), mix(target, target[perm], lam), lam, perm

    def _ict(self, student, batch, iteration, w):
        x, y = self.labelled_view(batch["image"], batch["label"])
        x_u = self._intensity(warp(batch["unlabelled"], self._matrices(batch["unlabelled"]), self._out_hw()))
        x_mix, target, _, _ = self.mix_pairs(x_u, self.teacher_prob(x_u), self.ict_alpha)
        logits = self._student(student, x, x_mix)
        b_l = x.shape[0]
        return {"loss_sup": self.supervised_loss_function(logits[:b_l], y),
                "loss_reg": softmax_mse(logits[b_l:], target),
                "image": x, "label": y, "pred": logits[:b_l]}

    def _entropy_min(self, student, batch, iteration, w):
        x, y = self.labelled_view(batch["image"], batch["label"])
        x_u = self._intensity(warp(batch["unlabelled"], self._matrices(batch["unlabelled"]), self._out_hw()))
        logits = self._student(student, x, x_u)
        b_l = x.shape[0]
        return {"loss_sup": self.supervised_loss_function(logits[:b_l], y), "loss_reg": entropy_loss(logits[b_l:]),
                "image": x, "label": y, "pred": logits[:b_l]}

    def _mixup(self, student, batch, iteration, w):
        x, y = self.labelled_view(batch["image"], batch["label"])
        b_l = x.shape[0]
        onehot = F.one_hot(y[:, 0].long(), self.num_classes).permute(0, 3, 1, 2).float()
        x_mix, target, _, _ = self.mix_pairs(x, onehot, self.mixup_alpha)
        logits = self._student(student, x, x_mix)
        return {"loss_sup": self.supervised_loss_function(logits[:b_l], y),
                "loss_reg": soft_cross_entropy(logits[b_l:], target),
                "image": x, "label": y, "pred": logits[:b_l]}

    def _adversarial(self, student, batch, iteration, w):
        x, y = self.labelled_view(batch["image"], batch["label"])
        x_u = self._intensity(warp(batch["unlabelled"], self._matrices(batch["unlabelled"]), self._out_hw()))
        logits = self._student(student, x, x_u)
        b_l = x.shape[0]
        prob = torch.softmax(logits, dim=1)
        d_u = self.discriminator(prob[b_l:])  # generator term: unlabelled predictions should look labelled
        return {"loss_sup": self.supervised_loss_function(logits[:b_l], y),
                "loss_reg": F.binary_cross_entropy_with_logits(d_u, torch.ones_like(d_u)),
                "image": x, "label": y, "pred": logits[:b_l],
                "_prob_labelled": prob[:b_l].detach(), "_prob_unlabelled": prob[b_l:].detach()}

    def _discriminator_step(self, prob_l: torch.Tensor, prob_u: torch.Tensor) -> torch.Tensor:
        """D learns labelled -> 1, unlabelled -> 0 on the (detached) predictions; one optimiser step."""
        self.discriminator.train()
        logits = self.discriminator(torch.cat([prob_l, prob_u]))
        target = torch.cat([torch.ones(prob_l.shape[0]), torch.zeros(prob_u.shape[0])]).to(logits)
        loss = F.binary_cross_entropy_with_logits(logits, target)
        self.discriminator_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.discriminator_optimizer.step()
        return loss.detach()
