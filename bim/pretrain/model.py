"""The pre-training networks.

- :class:`BIMClusterNet`: the paper's U-Net plus the dense cluster head, a plain ``nn.Module`` whose ``forward`` gives
  the cluster logits [B, K, H, W]. It is the bundle's ``network_def``; ``model.pt`` is its state dict (``unet.*``: the
  BasicUNet weights without ``final_conv``, which fine-tuning loads; ``cluster_head.*``). TorchScript-compatible.
- :class:`BIMPretrainNet`: the pre-training wrapper around a :class:`BIMClusterNet`, adding the global projector
  (L_con) and, for the local-contrast baseline, the dense projector. Its state dict is what the pre-training
  checkpoints hold (``cluster_net.*``, ``global_projector.*``, ``dense_projector.*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..network import PAPER_FEATURES, build_unet, check_dense_level, dense_channels

from .heads import ClusterHead, DenseProjector, GlobalProjector


class BIMClusterNet(nn.Module):
    """U-Net ``unet`` (a MONAI BasicUNet without its ``final_conv``, which pre-training does not train) and the dense
    cluster head ``cluster_head`` (``num_subheads`` 1x1 convs -> K clusters) on the dense embedding: the last decoder
    block ``upcat_1`` (the paper's ``upconv2``), or ``upcat_<dense_level>`` for ``dense_level`` 2-4 (the blocks after
    it are not run).

    ``forward(x)`` [B, in_channels, H, W] (H, W multiples of 16) -> the first sub-head's cluster logits
    [B, num_clusters, H, W] at the image's resolution (a deeper block's map is upsampled by nearest neighbour).
    """

    def __init__(
        self,
        num_clusters: int = 40,
        num_subheads: int = 3,
        features: Sequence[int] = PAPER_FEATURES,
        in_channels: int = 1,
        dense_level: int = 1,
        unet_style: str = "monai",
        bn_momentum: float | None = None,
    ) -> None:
        super().__init__()
        dense = dense_channels(features, dense_level)  # validates dense_level
        self.dense_level = check_dense_level(dense_level)
        self.features = tuple(int(f) for f in features)
        self.unet = build_unet(in_channels=in_channels, out_channels=1, features=features, unet_style=unet_style,
                               bn_momentum=bn_momentum)
        self.unet.final_conv = nn.Identity()  # no weights: model.pt holds no untrained layer
        self.cluster_head = ClusterHead(dense, num_clusters, num_subheads)

    def encoder_features(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Outputs of the 5 encoder blocks ``conv_0``, ``down_1`` ... ``down_4`` (the skip connections); the last one
        is the global embedding (``down_4``, the paper's ``conv5``)."""
        net = self.unet
        feats = [net.conv_0(x)]
        feats.append(net.down_1(feats[-1]))
        feats.append(net.down_2(feats[-1]))
        feats.append(net.down_3(feats[-1]))
        feats.append(net.down_4(feats[-1]))
        return feats

    def embeddings(self, x: torch.Tensor, ablate_levels: Optional[List[int]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(global_embedding, dense_embedding)``: the encoder output (``down_4``) and the decoder block
        ``upcat_<dense_level>`` (``upcat_1``, right before ``final_conv``, by default).

        ``ablate_levels`` (a probe of a trained network, not for training): encoder levels 0-4 whose output reaches the
        decoder as its per-channel spatial mean (each image its own), i.e. without its spatial information. Level 4 is
        the bottleneck, the whole deep path; levels 0-3 are the skip connections of ``conv_0`` ... ``down_3`` (the
        deeper levels are still computed from them). The global embedding is never ablated.
        """
        feats = self.encoder_features(x)
        glob = feats[4]
        if ablate_levels is not None:
            for k in ablate_levels:
                if k < 0 or k > 4:
                    raise ValueError("ablate_levels must be encoder levels 0-4, got " + str(ablate_levels))
            feats = [f.mean([-2, -1], keepdim=True).expand_as(f) if k in ablate_levels else f
                     for k, f in enumerate(feats)]
        net = self.unet
        u = net.upcat_4(feats[4], feats[3])
        if self.dense_level <= 3:
            u = net.upcat_3(u, feats[2])
        if self.dense_level <= 2:
            u = net.upcat_2(u, feats[1])
        if self.dense_level <= 1:
            u = net.upcat_1(u, feats[0])
        return glob, u

    def cluster_logits(self, x: torch.Tensor, ablate_levels: Optional[List[int]] = None) -> torch.Tensor:
        """The first sub-head's cluster logits [B, K, H, W] at the image's resolution; ``ablate_levels`` as
        :meth:`embeddings`'."""
        logits = self.cluster_head.heads[0](self.embeddings(x, ablate_levels)[1])
        if logits.shape[-2:] != x.shape[-2:]:
            logits = F.interpolate(logits, size=x.shape[-2:], mode="nearest")
        return logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cluster_logits(x)

    @torch.jit.unused
    def cluster_map_probs(self, x: torch.Tensor, ablate_levels: Sequence[int] = ()) -> torch.Tensor:
        """The first sub-head's cluster probabilities [B, K, H, W] (softmax in fp32) at the image's resolution: what
        the panels and the cluster scores show."""
        return torch.softmax(self.cluster_logits(x, [int(k) for k in ablate_levels] or None).float(), dim=1)

    @torch.jit.unused
    def subhead_map_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Every sub-head's cluster probabilities (softmax in fp32) at the image's resolution, concatenated on the
        channels: [B, S * K, H, W], sub-head s in channels ``s * K`` ... ``(s + 1) * K - 1``; the first K channels
        are :meth:`cluster_map_probs`. Each sub-head is an independent clustering of the same embedding."""
        dense, size = self.embeddings(x)[1], x.shape[-2:]
        logits = [head(dense) for head in self.cluster_head.heads]
        return torch.cat([torch.softmax((F.interpolate(z, size=size, mode="nearest") if z.shape[-2:] != size else z)
                                        .float(), dim=1) for z in logits], dim=1)


class BIMPretrainNet(nn.Module):
    """The pre-training network: ``cluster_net`` (a :class:`BIMClusterNet`, trained in place) with

    - ``global_projector``: avg pool -> MLP -> L2 norm on the global embedding (``down_4``), for L_con;
    - ``dense_projector`` (optional): the Chaitanya et al. local-contrast projector on the dense embedding.

    ``forward(x)`` returns ``(global_embedding, dense_embedding)``; heads are applied by the trainer, which needs the
    dense embedding both as it is and warped by the pair transform. ``unet`` and ``cluster_head`` are the cluster
    network's.
    """

    def __init__(self, cluster_net: BIMClusterNet, projector_dim: int = 256, dense_projector: bool = False) -> None:
        super().__init__()
        if not isinstance(cluster_net, BIMClusterNet):
            raise TypeError(f"cluster_net: expected a bim.pretrain.model.BIMClusterNet, got {type(cluster_net).__name__}")
        self.cluster_net = cluster_net
        self.global_projector = GlobalProjector(cluster_net.features[4], projector_dim, projector_dim)
        self.dense_projector = DenseProjector(cluster_net.cluster_head.in_channels) if dense_projector else None

    @property
    def unet(self) -> nn.Module:
        return self.cluster_net.unet

    @property
    def cluster_head(self) -> ClusterHead:
        return self.cluster_net.cluster_head

    def forward(self, x: torch.Tensor, ablate_levels=()) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cluster_net.embeddings(x, [int(k) for k in ablate_levels] or None)

    def global_embedding(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder output only (``down_4``), without running the decoder."""
        return self.cluster_net.encoder_features(x)[-1]

    def cluster_map_probs(self, x: torch.Tensor, ablate_levels=()) -> torch.Tensor:
        """See :meth:`BIMClusterNet.cluster_map_probs`."""
        return self.cluster_net.cluster_map_probs(x, ablate_levels)

    def subhead_map_probs(self, x: torch.Tensor) -> torch.Tensor:
        """See :meth:`BIMClusterNet.subhead_map_probs`."""
        return self.cluster_net.subhead_map_probs(x)


def upgrade_pretrain_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A :class:`BIMPretrainNet` state dict of a checkpoint written before pretrain_bim 0.3.0 (U-Net as ``unet.*``
    with its untrained ``final_conv``, ``cluster_head.*`` at the top) in today's names (``cluster_net.unet.*``,
    ``cluster_net.cluster_head.*``); a state dict in today's names is returned as it is."""
    if any(k.startswith("cluster_net.") for k in state):
        return dict(state)
    out = {}
    for k, v in state.items():
        if k.startswith("unet.final_conv."):
            continue
        out[f"cluster_net.{k}" if k.startswith(("unet.", "cluster_head.")) else k] = v
    return out
