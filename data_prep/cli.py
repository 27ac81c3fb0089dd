"""fire commands of `python -m data_prep` (each returns None so fire prints nothing), and the check
of a command line against them before fire runs anything."""

from __future__ import annotations

import difflib
import inspect
import re

from .common import DataPrepError


def acdc(src, dst, size=384, split=None, seeds="0,1,2", split_seed=0, workers=2, overwrite=False):
    """ACDC challenge layout SRC (SRC/training/patientNNN or SRC/patientNNN) -> DST."""
    from . import acdc as m

    m.prepare(src, dst, size=size, split=split, seeds=seeds, split_seed=split_seed, workers=workers, overwrite=overwrite)


def promise12(src, dst, size=256, split=None, seeds="0,1,2", split_seed=0, workers=2, overwrite=False):
    """PROMISE12 SRC (CaseNN.mhd + CaseNN_segmentation.mhd, or .nii/.nii.gz) -> DST."""
    from . import promise12 as m

    m.prepare(src, dst, size=size, split=split, seeds=seeds, split_seed=split_seed, workers=workers, overwrite=overwrite)


def nifti(images_dir, dst, labels_dir=None, label_suffix="_seg", size=256, num_partitions=3, spacing="none",
          num_classes=None, seeds="0,1,2", labelled_counts="1,2,4", split_seed=0, workers=2, overwrite=False):
    """A folder of 3D NIfTI images (labels optional: --labels_dir or NAME<label_suffix>) -> DST."""
    from . import nifti as m

    m.prepare(images_dir, dst, labels_dir=labels_dir, label_suffix=label_suffix, size=size,
              num_partitions=num_partitions, spacing=spacing, num_classes=num_classes, seeds=seeds,
              labelled_counts=labelled_counts, split_seed=split_seed, workers=workers, overwrite=overwrite)


def synthetic(dst, num_patients=20, seed=0, overwrite=False):
    """Synthetic cardiac phantoms in the ACDC challenge layout (DST/training/patientNNN/...)."""
    from . import synthetic as m

    m.generate(dst, num_patients=num_patients, seed=seed, overwrite=overwrite)


def demo(dst, num_patients=20, size=128, seed=0, overwrite=False):
    """Synthetic phantoms into DST/raw, then `acdc` into DST (size 128): the demo data set."""
    from . import demo as m

    m.prepare(dst, num_patients=num_patients, size=size, seed=seed, overwrite=overwrite)


COMMANDS = {"acdc": acdc, "promise12": promise12, "nifti": nifti, "synthetic": synthetic, "demo": demo}


FIRE_FLAGS = ("help", "h")  # fire's own, before a separating "--"


def _is_flag(arg: str) -> bool:
    """fire's notion of a flag: --anything, or -letter... (not a negative number)."""
    return arg.startswith("--") or re.match(r"^-[a-zA-Z]", arg) is not None


def check_args(argv) -> None:
    """Reject what fire would only complain about after running the command: an unknown option
    (naming the closest known one) or more positional arguments than the command takes."""
    argv = [str(a) for a in argv]
    if not argv or argv[0] not in COMMANDS:
        return  # fire's own message (unknown command, help)
    cmd, args = argv[0], argv[1:]
    if "--" in args:  # fire's flags (--help, --trace, ...) follow the last "--"
        args = args[: len(args) - 1 - args[::-1].index("--")]
    params = list(inspect.signature(COMMANDS[cmd]).parameters)
    given, positional, i = set(), [], 0
    while i < len(args):
        arg = args[i]
        if not _is_flag(arg):
            positional.append(arg)
            i += 1
            continue
        key = arg.lstrip("-").split("=", 1)[0].replace("-", "_")
        bool_syntax = "=" not in arg and (i + 1 == len(args) or _is_flag(args[i + 1]))
        if key in params:
            name = key
        elif bool_syntax and key.startswith("no") and key[2:] in params:
            name = key[2:]
        elif len(key) == 1 and len([p for p in params if p[0] == key]) == 1:
            name = next(p for p in params if p[0] == key)
        elif key in FIRE_FLAGS:
            return  # fire prints the help and runs nothing
        else:
            close = difflib.get_close_matches(key, params, n=1, cutoff=0.5)
            hint = f"did you mean --{close[0]}? " if close else ""
            raise DataPrepError(
                f"{cmd}: unknown option {arg.split('=', 1)[0]}; {hint}expected one of "
                f"{', '.join('--' + p for p in params)}"
            )
        given.add(name)
        i += 1 if ("=" in arg or bool_syntax) else 2
    free = [p for p in params if p not in given]
    if len(positional) > len(free):
        raise DataPrepError(
            f"{cmd}: unexpected extra argument(s) {' '.join(positional[len(free):])}; expected at most "
            f"{len(free)} positional argument(s) ({', '.join(p.upper() for p in free)})"
        )
