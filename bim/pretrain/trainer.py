"""Ignite/MONAI trainer of the pre-training step: BIM and the paper's pre-training baselines."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial

import torch
import torch.nn.functional as F
from monai.engines import SupervisedTrainer

from ..engine import bf16_autocast, ensure_train_mode, unwrap
from ..flags import as_flag, require_choice
from ..gpu_augment import EquivariantPairTransform, check_factor_range, pretrain_views

from . import losses as L

logger = logging.getLogger("bim")

LOSS_NAMES = ("mi", "cc", "con", "imsat", "local_con")
CC_MAPS = ("p_hat", "both")


class BIMPretrainTrainer(SupervisedTrainer):
    """One pre-training iteration (all on the device):

    1. the sampler gives full-size slices and their meta-labels; one geometric transform per slice (a random
       ``crop_size`` crop, flips and, ``view_rotation_deg`` > 0, a rotation) gives x (one ``grid_sample``); with
       ``view_jitter`` = [lo, hi] two views x1, x2 of it get independent brightness / contrast jitter (the
       authors' views), else x1 = x2 = x (:func:`bim.gpu_augment.pretrain_views`);
    2. the pair transform T draws one random state: T(x2) on the image (gamma + affine [+ mirror]);
    3. one forward pass of the U-Net on [x1, T(x2)] under bf16 autocast gives global and dense embeddings;
    4. p_hat = g(s(T(x2))), p_tilde = g(T(s(x1))) (the same geometric map applied to the dense embedding of x1,
       taken from the last decoder block or, with ``dense_level`` > 1, a deeper one at its own resolution),
       compared only where T maps inside the image (all pixels with ``mask_out_of_image`` false: the authors');
       L_CC correlates the edges of T(x2) with the entropy of p_hat (``cc_maps`` "p_hat") or, averaged, of both
       p_hat and p_tilde (``cc_maps`` "both", the authors');
    5. losses in fp32: ``total = w_con * L_con + w_cc * L_CC + w_mi * L_MI`` (+ the baselines' IMSAT and
       local-contrast terms when their weights are non-zero).

    ``loss_weights`` selects the paper's Table 1 row (see ``configs/variants``). When only encoder losses are
    active the decoder is not run (the paper pre-trains only the encoder for Contrast (Enc)).

    ``_iteration`` is overridden, as MONAI's one forward + ``loss_function(pred, label)`` cannot express the pair
    transform applied between the forward and the losses, nor several weighted losses of which some skip the decoder.
    """

    def __init__(
        self,
        *args,
        loss_weights: Mapping[str, float],
        pair_transform: EquivariantPairTransform,
        generator: torch.Generator,
        crop_size: int = 224,
        alpha: float = 0.5,
        temperature: float = 0.07,
        local_temperature: float = 0.1,
        edge: str = "sobel",
        edge_power: float = 0.75,
        cc_window: int = 5,
        bf16: bool = True,
        diagnostics_every: int = 50,
        compile_losses: bool = False,
        compile_mode: str | None = None,
        view_rotation_deg: float = 0.0,
        view_jitter: tuple[float, float] | None = None,
        cc_maps: str = "p_hat",
        mask_out_of_image: bool = True,
        **kwargs,
    ) -> None:
        kwargs.setdefault("decollate", False)
        super().__init__(*args, **kwargs)
        unknown = set(loss_weights) - set(LOSS_NAMES)
        if unknown:
            raise ValueError(f"loss_weights: unknown losses {sorted(unknown)}; expected keys among {LOSS_NAMES}")
        self.loss_weights = {k: float(loss_weights.get(k, 0.0)) for k in LOSS_NAMES}
        if not any(self.loss_weights.values()):
            raise ValueError("loss_weights: every weight is 0, nothing to train")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if isinstance(view_rotation_deg, bool) or not isinstance(view_rotation_deg, (int, float)) or not 0 <= view_rotation_deg <= 180:
            raise ValueError(f"view_rotation_deg must be a number of degrees in [0, 180], got {view_rotation_deg!r}")
        require_choice("cc_maps", cc_maps, CC_MAPS)
        mask_out_of_image = as_flag(mask_out_of_image, "mask_out_of_image")
        self.view_rotation_deg, self.view_jitter = float(view_rotation_deg), check_factor_range("view_jitter", view_jitter)
        self.cc_maps, self.mask_out_of_image = cc_maps, mask_out_of_image
        self.pair_transform, self.generator = pair_transform, generator
        self.crop_size, self.alpha, self.temperature = int(crop_size), float(alpha), float(temperature)
        self.local_temperature, self.edge, self.edge_power, self.cc_window = local_temperature, edge, edge_power, cc_window
        self.bf16, self.diagnostics_every = bool(bf16), int(diagnostics_every)
        objectives = partial(
            dense_objectives, alpha=self.alpha, edge=edge, edge_power=edge_power, cc_window=cc_window, bf16=self.bf16,
            cc_maps=cc_maps,
        )
        self._dense_objectives = torch.compile(objectives, mode=compile_mode) if compile_losses else objectives
        self.needs_decoder = any(self.loss_weights[k] for k in ("mi", "cc", "imsat", "local_con"))

    @property
    def model(self):
        return unwrap(self.network)

    def _autocast(self):
        """bf16 autocast on CUDA only: CPUs without bf16 units run bf16 convolutions ~50x slower than fp32."""
        return bf16_autocast(self.state.device, self.bf16)

    def compute_losses(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """All active losses of one batch (fp32 scalars) plus ``loss`` = their weighted sum."""
        image = batch["image"]
        b = image.shape[0]
        x, x2 = pretrain_views(image, self.crop_size, self.generator, self.view_rotation_deg, self.view_jitter)
        params = self.pair_transform.sample(b, self.generator)
        x_t = self.pair_transform.apply_image(x2, params)
        model, w = self.model, self.loss_weights
        out: dict[str, torch.Tensor] = {}
        with self._autocast():
            if self.needs_decoder:
                glob, dense = self.network(torch.cat([x, x_t]))
            else:
                glob = model.global_embedding(torch.cat([x, x_t]))
            if w["con"]:
                z = model.global_projector(glob)
            if self.needs_decoder:
                d_x, d_tx = dense[:b], dense[b:]
                d_tilde = self.pair_transform.apply_features(d_x, params)  # T(s(x))
        mask = self.pair_transform.valid_mask(params, d_x if self.needs_decoder else x)  # at the dense resolution
        mi_mask = mask if self.mask_out_of_image else None
        if w["con"]:
            labels = batch["partition"].repeat(2)
            out["con"] = L.supervised_contrastive_loss(z.float(), labels, self.temperature)
        if w["mi"] or w["cc"] or w["imsat"]:
            dense_losses, p_hat0 = self._dense_objectives(
                model.cluster_head, d_tx, d_tilde, x_t, mi_mask, w["mi"] > 0, w["cc"] > 0, w["imsat"] > 0
            )
            out.update(dense_losses)
            if self.diagnostics_every and (self.state.iteration % self.diagnostics_every == 0):
                usage = L.cluster_usage(p_hat0.detach(), mi_mask)
                out.update({k: torch.as_tensor(v, dtype=torch.float32) for k, v in usage.items()})
        if w["local_con"]:
            with self._autocast():
                f = model.dense_projector(torch.cat([d_tx, d_tilde]))
            out["local_con"] = L.local_contrastive_loss(
                f[:b].float(), f[b:].float(), temperature=self.local_temperature, generator=self.generator
            )
        out["loss"] = sum(w[k] * out[k] for k in LOSS_NAMES if w[k])
        return out

    def _iteration(self, engine, batchdata: dict[str, torch.Tensor]) -> dict:
        ensure_train_mode(engine.network)
        engine.optimizer.zero_grad(set_to_none=True)
        out = self.compute_losses(batchdata)
        out["loss"].backward()
        engine.optimizer.step()
        return {k: v.detach() for k, v in out.items()}



def dense_objectives(
    cluster_head, d_hat, d_tilde, image_t, mask, use_mi: bool, use_cc: bool, use_imsat: bool,
    alpha: float = 0.5, edge: str = "sobel", edge_power: float = 0.75, cc_window: int = 5, bf16: bool = True,
    cc_maps: str = "p_hat",
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The dense losses of one batch, averaged over the cluster sub-heads (one function, so it compiles into
    few fused kernels: the [2B, K, H, W] probabilities are the largest tensors of the step).

    ``d_hat`` = s(T(x)) and ``d_tilde`` = T(s(x)) are dense embeddings, ``image_t`` = T(x) is the image that
    p_hat = g(s(T(x))) is pixel-aligned with (L_CC correlates its edges with the entropy of p_hat, and with
    ``cc_maps`` "both" also with that of p_tilde, the mean over both maps and all sub-heads), ``mask`` marks pixels
    that T maps inside the image (None: every pixel counts). Returns the losses and the first sub-head's p_hat.
    """
    b = d_hat.shape[0]
    if image_t.shape[-2:] != d_hat.shape[-2:]:  # a deeper decoder block (dense_level > 1): edges at its resolution
        image_t = F.interpolate(image_t, size=d_hat.shape[-2:], mode="area")
    with bf16_autocast(d_hat.device, bf16):
        heads = cluster_head(torch.cat([d_hat, d_tilde]))  # list over sub-heads, fp32 softmax
    p_hat = [h[:b] for h in heads]
    p_tilde = [h[b:] for h in heads]
    out: dict[str, torch.Tensor] = {}
    if use_mi:
        out["mi"] = torch.stack([L.mi_loss(ph, pt, alpha, mask) for ph, pt in zip(p_hat, p_tilde)]).mean()
    if use_cc:
        maps = p_hat + p_tilde if cc_maps == "both" else p_hat
        out["cc"] = torch.stack([L.cc_loss(image_t, p, edge, edge_power, cc_window) for p in maps]).mean()
    if use_imsat:
        out["imsat"] = torch.stack([L.imsat_loss(ph, pt, mask=mask) for ph, pt in zip(p_hat, p_tilde)]).mean()
    return out, p_hat[0]
