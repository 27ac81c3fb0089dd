"""Settings as a command line hands them over (booleans, choices, lists of numbers), checked without importing torch
(the experiment runner uses them too). ``bim.engine`` re-exports the boolean checks, which the bundles' configs name."""

from __future__ import annotations


def as_flag(value, key: str) -> bool:
    """A bundle's boolean setting: a bool, or the strings ``true`` / ``false`` (any case) or ``1`` / ``0`` that a
    command line gives (``--amp false`` arrives as the string 'false', which Python's ``bool`` would
    take for true). Anything else is a ``ValueError`` naming ``key``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f"{key} must be true or false, got {value!r}")


def require_flags(flags: dict) -> None:
    """A bundle's boolean keys as the command line gave them (``{key: value}``): each must be a bool. ``monai.bundle
    run`` hands ``--amp False`` over as False but ``--amp false`` as the string 'false', which every ``if @amp``
    would take for true; such a value is a ``ValueError`` naming the key and the spelling to use."""
    for key, value in flags.items():
        if not isinstance(value, bool):
            hint = f" (write --{key} {value.strip().capitalize()})" if isinstance(value, str) and \
                value.strip().lower() in ("true", "false") else ""
            raise ValueError(f"{key} must be True or False, got {value!r}{hint}")


def require_choice(key: str, value, choices) -> None:
    """``value`` must be one of ``choices``; otherwise a ``ValueError`` naming ``key``, the choices and the value."""
    if value not in choices:
        raise ValueError(f"{key} must be one of {tuple(choices)}, got {value!r}")


def comma_floats(value, option: str, example: str = "0.5,0.75,1", positive: bool = True) -> tuple[float, ...]:
    """A list of numbers as a command line hands it over: ``"2,4,8"``, a single number (``--powers 1`` arrives as
    an int), or a list or tuple (``--powers 2,4`` may arrive as one). Anything that is not a number, or (with
    ``positive``) a number <= 0, is a ``ValueError`` naming ``option`` and showing ``example``."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else \
        [value] if isinstance(value, (int, float)) else value
    problem = ValueError(f"{option}: expected comma-separated{' positive' if positive else ''} numbers such as "
                         f"{example}, got {value!r}")
    try:
        out = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise problem from None
    if positive and any(not v > 0 for v in out):
        raise problem
    return out
