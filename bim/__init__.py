"""bim: the code of the BIM bundles (network, slice store on the device, GPU augmentation, the pre-training
losses and heads, fine-tuning, semi-supervised training, evaluation and inference).

Installed with ``pip install -e .`` from the repository root; the bundle configs name its objects as
``bim.<module>.<name>``. ``python -m bim.export_bundle`` writes a self-contained copy of a bundle whose
``scripts/bim`` holds this package; ``python -m bim.bundle_configs`` writes the segmentation bundles' configs from
``bundles/config_sources/``.
"""

from .errors import install as _install_excepthook

_install_excepthook()
