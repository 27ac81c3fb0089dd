"""Ignite handlers of the pre-training bundle (cluster panels, the final weights file) and the cluster panel of its
inference."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from ignite.engine import Engine, Events

from ..data import SliceStore
from ..engine import atomic_save, unwrap
from ..gpu_augment import crop_matrices, warp
from ..images import gray_rgb, save_png, tile_rows

from . import losses as L

logger = logging.getLogger("bim")


def cluster_palette(k: int) -> np.ndarray:
    """``k`` distinguishable RGB colours (golden-angle hues, alternating brightness), uint8 [k, 3]."""
    import colorsys

    cols = [colorsys.hsv_to_rgb((i * 0.618033988749895) % 1.0, 0.85, 0.95 if i % 2 == 0 else 0.65) for i in range(k)]
    return (np.asarray(cols) * 255).astype(np.uint8)


class ClusterPanelHandler:
    """Every ``interval`` iterations (and at the end) writes ``output_dir/clusters_iterNNNNNN.png`` and
    ``clusters_latest.png``: one row per slice, columns image | cluster map (argmax, fixed palette) |
    cluster-entropy map | edge map, and logs the marginal entropy and the number of clusters in use on these
    slices (a collapse detector) to the console and to ``engine.state.metrics``.

    The cluster map is drawn with :func:`cluster_palette`, not ``monai.visualize.blend_images``: that overlays a
    label on the image with a colour map scaled by each label's maximum, so a cluster's colour would change from slice
    to slice and panel to panel, and cluster 0, a cluster like any other, would be left uncoloured as background."""

    def __init__(self, store: SliceStore, output_dir: str, interval: int = 200, num_slices: int = 4, crop_size: int = 224,
                 edge: str = "sobel", edge_power: float = 0.75):
        self.output_dir, self.interval, self.crop_size = Path(output_dir), int(interval), int(crop_size)
        self.edge, self.edge_power = edge, edge_power
        n = store.num_slices
        # middle slice of a few scans, spread over the store
        scans = np.linspace(0, len(store.scans) - 1, num=min(num_slices, len(store.scans))).round().astype(int)
        picks = []
        for s in scans:
            idx = torch.nonzero(store.scan_index.cpu() == int(s)).flatten()
            picks.append(int(idx[len(idx) // 2]))
        picks = picks or [n // 2]
        images = store.image[torch.as_tensor(picks, device=store.image.device)]
        m = crop_matrices(len(picks), tuple(images.shape[-2:]), (self.crop_size, self.crop_size), random=False)
        self.images = warp(images, m, (self.crop_size, self.crop_size))

    def attach(self, engine: Engine) -> None:
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        engine.add_event_handler(Events.ITERATION_COMPLETED(every=self.interval), self)
        engine.add_event_handler(Events.COMPLETED, self)

    @torch.no_grad()
    def render(self, model) -> tuple[np.ndarray, dict]:
        was_training = model.training
        model.eval()
        x = self.images.to(next(model.parameters()).device)
        probs = model.cluster_map_probs(x).float()
        if was_training:
            model.train()
        usage = L.cluster_usage(probs)
        clusters = probs.argmax(1).cpu().numpy()
        ent = L.normalised_entropy_map(probs)[:, 0].cpu().numpy()
        edge_fn = L.sobel_edge_map if self.edge == "sobel" else (lambda t: L.gradient_power_edge_map(t, self.edge_power))
        edges = edge_fn(x.float())[:, 0].cpu().numpy()
        palette = cluster_palette(probs.shape[1])
        rows = [[gray_rgb(x[i, 0].float().cpu().numpy()), palette[clusters[i]], gray_rgb(ent[i]), gray_rgb(edges[i])]
                for i in range(x.shape[0])]
        return tile_rows(rows), {k: float(v) for k, v in usage.items()}

    def __call__(self, engine: Engine) -> None:
        it = engine.state.iteration
        if getattr(self, "_last_iteration", None) == it:  # COMPLETED right after an interval: already drawn
            return
        self._last_iteration = it
        panel, usage = self.render(unwrap(engine.network))  # eager: no recompilation for the panel
        save_png(panel, self.output_dir / f"clusters_iter{it:06d}.png")
        save_png(panel, self.output_dir / "clusters_latest.png")
        for k, v in usage.items():
            engine.state.metrics[f"panel_{k}"] = v
        logger.info(
            f"iteration {it}: cluster panel written; marginal entropy {usage['marginal_entropy']:.3f}, "
            f"clusters in use {int(usage['clusters_in_use'])}"
        )


class SaveClusterNetwork:
    """At the end of training writes ``path`` (``model.pt``): the state dict of the pre-training network's
    :class:`~bim.pretrain.model.BIMClusterNet` (the bundle's ``network_def``: ``unet.*``, the U-Net without
    ``final_conv``, and ``cluster_head.*``), plain tensors loadable with ``torch.load(..., weights_only=True)``."""

    def __init__(self, path: str):
        self.path = Path(path)

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.COMPLETED, self)

    def __call__(self, engine: Engine) -> None:
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        model = unwrap(engine.network)
        atomic_save({k: v.detach().cpu() for k, v in model.cluster_net.state_dict().items()}, self.path)
        logger.info(f"pre-trained cluster network (U-Net + cluster head) written to {self.path}")


class ClusterPanelWriterd:
    """A transform of ``inference.json``'s postprocessing, before the inverse: writes
    ``output_dir/<scan>_clusters.png`` with one row per slice (``num_slices`` slices evenly spread over the scan,
    the first and last left out) and columns image | cluster map (argmax over K of ``pred_key``, the palette of the
    training panels), both in the network's geometry (resampled). Returns ``data`` unchanged."""

    def __init__(self, output_dir: str, image_key: str = "image", pred_key: str = "pred", num_slices: int = 3):
        if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
            raise ValueError(f"num_slices: expected a positive int, got {num_slices!r}")
        self.output_dir, self.image_key, self.pred_key, self.num_slices = Path(output_dir), image_key, pred_key, num_slices

    def __call__(self, data: dict) -> dict:
        image, pred = data[self.image_key], data[self.pred_key]
        if image.ndim != 4 or pred.ndim != 4 or tuple(image.shape[1:]) != tuple(pred.shape[1:]):
            raise ValueError(f"{self.image_key!r} and {self.pred_key!r}: expected [1, H, W, D] and [K, H, W, D] of the "
                             f"same size, got {tuple(image.shape)} and {tuple(pred.shape)}")
        volume = torch.as_tensor(image)[0].float().cpu().numpy()
        clusters = torch.as_tensor(pred).argmax(0).cpu().numpy()
        palette = cluster_palette(pred.shape[0])
        depth = volume.shape[-1]
        slices = sorted({int(z) for z in np.linspace(0, depth - 1, self.num_slices + 2)[1:-1].round()}) or [0]
        rows = [[gray_rgb(volume[..., z]), palette[clusters[..., z]]] for z in slices]
        source = Path(str(getattr(image, "meta", {}).get("filename_or_obj", "scan")))
        name = source.name.removesuffix(".gz").removesuffix(".nii")
        path = save_png(tile_rows(rows), self.output_dir / f"{name}_clusters.png")
        logger.info(f"cluster panel of {source.name} (slices {slices}: image | clusters) -> {path}")
        return data
