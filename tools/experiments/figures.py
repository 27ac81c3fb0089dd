"""A report's figures (PNG, 32 or 64 colours): test Dice against labelled scans, the pre-trainings' cluster maps side
by side (as the paper's Figure 3), and the ablations beside the paper's."""

from __future__ import annotations

from pathlib import Path

from bim.files import atomic_file

from .sections import _ablation_of, _pretrain_label, paper_ablation, sorted_pretrains
from .tables import table
from .vocabulary import TASK_COLUMNS, TASK_NAMES, ablation_label


LINE_PLOT = {"colours": 32, "dpi": 75}  # line plots: ten line colours, their antialiased edges and the greys


def _save(fig, path: Path, colours: int = 64, dpi: int = 90) -> Path:
    """``fig`` as a PNG of ``colours`` colours (small enough to commit), written atomically."""
    from PIL import Image

    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
        Image.open(tmp).convert("RGB").quantize(colours).save(tmp, format="PNG", optimize=True)
    return path


def method_styles(methods: list[str]) -> dict[str, dict]:
    """One colour, marker and line style per method, the same in every panel of a figure (the legend is shared)."""
    markers, lines = "osD^v", ("-", "--", ":")
    return {m: {"color": f"C{i % 10}", "marker": markers[(i // 10) % len(markers)],
                "linestyle": lines[(i // 10) % len(lines)]} for i, m in enumerate(methods)}


def dice_vs_scans_figure(rows: list[dict], title: str):
    """The matplotlib figure of :func:`plot_dice_vs_scans` (None when no task has results)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods, columns, cells = table(rows)
    tasks = [t for t, _ in TASK_COLUMNS if any(c[0] == t for c in columns)]
    if not tasks:
        return None
    styles = method_styles(methods)
    plotted = [m for m in methods if any((m, *c) in cells for c in columns)]
    # the legend gets rows of its own below the panels, so a long list of methods does not squash them
    legend_rows = 1 + (len(plotted) - 1) // 4
    legend_in = 0.25 + 0.16 * legend_rows
    height = 3.6 + legend_in
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), height), squeeze=False)
    names = dict(TASK_COLUMNS)
    for ax, task in zip(axes[0], tasks):
        for m in methods:
            pts = sorted((c[1], cells[(m, *c)]) for c in columns if c[0] == task and (m, *c) in cells)
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1][0] for p in pts], yerr=[p[1][1] for p in pts], capsize=3,
                            label=m, **styles[m])
        ax.set_xticks(sorted({c[1] for c in columns if c[0] == task}))
        ax.set_title(names[task])
        ax.set_xlabel("labelled scans")
        ax.set_ylabel("test 3D Dice x 100")
        ax.grid(alpha=0.3)
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, legend_in / height, 1, 1))
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="lower center", ncol=min(4, len(handles)))
    return fig


def plot_dice_vs_scans(rows: list[dict], path: Path, title: str) -> Path | None:
    """Test Dice against labelled scans, one panel per task, one line per method (mean, std over seeds as bars)."""
    import matplotlib.pyplot as plt

    fig = dice_vs_scans_figure(rows, title)
    if fig is None:
        return None
    out = _save(fig, path, **LINE_PLOT)
    plt.close(fig)
    return out


def plot_cluster_panels(pretrain_rows: list[dict], path: Path, max_rows: int = 2, ablations: bool = False) -> Path | None:
    """The last cluster panel of each pre-training side by side, first ``max_rows`` slices: the variants, or with
    ``ablations`` the ablations' pre-trainings in the order of their values, one figure row per ablation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    panels = []
    for r in sorted_pretrains(pretrain_rows):
        if bool(r.get("ablation")) != ablations or not r.get("panel") or not Path(r["panel"]).is_file():
            continue
        img = np.asarray(Image.open(r["panel"]).convert("RGB"))
        rows_in_panel = _panel_rows(img)
        # the first max_rows slices, columns image | cluster map
        kept_rows = img.shape[0] * min(max_rows, rows_in_panel) // rows_in_panel
        group = _ablation_of(r)[0] if ablations else ""
        panels.append((group, _pretrain_label(r), img[:kept_rows, : img.shape[1] // 2]))
    if not panels:
        return None
    groups = list(dict.fromkeys(g for g, _, _ in panels))
    cols = max(sum(g == group for g, _, _ in panels) for group in groups)
    # constrained layout keeps the suptitle of a one-row figure clear of its panels' titles
    fig, axes = plt.subplots(len(groups), cols, figsize=(2.5 * cols, (0.4 + 0.95 * max_rows) * len(groups)), squeeze=False,
                             layout="constrained")
    for ax in axes.flat:
        ax.axis("off")
    common = {name.rsplit("\n", 1)[0] for _, name, _ in panels} if ablations else set()
    if len(common) == 1:  # one pre-training varied: its name once on top, each panel titled by its value
        fig.suptitle(common.pop().replace("\n", " "), fontsize=10)
        panels = [(g, name.rsplit("\n", 1)[-1], img) for g, name, img in panels]
    for row, group in zip(axes, groups):
        for ax, (_, name, img) in zip(row, [q for q in panels if q[0] == group]):
            ax.imshow(img)
            ax.set_title(name, fontsize=9)
    out = _save(fig, path)
    plt.close(fig)
    return out


def _panel_rows(img) -> int:
    """Rows (slices) of a cluster panel: pretrain_bim's ClusterPanelHandler draws four square tiles per row."""
    h, w = img.shape[:2]
    return max(1, round(h / (w / 4)))


def plot_ablations(abl: dict, path: Path) -> Path | None:
    """One panel per ablation key: our mean (std over seeds) per value for each task and labelled count, each
    pre-training's mean as a short bar where a value was pre-trained more than once, and the paper's values of the
    same cells dashed in the same colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not abl:
        return None
    keys = list(dict.fromkeys(k for k, _, _ in abl))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for i, ((k, task, n), pts) in enumerate((c, p) for c, p in abl.items() if c[0] == key):
            colour, where = f"C{i}", f"{TASK_NAMES.get(task, task)} {n}"
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                        color=colour, label=f"{where}, ours")
            twice = [(p[0], m) for p in pts if len(p[5]) > 1 for m in p[5]]  # each pre-training's mean: small
            if twice:
                ax.plot(*zip(*twice), linestyle="none", marker="_", markersize=10, color=colour)
            lent = [p for p in pts if p[4]]  # the shared default point: hollow
            if lent:
                ax.plot([p[0] for p in lent], [p[1] for p in lent], linestyle="none", marker="o", markersize=9,
                        markerfacecolor="white", markeredgecolor=colour, zorder=3)
            paper = [(p[0], paper_ablation(key, task, n, p[0])) for p in pts]
            paper = [(x, y) for x, y in paper if y is not None]
            if paper:
                ax.plot(*zip(*paper), linestyle="--", marker="x", color=colour, label=f"{where}, paper")
        ax.set_xlabel(ablation_label(key))
        ax.set_ylabel("test 3D Dice x 100")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    out = _save(fig, path, **LINE_PLOT)
    plt.close(fig)
    return out
