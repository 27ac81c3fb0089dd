"""The cluster quality of a clustering that knows nothing but intensity (or intensity and its surroundings): the
floor a pre-training's clusters must clear before they can be said to follow the anatomy.

    python tools/cluster_reference.py --dataset_dir DIR [--split validation] [--num_clusters 40]
        [--context_sigmas 2,4,8] [--out PATH]

Each pixel of the labelled ``split`` scans of a data_prep data set gets its intensity's bin among ``num_clusters``
bins of equal pixel count (edges shared by all scans) or, with ``--context_sigmas``, its cluster among the k-means
centres of intensity and its in-plane Gaussian smoothings at those widths in pixels (fitted on all scans together),
and the clusters are scored as pretrain_bim scores its clusters at the end of a run (``cluster_quality.json``: best-cluster Dice per structure, pooled over the scans, per scan,
many-to-one, NMI; :mod:`bim.pretrain.cluster_quality`). Prints one line per structure and the NMI; ``--out`` also
writes the scores as JSON (atomically).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bim.flags import comma_floats  # noqa: E402
from bim.inference import atomic_write_text  # noqa: E402
from bim.pretrain.cluster_quality import intensity_reference  # noqa: E402


def main(dataset_dir: str, split: str = "validation", num_clusters: int = 40, context_sigmas=(),
         out: str | None = None) -> None:
    try:
        sigmas = comma_floats(context_sigmas, "--context_sigmas", "2,4,8 (pixel widths)")
    except ValueError as err:
        raise SystemExit(str(err)) from None
    result = intensity_reference(dataset_dir, split, int(num_clusters), context_sigmas=sigmas)
    for name, c in result["classes"].items():
        print(f"{name}: best-cluster Dice {100 * c['pooled_dice']:.1f} (per scan {100 * c['per_scan_dice']:.1f}, "
              f"many-to-one {100 * c['many_to_one_dice']:.1f})")
    print(f"NMI {result['nmi']:.3f} ({result['scans']} {split} scans, {result['clustering']})")
    if out:
        atomic_write_text(json.dumps(result, indent=2), Path(out))


if __name__ == "__main__":
    import fire

    fire.Fire(main)
