"""The parts of a protocol's report besides its main tables: the LR choice, the hardest test scans, the test Dice by
patient group, the tags' meanings, the ablation tables and the pre-trainings' cluster quality."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from .collection import trains_cluster_head
from .grid import ablation_defaults
from .tables import _lrs_run, _mean_std, select
from .vocabulary import (ABLATION_LABELS, ABLATIONS, CHANGED_ABLATION, METHOD_ORDER, METHODS, PAPER_ABLATIONS,
                         TASK_COLUMNS, TASK_NAMES, TASK_ORDER, ExperimentError, ablation_label, fmt_lr,
                         without_pretrain_seed)


def hardest_scans(rows: list[dict], per_scan: dict[str, list[tuple[str, float]]], worst: int = 5) -> list[str]:
    """Markdown, one table per task: the ``worst`` test scans by their Dice averaged over the methods, lowest first,
    with each method's mean Dice x 100 over its ``rows`` (every labelled count and seed) that have per-scan Dice;
    then the range of each method's means over the other scans. Where a method fails shows here, not in a mean."""
    md = []
    for task, title in TASK_COLUMNS:
        values, runs = defaultdict(list), defaultdict(int)
        for r in rows:
            if r["task"] != task or r.get("ablation") or r.get("name") not in per_scan:
                continue
            runs[r["method"]] += 1
            for scan, dice in per_scan[r["name"]]:
                values[(r["method"], scan)].append(100.0 * dice)
        if not values:
            continue
        methods = [m for m in METHOD_ORDER if m in runs] + sorted(set(runs) - set(METHOD_ORDER))
        mean = {k: statistics.fmean(v) for k, v in values.items()}
        scans = sorted({scan for _, scan in mean},
                       key=lambda sc: statistics.fmean(mean[(m, sc)] for m in methods if (m, sc) in mean))
        md += [f"**{title}** (runs: {', '.join(f'{m} {runs[m]}' for m in methods)})", "",
               "| scan | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 1)]
        for sc in scans[:worst]:
            md.append(f"| {sc} | " + " | ".join(f"{mean[(m, sc)]:.1f}" if (m, sc) in mean else "–" for m in methods) + " |")
        if scans[worst:]:
            ranges = []
            for m in methods:
                v = [mean[(m, sc)] for sc in scans[worst:] if (m, sc) in mean]
                ranges.append(f"{min(v):.1f}–{max(v):.1f}" if v else "–")
            md.append(f"| the other {len(scans) - worst} scans | " + " | ".join(ranges) + " |")
        md.append("")
    return md


def read_groups(split_path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """From a data_prep ``datalist.json`` (test items with ``scan`` and ``group``) or the reference split
    (``data_prep/splits/acdc_reference.json``: test patients and ``groups``, patient -> group): scan -> patient group
    (ACDC's ``Info.cfg`` Group: DCM, HCM, MINF, NOR, RV) for the test scans, and labelled subset key
    (``labelled_seed{S}_{N}``) -> the groups of its scans."""
    path = Path(split_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExperimentError(f"{path}: cannot read it ({e}); expected data_prep's datalist.json or split") from None
    items = data.get("test") if isinstance(data, dict) else None
    if isinstance(data.get("groups") if items else None, dict):
        patient = data["groups"]
        scans = {f"{p}_{phase}": patient[p] for p in items for phase in ("ED", "ES")}
        labelled = {k: [patient.get(s.split("_")[0], "?") for s in v] for k, v in data.items()
                    if k.startswith("labelled_seed") and isinstance(v, list)}
        return scans, labelled
    if not items or any(not isinstance(it, dict) or "scan" not in it or "group" not in it for it in items):
        raise ExperimentError(f"{path}: expected a 'test' list whose items have 'scan' and 'group' (data_prep acdc "
                              "writes them), or a split with 'test' patients and their 'groups'")
    labelled = {k: [it.get("group", "?") for it in v] for k, v in data.items()
                if k.startswith("labelled_seed") and isinstance(v, list)}
    return {it["scan"]: it["group"] for it in items}, labelled


def group_tables(rows: list[dict], per_scan: dict[str, list[tuple[str, float]]], scan_group: dict[str, str],
                 labelled: dict[str, list[str]], focus: str | None = None) -> list[str]:
    """Markdown: per structure, each method's test Dice x 100 on each patient group (mean over its runs' scans of
    that group). With ``focus`` (a group), one row per structure, labelled count and seed: the groups of the
    labelled scans, then each method's Dice on the ``focus`` group / on the other scans."""
    md, fmean = [], statistics.fmean
    runs = [r for r in rows if not r.get("ablation") and r.get("name") in per_scan]
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in runs)]
    methods += sorted({r["method"] for r in runs} - set(methods))
    groups = sorted(set(scan_group.values()))
    for task, title in TASK_COLUMNS:
        values = defaultdict(list)
        for r in (r for r in runs if r["task"] == task):
            for scan, dice in per_scan[r["name"]]:
                if scan in scan_group:
                    values[(r["method"], scan_group[scan])].append(100.0 * dice)
        if not values:
            continue
        counts = {g: sum(1 for sc, gg in scan_group.items() if gg == g) for g in groups}
        md += [f"**{title}**", "", "| group (test scans) | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 1)]
        md += [f"| {g} ({counts[g]}) | " + " | ".join(f"{fmean(values[(m, g)]):.1f}" if values.get((m, g)) else "–"
                                                      for m in methods) + " |" for g in groups]
        md.append("")
    if focus:
        if focus not in groups:
            raise ExperimentError(f"group {focus!r} is not among the test scans' groups {groups}")
        md += [f"Dice × 100 on the {focus} test scans / on the other test scans, per run:", "",
               "| structure | labelled scans | seed | their groups | " + " | ".join(methods) + " |",
               "|" + "---|" * (len(methods) + 4)]
        cells = defaultdict(dict)
        for r in runs:
            dice = per_scan[r["name"]]
            inside = [100.0 * d for sc, d in dice if scan_group.get(sc) == focus]
            outside = [100.0 * d for sc, d in dice if sc in scan_group and scan_group[sc] != focus]
            if inside and outside:
                cells[(r["task"], r["labelled_scans"], r["seed"])][r["method"]] = f"{fmean(inside):.0f} / {fmean(outside):.0f}"
        for (task, n, seed), by_method in sorted(cells.items(), key=lambda kv: (TASK_ORDER[kv[0][0]], kv[0][1], kv[0][2])):
            sub = ", ".join(labelled.get(f"labelled_seed{seed}_{n}", ["?"]))
            md.append(f"| {TASK_NAMES[task]} | {n} | {seed} | {sub} | "
                      + " | ".join(by_method.get(m, "–") for m in methods) + " |")
        md.append("")
    return md


def chosen_weight_lines(chosen: list[dict], pool: list[dict]) -> list[str]:
    """Markdown lines: for each method and cell where some seed ran at more than one Mean Teacher consistency
    weight (among ``pool``, the protocol's candidates), the weight the validation Dice chose for each seed, and each
    weight's test Dice x 100 as the mean over its runs."""
    tried = defaultdict(lambda: defaultdict(list))
    for r in pool:
        if r.get("consistency_weight") is not None and not r.get("ablation"):
            tried[(r["method"], r["task"], int(r["labelled_scans"]))][r["consistency_weight"]].append(100.0 * r["test_dice"])
    cells = sorted((c for c in tried if len(tried[c]) > 1), key=lambda c: (c[0], TASK_ORDER.get(c[1], len(TASK_ORDER)), c[2]))
    if not cells:
        return []
    picks = defaultdict(dict)
    for r in chosen:
        if r.get("consistency_weight") is not None:
            picks[(r["method"], r["task"], int(r["labelled_scans"]))][int(r["seed"])] = r["consistency_weight"]
    md = ["Mean Teacher's consistency weight, chosen for each seed on the validation split, and each weight's test "
          "Dice (mean over its runs):", "", "| method | cell | chosen weight by seed | test Dice at each weight |",
          "|---|---|---|---|"]
    for c in cells:
        md.append(f"| {c[0]} | {TASK_NAMES.get(c[1], c[1])} {c[2]} | "
                  + ", ".join(f"s{seed}: {w:g}" for seed, w in sorted(picks[c].items())) + " | "
                  + ", ".join(f"{w:g}: {statistics.fmean(v):.1f}" + (f" (n={len(v)})" if len(v) != len(picks[c]) else "")
                              for w, v in sorted(tried[c].items())) + " |")
    return md + [""]


def chosen_lr_lines(chosen: list[dict], rows: list[dict]) -> list[str]:
    """Markdown lines: for each method and cell where some seed was run at more than one LR, the LR that the
    validation Dice chose for each seed, and each LR's test Dice x 100 as the mean over the seeds run at it, so that
    a reader sees what the choice gained or lost."""
    tried = defaultdict(lambda: defaultdict(list))
    inits = defaultdict(lambda: defaultdict(set))  # the pre-trainings each LR's runs of a cell started from
    for r in rows:
        if r.get("kind") != "pretrain" and not r.get("ablation"):
            tried[(r["method"], r["task"], int(r["labelled_scans"]))][r["lr"]].append(100.0 * r["test_dice"])
            if r.get("init") and r["init"] != "random":
                inits[(r["method"], r["task"], int(r["labelled_scans"]))][r["lr"]].add(r["init"])
    picks = defaultdict(dict)
    for r in chosen:
        if not r.get("ablation"):
            picks[(r["method"], r["task"], int(r["labelled_scans"]))][int(r["seed"])] = r["lr"]
    cells = [c for c in sorted(picks, key=lambda c: (c[0], TASK_ORDER.get(c[1], len(TASK_ORDER)), c[2]))
             if len(tried[c]) > 1]
    if not cells:
        return []

    md = ["The LR chosen for each seed, and each LR's test Dice (mean over the seeds run at it):", "",
          "| method | cell | chosen LR by seed | test Dice at each LR |", "|---|---|---|---|"]
    for m, task, n in cells:
        seeds = picks[(m, task, n)]
        by_lr = tried[(m, task, n)]
        md.append(f"| {m} | {TASK_NAMES.get(task, task)} {n} | "
                  + ", ".join(f"s{s}: {fmt_lr(seeds[s])}" for s in sorted(seeds)) + " | "
                  + ", ".join(f"{fmt_lr(lr)}: {statistics.fmean(v):.1f}" + (f" (n={len(v)})" if len(v) != len(seeds) else "")
                              for lr, v in sorted(by_lr.items())) + " |")
    mixed = [c for c in cells if len(set().union(*inits[c].values())) > 1]
    if mixed:  # an LR comparison across pre-trainings includes their spread too
        md += ["", "Cells whose LRs' runs start from more than one pre-training (so the comparison of LRs includes "
               "the pre-trainings' spread):", ""]
        for m, task, n in mixed:
            groups = defaultdict(list)  # the same pre-trainings -> the LRs that used them
            for lr, names in sorted(inits[(m, task, n)].items()):
                groups[tuple(sorted(names))].append(fmt_lr(lr))
            md.append(f"- {m}, {TASK_NAMES.get(task, task)} {n}: "
                      + "; ".join(f"{', '.join(lrs)} from {', '.join(f'`{x}`' for x in names)}"
                                  for names, lrs in groups.items()))
    return md + [""]


def lr_choice_lines(rows: list[dict], pools: dict | None = None) -> list[str]:
    """Markdown lines: how much the LR choice matters for each row, over its *clean* units only: a (task, labelled
    scans, seed) run at two or more LRs, once each, every run from the same start (one pre-training, or random
    init), so that the LRs differ in nothing else. Per row: the units, the mean test Dice x 100 at each LR, at the
    LR the validation Dice chose (:func:`select`'s rule) with how often it chose each LR, and how often that was
    the unit's best test LR. An LR run in only some of a row's units (a probe) is also set against the LR next below
    it on those same units, since its mean over fewer units is not comparable with the others' (``2e-3: 49.0 (n=3;
    1e-3 on those: 53.8)``). ``pools``: ``{name: [row labels]}``, extra lines pooling several rows' clean units
    (e.g. one method's seeds run under two tags because their pre-trainings differ)."""

    units = defaultdict(list)
    for r in rows:
        if r.get("kind") != "pretrain" and not r.get("ablation"):
            units[(r["method"], r["task"], int(r["labelled_scans"]), int(r["seed"]))].append(r)
    clean = {k: runs for k, runs in units.items()
             if len({r["lr"] for r in runs}) == len(runs) > 1 and len({r.get("init") or "random" for r in runs}) == 1}
    labels = {k[0] for k in clean}
    order = [m for m in METHOD_ORDER if m in labels] + sorted(labels - set(METHOD_ORDER), key=lambda m: (
        METHOD_ORDER.index(m.split(" [")[0]) if m.split(" [")[0] in METHOD_ORDER else len(METHOD_ORDER), m))
    groups = {m: [runs for k, runs in clean.items() if k[0] == m] for m in order}
    for name, members in (pools or {}).items():
        unknown = sorted(set(members) - {r["method"] for r in rows})
        if unknown:
            raise ExperimentError(f"lr_pools {name!r}: rows {unknown} are not in the report")
        groups[name] = [runs for k, runs in clean.items() if k[0] in members]
    groups = {m: g for m, g in groups.items() if g}
    if not groups:
        return []
    md = ["How much the LR choice matters, over the units where every LR's run started from the same pre-training "
          "(or random init) — a task, labelled count and seed run at two or more LRs:", "",
          "| row | units | test Dice at each LR | at the LR validation chose (its picks) | validation chose the best test LR |",
          "|---|---|---|---|---|"]

    def partial(lr, group):  # " (n=K)" for an LR run in K of the row's units, with the LR below it on those K
        those = [{r["lr"]: 100.0 * r["test_dice"] for r in runs} for runs in group]
        those = [u for u in those if lr in u]
        if len(those) == len(group):
            return ""
        below = max((x for x in those[0] if x < lr and all(x in u for u in those)), default=None)
        return f" (n={len(those)}" + ("" if below is None else
                                      f"; {fmt_lr(below)} on those: {statistics.fmean(u[below] for u in those):.1f}") + ")"

    for m, group in groups.items():
        by_lr, picks, best = defaultdict(list), defaultdict(int), 0
        chosen = []
        for runs in group:
            for r in runs:
                by_lr[r["lr"]].append(100.0 * r["test_dice"])
            c, = select(runs, "tuned")  # one unit: one (method, task, labelled scans, seed)
            chosen.append(100.0 * c["test_dice"])
            picks[c["lr"]] += 1
            best += c["test_dice"] == max(r["test_dice"] for r in runs)
        md.append(f"| {m} | {len(group)} | "
                  + ", ".join(f"{fmt_lr(lr)}: {statistics.fmean(v):.1f}{partial(lr, group)}"
                              for lr, v in sorted(by_lr.items())) + f" | {statistics.fmean(chosen):.1f} ("
                  + ", ".join(f"{fmt_lr(lr)} x{k}" for lr, k in sorted(picks.items())) + f") | {best} of {len(group)} |")
    return md + [""]


def one_lr_lines(rows: list[dict], left_out=()) -> list[str]:
    """Markdown lines: the cells of the LR-chosen table where a seed ran at one LR only, so that the table shows that
    run and no choice: per method, ``Myo 4`` (every seed) or ``Myo 2 (seeds 1, 2)``; rows with one LR in every cell
    are named together. ``left_out``: those the mean and gap tables leave out."""
    cells = defaultdict(lambda: defaultdict(list))  # method -> (task, n) -> [(seed, LRs run)]
    for (m, ablation, _, task, n, seed), tried in _lrs_run(rows).items():
        if not ablation:
            cells[m][(task, int(n))].append((int(seed), len(tried)))
    per_method, untuned = [], []
    for m in sorted(cells, key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m)):
        if all(k == 1 for seeds in cells[m].values() for _, k in seeds):
            untuned.append(m)
            continue
        where = []
        for (task, n) in sorted(cells[m], key=lambda c: (TASK_ORDER.get(c[0], len(TASK_ORDER)), c[1])):
            single = sorted(seed for seed, k in cells[m][(task, n)] if k == 1)
            if single:
                every = len(single) == len(cells[m][(task, n)])
                where.append(f"{TASK_NAMES.get(task, task)} {n}" + ("" if every else
                             f" (seed{'s' if len(single) > 1 else ''} {', '.join(map(str, single))})"))
        if where:
            per_method.append(f"- {m}: {', '.join(where)}")
    if untuned:
        gone = [m for m in untuned if m in left_out]
        said = "the tagged ones" if gone == [m for m in untuned if "[" in m] else ", ".join(gone)
        if gone:
            said += " are left out of this section's mean and gap tables: they equal the paper-protocol tables"
        per_method.append(f"- one LR in every cell: {', '.join(untuned)}" + (f" ({said})" if gone else ""))
    if not per_method:
        return []
    return ["Where a seed ran at one LR only, the table shows that run, not a choice:", "", *per_method, ""]


def same_as_paper(rows: list[dict], tuned: dict, paper: dict) -> list[str]:
    """The tagged rows run at one LR in every cell whose ``tuned`` cells (:func:`table`) are the ``paper`` ones."""
    runs = defaultdict(set)
    for (m, ablation, *_), tried in _lrs_run(rows).items():
        if not ablation:
            runs[m].add(len(tried))
    own = {m: {c: v for c, v in tuned.items() if c[0] == m} for m in runs}
    return [m for m, k in runs.items() if "[" in m and k == {1} and own[m]
            and own[m] == {c: v for c, v in paper.items() if c[0] == m}]


def tag_lines(seg_rows: list[dict], meanings: dict | None = None) -> list[str]:
    """Markdown lines saying what each tag of tagged rows (``Method [tag]``) changed: the bundle overrides the
    runner recorded with the runs (``overrides`` / ``pretrain_overrides`` columns), and ``meanings[tag]`` (what the
    rows were for, e.g. that their LRs start from one pre-training)."""
    tags: dict[str, set] = {}
    for r in seg_rows:
        if r.get("tag"):
            tags.setdefault(r["tag"], set()).add((r.get("overrides") or "", r.get("pretrain_overrides") or ""))
    if not tags:
        return []
    md = ["Tagged rows (`Method [tag]`) ran the preset with these bundle overrides:", ""]
    for tag, variants in sorted(tags.items()):
        for ft, pre in sorted(variants):
            what = "; ".join(x for x in (f"fine-tuning `{ft}`" if ft not in ("", "{}") else "",
                                         f"pre-training `{pre}`" if pre else "") if x)
            if not what:
                what = ("no overrides: the preset's settings, in a row of their own" if ft == "{}"
                        else "overrides not recorded (runs older than this column)")
            why = (meanings or {}).get(tag)
            md.append(f"- `[{tag}]`: {what}" + (f". {why}" if why else ""))
    return md + [""]


def provenance_lines(rows: list[dict]) -> list[str]:
    """Markdown: per row label (pre-trainings under ``pre-training``), its runs, the GPU(s) that ran them (as each
    CSV row records) and their summed wall time."""
    runs = defaultdict(list)
    for r in rows:
        runs["pre-training" if r.get("kind") == "pretrain" else r["method"]].append(r)
    md = ["Where the runs ran (each CSV row records its command, commit, GPU and wall time):", "",
          "| row | runs | GPU (runs) | wall time, h |", "|---|---|---|---|"]
    for label in sorted(runs, key=lambda m: (m != "pre-training", METHOD_ORDER.index(m.split(" [")[0])
                                             if m.split(" [")[0] in METHOD_ORDER else len(METHOD_ORDER), m)):
        gpus = defaultdict(int)
        for r in runs[label]:
            gpus[r.get("gpu") or "unknown"] += 1
        wall = sum(float(r["wall_s"]) for r in runs[label] if r.get("wall_s") not in (None, ""))
        md.append(f"| {label} | {len(runs[label])} | " + ", ".join(f"{g} ({k})" for g, k in sorted(gpus.items()))
                  + f" | {wall / 3600:.1f} |")
    return md + [""]


def _ablation_of(r: dict) -> tuple[str, float] | None:
    """(key, value) of an ablation's pre-training (its ``ablation`` column is key and value, ``alpha0.25``, and the
    key's own column holds the value), None for other pre-trainings."""
    name = r.get("ablation") or ""
    for key in ABLATION_LABELS:
        if name.startswith(key):
            value = r.get(key) if r.get(key) not in (None, "") else name[len(key):]
            try:
                return key, float(value)
            except ValueError:
                return None
    return None


def sorted_pretrains(pretrain_rows: list[dict]) -> list[dict]:
    """The variants' pre-trainings in their given order, then the ablations' by key and value."""
    plain = [r for r in pretrain_rows if _ablation_of(r) is None]
    return plain + sorted((r for r in pretrain_rows if _ablation_of(r) is not None), key=_ablation_of)


def _pretrain_label(r: dict, sep: str = "\n") -> str:
    """A pre-training's name in figures (``sep`` a newline) and tables (a space): its variant, with its tag when it
    has one (``[pre10k]``) and an ablation's value (``alpha=0.25``)."""
    abl = _ablation_of(r)
    return (_variant_label(r.get("variant") or r["name"], sep) + (f" [{r['tag']}]" if r.get("tag") else "")
            + (f"{sep}{ABLATION_LABELS[abl[0]]}={abl[1]:g}" if abl else ""))


def spearman(x, y) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get their mean rank); nan if either is
    constant."""
    import numpy as np

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = v.argsort(kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties: their mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def cluster_quality_table(pretrain_rows: list[dict], finetunes=()) -> list[str]:
    """Markdown lines: each pre-training (label and run name) with its ``cq_*`` columns (pretrain_bim's
    ``cluster_quality.json``), i.e. the best single cluster's Dice per structure over all validation scans pooled
    (per scan in brackets) and NMI; with ``finetunes`` (segmentation runs, e.g. the paper protocol's), the mean test
    Dice of the fine-tunes that start from each pre-training at the fewest labelled scans they used, and, where 4 or
    more pre-trainings have both, Spearman's rank correlation of the two per structure: does a better cluster make
    a better fine-tune?"""
    scored = [r for r in pretrain_rows if r.get("cq_nmi") not in (None, "")]
    if not scored:
        return []
    suffixes = ("_per_scan", "_many_to_one", "_precision", "_recall", "_centre", "_subheads", "_spill_border",
                "_spill_far")
    names = sorted({k[3:] for r in scored for k in r if k.startswith("cq_") and k != "cq_nmi"
                    and not k.endswith(suffixes)})
    by_init = defaultdict(list)
    for f in finetunes:
        if f.get("kind") == "finetune" and f.get("init") and not math.isnan(f["test_dice"]):
            by_init[f["init"]].append(f)
    started = [f for r in scored for f in by_init.get(r["name"], ())]
    fewest = min((f["labelled_scans"] for f in started), default=None)
    tuned_names = [n for n in names if any(f["task"] == n.lower() for f in started)]

    def tuned(r, n):
        runs = [100 * f["test_dice"] for f in by_init.get(r["name"], ())
                if f["task"] == n.lower() and f["labelled_scans"] == fewest]
        return (sum(runs) / len(runs), len(runs)) if runs else None

    def cell(r, n):
        pooled, per_scan, m2o = r.get(f"cq_{n}"), r.get(f"cq_{n}_per_scan"), r.get(f"cq_{n}_many_to_one")
        if pooled in (None, ""):
            return "–"
        return f"{100 * float(pooled):.1f} ({100 * float(per_scan):.1f})" + (
            f" / {100 * float(m2o):.1f}" if m2o not in (None, "") else "")

    probed = [k for k in (4, 0) if any(r.get(f"pd_L{k}") not in (None, "") for r in scored)]

    def probe(r, k):
        changed, inside = r.get(f"pd_L{k}"), r.get(f"pd_L{k}_in")
        return "–" if changed in (None, "") else f"{100 * float(changed):.1f} ({100 * float(inside):.1f})"

    md = ["## Cluster quality of the pre-trainings (labels used only to score)", "",
          "Best single cluster's Dice × 100 per structure, over the validation scans pooled: one cluster must stand "
          "for the structure in every scan. In brackets, the same with each scan free to pick its own cluster. "
          "After the slash (pretrain_bim >= 0.2.1), the many-to-one Dice: each cluster given its majority class, the "
          "union of a structure's clusters scored. NMI between clusters and labels."
          + (" `level 4` / `level 0` (pretrain_bim's `path_dependence.json`, where run): the % of pixels whose cluster "
             "changes when the bottleneck (the deep path) / the first skip connection reaches the decoder without its "
             "spatial information; inside the labelled structures in brackets." if probed else "")
          + (f" `fine-tuned`: the mean test Dice × 100 of the fine-tunes that start from the pre-training, "
             f"{fewest} labelled scan{'s' if fewest != 1 else ''}, this table's paper-protocol runs (their number "
             f"in brackets; each pre-training's fine-tunes ran its own row's settings, which differ between tagged "
             f"rows)." if tuned_names else ""), "",
          "| pre-training | " + " | ".join(names) + " | NMI |" + "".join(f" level {k} |" for k in probed)
          + "".join(f" fine-tuned {n} |" for n in tuned_names),
          "|" + "---|" * (len(names) + 2 + len(probed) + len(tuned_names))]

    def fmt(t):
        return "–" if t is None else f"{t[0]:.1f} ({t[1]})"

    for r in sorted_pretrains(scored):
        md.append(f"| {_pretrain_label(r, ' ')} `{r['name']}` | " + " | ".join(cell(r, n) for n in names)
                  + f" | {float(r['cq_nmi']):.3f} |"  # the run name tells apart two pre-trainings of one label
                  + "".join(f" {probe(r, k)} |" for k in probed)
                  + "".join(f" {fmt(tuned(r, n))} |" for n in tuned_names))
    md.append("")

    return md + seed_spread_lines(scored, names) + rank_correlation_lines(scored, tuned_names, tuned)


CLUSTER_BAR = 60.0  # best single cluster Dice x 100 from which a cluster is counted as standing for its structure


def seed_spread_lines(scored: list[dict], names: list[str]) -> list[str]:
    """Markdown: the settings pre-trained with several seeds (run names that differ only in ``_ps<seed>``, as the
    grid's ``pretrain_per_seed`` names them): per structure the mean best single cluster Dice x 100 over the seeds,
    its range, and how many of the seeds reach :data:`CLUSTER_BAR`; () where no setting has two seeds."""
    groups = defaultdict(list)
    for r in scored:
        groups[without_pretrain_seed(r["name"])].append(r)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return []

    def cell(rows, n):
        vals = [100 * float(r[f"cq_{n}"]) for r in rows if r.get(f"cq_{n}") not in (None, "")]
        if not vals:
            return "–"
        reach = sum(v >= CLUSTER_BAR for v in vals)
        return f"{statistics.mean(vals):.1f} ({min(vals):.1f}–{max(vals):.1f}) {reach}/{len(vals)}"

    md = [f"Each setting over its pre-training seeds: mean best single cluster Dice × 100, (lowest–highest), and how "
          f"many seeds reach {CLUSTER_BAR:g}:", "",
          "| setting | seeds | " + " | ".join(names) + " | NMI |", "|" + "---|" * (len(names) + 3)]
    for key, rows in groups.items():
        nmi = statistics.mean(float(r["cq_nmi"]) for r in rows)
        md.append(f"| {_pretrain_label(rows[0], ' ')} `{key}` | {len(rows)} | "
                  + " | ".join(cell(rows, n) for n in names) + f" | {nmi:.3f} |")
    return md + [""]


def rank_correlation_lines(scored: list[dict], names: list[str], tuned) -> list[str]:
    """Markdown: Spearman's rank correlation between each structure's best single cluster Dice and the fine-tuned
    test Dice (``tuned(row, name)``: (mean, runs) or None), over the pre-trainings that train a cluster head and have
    both, where 4 or more do."""
    def head_trained(r):  # a variant this checkout does not know is counted
        try:
            return trains_cluster_head([r["variant"]]) if r.get("variant") else True
        except ExperimentError:
            return True

    clustered = [r for r in scored if head_trained(r)]
    rhos = []
    for n in names:
        pairs = [(float(r[f"cq_{n}"]), tuned(r, n)[0]) for r in clustered
                 if r.get(f"cq_{n}") not in (None, "") and tuned(r, n) is not None]
        if len(pairs) >= 4:
            rhos.append(f"{n} {spearman(*zip(*pairs)):+.2f} ({len(pairs)} pre-trainings)")
    if not rhos:
        return []
    left_out = sorted({_pretrain_label(r, " ") for r in scored if r not in clustered})
    return ["Does a better cluster make a better fine-tune? Spearman's rank correlation between the best single "
            "cluster's Dice and the fine-tuned test Dice, over the pre-trainings that have both"
            + (f" and train a cluster head (left out: {', '.join(left_out)})" if left_out else "")
            + ": " + ", ".join(rhos) + ".", ""]

def _variant_label(variant: str, sep: str = "\n") -> str:
    """The Table 1 row of a pre-training variant (experiments.METHODS, the one place that maps them), then the
    variant's name in brackets after ``sep``."""

    labels = [m for m, (v, kind) in METHODS.items() if v == variant and kind == "finetune"]
    return f"{labels[0]}{sep}({variant})" if labels else variant


def _ablated_variant(r: dict) -> str:
    """The pre-training variant an ablation run varies: the row's ``variant`` where it has one, else its method's
    (``experiments.METHODS``, a tag like ``[pre5k]`` stripped), else ``full``."""

    if r.get("variant"):
        return r["variant"]
    variant = METHODS.get(str(r.get("method", "")).split(" [")[0], (None, None))[0]
    return variant or "full"


def pretraining_change(overrides: str | None, protocol: dict | None = None) -> str:
    """The part of a run's ``pretrain_overrides`` (JSON) that changes its pre-training's setting, as sorted JSON ('' for
    none): without ``seed`` (the seeds of a setting repeat it) and without the values of ``protocol``, the overrides a
    page's every run shares (``ReportSpec.pretrain_protocol``)."""
    if not overrides:
        return ""
    protocol = protocol or {}
    changes = {k: v for k, v in json.loads(overrides).items()
               if k != "seed" and (k not in protocol or protocol[k] != v)}
    return json.dumps(changes, sort_keys=True) if changes else ""


def ablation_rows(rows: list[dict], protocol: dict | None = None) -> dict:
    """(ablation key, task, labelled scans) -> sorted [(value, mean x 100, std x 100, n, shared_from,
    by_pretraining)] over the seeds of the ablation runs. The ablations share one default point
    (``experiments.ablation_defaults`` of the variant) and the grid runs it once, under the first key: a run of key
    k at k's default v also stands for the default of every other key k2, in a cell (k2, task, labelled scans) that
    has runs of its own but none at k2's default; ``shared_from`` is then (k, v) (the first such key of
    ``ABLATIONS``' order), else (). Runs of a tagged grid that changed the pre-training (``pretrain_overrides`` beyond
    its seed and the page's ``protocol``, :func:`pretraining_change`) are cells of their own, keyed ``k`` +
    ``CHANGED_ABLATION`` + the changes, and share their default point only among themselves. ``by_pretraining``: the
    mean x 100 of each pre-training's runs (its ``init``), in the order first met, so that a value pre-trained twice
    shows how far two pre-trainings differ."""

    order, defaults_of = list(ABLATIONS), {}
    values, shared = defaultdict(list), defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("ablation") and r.get("ablation_value") not in (None, ""):
            base, task, n, value = r["ablation"], r["task"], int(r["labelled_scans"]), float(r["ablation_value"])
            changed = pretraining_change(r.get("pretrain_overrides"), protocol)  # another pre-training: its own cell
            suffix = CHANGED_ABLATION + changed if changed else ""
            key, pretraining_dice = base + suffix, (r.get("init") or r.get("method"), 100.0 * r["test_dice"])
            values[(key, task, n, value)].append(pretraining_dice)
            variant = _ablated_variant(r)
            if variant not in defaults_of:
                defaults_of[variant] = ablation_defaults(variant)
            defaults = defaults_of[variant]
            if defaults.get(base) == value:
                for k2, v2 in defaults.items():
                    if k2 != base:
                        shared[(k2 + suffix, task, n, v2)][(key, value)].append(pretraining_dice)
    cells = {(key, task, n) for key, task, n, _ in values}
    points = {k: (v, ()) for k, v in values.items()}
    for (k2, task, n, v2), by_key in shared.items():
        if (k2, task, n) in cells and (k2, task, n, v2) not in values:
            source = min(by_key, key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
            points[(k2, task, n, v2)] = (by_key[source], source)
    out = defaultdict(list)
    for (key, task, n, value), (v, source) in sorted(points.items()):
        by_init = defaultdict(list)
        for pretraining, dice in v:
            by_init[pretraining].append(dice)
        out[(key, task, n)].append((value, *_mean_std([d for _, d in v]), len(v), source,
                                    [statistics.fmean(d) for d in by_init.values()]))
    return dict(out)


def paper_ablation(key: str, task: str, n: int, value: float) -> float | None:
    """The paper's Dice x 100 for an ablation cell (``PAPER_ABLATIONS``), None where it has none."""
    return PAPER_ABLATIONS.get(key, {}).get(task, {}).get(n, {}).get(float(value))


def ablation_tables(abl: dict) -> list[str]:
    """Markdown lines: per ablation cell (key, task, labelled scans) our mean (std, seeds) per value, best in bold,
    and the paper's row beside it (``PAPER_ABLATIONS``)."""
    md = []
    for (key, task, n), pts in abl.items():
        best = max(p[1] for p in pts)
        ours = [(f"**{p[1]:.2f}**" if p[1] == best else f"{p[1]:.2f}") + f" ({p[2]:.2f}, n={p[3]})" for p in pts]
        paper = [paper_ablation(key, task, n, p[0]) for p in pts]
        where = f"{TASK_NAMES.get(task, task)}, {n} scan{'s' if n > 1 else ''}"
        md += [f"| {ablation_label(key)} | " + " | ".join(f"{p[0]:g}" for p in pts) + " |",
               "|" + "---|" * (len(pts) + 1),
               f"| {where}, ours | " + " | ".join(ours) + " |"]
        if any(v is not None for v in paper):
            md.append(f"| {where}, paper | " + " | ".join("–" if v is None else f"{v:.2f}" for v in paper) + " |")
        if any(len(p[5]) > 1 for p in pts):  # a value pre-trained more than once: each pre-training's mean
            md.append(f"| {where}, each pre-training | " + " | ".join(" / ".join(f"{m:.2f}" for m in p[5])
                                                                       for p in pts) + " |")
        md.append("")
        for p in pts:
            if p[4]:
                src, src_value = p[4]
                md += [f"{ablation_label(key)} = {p[0]:g} is the default point: the runs of "
                       f"{ablation_label(src)} = {src_value:g}, shared by the three ablations.", ""]
    return md


ES_COLUMN = re.compile(r"es(\d+)_(\w+)")  # a recorded early stop's column: es<patience>_<field>


def early_stops(row: dict) -> dict[int, dict]:
    """A results row's recorded early stops: patience -> {field: value} from its ``es<N>_<field>`` columns (and the
    ``es_<field>`` columns with ``es_patience`` of CSVs written before several patiences could be recorded); only
    those with a test Dice."""
    out = defaultdict(dict)
    for key, value in row.items():
        m = ES_COLUMN.fullmatch(key)
        if m:
            out[int(m.group(1))][m.group(2)] = value
    if row.get("es_patience") not in (None, ""):
        out[int(float(row["es_patience"]))].update(
            {k[3:]: v for k, v in row.items() if k.startswith("es_") and k != "es_patience"})
    return {n: f for n, f in out.items() if f.get("test_dice") not in (None, "")}


def early_stop_lines(seg_rows: list[dict]) -> list[str]:
    """Markdown: for runs trained with ``--record_early_stop`` (the ``es*`` columns), per method, cell and recorded
    patience the test Dice x 100 of the full-length run's best-validation model against that of the model early
    stopping with that patience would have kept (the same runs, mean (std over seeds)), their difference, and the
    share of the training's seconds early stopping would have taken. Empty when no run recorded it."""
    cells = defaultdict(list)
    for r in seg_rows:
        for n, es in ({} if r.get("ablation") else early_stops(r)).items():
            cells[(r["method"], r["task"], int(r["labelled_scans"]), n)].append((r, es))
    if not cells:
        return []
    patience = sorted({c[3] for c in cells})
    md = [f"## Early stopping (patience {', '.join(map(str, patience))}), recorded on the full-length runs", "",
          "Each run trained all its epochs and recorded where early stopping would have ended it; both models are "
          "scored on the test scans. Time: the share of the run's seconds up to that point.", "",
          "| method | cell | all epochs | patience | early stop | difference | time | stopped |",
          "|---|---|---|---|---|---|---|---|"]
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    counts = defaultdict(list)  # (method, labelled scans, patience) -> the runs of all its tasks
    for (m, task, n, p) in sorted(cells, key=lambda c: (order.get(c[0], len(order)), c[0], TASK_ORDER.get(c[1], 0),
                                                          c[2], c[3])):
        rs = cells[(m, task, n, p)]
        counts[(m, n, p)] += rs
        full = _mean_std([100.0 * float(r["test_dice"]) for r, _ in rs])
        early = _mean_std([100.0 * float(es["test_dice"]) for _, es in rs])
        md.append(f"| {m} | {TASK_NAMES.get(task, task)} {n} | {full[0]:.1f} ({full[1]:.1f}) | {p} | {early[0]:.1f} "
                  f"({early[1]:.1f}) | {_early_stop_summary(rs)} |")
    md += ["", "Per number of labelled scans, over the runs of all its cells:", "",
           "| method | labelled scans | patience | difference | time | stopped |", "|---|---|---|---|---|---|"]
    for (m, n, p) in sorted(counts, key=lambda c: (order.get(c[0], len(order)), c[0], c[1], c[2])):
        md.append(f"| {m} | {n} | {p} | {_early_stop_summary(counts[(m, n, p)])} |")
    return md + [""]


def _early_stop_summary(runs: list[tuple[dict, dict]]) -> str:
    """The last three cells of an early-stopping line for ``runs`` ((row, its early stop) pairs): the mean paired
    difference of test Dice x 100 (early stop minus all epochs), the mean time share and how many runs it stopped."""
    diff = statistics.fmean(100.0 * (float(es["test_dice"]) - float(r["test_dice"])) for r, es in runs)
    shares = [float(es["time_share"]) for _, es in runs if es.get("time_share") not in (None, "")]
    share = f"{100 * statistics.fmean(shares):.0f} %" if shares else "–"
    stopped = sum(str(es.get("stopped")).lower() == "true" for _, es in runs)
    return f"{diff:+.1f} | {share} | {stopped} of {len(runs)}"


AB_TASKS = ("lv", "myo", "rv", "prostate")  # the order of the results pages' A/B tables (LV / Myo / RV)


def _ab_runs(rows: list[dict], labelled_scans: int, method: str | None) -> dict[int, dict]:
    """split seed -> {"cluster": {task: best-cluster Dice x 100 of its pre-training}, "val" / "test": {task: Dice x
    100}} of the fine-tunes at ``labelled_scans`` (of ``method``, its tag ignored, when given). Two runs of one cell
    (LRs, early-stop lines) are ambiguous: an ``ExperimentError`` names them."""
    pretrains = {r["name"]: r for r in rows if r.get("kind") == "pretrain"}
    out: dict[int, dict] = {}
    for r in rows:
        if r.get("kind") == "pretrain" or r["labelled_scans"] != labelled_scans or r.get("ablation"):
            continue
        if method is not None and str(r["method"]).split(" [")[0] != method:
            continue
        seed = out.setdefault(r["seed"], {"cluster": {}, "val": {}, "test": {}, "runs": {}})
        if r["task"] in seed["runs"]:
            raise ExperimentError(f"two runs of {r['task']} at {labelled_scans} scans, seed {r['seed']}: "
                                  f"{seed['runs'][r['task']]} and {r['name']}; narrow them with method or the CSVs")
        seed["runs"][r["task"]] = r["name"]
        seed["val"][r["task"]], seed["test"][r["task"]] = 100 * r["val_dice"], 100 * r["test_dice"]
        cq = pretrains.get(r.get("init"), {}).get(f"cq_{TASK_NAMES[r['task']]}")
        if cq not in (None, ""):
            seed["cluster"][r["task"]] = 100 * float(cq)
    return out


def ab_comparison(candidate: list[dict], reference: list[dict], names: tuple[str, str], labelled_scans: int = 1,
                  method: str | None = None) -> list[str]:
    """Markdown lines: an A/B of two settings run on the same split seeds (pre-training s for split seed s), as the
    results pages show it: per seed and as the mean over the seeds both have, each one's best-cluster Dice on the
    validation scans and its fine-tunes' validation and test Dice x 100 per structure (with their mean), then the
    candidate's difference of the means on validation and test."""
    runs = [_ab_runs(candidate, labelled_scans, method), _ab_runs(reference, labelled_scans, method)]
    seeds = sorted(set(runs[0]) & set(runs[1]))
    if not seeds:
        raise ExperimentError(f"no split seed has fine-tunes at {labelled_scans} scans in both: candidate "
                              f"{sorted(runs[0])}, reference {sorted(runs[1])}")
    tasks = [t for t in AB_TASKS if all(t in runs[i][s]["test"] for i in (0, 1) for s in seeds)]

    def cells(values: dict, with_mean: bool) -> str:
        text = " / ".join(f"{values[t]:.1f}" if t in values else "–" for t in tasks)
        return text + (f" ({statistics.fmean(values[t] for t in tasks):.1f})" if with_mean else "")

    md = ["| run | best-cluster Dice (validation) | fine-tune, validation (mean) | fine-tune, test (mean) |",
          "|---|---|---|---|"]
    for s in seeds:
        md += [f"| seed {s}, {names[i]} | {cells(runs[i][s]['cluster'], False)} | {cells(runs[i][s]['val'], True)} | "
               f"{cells(runs[i][s]['test'], True)} |" for i in (0, 1)]
    means = []
    for i in (0, 1):
        mean = {k: {t: statistics.fmean(runs[i][s][k][t] for s in seeds) for t in tasks
                    if all(t in runs[i][s][k] for s in seeds)} for k in ("cluster", "val", "test")}
        means.append(mean)
        md.append(f"| mean, {names[i]} | {cells(mean['cluster'], False)} | {cells(mean['val'], True)} | "
                  f"{cells(mean['test'], True)} |")
    gap = {k: statistics.fmean(means[0][k][t] - means[1][k][t] for t in tasks) for k in ("val", "test")}
    per_seed = ", ".join(f"seed {s} {statistics.fmean(runs[0][s]['val'][t] - runs[1][s]['val'][t] for t in tasks):+.1f}"
                         for s in seeds)
    md += ["", f"{names[0]} against {names[1]} (seeds {', '.join(map(str, seeds))}, {labelled_scans} labelled "
               f"scan{'s' if labelled_scans > 1 else ''}): validation {gap['val']:+.1f} ({per_seed}), test "
               f"{gap['test']:+.1f}."]
    return md
