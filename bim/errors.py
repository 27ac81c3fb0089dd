"""One clear last line for a bundle's error.

MONAI wraps an error raised while a config builds a component in ``RuntimeError("Failed to instantiate ...")``
(and an expression's in ``"Failed to evaluate ..."``), several times when components nest; the project's own
message, which names the key or file, what was expected and what was given, ends up in the middle of the
chained tracebacks. :func:`excepthook` (installed when ``bim`` is imported) prints the tracebacks as Python does
and then, as the last line, ``error: <message>`` of the innermost exception raised by the project's code
(``bim``, ``data_prep`` or a bundle's ``scripts``).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

_PROJECT_PACKAGES = ("bim", "data_prep", "scripts")


def _raised_by_project(exc: BaseException) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = Path(tb.tb_frame.f_code.co_filename)
    return any(part in _PROJECT_PACKAGES for part in path.parts[:-1])


def project_error(exc: BaseException) -> BaseException | None:
    """The innermost exception of ``exc``'s chain (causes and contexts) raised by the project's code, or None."""
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _raised_by_project(exc):
            found = exc
        exc = exc.__cause__ or exc.__context__
    return found


def _size_mismatch(exc: BaseException) -> str | None:
    """The first ``size mismatch for <tensor>: ...`` line of torch's ``load_state_dict`` error in ``exc``'s chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for line in str(exc).splitlines():
            if line.strip().startswith("size mismatch for "):
                return line.strip()
        exc = exc.__cause__ or exc.__context__
    return None


def last_line(exc: BaseException) -> str | None:
    """``error: <message>`` of :func:`project_error`, or None when the project raised none of the chain. Weights
    that do not fit the network (torch's "size mismatch") get a line that says which option sets the widths."""
    mismatch = _size_mismatch(exc)
    if mismatch is not None:
        return (f"error: the weights do not fit this network ({mismatch.rstrip('.')}): pass the --features (and "
                "--unet_style, --num_clusters) the model was trained with")
    err = project_error(exc)
    if err is None or err is exc and len(str(exc).splitlines()) <= 1:
        return None
    message = " ".join(str(err).split()) or type(err).__name__
    return f"error: {message}"


def excepthook(exc_type, exc, tb) -> None:
    traceback.print_exception(exc_type, exc, tb)
    line = last_line(exc) if exc is not None else None
    if line:
        print(line, file=sys.stderr)


def install() -> None:
    """Make :func:`excepthook` the process's hook (once; only where Python's default hook is still in place)."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = excepthook
