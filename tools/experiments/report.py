"""One protocol's page: ``README.md`` with the paper's tables under both protocols (the paper's single fine-tuning LR,
and each row's LR chosen on validation), gaps to the paper, the order of the rows, run-for-run pairs, the LR choice,
the hardest scans, the ablations and the cluster quality; ``table_cells.json`` (the tables' means and seed counts) and
the PNGs beside it. What a page shows is a :class:`ReportSpec`, kept as ``report.json`` in the page's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from .collection import per_scan_path
from .figures import plot_ablations, plot_cluster_panels, plot_dice_vs_scans
from .sections import (ablation_rows, ablation_tables, chosen_lr_lines, chosen_weight_lines, cluster_quality_table,
                       early_stop_lines, group_tables, hardest_scans, lr_choice_lines, one_lr_lines, provenance_lines, read_groups,
                       same_as_paper, tag_lines)
from .tables import (_lrs_tried, candidates, cells_json, gap_table, markdown_table, ordering_lines, pair_references,
                     paired_table, read_cells_json, read_per_scan, read_rows, relabel_rows, select, table, write_text)
from .vocabulary import METHOD_ORDER, PAPER_TABLE1, TASK_COLUMNS, COUNTS, ExperimentError

PROTOCOLS = (("paper", "Paper protocol: one fine-tuning LR for every method"),
             ("tuned", "Each method at its fine-tuning LR chosen on the validation split"))


@dataclass
class ReportSpec:
    """What a report shows. ``csvs``: results CSVs, oldest first (a run name in several is taken from the last);
    their ``*_per_scan`` CSVs are read when present. ``note``: markdown under the title. ``methods``: only these rows
    and the pre-trainings they start from. ``relabel``: rows that ran the same settings under another label,
    ``{"Baseline [longaug]": "Baseline"}``. ``paper_lr``: one LR for every row of the paper-protocol table (default:
    each preset's). ``pair_with``: ``{row: reference or [references]}`` for the run-for-run table (default
    Baseline). ``groups``: a datalist or split with the test scans' patient groups, ``group_focus`` a group detailed
    run by run. ``per_scan_methods``: the rows of those per-scan sections. ``lr_pools``: ``{name: [rows]}`` pooled in
    the LR-choice table. ``order_against``: another report's ``table_cells.json`` (named ``order_against_name``) whose
    row order each table is also counted against. ``tags``: what each tag was for. ``panels_note``: markdown closing
    the cluster maps' section. ``renamed``: ``{old: new}`` pre-training names as the page shows them (with the
    fine-tunes' ``init``; a renamed pre-training's tag keeps what precedes a comma), the CSVs unchanged.
    ``pretrain_protocol``: pre-training overrides every ablation run of the page shares (``{"epochs": 25}`` for a
    page at 5,000 iterations), which do not make its cells another pre-training's. ``figure_methods``: the rows the
    Dice-vs-scans figures draw (default: every row of the tables)."""

    csvs: list
    title: str = "Results"
    note: str = ""
    methods: list | None = None
    relabel: dict = field(default_factory=dict)
    paper_lr: float | None = None
    pair_with: dict = field(default_factory=dict)
    groups: str | None = None
    group_focus: str | None = None
    per_scan_methods: list | None = None
    lr_pools: dict = field(default_factory=dict)
    order_against: str | None = None
    order_against_name: str = ""
    tags: dict = field(default_factory=dict)
    panels_note: str = ""
    renamed: dict = field(default_factory=dict)
    pretrain_protocol: dict = field(default_factory=dict)
    figure_methods: list | None = None


def load_spec(folder) -> ReportSpec:
    """The :class:`ReportSpec` of a page's folder: its ``report.json`` (paths relative to the folder, repository
    paths from the root; ``note`` and ``panels_note`` name markdown files of the folder)."""
    folder = Path(folder)
    path = folder / "report.json"
    if not path.is_file():
        raise ExperimentError(f"{path}: no such file (a page's folder keeps what its report shows in report.json)")
    data = json.loads(path.read_text())
    unknown = set(data) - {f.name for f in fields(ReportSpec)}
    if unknown or "csvs" not in data:
        raise ExperimentError(f"{path}: expected 'csvs' and keys among {[f.name for f in fields(ReportSpec)]}; "
                              f"unknown: {sorted(unknown)}")
    data["csvs"] = [folder / c for c in data["csvs"]]
    for key in ("note", "panels_note"):
        if data.get(key):
            data[key] = (folder / data[key]).read_text().strip()
    for key in ("order_against",):
        if data.get(key):
            data[key] = str(folder / data[key])
    if data.get("groups"):
        data["groups"] = str(Path(__file__).resolve().parents[2] / data["groups"])
    return ReportSpec(**data)


def report_rows(spec: ReportSpec) -> list[dict]:
    """The rows a report shows: the CSVs' rows narrowed to ``methods`` (and their pre-trainings), relabelled."""
    rows = read_rows(spec.csvs)
    for r in rows:
        if r.get("name") in spec.renamed:
            r["name"], r["tag"] = spec.renamed[r["name"]], (r.get("tag") or "").split(",")[0]
        if r.get("init") in spec.renamed:
            r["init"] = spec.renamed[r["init"]]
    if spec.methods is not None:
        unknown = sorted(set(spec.methods) - {r.get("method") for r in rows if r.get("kind") != "pretrain"})
        if unknown:
            raise ExperimentError(f"methods {unknown} are in none of {[str(p) for p in spec.csvs]}")
        rows = [r for r in rows if r.get("kind") == "pretrain" or r.get("method") in spec.methods]
        inits = {r.get("init") for r in rows if r.get("kind") != "pretrain"}
        rows = [r for r in rows if r.get("kind") != "pretrain" or r.get("name") in inits]
    if not any(r.get("kind") != "pretrain" for r in rows):
        raise ExperimentError(f"{[str(p) for p in spec.csvs]}: no fine-tuning results to report")
    if spec.relabel:
        relabel_rows(rows, dict(spec.relabel))
    return rows


def _check_labels(spec: ReportSpec, labels: set) -> None:
    named = set(spec.pair_with) | {ref for m in spec.pair_with for ref in pair_references(spec.pair_with, m)}
    named |= set(spec.per_scan_methods or ()) | set(spec.figure_methods or ())
    if named - labels:
        raise ExperimentError(f"pair_with / per_scan_methods / figure_methods name {sorted(named - labels)}, which are "
                              f"not rows of this report; rows: {sorted(labels)}")


def protocol_section(spec: ReportSpec, seg: list[dict], protocol: str, heading: str, out: Path):
    """(markdown lines, table cells, PNG or None) of one protocol's tables."""
    chosen = select(seg, protocol, spec.paper_lr)
    if not any(not r.get("ablation") for r in chosen):  # no method rows (e.g. an ablation grid): no method table
        return [], {}, None
    methods, columns, cells = table(chosen)
    same = same_as_paper(seg, cells, select_cells(seg, spec.paper_lr)) if protocol == "tuned" else []
    shown = [m for m in methods if m not in same]  # the best in bold is that of the rows shown
    lrs = sorted({r["lr"] for r in chosen if not r.get("ablation")})
    tried = _lrs_tried(seg)
    one_lr = ("the preset's `paper_lr`" if spec.paper_lr is None else f"{spec.paper_lr:g} for every row")
    md = [f"## {heading}" + (f" ({one_lr})" if protocol == "paper" else ""), "",
          f"LR(s) used: {', '.join(f'{x:g}' for x in lrs)}"
          + (f"; LRs tried per cell: {min(tried)} to {max(tried)}." if protocol == "tuned" else "."), "",
          markdown_table(shown, columns, cells), "", *(one_lr_lines(seg, same) if protocol == "tuned" else []),
          "Our mean minus the paper's (Dice points):", "", gap_table(shown, columns, cells), "",
          *ordering_lines(methods, columns, cells)]
    against = read_cells_json(spec.order_against) if spec.order_against else {}
    if protocol in against:
        md += ordering_lines(methods, columns, cells, against[protocol], spec.order_against_name)
    md += paired_table(chosen, spec.pair_with)
    if protocol == "tuned":
        md += chosen_lr_lines(chosen, seg) + lr_choice_lines(seg, spec.lr_pools)
    md += chosen_weight_lines(chosen, candidates(seg, protocol, spec.paper_lr))
    drawn = chosen if spec.figure_methods is None else [r for r in chosen if r["method"] in spec.figure_methods]
    png = plot_dice_vs_scans(drawn, out / f"dice_vs_scans_{protocol}.png", heading.split(":")[0])
    if png:
        md += [f"![Dice vs labelled scans]({png.name})", ""]
        if spec.figure_methods is not None:
            md += [f"The figure draws {', '.join(m for m in methods if m in spec.figure_methods)}; the tables above "
                   "have every row.", ""]
    return md, {k: v for k, v in cells.items() if k[0] in methods}, png


def select_cells(seg: list[dict], paper_lr) -> dict:
    """The paper-protocol table's cells of ``seg``."""
    return table(select(seg, "paper", paper_lr))[2]


def per_scan_sections(spec: ReportSpec, seg: list[dict]) -> list[str]:
    """The hardest test scans and the test Dice by patient group, from the per-scan CSVs beside ``csvs``."""
    paths = [per_scan_path(Path(p)) for p in spec.csvs]
    scan_dice = read_per_scan([p for p in paths if p.is_file()]) if any(p.is_file() for p in paths) else {}
    if not scan_dice:
        return []
    detail = [r for r in select(seg, "paper", spec.paper_lr)
              if spec.per_scan_methods is None or r["method"] in spec.per_scan_methods]
    hardest = hardest_scans(detail, scan_dice)
    if not hardest:  # no method row with per-scan Dice (ablation runs are not compared scan by scan)
        return []
    md = ["## Hardest test scans (the paper-protocol runs that have per-scan Dice)", "",
          "Test 3D Dice x 100 of each scan, each method's mean over its runs (every labelled count and seed); the 5 "
          "scans with the lowest mean over the methods, lowest first, then the other scans' range.", "", *hardest]
    if spec.groups:
        md += ["## Test Dice by patient group (the paper-protocol runs that have per-scan Dice)", "",
               f"Groups from `{Path(spec.groups).name}` (ACDC's Info.cfg); each method's mean over its runs' scans "
               "of the group.", "", *group_tables(detail, scan_dice, *read_groups(spec.groups), focus=spec.group_focus)]
    return md


def pretraining_sections(spec: ReportSpec, rows: list[dict], seg: list[dict], out: Path) -> tuple[list[str], list]:
    """The ablation tables and figure, the cluster maps and the cluster quality; (markdown, PNGs written)."""
    md, written = [], []
    abl = ablation_rows(select(seg, "paper", spec.paper_lr), spec.pretrain_protocol)
    if abl:
        md += ["## Ablations (paper-LR protocol)", "",
               "Each value of a hyper-parameter is its own pre-training, fine-tuned per seed; mean (std over seeds, "
               "number of seeds), best in bold. The paper's rows (its ablation tables) vary Ours (Dec) MI+CC at its "
               "full protocol.", "", *ablation_tables(abl)]
        png = plot_ablations(abl, out / "ablations.png")
        if png:
            written.append(png)
            md += [f"![ablations]({png.name})", ""]
    pretrains = [r for r in rows if r.get("kind") == "pretrain"]
    for ablations, name, heading, extra in (
            (False, "cluster_panels.png", "Cluster maps of the pre-training variants (as the paper's Figure 3)",
             spec.panels_note),
            (True, "cluster_panels_ablations.png",
             "Cluster maps of the ablations' pre-trainings (as the paper's Figure 3, one value per panel)", "")):
        panels = plot_cluster_panels(pretrains, out / name, ablations=ablations)
        if panels:
            written.append(panels)
        elif (out / name).is_file():  # the pre-training folders are not here: keep the figure an earlier run drew
            panels = out / name
        if panels:
            md += [f"## {heading}", "", f"![{name.removesuffix('.png')}]({panels.name})", ""] + (
                [extra, ""] if extra else [])
    md += cluster_quality_table(pretrains, candidates(rows, "paper", spec.paper_lr))
    return md, written


def render(spec: ReportSpec, out: Path) -> tuple[str, dict, list]:
    """(README.md text, table cells by protocol, PNGs written) of ``spec``."""
    rows = report_rows(spec)
    seg = [r for r in rows if r.get("kind") != "pretrain"]
    _check_labels(spec, {r["method"] for r in seg})
    md = [f"# {spec.title}", "", "3D Dice x 100 on the test scans, mean (std over seeds); `n=` when a cell has 2 or "
          "more than 3 seeds, a bare number when it has one seed; best of each column in bold.", ""]
    if spec.note:
        md += [spec.note, ""]
    md += tag_lines(seg, spec.tags)
    md += [f"- rows `{old}` are reported as `{new}` (the same settings under another name)."
           for old, new in spec.relabel.items()] + ([""] if spec.relabel else [])
    md += provenance_lines(rows)
    cells, written = {}, []
    for protocol, heading in PROTOCOLS:
        lines, cells[protocol], png = protocol_section(spec, seg, protocol, heading, out)
        md += lines
        written += [png] if png else []
    cells = {p: c for p, c in cells.items() if c}
    md += per_scan_sections(spec, seg)
    md += early_stop_lines(seg)
    methods = [m for m in METHOD_ORDER if m in PAPER_TABLE1]
    paper_cols = [(t, n) for t, _ in TASK_COLUMNS for n in COUNTS[t]]
    md += ["## The paper's Table 1 and Table 3 (mean of 3 seeds, its full protocol)", "",
           markdown_table(methods, paper_cols, {}, paper=True), ""]
    more, pngs = pretraining_sections(spec, rows, seg, out)
    return "\n".join(md + more), cells, written + pngs


def write_report(spec: ReportSpec, out_dir) -> list[Path]:
    """Write ``out_dir/README.md``, ``out_dir/table_cells.json`` and the PNGs of ``spec``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text, cells, written = render(spec, out)
    readme, cells_path = out / "README.md", out / "table_cells.json"
    write_text(cells_path, cells_json(cells))
    write_text(readme, text)
    return [readme, cells_path, *written]
