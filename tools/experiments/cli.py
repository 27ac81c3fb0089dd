"""The command line, ``python tools/experiments.py COMMAND`` (``--help`` on any command):

    python tools/experiments.py presets
    python tools/experiments.py plan acdc_fast --select '{"tasks": "lv", "seeds": 0}'
    python tools/experiments.py run acdc_paper --dataset_dir data/acdc --work_dir runs/acdc_paper --jobs 8 --gpus 4
    python tools/experiments.py collect runs/acdc_paper                 # -> runs/acdc_paper/results.csv
    python tools/experiments.py report runs/acdc_paper/results.csv --out_dir runs/acdc_paper/report
    python tools/experiments.py pages                                   # regenerate docs/results from its CSVs
    python tools/experiments.py compare runs/mask/results.csv docs/results/acdc_authors_options/fp32_grid_decoder_rows.csv.gz

``run`` resumes: a run whose folder holds a ``result.json`` is skipped. ``--select`` narrows a preset
(``tasks``, ``counts``, ``seeds``, ``lrs``, ``methods``, ``only``, ``mt_weights``; ``pretrain_per_seed`` true: one
pre-training per seed, split seed s fine-tuned from pre-training s); ``--tag`` with ``--overrides``
(fine-tuning) or ``--pretrain_overrides`` runs the grid with other bundle settings under rows of its own.
Overrides reach ``monai.bundle run`` as they are, where a value starting with ``$`` is a Python expression: an
overrides string is code, so run only your own. ``probe RUN_DIR`` re-runs a recorded pre-training command only if
it names pretrain_bim's own configs with plain ``--key value`` options.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .collection import collect, probe_command
from .figures import plot_cluster_panels
from .grid import build_grid
from .pages import regenerate
from .report import ReportSpec, load_spec, write_report
from .runner import run_grid
from .sections import ab_comparison
from .tables import read_rows
from .vocabulary import PRESETS, ExperimentError


def _path_list(value) -> list:
    """A CLI list of paths: fire keeps "[a.csv, b.csv]" (names with dots) as one string."""
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        value = [x.strip().strip("'\"") for x in value[1:-1].split(",") if x.strip()]
    return [value] if isinstance(value, (str, Path)) else list(value)


class CLI:
    """Experiments of the paper's tables: presets -> grids of bundle runs -> results CSV -> tables and figures."""

    def presets(self) -> list[str]:
        """The preset names (``vocabulary.PRESETS``)."""
        return sorted(PRESETS)

    def plan(self, preset: str, dataset_dir: str = "DATASET", work_dir: str = "WORK", select=None, tag=None,
             overrides=None, pretrain_overrides=None) -> None:
        """Print the runs of a preset (narrowed by ``select``) and their commands, without running them."""
        for r in build_grid(preset, dataset_dir, work_dir, select, tag, overrides, pretrain_overrides):
            print(f"{r.name}  ({r.kind}{', after ' + ', '.join(r.depends) if r.depends else ''})")
            for c in r.commands:
                print("    " + " ".join(c))

    def run(self, preset: str, dataset_dir: str, work_dir: str, jobs: int = 1, gpus=None, select=None, tag=None,
            overrides=None, pretrain_overrides=None) -> None:
        """Run a preset's grid in ``work_dir`` (resumable: finished runs are skipped), up to ``jobs`` runs at once
        spread over ``gpus`` (a count or ids such as 0,1), then collect it into ``work_dir/results.csv``."""
        grid = build_grid(preset, dataset_dir, work_dir, select, tag, overrides, pretrain_overrides)
        print(f"{preset}: {len(grid)} runs")
        counts = run_grid(grid, work_dir, jobs=jobs, gpus=gpus)
        print(counts)
        if counts["done"] + counts["skipped_existing"]:
            print(collect(work_dir))
        if counts["failed"] or counts["skipped_dependency"]:
            raise SystemExit(1)

    def collect(self, work_dir: str, csv_path: str | None = None) -> None:
        """Gather ``work_dir/runs/*/result.json`` into a results CSV (``X.csv.gz``: gzip-compressed) and its
        ``_per_scan`` CSV."""
        print(collect(work_dir, csv_path))

    def probe(self, run_dir: str, dataset_dir: str | None = None) -> None:
        """Run pretrain_bim's ``path_dependence.json`` on a finished pre-training (the encoder levels its clusters
        depend on), with the settings it was trained with; ``collect`` then adds its ``pd_L*`` columns."""
        import subprocess

        cmd = probe_command(run_dir, dataset_dir)
        if cmd is None:
            print(f"{run_dir}: this variant trains no cluster head; nothing to probe")
            return
        raise SystemExit(subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2]).returncode)

    def report(self, csv_paths, out_dir: str, title: str = "Results", paper_lr: float | None = None) -> None:
        """Render results CSV(s) (oldest first) as the paper's tables and figures in ``out_dir``; a folder holding a
        ``report.json`` (as each page under docs/results does) is rendered as that file says."""
        paths = _path_list(csv_paths)
        if len(paths) == 1 and Path(paths[0]).is_dir():
            spec = load_spec(paths[0])
        else:
            spec = ReportSpec(csvs=paths, title=title, paper_lr=None if paper_lr is None else float(paper_lr))
        for p in write_report(spec, out_dir):
            print(p)

    def pages(self, check: bool = False) -> None:
        """Regenerate every page under docs/results from its committed CSVs (``PAGES``), and the tables of
        docs/results/README.md; ``check``: write nothing, fail if a page's tables differ from the CSVs."""
        from bim.flags import require_flags  # fire hands --check false over as the string 'false'

        require_flags({"check": check})
        stale = regenerate(check=check)
        for p in stale:
            print(("differs: " if check else "") + str(p))
        if check and stale:
            raise SystemExit(1)

    def compare(self, candidate, reference, labelled_scans: int = 1, method: str | None = None,
                names: str = "candidate,reference") -> None:
        """Print the A/B table of two settings run on the same split seeds (CSVs, or lists of them): per seed and on
        average, each one's best-cluster Dice and its fine-tunes' validation and test Dice at ``labelled_scans``
        (of ``method`` when the CSVs hold several), then the candidate's difference on validation and test."""
        labels = tuple(str(names).split(","))
        if len(labels) != 2:
            raise ExperimentError(f"names: expected two labels separated by a comma, got {names!r}")
        candidate_rows, reference_rows = read_rows(_path_list(candidate)), read_rows(_path_list(reference))
        print("\n".join(ab_comparison(candidate_rows, reference_rows, labels, int(labelled_scans), method)))

    def panels(self, csv_paths, out_png: str, ablations: bool = False) -> None:
        """Draw the cluster panels of the pre-trainings in results CSV(s) side by side (``runs/NAME/panels`` beside
        each CSV, as ``collect`` leaves them) into ``out_png``; ``ablations``: one figure row per ablation."""
        from bim.flags import require_flags  # fire hands --ablations false over as the string 'false'

        require_flags({"ablations": ablations})
        pretrains = [r for r in read_rows(_path_list(csv_paths)) if r.get("kind") == "pretrain"]
        png = plot_cluster_panels(pretrains, Path(out_png), ablations=ablations)
        if png is None:
            raise ExperimentError(f"none of the {len(pretrains)} pre-trainings has a cluster panel to draw")
        print(png)


def main() -> None:
    import fire

    try:
        fire.Fire(CLI, name="experiments.py")
    except ValueError as e:  # bad input (ExperimentError is one): one line that names the file or key, not a traceback
        print(f"experiments.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None
