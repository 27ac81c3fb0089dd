"""Ignite/MONAI trainer of the pre-training step: BIM and the paper's pre-training baselines."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import torch
from monai.engines import SupervisedTrainer

from bim_common.engine import bf16_autocast
from bim_common.network import unet_global_embedding
from bim_common.gpu_augment import EquivariantPairTransform, crop_matrices, random_affine_matrices, warp

from . import losses as L

logger = logging.getLogger("bim")

LOSS_NAMES = ("mi", "cc", "con", "imsat", "local_con")


class BIMPretrainTrainer(SupervisedTrainer):
    """One pre-training iteration (all on the device):

    1. the sampler gives full-size slices and their meta-labels; a random ``crop_size`` crop with flips
       gives x (one ``grid_sample``);
    2. the pair transform T draws one random state: T(x) on the image (gamma + affine);
    3. one forward pass of the U-Net on [x, T(x)] under bf16 autocast gives global and dense embeddings;
    4. p_hat = g(s(T(x))), p_tilde = g(T(s(x))) (the same affine applied to the dense embedding of x),
       compared only where T maps inside the image;
    5. losses in fp32: ``total = w_con * L_con + w_cc * L_CC + w_mi * L_MI`` (+ the baselines' IMSAT and
       local-contrast terms when their weights are non-zero).

    ``loss_weights`` selects the paper's Table 1 row (see ``configs/variants``). When only encoder losses are
    active the decoder is not run (the paper pre-trains only the encoder for Contrast (Enc)).
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
        self.pair_transform, self.generator = pair_transform, generator
        self.crop_size, self.alpha, self.temperature = int(crop_size), float(alpha), float(temperature)
        self.local_temperature, self.edge, self.edge_power, self.cc_window = local_temperature, edge, edge_power, cc_window
        self.bf16, self.diagnostics_every = bool(bf16), int(diagnostics_every)
        self.needs_decoder = any(self.loss_weights[k] for k in ("mi", "cc", "imsat", "local_con"))

    @property
    def model(self):
        net = self.network
        return net.module if hasattr(net, "module") else net

    def _autocast(self):
        """bf16 autocast on CUDA only: CPUs without bf16 units run bf16 convolutions ~50x slower than fp32."""
        return bf16_autocast(self.state.device, self.bf16)

    def compute_losses(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """All active losses of one batch (fp32 scalars) plus ``loss`` = their weighted sum."""
        image = batch["image"]
        b = image.shape[0]
        crop = crop_matrices(b, tuple(image.shape[-2:]), (self.crop_size, self.crop_size), self.generator)
        flips = random_affine_matrices(b, self.generator, (1.0, 1.0), 0.0, 0.0, flip_prob=0.5)
        x = warp(image, crop @ flips, (self.crop_size, self.crop_size))
        params = self.pair_transform.sample(b, self.generator)
        x_t = self.pair_transform.apply_image(x, params)
        model, w = self.model, self.loss_weights
        out: dict[str, torch.Tensor] = {}
        with self._autocast():
            if self.needs_decoder:
                glob, dense = self.network(torch.cat([x, x_t]))
            else:
                glob = unet_global_embedding(model.unet, torch.cat([x, x_t]))
            if w["con"]:
                z = model.global_projector(glob)
            if self.needs_decoder:
                d_x, d_tx = dense[:b], dense[b:]
                d_tilde = self.pair_transform.apply_features(d_x, params)  # T(s(x))
        mask = self.pair_transform.valid_mask(params, x)
        if w["con"]:
            labels = batch["partition"].repeat(2)
            out["con"] = L.supervised_contrastive_loss(z.float(), labels, self.temperature)
        if w["mi"] or w["cc"] or w["imsat"]:
            with self._autocast():
                heads = model.cluster_head(torch.cat([d_tx, d_tilde, d_x]))  # list over sub-heads
            p_hat = [h[:b] for h in heads]
            p_tilde = [h[b : 2 * b] for h in heads]
            p_x = [h[2 * b :] for h in heads]
            if w["mi"]:
                out["mi"] = torch.stack([L.mi_loss(ph, pt, self.alpha, mask) for ph, pt in zip(p_hat, p_tilde)]).mean()
            if w["cc"]:
                cc = [
                    0.5 * (L.cc_loss(x_t, ph, self.edge, self.edge_power, self.cc_window)
                           + L.cc_loss(x, px, self.edge, self.edge_power, self.cc_window))
                    for ph, px in zip(p_hat, p_x)
                ]
                out["cc"] = torch.stack(cc).mean()
            if w["imsat"]:
                out["imsat"] = torch.stack([L.imsat_loss(ph, pt, mask=mask) for ph, pt in zip(p_hat, p_tilde)]).mean()
            if self.diagnostics_every and (self.state.iteration % self.diagnostics_every == 0):
                usage = L.cluster_usage(p_hat[0].detach(), mask)
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
        engine.network.train()
        engine.optimizer.zero_grad(set_to_none=True)
        out = self.compute_losses(batchdata)
        out["loss"].backward()
        engine.optimizer.step()
        return {k: v.detach() for k, v in out.items()}

