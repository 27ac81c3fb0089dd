"""The words every other module of the experiment tools uses, defined once: the methods (the rows of the paper's
Table 1 and Table 3), the labelled-scan columns, the presets (training budgets and grids), the ablations and the
paper's published numbers. Nothing here imports another module of the package."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRETRAIN_TRAIN = "bundles/pretrain_bim/configs/train.json"
PRETRAIN_PATHS = "bundles/pretrain_bim/configs/path_dependence.json"
FINETUNE_TRAIN = "bundles/finetune_seg/configs/train.json"
FINETUNE_EVAL = "bundles/finetune_seg/configs/evaluate.json"
MT_TRAIN = "bundles/meanteacher_seg/configs/train.json"
MT_EVAL = "bundles/meanteacher_seg/configs/evaluate.json"
TRAIN_CONFIG_OF_KIND = {"pretrain": PRETRAIN_TRAIN, "finetune": FINETUNE_TRAIN, "meanteacher": MT_TRAIN}
# the evaluation of a run's early-stopping record (``--record_early_stop N``): eval/early_stop_p<N>_*
EARLY_STOP_EVAL_PREFIX = "early_stop_p"
# a pre-training of one seed per split seed (the grid's ``pretrain_per_seed``): its run name carries "_ps<seed>"
PRETRAIN_SEED_TAG = "_ps"


def pretrain_seed_name(seed: int | None) -> str:
    """The run-name part of a pre-training's own seed: ``_ps<seed>`` ("" for None, the bundle's default seed)."""
    return "" if seed is None else f"{PRETRAIN_SEED_TAG}{seed}"


def without_pretrain_seed(name: str) -> str:
    """A pre-training's run name without its ``_ps<seed>`` part: the name of its setting, shared by its seeds."""
    return re.sub(rf"{PRETRAIN_SEED_TAG}\d+(?=_|$)", "", name)


class ExperimentError(ValueError):
    """A preset, a grid, a results CSV or a report that cannot be used as asked."""


# method label -> (pre-training variant of pretrain_bim or None for random init, the bundle that trains it)
METHODS = {
    "Baseline": (None, "finetune"),
    "IIC (Dec)": ("iic_dec", "finetune"),
    "Contrast (Enc)": ("contrast_enc", "finetune"),
    "Contrast (Enc+Dec)": ("contrast_enc_dec", "finetune"),
    "Ours (Dec) MI+CC": ("ours_mi_cc", "finetune"),
    "Contrast (Enc) + Ours (Dec)": ("full", "finetune"),
    "Mean Teacher": (None, "meanteacher"),
    "MT + Ours": ("full", "meanteacher"),
}
METHOD_ORDER = tuple(METHODS)
# the paper's Table 1 (pre-training rows) and Table 3 (the semi-supervised rows added), as our grids run them
TABLE1_ROWS = ("Baseline", "IIC (Dec)", "Contrast (Enc)", "Ours (Dec) MI+CC", "Contrast (Enc) + Ours (Dec)")
TABLE3_ROWS = ("Mean Teacher", "MT + Ours")
ACDC_ROWS = TABLE1_ROWS + TABLE3_ROWS
PROSTATE_ROWS = ("Baseline", "Contrast (Enc) + Ours (Dec)", "Mean Teacher", "MT + Ours")

TASK_COLUMNS = (("lv", "LV"), ("rv", "RV"), ("myo", "Myo"), ("prostate", "Prostate"))
TASK_NAMES = dict(TASK_COLUMNS)
TASK_ORDER = {t: i for i, (t, _) in enumerate(TASK_COLUMNS)}
ACDC_TASKS, ACDC_COUNTS = ("lv", "rv", "myo"), (1, 2, 4)
PROSTATE_TASKS, PROSTATE_COUNTS = ("prostate",), (4, 6, 8)
COUNTS = {"lv": ACDC_COUNTS, "rv": ACDC_COUNTS, "myo": ACDC_COUNTS, "prostate": PROSTATE_COUNTS}

# The paper's Table 1 / Table 3 (3D Dice x 100, mean of 3 seeds): per method, LV, RV, Myo at 1 / 2 / 4 labelled scans
# and Prostate at 4 / 6 / 8 (paper.tex, tab:representation_result and tab:compare_sota)
_PAPER_ROWS = {
    "Baseline": ((67.13, 74.49, 84.81), (51.82, 60.50, 64.18), (54.05, 67.56, 76.00), (49.91, 71.53, 78.04)),
    "IIC (Dec)": ((71.96, 82.84, 85.43), (56.92, 63.58, 64.93), (58.31, 70.22, 74.98), (54.21, 72.97, 80.05)),
    "Contrast (Enc)": ((80.59, 85.68, 87.78), (68.91, 73.54, 72.70), (67.30, 77.22, 79.58), (63.54, 78.24, 81.72)),
    "Contrast (Enc+Dec)": ((77.98, 85.97, 88.42), (66.47, 72.82, 76.69), (64.96, 76.98, 78.76), (60.68, 77.97, 80.53)),
    "Ours (Dec) MI+CC": ((84.04, 88.52, 89.31), (76.86, 79.13, 75.92), (76.93, 79.59, 81.97), (68.13, 78.75, 82.82)),
    "Contrast (Enc) + Ours (Dec)": ((84.48, 87.85, 90.04), (75.42, 79.73, 78.89), (74.30, 78.43, 82.82),
                                    (69.76, 80.47, 82.09)),
    "Mean Teacher": ((83.13, 87.02, 87.70), (61.61, 68.76, 67.21), (61.55, 75.32, 78.42), (84.71, 85.97, 86.93)),
    "MT + Ours": ((90.25, 91.36, 91.04), (80.16, 81.50, 78.97), (78.71, 83.33, 83.61), (85.64, 85.60, 88.45)),
}
# method -> task -> {labelled scans: Dice x 100}
PAPER_TABLE1 = {
    method: {task: dict(zip(COUNTS[task], values)) for (task, _), values in zip(TASK_COLUMNS, rows)}
    for method, rows in _PAPER_ROWS.items()
}

# the authors' code's choices that became pretrain_bim's defaults in 0.5.0, in the groups the authors-options page
# screened them by; a leave-one-out grid sets one group back to its value in configs/earlier_defaults.json at a time
AUTHORS_OPTION_GROUPS = {"views": ("view_rotation_deg", "view_jitter"),
                         "t": ("t_interpolation", "t_mirror_prob", "t_gamma_sampling"),
                         "decoder": ("unet_style",), "cc": ("cc_maps", "edge"),
                         "fp32_warp": ("feature_warp_fp32",), "unmasked_joint": ("mask_out_of_image",)}
EARLIER_DEFAULTS = "bundles/pretrain_bim/configs/earlier_defaults.json"
# the ablated pre-training hyper-parameters and their values (the paper's ablation tables)
ABLATIONS = {"alpha": (0.0, 0.25, 0.5, 0.75, 1.0), "lambda_cc": (0.0, 0.1, 1.0, 4.0),
             "num_clusters": (5, 10, 20, 40, 60)}
ABLATION_LABELS = {"alpha": "alpha", "lambda_cc": "lambda_CC", "num_clusters": "K"}
# an ablation whose pre-trainings a tagged grid changed (``--pretrain_overrides``) is reported under its key, this
# separator and the changes (``alpha with {"edge_power": 0.5}``): another experiment, not the paper's ablation
CHANGED_ABLATION = " with "


def ablation_label(key: str) -> str:
    """The table and figure label of an ablation key (``K``; ``alpha with {"edge_power": 0.5}`` for changed ones)."""
    base, sep, changes = key.partition(CHANGED_ABLATION)
    return ABLATION_LABELS.get(base, base) + sep + changes
# The paper's ablation tables (ACDC, Ours (Dec) MI+CC; alpha 0.5, lambda_CC 1, K 40 where not varied):
# key -> value -> (LV, RV, Myo) at 1 / 2 / 4 labelled scans
_PAPER_ABLATION_ROWS = {
    "alpha": {0.0: ((61.58, 78.09, 81.27), (31.95, 23.50, 41.64), (54.74, 58.15, 69.45)),
              0.25: ((84.36, 87.68, 89.32), (38.98, 59.73, 59.39), (76.93, 79.59, 81.97)),
              0.5: ((84.04, 88.52, 89.31), (76.86, 79.13, 75.92), (76.27, 79.81, 82.36)),
              0.75: ((82.02, 87.81, 89.03), (76.76, 79.41, 75.49), (73.14, 78.79, 81.79)),
              1.0: ((81.31, 85.58, 88.66), (73.34, 76.37, 70.44), (71.90, 79.47, 81.22))},
    "lambda_cc": {0.0: ((83.63, 86.94, 89.33), (66.63, 73.78, 73.85), (73.65, 77.39, 81.92)),
                  0.1: ((80.54, 85.40, 87.80), (66.99, 76.00, 75.33), (72.62, 77.03, 81.39)),
                  1.0: ((84.04, 88.52, 89.31), (76.86, 79.13, 75.92), (76.93, 79.59, 81.97)),
                  4.0: ((78.36, 84.60, 85.48), (70.84, 75.39, 70.88), (73.74, 76.65, 81.33))},
    "num_clusters": {5: ((66.88, 73.95, 77.33), (49.32, 52.10, 51.74), (38.52, 48.18, 49.25)),
                     10: ((81.00, 86.11, 87.73), (70.75, 74.37, 71.78), (71.16, 77.48, 80.14)),
                     20: ((69.72, 73.37, 74.68), (59.63, 63.13, 54.00), (76.03, 79.34, 82.30)),
                     40: ((84.04, 88.52, 89.31), (76.86, 79.13, 75.92), (76.27, 79.81, 82.36)),
                     60: ((85.25, 88.12, 89.74), (70.28, 74.78, 76.39), (75.96, 79.09, 82.68))},
}
# key -> task -> labelled scans -> {value: Dice x 100}
PAPER_ABLATIONS = {
    key: {task: {n: {float(v): rows[t][i] for v, rows in table.items()} for i, n in enumerate(ACDC_COUNTS)}
          for t, task in enumerate(ACDC_TASKS)}
    for key, table in _PAPER_ABLATION_ROWS.items()
}


@dataclass(frozen=True)
class Protocol:
    """The training budget of a preset. ``*_overrides`` are extra bundle command-line overrides."""

    pretrain_epochs: int = 50
    pretrain_iters: int = 200
    pretrain_warmup: int = 10
    finetune_epochs: int = 50
    finetune_iters: int = 200
    finetune_warmup: int = 10
    rampup_epochs: int = 10
    unlabelled_batch_size: int | None = None  # Mean Teacher runs' (None: the bundle's default)
    paper_lr: float = 2e-5
    lrs: tuple[float, ...] = (2e-5, 1e-4, 5e-4)
    pretrain_overrides: tuple[str, ...] = ()
    finetune_overrides: tuple[str, ...] = ()
    # appended to run names (a grid run with extra overrides, see ``grid.build_grid``'s ``tag``)
    name_suffix: str = ""
    pretrain_suffix: str = ""


@dataclass(frozen=True)
class Preset:
    """A named grid: its protocol, rows, tasks, labelled counts, seeds, whether it ablates the pre-training, and the
    row whose pre-training an ablation grid varies unless ``--select`` names methods."""

    protocol: Protocol
    methods: tuple[str, ...]
    tasks: tuple[str, ...]
    counts: tuple[int, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    ablation: bool = False
    ablated: tuple[str, ...] = ("Contrast (Enc) + Ours (Dec)",)
    leave_one_out: bool = False  # one pre-training per AUTHORS_OPTION_GROUPS group set back to its earlier value


FAST = Protocol(pretrain_epochs=10, pretrain_iters=200, pretrain_warmup=2, finetune_epochs=20,
                finetune_iters=100, finetune_warmup=2, rampup_epochs=5, paper_lr=1e-4, lrs=(2e-5, 1e-4, 5e-4),
                pretrain_overrides=("--panel_every", "1000", "--save_every", "1000", "--log_every", "200"),
                finetune_overrides=("--save_every", "500", "--log_every", "100"))
# acdc_fast keeps the light labelled augmentation all of its rows were measured with (rotation ±15°, zoom 0.9-1.1,
# no gamma); the bundles' ACDC default is the pre-training transform's ranges (ACDC_AUGMENTATION in bim_common.tasks)
LIGHT_AUGMENTATION = ("--max_rotation_deg", "15.0", "--scale_range", "[0.9, 1.1]", "--gamma_range", "None")
ACDC_FAST = replace(FAST, finetune_overrides=FAST.finetune_overrides + LIGHT_AUGMENTATION)
PAPER = Protocol()
# the paper's lengths at one fine-tuning LR, 1e-4 (the LR validation chose for Ours (Dec) MI+CC), also the LR that
# `report` reads the runs at
PAPER_LR_1E4 = replace(PAPER, paper_lr=1e-4, lrs=(1e-4,))
# the authors' edge map for prostate MR: |grad I|^0.5 (ACDC: the bundle's default 0.75)
PROSTATE_EDGE = ("--edge_power", "0.5")
SMOKE = Protocol(pretrain_epochs=1, pretrain_iters=2, pretrain_warmup=0, finetune_epochs=1, finetune_iters=2,
                 finetune_warmup=0, rampup_epochs=1, unlabelled_batch_size=2, paper_lr=1e-3, lrs=(1e-3,),
                 pretrain_overrides=("--features", "[8,16,32,64,128,8]", "--scans_per_batch", "2",
                                     "--crop_size", "64", "--panel_every", "2", "--save_every", "2"),
                 finetune_overrides=("--features", "[8,16,32,64,128,8]", "--crop_size", "64", "--batch_size", "2",
                                     "--save_every", "2"))

PRESETS = {
    # the paper's lengths (50 x 200 iterations for both stages), three fine-tuning LRs per cell
    "acdc_paper": Preset(PAPER, ACDC_ROWS, ACDC_TASKS, ACDC_COUNTS),
    # PROMISE12's epoch is 400 iterations (the paper's appendix); its fine-tuning base LR 1e-6 x 200 gives 2e-4
    "promise12_paper": Preset(replace(PAPER, pretrain_iters=400, finetune_iters=400, paper_lr=2e-4,
                                      lrs=(2e-5, 2e-4, 5e-4), pretrain_overrides=PROSTATE_EDGE),
                              PROSTATE_ROWS, PROSTATE_TASKS, PROSTATE_COUNTS),
    # a shortened protocol (2,000 + 2,000 iterations) for a quick look on one GPU
    "acdc_fast": Preset(ACDC_FAST, ACDC_ROWS, ACDC_TASKS, ACDC_COUNTS),
    "promise12_fast": Preset(replace(FAST, pretrain_epochs=5, pretrain_iters=400,
                                     pretrain_overrides=FAST.pretrain_overrides + PROSTATE_EDGE),
                             PROSTATE_ROWS, PROSTATE_TASKS, PROSTATE_COUNTS),
    # the alpha, lambda_CC and K ablations at 1 labelled LV scan
    "acdc_ablation_fast": Preset(ACDC_FAST, (), ("lv",), (1,), (0,), ablation=True),
    # the paper's ablation tables at its lengths: Ours (Dec) MI+CC, LV / RV / Myo at 1 labelled scan, 3 seeds, at the
    # LR validation chose for that row (1e-4); add "pretrain_per_seed": true to --select for a pre-training per seed
    "acdc_ablation_paper": Preset(PAPER_LR_1E4, (), ACDC_TASKS, (1,), ablation=True,
                                  ablated=("Ours (Dec) MI+CC",)),
    # which of the authors' code's choices Ours (Dec) MI+CC needs: each group of them left out (set back to
    # configs/earlier_defaults.json) in turn, at the paper's lengths, LV / RV / Myo at 1 labelled scan, LR 1e-4
    "acdc_authors_loo": Preset(PAPER_LR_1E4, (), ACDC_TASKS, (1,), leave_one_out=True,
                               ablated=("Ours (Dec) MI+CC",)),
    # a seconds-long CPU grid on the demo data (tests)
    "smoke": Preset(SMOKE, ("Baseline", "Contrast (Enc) + Ours (Dec)", "Mean Teacher"), ("lv",), (1,), (0,)),
}


def fmt_lr(lr: float) -> str:
    """An LR as run names and tables write it: ``5e-4``."""
    return f"{lr:.0e}".replace("e-0", "e-")
