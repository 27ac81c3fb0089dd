"""CLI: python -m data_prep <acdc|promise12|nifti|synthetic|demo> ... (see data_prep/README.md)."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    import fire

    from .cli import COMMANDS, check_args
    from .common import DataPrepError, setup_logging

    setup_logging()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        check_args(argv)  # an unknown option stops here, before any work
        fire.Fire(COMMANDS, command=argv, name="data_prep")
    except DataPrepError as e:
        print(f"data_prep: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
