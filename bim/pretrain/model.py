"""The pre-training network: the paper's U-Net plus its cluster, global and (for the baseline) dense heads."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..network import PAPER_FEATURES, backbone_state_dict, build_unet, dense_channels, unet_embeddings

from .heads import ClusterHead, DenseProjector, GlobalProjector


class BIMPretrainNet(nn.Module):
    """U-Net ``unet`` (a MONAI BasicUNet, saved as plain BasicUNet weights) with

    - ``cluster_head``: 1x1 conv -> K-way softmax on the dense embedding (``upcat_1``; ``upcat_<dense_level>``
      with ``dense_level`` > 1), ``num_subheads`` copies;
    - ``global_projector``: avg pool -> MLP -> L2 norm on the global embedding (``down_4``), for L_con;
    - ``dense_projector`` (optional): the Chaitanya et al. local-contrast projector on the dense embedding.

    ``forward(x)`` returns ``(global_embedding, dense_embedding)``; heads are applied by the trainer, which
    needs the dense embedding both as it is and warped by the pair transform.
    """

    def __init__(
        self,
        num_clusters: int = 40,
        num_subheads: int = 3,
        features: Sequence[int] = PAPER_FEATURES,
        projector_dim: int = 256,
        dense_projector: bool = False,
        in_channels: int = 1,
        dense_level: int = 1,
        unet_style: str = "monai",
    ) -> None:
        super().__init__()
        dense = dense_channels(features, dense_level)  # validates dense_level
        self.dense_level = int(dense_level)
        self.unet = build_unet(in_channels=in_channels, out_channels=1, features=features, unet_style=unet_style)
        self.cluster_head = ClusterHead(dense, num_clusters, num_subheads)
        self.global_projector = GlobalProjector(features[4], projector_dim, projector_dim)
        self.dense_projector = DenseProjector(dense) if dense_projector else None

    def forward(self, x: torch.Tensor, ablate_levels=()) -> tuple[torch.Tensor, torch.Tensor]:
        return unet_embeddings(self.unet, x, ablate_levels, self.dense_level)

    def cluster_map_probs(self, x: torch.Tensor, ablate_levels=()) -> torch.Tensor:
        """The first sub-head's cluster probabilities [B, K, H, W] at the image's resolution (a dense embedding from
        a deeper decoder block, ``dense_level`` > 1, is upsampled by nearest neighbour): what the panels and the
        cluster scores show. ``ablate_levels``: see :func:`bim.network.unet_embeddings`."""
        probs = self.cluster_head(self(x, ablate_levels)[1])[0]
        if probs.shape[-2:] != x.shape[-2:]:
            probs = F.interpolate(probs, size=x.shape[-2:], mode="nearest")
        return probs

    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        """BasicUNet weights without the untrained ``final_conv`` (what ``model.pt`` holds)."""
        return backbone_state_dict(self.unet)
