"""How visible each labelled border is in L_CC's edge map, per edge power: a guide to ``edge_power`` on a data set.

    python tools/border_edges.py --dataset_dir DIR [--split training] [--powers 0.5,0.75,1] [--near_px 30]
        [--max_scans 200] [--out PATH]

L_CC correlates the clusters' boundaries with the edge map min-max(|grad I|)^power (pretrain_bim's ``edge_power``:
the authors' 0.75 on ACDC, 0.5 on prostate MR). For the labelled ``split`` scans of a data_prep data set, this prints
for each power the mean edge value on every border between two touching classes, its contrast (that mean over the
mean edge value within ``near_px`` pixels of the labelled structures) and how many pixel pairs it rests on
(:func:`bim.pretrain.cluster_quality.border_edge_strength`). A lower power evens out strong and weak borders; a
higher one lifts the borders out of their surroundings. ``--out`` writes the numbers as JSON (atomically).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bim.flags import comma_floats  # noqa: E402
from bim.inference import atomic_write_text  # noqa: E402
from bim.pretrain.cluster_quality import border_edge_strength, labelled_volumes  # noqa: E402


def main(dataset_dir: str, split: str = "training", powers="0.5,0.75,1", near_px: int = 30, max_scans: int = 200,
         out: str | None = None) -> None:
    try:
        power_list = comma_floats(powers, "--powers")
        if not power_list:
            raise ValueError(f"--powers: expected at least one edge power such as 0.5,0.75,1, got {powers!r}")
    except ValueError as err:
        raise SystemExit(str(err)) from None
    images, labels, names = labelled_volumes(dataset_dir, split, int(max_scans), "the borders are the labels' borders")
    results = [border_edge_strength(images, labels, names, p, int(near_px)) for p in power_list]
    for r in results:
        borders = ", ".join(f"{k} {v['mean']:.3f} (x{v['contrast']:.2f}, {v['pixel_pairs']} pixel pairs)"
                            for k, v in sorted(r["borders"].items()))
        print(f"power {r['power']:g}: within {r['near_px']} px of the structures {r['neighbourhood_mean']:.3f}; "
              f"borders {borders} ({r['scans']} {split} scans)")
    if out:
        atomic_write_text(json.dumps({"split": split, "results": results}, indent=2), Path(out))


if __name__ == "__main__":
    import fire

    fire.Fire(main)
