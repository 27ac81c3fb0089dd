"""Patient-level splits and nested labelled subsets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .common import DataPrepError, labelled_key, log, nested_draw, stratified_split

REFERENCE_DIR = Path(__file__).resolve().parent / "splits"
ACDC_REFERENCE = REFERENCE_DIR / "acdc_reference.json"

# paper: 175 / 8 / 17 scans of 200 = 88 / 4 / 8 patients of 100
ACDC_FRACTIONS = (0.04, 0.08)
# paper: 40 / 3 / 7 scans of 50
PROMISE_FRACTIONS = (3 / 50, 7 / 50)


def draw_labelled(
    train_units: Sequence[str],
    scans_of: dict[str, list[str]],
    counts: Sequence[int],
    seeds: Sequence[int],
    what: str = "scans",
) -> dict[str, list[str]]:
    """For each seed, nested subsets of `counts` scans from distinct training units (patients),
    one random scan (phase) per unit; the k-scan set is the prefix of the next larger one."""
    counts = sorted(set(int(c) for c in counts))
    fit = [c for c in counts if c <= len(train_units)]
    skipped = [c for c in counts if c > len(train_units)]
    if skipped:
        log.info(
            "labelled subsets of %s %s skipped: only %d training patients/cases",
            ",".join(map(str, skipped)), what, len(train_units),
        )
    out: dict[str, list[str]] = {}
    if not fit:
        return out
    for s in seeds:
        order = nested_draw(train_units, max(fit), s)
        rng = np.random.default_rng([int(s), 104729])
        picked = [scans_of[u][int(rng.integers(len(scans_of[u])))] for u in order]
        for c in fit:
            out[labelled_key(s, c)] = picked[:c]
    return out


def seeded_split(
    groups: dict[str, str],
    scans_of: dict[str, list[str]],
    fractions: tuple[float, float],
    seed: int,
    counts: Sequence[int],
    seeds: Sequence[int],
) -> dict:
    split = stratified_split(groups, fractions[0], fractions[1], seed)
    split["labelled"] = draw_labelled(split["training"], scans_of, counts, seeds)
    return split


def load_split_file(path: Path) -> dict:
    path = Path(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise DataPrepError(f"{path}: split file not found; expected a JSON split file") from None
    except (OSError, ValueError) as e:
        raise DataPrepError(f"{path}: cannot read split file ({e}); expected JSON") from None
    if not isinstance(d, dict) or not all(isinstance(d.get(k), list) for k in ("training", "validation", "test")):
        raise DataPrepError(
            f"{path}: expected a JSON object with lists 'training', 'validation', 'test' of patient ids "
            "(and optional 'labelled_seedS_K' lists of scan ids)"
        )
    return d


def apply_split_file(
    d: dict,
    present: dict[str, list[str]],
    path_label: str,
    seeds: Sequence[int],
    counts: Sequence[int],
    strict: bool,
) -> dict:
    """Restrict a stored split (reference or --split) to the present patients, keeping each patient's
    role and the present labelled scans; a labelled subset that becomes empty is redrawn (seeded)
    from the present training patients, nested with the larger subsets of the same seed."""
    role: dict[str, str] = {}
    for key in ("training", "validation", "test"):
        for p in d[key]:
            if p in role:
                raise DataPrepError(f"{path_label}: patient {p} is in both {role[p]} and {key}; expected disjoint lists")
            role[p] = key
    missing = sorted(p for p in present if p not in role)
    if missing:
        if strict:
            raise DataPrepError(
                f"{path_label}: patients {missing[:5]}{' ...' if len(missing) > 5 else ''} of the source are "
                "not in the split file; expected every patient to have a role"
            )
        return {}
    split = {k: sorted(p for p in d[k] if p in present) for k in ("training", "validation", "test")}
    for k in ("validation", "test"):
        if not split[k]:
            log.info("split %s: no present patient has role %s; that list is empty", path_label, k)
    all_scans = {s for scans in present.values() for s in scans}
    train_set = set(split["training"])
    scan_patient = {s: p for p, scans in present.items() for s in scans}
    labelled: dict[str, list[str]] = {}
    for s in seeds:
        keys = {c: labelled_key(s, c) for c in counts}
        ref = {c: [x for x in d.get(keys[c], []) if x in all_scans and scan_patient[x] in train_set] for c in counts}
        stored = [c for c in counts if keys[c] in d]
        if not stored:
            # split file without labelled subsets: draw them
            labelled.update(draw_labelled(split["training"], present, [c for c in counts], [s]))
            continue
        largest: list[str] = []  # stored subsets merged in count order (nested files: the largest one)
        for c in sorted(counts):
            largest += [x for x in ref[c] if x not in largest]
        taken = {scan_patient[x] for x in largest}
        extra_units = [p for p in split["training"] if p not in taken]
        n_extra = min(max(counts), len(extra_units))
        extra = draw_labelled(extra_units, present, [n_extra], [s]) if n_extra else {}
        fill = largest + next(iter(extra.values()), [])
        nonempty = [c for c in sorted(counts) if ref[c]]
        for c in sorted(counts):
            if ref[c]:
                labelled[keys[c]] = ref[c]
                continue
            later = [m for m in nonempty if m > c]
            n = min(c, len(ref[later[0]])) if later else c
            drawn = fill[:n]
            if not drawn:
                log.info("labelled subset %s: no training patient present; skipped", keys[c])
                continue
            labelled[keys[c]] = drawn
            log.info(
                "labelled subset %s: none of its reference scans is present; drew %d seeded scan(s) "
                "from the present training patients: %s", keys[c], len(drawn), ",".join(drawn),
            )
    split["labelled"] = labelled
    return split
