"""Custom code of the meanteacher_seg bundle.

Importing this package puts ``bundles/`` (shared package ``bim_common``) and the repository root
(``data_prep``) on ``sys.path``, so the bundle runs with the plain ``python -m monai.bundle run`` from any folder.
"""

import sys
from pathlib import Path

BUNDLE_ROOT = Path(__file__).resolve().parents[1]
for _path in (BUNDLE_ROOT.parent, BUNDLE_ROOT.parent.parent):
    if str(_path) not in sys.path:
        sys.path.append(str(_path))


def bundle_root() -> str:
    """This bundle's folder, so configs resolve paths relative to the bundle and not the current folder."""
    return BUNDLE_ROOT.as_posix()


# the shared package, reachable from configs as ``scripts.bim.<module>.<name>``
import bim_common as bim  # noqa: E402
import bim_common.data  # noqa: E402,F401
import bim_common.engine  # noqa: E402,F401
import bim_common.gpu_augment  # noqa: E402,F401
import bim_common.inference  # noqa: E402,F401
import bim_common.network  # noqa: E402,F401
import bim_common.segmentation  # noqa: E402,F401
import bim_common.semi_supervised  # noqa: E402,F401
import bim_common.tasks  # noqa: E402,F401
