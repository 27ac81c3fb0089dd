"""The committed pages under ``docs/results``: each protocol's page (its folder's ``report.json``, see
:mod:`.report`) and the tables of the summary page ``docs/results/README.md`` and of the repository's README, between
``<!-- generated: NAME -->`` and ``<!-- end -->`` lines, all computed from the committed CSVs."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

from .figures import plot_dice_vs_scans
from .report import load_spec, report_rows, write_report
from .tables import _p_text, select, sign_test_p
from .vocabulary import ACDC_ROWS, COUNTS, PAPER_TABLE1, PROSTATE_ROWS, ROOT, TASK_NAMES, ExperimentError

RESULTS = ROOT / "docs" / "results"
# in this order: acdc_fast counts its order of the rows against acdc_paper_length's table_cells.json
PAGES = ("acdc_paper_length", "promise12_paper_length", "acdc_ablation", "acdc_fast", "promise12_fast")
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end -->)", re.S)
# the run-for-run comparisons of the summary: (row, reference)
COMPARISONS = (("Contrast (Enc) + Ours (Dec)", "Baseline"), ("Contrast (Enc)", "Baseline"),
               ("Contrast (Enc) + Ours (Dec)", "Contrast (Enc)"), ("IIC (Dec)", "Baseline"),
               ("Ours (Dec) MI+CC", "Baseline"), ("Mean Teacher", "Baseline"), ("MT + Ours", "Mean Teacher"))


def _dice(rows: list[dict]) -> dict:
    """(method, task, labelled scans, seed) -> test Dice x 100."""
    return {(r["method"], r["task"], r["labelled_scans"], r["seed"]): 100.0 * r["test_dice"] for r in rows
            if not r.get("ablation")}


def _cell(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f}±{statistics.pstdev(values):.1f}"


def measured_table(chosen: list[dict], methods, tasks) -> str:
    """Markdown: each method by each (task, labelled scans), our mean ± std over seeds with the paper's number in
    brackets, then the full method's and MT + Ours's paired gains with their wins (the paper's gain in brackets)."""
    dice = _dice(chosen)
    columns = [(t, n) for t in tasks for n in COUNTS[t]]
    lines = ["| method | " + " | ".join(f"{TASK_NAMES[t]} {n}" for t, n in columns) + " |",
             "|" + "---|" * (len(columns) + 1)]
    for m in methods:
        cells = []
        for t, n in columns:
            v = [d for k, d in dice.items() if k[:3] == (m, t, n)]
            p = PAPER_TABLE1.get(m, {}).get(t, {}).get(n)
            cells.append(("–" if not v else _cell(v)) + ("" if p is None else f" ({p:.1f})"))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for m, ref in (("Contrast (Enc) + Ours (Dec)", "Baseline"), ("MT + Ours", "Mean Teacher")):
        cells = []
        for t, n in columns:
            gains = [d - dice[(ref, *k[1:])] for k, d in dice.items() if k[:3] == (m, t, n) and (ref, *k[1:]) in dice]
            paper = PAPER_TABLE1[m][t][n] - PAPER_TABLE1[ref][t][n]
            cells.append("–" if not gains else f"{statistics.fmean(gains):+.1f} {sum(g > 0 for g in gains)}/"
                         f"{len(gains)} ({paper:+.1f})")
        lines.append(f"| *{m} − {ref}* | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pairs_cell(dice: dict, m: str, ref: str) -> tuple[str, float] | None:
    """(``wins/pairs gain (p)``, the paper's gain over the same cells) of ``m`` against ``ref`` run for run (same
    task, labelled scans and seed); None without pairs."""
    gains, paper = [], []
    for k, d in dice.items():
        if k[0] == m and (ref, *k[1:]) in dice:
            gains.append(d - dice[(ref, *k[1:])])
            paper.append(PAPER_TABLE1[m][k[1]][k[2]] - PAPER_TABLE1[ref][k[1]][k[2]])
    if not gains:
        return None
    wins, losses = sum(g > 0 for g in gains), sum(g < 0 for g in gains)
    p = _p_text(sign_test_p(wins, losses))
    return f"{wins}/{len(gains)} {statistics.fmean(gains):+.1f} (p{'' if p.startswith('<') else '='}{p})", \
        statistics.fmean(paper)


def pairs_table(rows_by_protocol: dict) -> str:
    """Markdown: the ``COMPARISONS`` run for run, a column per protocol (wins/pairs, mean gain, sign test's p), and
    the paper's gain over the same cells."""
    lines = ["| row − reference | " + " | ".join(rows_by_protocol) + " | paper |",
             "|" + "---|" * (len(rows_by_protocol) + 2)]
    dice = {protocol: _dice(chosen) for protocol, chosen in rows_by_protocol.items()}
    for m, ref in COMPARISONS:
        cells = [pairs_cell(d, m, ref) for d in dice.values()]
        if any(cells):
            paper = next(c[1] for c in cells if c)
            lines.append(f"| {m} − {ref} | " + " | ".join(c[0] if c else "–" for c in cells) + f" | {paper:+.1f} |")
    return "\n".join(lines)


def noise_table(rows: list[dict], ablation_rows: list[dict]) -> str:
    """Markdown: the run-to-run noise (a baseline run twice with the same seed and command, ``Baseline [rerun]``) and
    the noise between pre-trainings (ablation points pre-trained two or three times: the range of their means)."""
    first = {r["name"]: r for r in rows if r.get("kind") != "pretrain"}
    lines = ["| noise | difference, Dice points |", "|---|---|"]
    twice = [(f"{TASK_NAMES[r['task']]} {r['labelled_scans']}", 100 * (r["test_dice"] - first[twin]["test_dice"]))
             for r in rows if r.get("method") == "Baseline [rerun]"
             for twin in [r["name"].removesuffix("_rerun")] if twin in first]
    if twice:
        lines.append("| the baseline run twice, same seed and command | "
                     + ", ".join(f"{cell} {d:+.1f}" for cell, d in sorted(twice)) + " |")
    means = defaultdict(lambda: defaultdict(list))
    for r in ablation_rows:
        if r.get("kind") != "pretrain" and r.get("ablation"):
            means[(r["ablation"], r["ablation_value"])][r["init"]].append(100.0 * r["test_dice"])
    spreads = sorted((max(m) - min(m), key) for key, inits in means.items()
                     for m in [[statistics.fmean(v) for v in inits.values()]] if len(m) > 1)
    if spreads:
        lines.append(f"| pre-trainings of one ablation setting, 5,000 iterations (LV 1, mean of 3 seeds; "
                     f"{len(spreads)} settings) | range: median {statistics.median(s for s, _ in spreads):.1f}, "
                     f"largest {spreads[-1][0]:.1f} |")
    return "\n".join(lines)


def lr_table(seg: list[dict], paper: list[dict], tuned: list[dict]) -> str:
    """Markdown: what choosing each row's LR on validation changes, mean over seeds, per (task, labelled scans);
    "–" where the cell ran one LR, rows that ran one LR everywhere left out."""
    a, b = _dice(paper), _dice(tuned)
    tried = defaultdict(set)
    for r in seg:
        tried[(r["method"], r["task"], r["labelled_scans"])].add(r["lr"])
    columns = [(t, n) for t in ("lv", "rv", "myo") for n in COUNTS[t]]
    lines = ["| method | LV 1 | RV 1 | Myo 1 | cells with a choice |", "|---|---|---|---|---|"]
    for m in ACDC_ROWS:
        diffs = {c: [b[k] - a[k] for k in a if k[:3] == (m, *c) and k in b] if len(tried[(m, *c)]) > 1 else []
                 for c in columns}
        cells = [f"{statistics.fmean(diffs[(t, 1)]):+.1f}" if diffs[(t, 1)] else "–" for t in ("lv", "rv", "myo")]
        every = [x for d in diffs.values() for x in d]
        if every:
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {statistics.fmean(every):+.1f} |")
    return "\n".join(lines)


def pretraining_time(rows: list[dict]) -> str:
    """Markdown: the full method's 10,000-iteration pre-trainings that ran in one attempt, wall time by GPU model."""
    times = defaultdict(list)
    for r in rows:
        if (r.get("kind") == "pretrain" and r.get("variant") == "full" and r.get("wall_s")
                and r.get("wall_s") == r.get("wall_s_all_attempts") and "--epochs 50 --iters_per_epoch 200 " in (r.get("command") or "")):
            times[r["gpu"].split(" x ")[-1]].append(float(r["wall_s"]))
    return "\n".join(["| GPU (one per pre-training) | pre-trainings | wall time, min (median; range) |", "|---|---|---|"]
                     + [f"| {g} | {len(v)} | {statistics.median(v) / 60:.1f}; {min(v) / 60:.1f}–{max(v) / 60:.1f} |"
                        for g, v in sorted(times.items())])


def headline_table(acdc: list[dict], prostate: list[dict]) -> str:
    """Markdown for the repository's README: the four main rows' means per task, 1 / 2 / 4 (4 / 6 / 8) scans, the
    paper's numbers in brackets for the pre-trained rows."""
    dice = {**_dice(acdc), **_dice(prostate)}
    rows = ("Baseline", "Contrast (Enc) + Ours (Dec)", "Mean Teacher", "MT + Ours")
    lines = ["| data, labelled scans | random init | full method | Mean Teacher | MT + Ours |", "|---|---|---|---|---|"]
    for task, data in (("lv", "ACDC LV"), ("rv", "ACDC RV"), ("myo", "ACDC Myo"), ("prostate", "PROMISE12")):
        cells = []
        for m in rows:
            ours = " / ".join(f"{statistics.fmean(v for k, v in dice.items() if k[:3] == (m, task, n)):.1f}"
                              for n in COUNTS[task])
            paper = " / ".join(f"{PAPER_TABLE1[m][task][n]:.1f}" for n in COUNTS[task])
            cells.append(ours + (f" ({paper})" if m in ("Contrast (Enc) + Ours (Dec)", "MT + Ours") else ""))
        lines.append(f"| {data}, {' / '.join(map(str, COUNTS[task]))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_blocks(figure: bool = False) -> dict[str, str]:
    """The generated tables of ``docs/results/README.md``, by block name (``figure``: also draw its figure)."""
    acdc_spec = load_spec(RESULTS / "acdc_paper_length")
    acdc_all = report_rows(acdc_spec)
    acdc = [r for r in acdc_all if r.get("kind") != "pretrain"]
    prostate_spec = load_spec(RESULTS / "promise12_paper_length")
    prostate = [r for r in report_rows(prostate_spec) if r.get("kind") != "pretrain"]
    ablation = report_rows(load_spec(RESULTS / "acdc_ablation"))
    paper = [r for r in select(acdc, "paper", acdc_spec.paper_lr) if r["method"] in ACDC_ROWS]
    tuned = [r for r in select(acdc, "tuned") if r["method"] in ACDC_ROWS]
    if figure:
        plot_dice_vs_scans(paper, RESULTS / "acdc_paper_lr.png", "ACDC, paper's lengths, LR 1e-4")
    prostate = select(prostate, "paper")
    return {"acdc": measured_table(paper, ACDC_ROWS, ("lv", "rv", "myo")),
            "promise12": measured_table(prostate, PROSTATE_ROWS, ("prostate",)),
            "headline": headline_table(paper, prostate),
            "pairs": pairs_table({"LR 1e-4": paper, "LR chosen": tuned}),
            "noise": noise_table(acdc, ablation), "lr": lr_table(acdc, paper, tuned), "time": pretraining_time(acdc_all)}


def fill(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block replaced by ``blocks[name]``; a block without a table is an error."""
    def sub(m):
        if m.group(2) not in blocks:
            raise ExperimentError(f"no generated table is called {m.group(2)!r}; tables: {sorted(blocks)}")
        return f"{m.group(1)}{blocks[m.group(2)]}\n{m.group(4)}"
    return BLOCK.sub(sub, text)


def regenerate(check: bool = False) -> list[Path]:
    """Rewrite every page and the summary's tables from the CSVs; ``check``: write nothing, return the summary if its
    tables differ from the CSVs. Returns the paths written (or found stale)."""
    summaries = (RESULTS / "README.md", ROOT / "README.md")
    if check:
        blocks = summary_blocks()
        return [p for p in summaries if fill(p.read_text(), blocks) != p.read_text()]
    written = []
    for page in PAGES:
        written += write_report(load_spec(RESULTS / page), RESULTS / page)
    blocks = summary_blocks(figure=True)
    for p in summaries:
        p.write_text(fill(p.read_text(), blocks))
    return written + [*summaries, RESULTS / "acdc_paper_lr.png"]
