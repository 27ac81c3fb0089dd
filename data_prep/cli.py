"""fire commands of `python -m data_prep` (each returns None so fire prints nothing)."""

from __future__ import annotations


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
