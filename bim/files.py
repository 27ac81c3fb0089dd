"""Files the bundles and tools write: never half-written, readable by others.

Only the standard library: ``tools/experiments`` and ``data_prep`` use it without importing torch.
"""

from __future__ import annotations

import glob
import os
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

READABLE = 0o644  # what the bundles write (weights, checkpoints, CSV/JSON) is readable by others, as any new file


def _remove_stale_temporaries(path: Path) -> None:
    """Remove temporary files that :func:`atomic_file` left for ``path`` in a process of this host that is gone
    (killed while writing); those of running processes and of other hosts are kept."""
    prefix, host = f".{path.name}.", socket.gethostname()
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        owner = tmp.name[len(prefix):].rsplit("-", 1)[0]
        tmp_host, _, pid = owner.rpartition(".")
        if tmp_host != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:  # alive, another user's
            pass


@contextmanager
def atomic_file(path: str | os.PathLike):
    """Yields a temporary path in ``path``'s folder; when the block succeeds, the file gets mode 0644 and is renamed
    to ``path`` (never half-written; ``tempfile`` creates it 0600); when it fails, the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = f"{socket.gethostname()}.{os.getpid()}"
    _remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{owner}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, READABLE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
