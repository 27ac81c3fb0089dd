"""How well the pre-trained clusters match the anatomy, scored with labels the pre-training never saw.

Pre-training is label-free, but a data set's validation scans usually carry labels. Scoring the cluster maps
against them tells, without any fine-tuning, whether a variant's clusters *mean the same thing in every scan*
-- the property that separated the full method from Ours (Dec) in ``docs/results`` (the cluster panels of acdc_fast).

For each labelled structure c and cluster k, with n_kc the pixels of cluster k inside c:

- **pooled Dice**: ``max_k 2 n_kc / (n_k + n_c)`` over the counts of all scans together, i.e. one cluster
  must stand for c in every scan;
- **per-scan Dice**: the same maximum taken in each scan separately, then averaged (each scan may pick its own
  cluster: an upper bound of the pooled Dice);
- **consistency** = pooled / per-scan (near 1: the same cluster everywhere; it can exceed 1 a little, as the
  pooled Dice weighs scans by their size);
- **precision** ``n_kc / n_k`` and **recall** ``n_kc / n_c`` of the pooled best cluster k: a low precision means
  that cluster also covers other tissue, a low recall that the structure is split over several clusters;
- **composition** of that cluster: the share of its pixels in each class (background and every class, the
  structure's own share being its precision), i.e. *which* other tissue a low precision takes in (a myocardium
  cluster that spills into the LV cavity and one that spills outwards have the same precision);
- **spill** of that cluster: the share of its pixels outside the structure that lie within 1-3, 4-10 and more
  than 10 pixels of it in their slice (in-plane chessboard distance; 1 mm pixels on a prepared ACDC scan), so that
  precision + spill = 1: a cluster that straddles the structure's border spills within 3 pixels, one that also
  takes in tissue of the same look elsewhere (other muscle for the myocardium) spills far;
- **many-to-one Dice**: each cluster is given the class most of its pooled pixels have, and the union of the
  clusters given c is scored against c (the usual score of over-clustering, as in IIC): a structure split over
  several clusters that cover nothing else scores 1 here but less in the best-cluster Dice;
- **NMI** between cluster and label over all pixels: ``I(K; C) / sqrt(H(K) H(C))``.

These are the first sub-head's scores on the whole slice (what the panels show). The same scores are written for
every sub-head (each an independent clustering of the same embedding, so they say how much a score owes to one
head's initialisation; the spill for the first only) and for the first sub-head inside the centre 224 x 224 window of
each slice (the authors' field of view on ACDC, where fewer tissues outside the heart share a cluster with a
structure).

:func:`intensity_reference` scores a clustering of intensity alone the same way (``tools/cluster_reference.py``): the
floor a pre-training's clusters must clear before they can be said to follow the anatomy.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
from ignite.engine import Engine, Events

from ..data import read_items, resolve_dataset_dir, volume_loader
from ..distributed import all_gather_objects, rank_and_world, share_bounds
from ..engine import load_weights, unwrap
from ..inference import SliceBatchInferer, atomic_write_text
from .model import upgrade_pretrain_state_dict

logger = logging.getLogger("bim")


def contingency(clusters: torch.Tensor, labels: torch.Tensor, num_clusters: int, num_classes: int) -> torch.Tensor:
    """Pixel counts n_kc [K, C] of cluster index ``k`` (``clusters``) and class ``c`` (``labels``), same shape."""
    if clusters.shape != labels.shape:
        raise ValueError(f"clusters {tuple(clusters.shape)} and labels {tuple(labels.shape)} must have the same shape")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes - 1}], got [{int(labels.min())}, {int(labels.max())}]")
    flat = clusters.long().flatten() * num_classes + labels.long().flatten()
    return torch.bincount(flat, minlength=num_clusters * num_classes).view(num_clusters, num_classes).double()


SPILL_BANDS_PX = (3, 10)  # the spill's distance bands: 1-3, 4-10 and > 10 pixels from the structure


def spill_counts(clusters: torch.Tensor, labels: torch.Tensor, num_clusters: int, num_classes: int,
                 bands: tuple[int, ...] = SPILL_BANDS_PX) -> torch.Tensor:
    """Pixel counts [C, len(bands), K]: entry (c, b, k) counts the pixels of cluster ``k`` outside class ``c`` that
    lie within ``bands[b]`` pixels of class c in their slice (chessboard distance in the plane of the first two
    axes of the [H, W, D] maps ``clusters`` and ``labels``; cumulative over the bands). Class 0 (background) is not
    scored: its rows are 0."""
    if clusters.shape != labels.shape or labels.dim() != 3:
        raise ValueError(f"clusters {tuple(clusters.shape)} and labels {tuple(labels.shape)} must be [H, W, D] maps "
                         f"of the same shape")
    if not bands or any(not isinstance(r, int) or r < 1 for r in bands) or list(bands) != sorted(set(bands)):
        raise ValueError(f"bands must be increasing positive ints of pixels, got {bands!r}")
    slices = labels.permute(2, 0, 1).long()  # [D, H, W]
    flat_clusters = clusters.permute(2, 0, 1).long()
    out = torch.zeros(num_classes, len(bands), num_clusters, dtype=torch.float64)
    for c in range(1, num_classes):
        inside = (slices == c).float()[:, None]  # [D, 1, H, W]
        if not inside.any():
            continue
        for b, r in enumerate(bands):
            near = torch.nn.functional.max_pool2d(inside, 2 * r + 1, stride=1, padding=r)[:, 0] > 0
            ring = near & (slices != c)
            out[c, b] = torch.bincount(flat_clusters[ring], minlength=num_clusters).double()
    return out


def spill_shares(spill: torch.Tensor, k: int, c: int, cluster_size: float, outside: float,
                 bands: tuple[int, ...] = SPILL_BANDS_PX) -> dict[str, float]:
    """From pooled :func:`spill_counts` ``spill`` [C, B, K]: the shares of cluster ``k``'s ``cluster_size`` pixels
    that lie outside class ``c`` (``outside`` of them in all) in each distance band, the last band open
    ({"1-3px": .., "4-10px": .., ">10px": ..} for the default bands)."""
    if cluster_size <= 0:
        return {}
    within = [float(spill[c, b, k]) for b in range(len(bands))]
    edges = [0, *bands]
    shares = {f"{edges[b] + 1}-{edges[b + 1]}px": (within[b] - (within[b - 1] if b else 0.0)) / cluster_size
              for b in range(len(bands))}
    shares[f">{bands[-1]}px"] = (outside - within[-1]) / cluster_size
    return shares


def best_cluster_dice(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each class c of ``counts`` [K, C]: ``max_k 2 n_kc / (n_k + n_c)`` and the maximising cluster k.
    A class with no pixels gets NaN."""
    n_k = counts.sum(1, keepdim=True)
    n_c = counts.sum(0, keepdim=True)
    dice = 2 * counts / (n_k + n_c).clamp_min(1e-12)
    best, arg = dice.max(0)
    best = torch.where(n_c[0] > 0, best, torch.full_like(best, math.nan))
    return best, arg


def many_to_one_dice(counts: torch.Tensor) -> torch.Tensor:
    """Per class c of ``counts`` [K, C]: give each cluster k the class ``argmax_c n_kc`` and score the union U_c of
    the clusters given c: ``2 sum_{k in U_c} n_kc / (sum_{k in U_c} n_k + n_c)``. A class with no pixels gets NaN."""
    owner = torch.nn.functional.one_hot(counts.argmax(1), counts.shape[1]).to(counts.dtype)  # [K, C]
    tp = (owner * counts).sum(0)
    predicted = (owner * counts.sum(1, keepdim=True)).sum(0)
    n_c = counts.sum(0)
    dice = 2 * tp / (predicted + n_c).clamp_min(1e-12)
    return torch.where(n_c > 0, dice, torch.full_like(dice, math.nan))


def normalised_mutual_information(counts: torch.Tensor) -> float:
    """``I(K; C) / sqrt(H(K) H(C))`` from the joint counts [K, C] (0 when either side is constant).

    Written here: no dependency has the NMI of two labellings (Ignite's ``MutualInformation`` is the unnormalised
    I(X; Y) of predicted probability vectors, MONAI's ``GlobalMutualInformationLoss`` a Parzen-window loss between
    images; numpy and torch have none)."""
    p = counts / counts.sum().clamp_min(1e-12)
    pk, pc = p.sum(1, keepdim=True), p.sum(0, keepdim=True)
    nz = p > 0
    mi = (p[nz] * (p[nz] / (pk @ pc)[nz]).log()).sum()
    hk = -(pk[pk > 0] * pk[pk > 0].log()).sum()
    hc = -(pc[pc > 0] * pc[pc > 0].log()).sum()
    denom = (hk * hc).sqrt()
    return float(mi / denom) if denom > 0 else 0.0


def cluster_quality(per_scan_counts: list[torch.Tensor], class_names: dict[int, str],
                    per_scan_spill: list[torch.Tensor] | None = None) -> dict:
    """The scores of the module docstring from one [K, C] count matrix per scan; ``class_names`` maps the
    foreground class indices to be scored to their names (background is not scored). ``per_scan_spill``, one
    :func:`spill_counts` per scan, adds each best cluster's ``spill``."""
    if not per_scan_counts:
        raise ValueError("cluster_quality needs at least one scan")
    if per_scan_spill is not None and len(per_scan_spill) != len(per_scan_counts):
        raise ValueError(f"expected one spill count per scan ({len(per_scan_counts)}), got {len(per_scan_spill)}")
    spill = torch.stack(per_scan_spill).sum(0) if per_scan_spill else None
    pooled = torch.stack(per_scan_counts).sum(0)
    pooled_dice, pooled_cluster = best_cluster_dice(pooled)
    pooled_m2o = many_to_one_dice(pooled)
    n_k, n_c = pooled.sum(1), pooled.sum(0)
    class_label = {c: class_names.get(c, "background" if c == 0 else str(c)) for c in range(pooled.shape[1])}
    per_scan = torch.stack([best_cluster_dice(c)[0] for c in per_scan_counts])  # [S, C]
    out = {"scans": len(per_scan_counts), "num_clusters": int(pooled.shape[0]), "nmi": normalised_mutual_information(pooled),
           "classes": {}}
    for c, name in sorted(class_names.items()):
        scan_dice = per_scan[:, c][~per_scan[:, c].isnan()]
        mean_scan = float(scan_dice.mean()) if scan_dice.numel() else math.nan
        pooled_c, k = float(pooled_dice[c]), int(pooled_cluster[c])
        out["classes"][name] = {
            "pooled_dice": pooled_c,
            "per_scan_dice": mean_scan,
            "consistency": pooled_c / mean_scan if mean_scan > 0 else math.nan,
            "cluster": k,
            "precision": float(pooled[k, c] / n_k[k]) if n_k[k] > 0 else math.nan,
            "recall": float(pooled[k, c] / n_c[c]) if n_c[c] > 0 else math.nan,
            "composition": {class_label[j]: float(pooled[k, j] / n_k[k]) if n_k[k] > 0 else math.nan
                            for j in range(pooled.shape[1])},
            "many_to_one_dice": float(pooled_m2o[c]),
        }
        if spill is not None:
            out["classes"][name]["spill"] = spill_shares(spill, k, c, float(n_k[k]), float(n_k[k] - pooled[k, c]))
    return out


def labelled_scans(dataset_dir, split: str, max_scans: int) -> tuple[list[dict], dict[int, str]]:
    """The first ``max_scans`` labelled items of ``split`` in a data_prep data set, and its foreground label names
    {index: name} (background not scored)."""
    items = [it for it in read_items(dataset_dir, split) if "label" in it][:max_scans]
    datalist = json.loads((resolve_dataset_dir(dataset_dir) / "datalist.json").read_text())
    return items, {int(k): v for k, v in datalist.get("labels", {}).items() if int(k) > 0}


def labelled_volumes(dataset_dir, split: str, max_scans: int, why: str):
    """The images and label maps ([H, W, D] tensors) of the first ``max_scans`` labelled ``split`` scans of a
    data_prep data set, read as the pre-training's cluster quality reads them, and its foreground label names; a
    data set without them is refused, the message ending with ``why`` they are needed."""
    items, names = labelled_scans(dataset_dir, split, max_scans)
    if not items or not names:
        raise ValueError(f"{dataset_dir}: no labelled {split!r} scans (or no label names in datalist.json): {why}")
    load = volume_loader(with_label=True)
    scans = [load(it) for it in items]
    return [torch.as_tensor(d["image"]) for d in scans], [torch.as_tensor(d["label"]).long() for d in scans], names


def intensity_bin_counts(images: list[torch.Tensor], labels: list[torch.Tensor], num_clusters: int, num_classes: int,
                         max_samples: int = 4_000_000) -> list[torch.Tensor]:
    """A clustering that knows nothing but intensity, as the floor a learned clustering must clear: each pixel's
    cluster is its intensity's bin among ``num_clusters`` bins of equal pixel count, the bin edges the quantiles of
    all scans' pixels together (so one cluster means the same intensity range in every scan; at most
    ``max_samples`` pixels, evenly strided, set the edges). Returns one [K, C] count matrix per scan (C =
    ``num_classes``), as :func:`cluster_quality` takes them."""
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 2:
        raise ValueError(f"num_clusters must be an int >= 2, got {num_clusters!r}")
    if not images or len(images) != len(labels):
        raise ValueError(f"expected as many label maps as images (at least one), got {len(images)} and {len(labels)}")
    pixels = torch.cat([im.float().flatten() for im in images])
    pixels = pixels[:: max(1, math.ceil(pixels.numel() / max_samples))]
    edges = torch.quantile(pixels, torch.linspace(0, 1, num_clusters + 1)[1:-1])
    return [contingency(torch.bucketize(im.float(), edges), lab, num_clusters, num_classes)
            for im, lab in zip(images, labels)]


def context_features(image: torch.Tensor, sigmas: tuple[float, ...]) -> torch.Tensor:
    """Per pixel of an [H, W, D] scan: its intensity and the intensity's in-plane Gaussian smoothings at ``sigmas``
    (pixels; each slice on its own, MONAI's ``GaussianFilter``), as [H * W * D, 1 + len(sigmas)] features."""
    from monai.networks.layers import GaussianFilter

    slices = image.float().permute(2, 0, 1)[:, None]  # [D, 1, H, W]
    maps = [slices] + [GaussianFilter(2, float(s))(slices) for s in sigmas]
    return torch.cat(maps, 1).permute(2, 3, 0, 1).reshape(-1, len(maps))  # (h, w, d) order, as image.flatten()


def kmeans(points: torch.Tensor, num_clusters: int, generator: torch.Generator, iterations: int = 100) -> torch.Tensor:
    """Lloyd's k-means of ``points`` [N, F] with k-means++ seeding from ``generator``; returns the [K, F] centres
    (iterations stop early once no point changes its cluster). No dependency has one (MONAI and torch do not)."""
    points = points.double()
    centres = points[torch.randint(len(points), (1,), generator=generator)]
    for _ in range(1, num_clusters):  # k-means++: the next centre drawn in proportion to the squared distance
        d2 = torch.cdist(points, centres).min(1).values.square()
        centres = torch.cat([centres, points[torch.multinomial(d2 / d2.sum(), 1, generator=generator)]])
    assign = None
    for _ in range(iterations):
        new = torch.cdist(points, centres).argmin(1)
        if assign is not None and torch.equal(new, assign):
            break
        assign = new
        sums = torch.zeros_like(centres).index_add_(0, assign, points)
        sizes = torch.bincount(assign, minlength=num_clusters).double()[:, None]
        centres = torch.where(sizes > 0, sums / sizes.clamp_min(1), centres)  # an emptied cluster keeps its centre
    return centres


def context_kmeans_counts(images: list[torch.Tensor], labels: list[torch.Tensor], num_clusters: int, num_classes: int,
                          sigmas: tuple[float, ...] = (2.0, 4.0, 8.0), max_samples: int = 200_000,
                          seed: int = 0) -> list[torch.Tensor]:
    """A clustering that knows intensity and its surroundings, but nothing learned: the k-means (``num_clusters``
    centres, fitted on at most ``max_samples`` pixels of all scans together, evenly strided) of each pixel's
    :func:`context_features`, each feature standardised over those pixels; every pixel then takes its nearest centre,
    so one cluster means the same look in every scan. A myocardium that shares its intensity with other muscle, but
    not its bright surroundings, can be one cluster here and not among intensity bins. Returns one [K, C] count
    matrix per scan (C = ``num_classes``), as :func:`cluster_quality` takes them."""
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 2:
        raise ValueError(f"num_clusters must be an int >= 2, got {num_clusters!r}")
    if not images or len(images) != len(labels):
        raise ValueError(f"expected as many label maps as images (at least one), got {len(images)} and {len(labels)}")
    if any(not s > 0 for s in sigmas):
        raise ValueError(f"sigmas must be positive pixel widths, got {sigmas!r}")
    features = [context_features(im, tuple(sigmas)) for im in images]
    pooled = torch.cat(features)
    sample = pooled[:: max(1, math.ceil(len(pooled) / max_samples))].double()
    mean, std = sample.mean(0), sample.std(0).clamp_min(1e-12)
    centres = kmeans((sample - mean) / std, num_clusters, torch.Generator().manual_seed(seed))
    counts = []
    for f, lab in zip(features, labels):
        clusters = torch.cat([torch.cdist((chunk.double() - mean) / std, centres).argmin(1)
                              for chunk in f.split(1 << 18)])
        counts.append(contingency(clusters, lab.flatten(), num_clusters, num_classes))
    return counts


def intensity_reference(dataset_dir, split: str = "validation", num_clusters: int = 40, max_scans: int = 50,
                        context_sigmas: tuple[float, ...] = ()) -> dict:
    """:func:`cluster_quality` of :func:`intensity_bin_counts` (or, with ``context_sigmas``, of
    :func:`context_kmeans_counts` at those smoothings) on the labelled ``split`` scans of a data_prep data set, read
    as the pre-training's cluster quality reads them (the same scans, the same normalised intensities)."""
    images, labels, names = labelled_volumes(dataset_dir, split, max_scans,
                                             "the reference clustering is scored against labels")
    if context_sigmas:
        counts = context_kmeans_counts(images, labels, num_clusters, max(names) + 1, tuple(context_sigmas))
        clustering = (f"k-means, {num_clusters} clusters, of intensity and its Gaussian smoothings at "
                      f"{', '.join(f'{s:g}' for s in context_sigmas)} pixels")
    else:
        counts = intensity_bin_counts(images, labels, num_clusters, max(names) + 1)
        clustering = f"intensity, {num_clusters} equal-count bins"
    return {"split": split, "clustering": clustering, **cluster_quality(counts, names)}


def border_edge_strength(images: list[torch.Tensor], labels: list[torch.Tensor], class_names: dict[int, str],
                         power: float = 0.75, near_px: int = 30) -> dict:
    """How visible each border between two labelled classes is in L_CC's edge map (the authors' min-max normalised
    |grad I|^power of each slice, :func:`bim.pretrain.losses.gradient_power_edge_map`): per pair of classes that
    touch (``"Myo|LV"``, background included as ``"background"``), the mean edge value on their border (over the
    4-neighbour pixel pairs of the two classes, the larger of the pair's two values) and its ``contrast``, that mean
    over the mean edge value of all pixels within ``near_px`` pixels of a labelled structure. A border that L_CC can
    align a cluster boundary with stands out of its surroundings (contrast well above 1). ``images`` and ``labels``
    are [H, W, D] scans; the edge map is taken over each whole slice (pre-training takes it over its crop)."""
    from .losses import gradient_power_edge_map

    if not images or len(images) != len(labels):
        raise ValueError(f"expected as many label maps as images (at least one), got {len(images)} and {len(labels)}")
    if isinstance(near_px, bool) or not isinstance(near_px, int) or near_px < 1:
        raise ValueError(f"near_px must be a positive int of pixels, got {near_px!r}")
    names = {0: "background", **class_names}
    num_classes = max(names) + 1
    sums = torch.zeros(num_classes * num_classes, dtype=torch.float64)
    pairs = torch.zeros_like(sums)
    near_sum = near_count = 0.0
    for image, label in zip(images, labels):
        edge = gradient_power_edge_map(image.float().permute(2, 0, 1)[:, None], power)[:, 0].double()  # [D, H, W]
        lab = label.long().permute(2, 0, 1)
        for dim in (1, 2):  # vertical, then horizontal neighbours
            a, b = lab.narrow(dim, 0, lab.shape[dim] - 1), lab.narrow(dim, 1, lab.shape[dim] - 1)
            value = torch.maximum(edge.narrow(dim, 0, edge.shape[dim] - 1), edge.narrow(dim, 1, edge.shape[dim] - 1))
            border = a != b
            key = torch.minimum(a, b)[border] * num_classes + torch.maximum(a, b)[border]
            sums += torch.bincount(key, weights=value[border], minlength=sums.numel())
            pairs += torch.bincount(key, minlength=sums.numel()).double()
        near = (lab > 0).float()[:, None]  # dilated by a (2 near_px + 1)-pixel square: a column pass, then a row pass
        near = torch.nn.functional.max_pool2d(near, (2 * near_px + 1, 1), 1, (near_px, 0))
        near = torch.nn.functional.max_pool2d(near, (1, 2 * near_px + 1), 1, (0, near_px))[:, 0] > 0
        near_sum, near_count = near_sum + float(edge[near].sum()), near_count + int(near.sum())
    neighbourhood = near_sum / near_count if near_count else math.nan
    borders = {}
    for key in torch.nonzero(pairs).flatten().tolist():
        lo, hi = divmod(key, num_classes)
        if lo in names and hi in names:
            mean = float(sums[key] / pairs[key])
            borders[f"{names[hi]}|{names[lo]}" if lo == 0 else f"{names[lo]}|{names[hi]}"] = {
                "mean": mean, "contrast": mean / neighbourhood if neighbourhood > 0 else math.nan,
                "pixel_pairs": int(pairs[key])}
    return {"edge": "gradient_power", "power": float(power), "near_px": near_px, "scans": len(images),
            "neighbourhood_mean": neighbourhood, "borders": borders}


class ClusterQualityHandler:
    """At the end of pre-training (ignite ``COMPLETED``) scores the cluster maps of the model on the labelled
    ``split`` scans of ``dataset_dir`` (see the module docstring) and writes ``path`` (JSON, atomically); also
    logs one line. In a multi-GPU run each rank scores its block of the scans and rank 0 writes the scores of the
    gathered counts, the same as one process's. A data set whose ``split`` list is empty or unlabelled (e.g. a folder of unlabelled NIfTI
    files) is skipped with a log line: the scores need labels, the pre-training does not."""

    def __init__(self, dataset_dir, path: str, split: str = "validation", enabled: bool = True, max_scans: int = 50,
                 center_crop: int | None = 224):
        self.dataset_dir, self.path, self.split = dataset_dir, Path(path), split
        self.enabled, self.max_scans = bool(enabled), int(max_scans)
        if center_crop is not None and (isinstance(center_crop, bool) or not isinstance(center_crop, int) or center_crop < 1):
            raise ValueError(f"center_crop must be null or a positive int of pixels, got {center_crop!r}")
        self.center_crop = center_crop

    def attach(self, engine: Engine) -> None:
        if self.enabled:  # on every rank of a multi-GPU run: each scores its share of the scans (see score)
            engine.add_event_handler(Events.COMPLETED, self)

    def _labelled_items(self) -> tuple[list[dict], dict[int, str]]:
        return labelled_scans(self.dataset_dir, self.split, self.max_scans)

    def _scan_clusters(self, model, ablate_levels=(), items=None):
        """Per labelled ``split`` scan (or per entry of ``items``): (cluster index map, label map), both [H, W, D] on
        the CPU, in eval mode; ``ablate_levels`` as :meth:`bim.pretrain.model.BIMClusterNet.embeddings`'."""
        items = self._labelled_items()[0] if items is None else items
        device = next(model.parameters()).device
        load, infer = volume_loader(with_label=True), SliceBatchInferer(divisor=16, max_slices=16)

        def cluster_probs(x):
            return model.cluster_map_probs(x, ablate_levels)

        for it in items:
            d = load(it)
            image = torch.as_tensor(d["image"], device=device)[None, None]  # [1, 1, H, W, D]
            yield infer(image, cluster_probs).argmax(1)[0].cpu(), torch.as_tensor(d["label"]).long()

    def _num_clusters(self, model) -> int:
        return int(model.cluster_head.num_clusters)

    def _scan_subhead_clusters(self, model, items):
        """Per entry of ``items``: (cluster index maps [S, H, W, D] of the S sub-heads, label map [H, W, D]), on the
        CPU, in eval mode. A model without ``subhead_map_probs`` counts as one sub-head (``cluster_map_probs``)."""
        subhead_probs = getattr(model, "subhead_map_probs", None)
        if subhead_probs is None:
            for clusters, label in self._scan_clusters(model, items=items):
                yield clusters[None], label
            return
        device, k = next(model.parameters()).device, self._num_clusters(model)
        load, infer = volume_loader(with_label=True), SliceBatchInferer(divisor=16, max_slices=16)
        for it in items:
            d = load(it)
            image = torch.as_tensor(d["image"], device=device)[None, None]  # [1, 1, H, W, D]
            probs = infer(image, subhead_probs)[0]  # [S * K, H, W, D]
            yield probs.view(-1, k, *probs.shape[1:]).argmax(1).cpu(), torch.as_tensor(d["label"]).long()

    def _center_window(self, volume: torch.Tensor) -> torch.Tensor:
        """The centre ``center_crop`` x ``center_crop`` window of every slice of ``volume`` [H, W, D] (the whole
        slice along an axis shorter than the window), placed as :class:`bim.inference.CenterCropSlicesd` places it."""
        from monai.transforms import CenterSpatialCrop

        window = CenterSpatialCrop((self.center_crop, self.center_crop, -1))(volume[None])[0]
        return window.as_tensor() if hasattr(window, "as_tensor") else window

    @torch.no_grad()
    def score(self, model) -> dict | None:
        """The scores of the module docstring for the first sub-head on the whole slice (the top-level entries),
        plus ``subheads`` (the same scores for every sub-head, the first included) and, when ``center_crop`` is
        set, ``center_crop`` (the first sub-head scored inside the centre window of each slice: the authors'
        field of view on ACDC)."""
        items, names = self._labelled_items()
        if not items or not names:
            logger.info(f"cluster quality: no labelled {self.split!r} scans (or no label names): not scored")
            return None
        was_training = model.training
        model.eval()
        rank, world = rank_and_world()
        start, stop = share_bounds(len(items), rank, world)  # each rank its block of scans, gathered in order
        num_clusters, num_classes = self._num_clusters(model), max(names) + 1
        counts, window, spill = [], [], []  # per scan: [S, K, C] of every sub-head; [K, C] in the window; spill
        for clusters, label in self._scan_subhead_clusters(model, items[start:stop]):
            counts.append(torch.stack([contingency(c, label, num_clusters, num_classes) for c in clusters]))
            spill.append(spill_counts(clusters[0], label, num_clusters, num_classes))
            if self.center_crop is not None:
                inner, inner_label = self._center_window(clusters[0]), self._center_window(label)
                window.append((contingency(inner, inner_label, num_clusters, num_classes),
                               spill_counts(inner, inner_label, num_clusters, num_classes)))
        counts = [c for share in all_gather_objects(counts) for c in share]
        window = [c for share in all_gather_objects(window) for c in share]
        spill = [c for share in all_gather_objects(spill) for c in share]
        if was_training:
            model.train()
        out = {"split": self.split, **cluster_quality([c[0] for c in counts], names, spill)}
        out["subheads"] = [cluster_quality([c[s] for c in counts], names, None if s else spill)
                          for s in range(counts[0].shape[0])]
        if self.center_crop is not None:
            out["center_crop"] = {"size": self.center_crop,
                                  **cluster_quality([w[0] for w in window], names, [w[1] for w in window])}
        return out

    @torch.no_grad()
    def path_dependence(self, model, levels=(0, 1, 2, 3, 4)) -> dict | None:
        """Which encoder levels the clusters are computed from. For each level k, the level's output reaches the
        decoder without its spatial information (its per-channel mean: ``ablate_levels=[k]`` of
        ``bim.pretrain.model.BIMClusterNet.embeddings``), and the cluster maps of the labelled ``split`` scans are compared
        with the intact ones:

        - ``changed``: the share of pixels whose cluster changes, over all pixels;
        - ``changed_in_structures``: the same inside the labelled structures (label > 0);
        - ``pooled_dice``: each structure's best single cluster Dice (as :func:`cluster_quality`) with level k ablated.

        Clusters made from shallow texture barely change when level 4 (the bottleneck) is ablated; clusters that
        use the deep, global features change there."""
        items, names = self._labelled_items()
        if not items or not names:
            logger.info(f"path dependence: no labelled {self.split!r} scans (or no label names): not scored")
            return None
        model.eval()
        intact = list(self._scan_clusters(model))
        num_classes = max(names) + 1
        out = {"split": self.split, "scans": len(intact), "levels": {}}
        for k in levels:
            changed = inside = total = total_inside = 0
            counts = []
            for (ref, label), (clusters, _) in zip(intact, self._scan_clusters(model, [k])):
                diff = clusters != ref
                changed, total = changed + int(diff.sum()), total + diff.numel()
                inside, total_inside = inside + int(diff[label > 0].sum()), total_inside + int((label > 0).sum())
                counts.append(contingency(clusters, label, self._num_clusters(model), num_classes))
            quality = cluster_quality(counts, names)["classes"]
            out["levels"][str(k)] = {
                "changed": changed / max(total, 1),
                "changed_in_structures": inside / max(total_inside, 1),
                "pooled_dice": {n: v["pooled_dice"] for n, v in quality.items()},
            }
        return out

    def __call__(self, engine: Engine) -> None:
        result = self.score(unwrap(engine.network))
        if rank_and_world()[0] == 0:
            self.write(result)

    def evaluate_checkpoint(self, network: torch.nn.Module, checkpoint: str) -> dict | None:
        """``evaluate.json``'s entry point: load the ``network`` entry of a pre-training checkpoint
        (``checkpoint_final.pt``/``checkpoint_last.pt``, loaded with ``weights_only``) into ``network``, score it
        and write ``path``."""
        load_pretrain_checkpoint(network, checkpoint)
        result = self.score(network)
        self.write(result)
        return result

    def evaluate_paths(self, network: torch.nn.Module, checkpoint: str) -> dict | None:
        """``path_dependence.json``'s entry point: load a pre-training checkpoint as :meth:`evaluate_checkpoint`
        does, write :meth:`path_dependence` to ``path`` and log one line."""
        load_pretrain_checkpoint(network, checkpoint)
        result = self.path_dependence(network)
        if result is not None:
            atomic_write_text(json.dumps(result, indent=2), self.path)
            summary = ", ".join(f"level {k} {v['changed']:.3f} ({v['changed_in_structures']:.3f})"
                                for k, v in result["levels"].items())
            logger.info(f"path dependence on {result['scans']} {self.split} scans, share of pixels whose cluster "
                        f"changes without a level's spatial information (inside the structures): {summary} -> {self.path}")
        return result

    def write(self, result: dict | None) -> None:
        if result is None:
            return
        atomic_write_text(json.dumps(result, indent=2), self.path)
        summary = ", ".join(f"{n} {v['pooled_dice']:.3f} (per scan {v['per_scan_dice']:.3f}, many-to-one "
                            f"{v['many_to_one_dice']:.3f})" for n, v in result["classes"].items())
        heads = "; ".join(f"sub-head {s}: " + ", ".join(f"{n} {v['pooled_dice']:.3f}" for n, v in h["classes"].items())
                          for s, h in enumerate(result.get("subheads", [])[1:], start=1))
        window = result.get("center_crop")
        window = (f"; centre {window['size']} x {window['size']}: " + ", ".join(
            f"{n} {v['pooled_dice']:.3f}" for n, v in window["classes"].items())) if window else ""
        logger.info(f"cluster quality on {result['scans']} {self.split} scans: best-cluster Dice {summary}; "
                    f"NMI {result['nmi']:.3f}{window}{'; ' + heads if heads else ''} -> {self.path}")


def load_pretrain_checkpoint(network: torch.nn.Module, checkpoint: str) -> None:
    """Load the ``network`` entry of a pretrain_bim ``checkpoint_*.pt`` (``weights_only``) into ``network``."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: pass the checkpoint_final.pt (or "
                                f"checkpoint_last.pt) of a pretrain_bim run as --checkpoint")
    state = load_weights(path, "--checkpoint", "pass the checkpoint_final.pt (or checkpoint_last.pt) of a pretrain_bim run",
                         next(network.parameters()).device)
    if "network" not in state:
        raise KeyError(f"{path} has no 'network' entry (keys {sorted(state)}): expected a pretrain_bim "
                       f"checkpoint_*.pt, not model.pt (which holds the cluster network without the projectors)")
    network.load_state_dict(upgrade_pretrain_state_dict(state["network"]))
