"""The configs of the two segmentation bundles, written from one source.

``finetune_seg`` and ``meanteacher_seg`` share most of their configs. What they share stands once in
``bundles/config_sources/segmentation/``; what is a bundle's own stands in ``bundles/config_sources/<bundle>/``
(a file of the same name, or none). ::

    python -m bim.bundle_configs           # writes the bundles' configs/*.json that differ from their sources
    python -m bim.bundle_configs --check   # lists (with a diff) those that differ; exit status 1 if any

The written files are complete, so each bundle runs alone (``monai.bundle run`` from any folder, a bundle folder
copied alone, the model-zoo layout, ``bim.export_bundle``). Edit the sources, never the written files:
``tests/test_bundle_configs.py`` fails while they differ, and the next run of this command overwrites them.

A bundle's file is the shared file merged with the bundle's own:

- objects merge key by key, recursively; any other value of the bundle's (number, string, list, null) replaces the
  shared one, and so does an object naming another ``_target_`` than the shared object (another component: none of
  the shared arguments carry over);
- keys only in the bundle's file follow the shared keys of their object, in the bundle file's order; a ``_target_``
  comes first, and at the top level they come before MONAI's workflow keys (``initialize``, ``run``, ``finalize``);
- a key named with ``#`` (``train#store#device``) is a plain key here; MONAI applies it when it reads the file.

Each value stands once: a bundle's file repeating a shared value, or both bundles' files holding the same value at
the same place, is reported by :func:`repeated_values` (and fails the test).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from .export_bundle import bundles_dir
from .files import atomic_file

SHARED = "segmentation"
BUNDLES = ("finetune_seg", "meanteacher_seg")
WORKFLOW_KEYS = ("initialize", "run", "finalize")


def sources_dir(root: Path | None = None) -> Path:
    return (root or bundles_dir()) / "config_sources"


def json_text(config) -> str:
    """The bundles' JSON formatting: two-space indent, a final newline."""
    return json.dumps(config, indent=2) + "\n"


def _other_component(shared, own) -> bool:
    return "_target_" in shared and "_target_" in own and shared["_target_"] != own["_target_"]


def merge(shared, own, top: bool = True):
    """``own`` (a bundle's file) merged into ``shared`` by the rules of the module's docstring."""
    if not isinstance(shared, dict) or not isinstance(own, dict) or _other_component(shared, own):
        return own
    merged = {k: merge(v, own[k], top=False) if k in own else v for k, v in shared.items()}
    new = [k for k in own if k not in shared]
    keys = list(merged)
    at = next((i for i, k in enumerate(keys) if k in WORKFLOW_KEYS), len(keys)) if top else len(keys)
    order = [k for k in new if k == "_target_"] + keys[:at] + [k for k in new if k != "_target_"] + keys[at:]
    return {k: merged[k] if k in merged else own[k] for k in order}


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _file_names(root: Path | None, bundle: str) -> list[str]:
    src = sources_dir(root)
    return sorted({p.name for folder in (SHARED, bundle) for p in (src / folder).glob("*.json")})


def generated(root: Path | None = None) -> dict[Path, str]:
    """Each written config (``bundles/<bundle>/configs/<name>.json``) -> its text, from the sources."""
    root, src = root or bundles_dir(), sources_dir(root)
    return {root / bundle / "configs" / name: json_text(merge(_read(src / SHARED / name), _read(src / bundle / name)))
            for bundle in BUNDLES for name in _file_names(root, bundle)}


def stale(root: Path | None = None) -> dict[Path, str]:
    """The written configs that differ from their sources (missing, a link, other text) -> the text they should have."""
    return {path: text for path, text in generated(root).items()
            if path.is_symlink() or not path.is_file() or path.read_text() != text}


def write(root: Path | None = None) -> list[Path]:
    """Write each config that differs from its sources, atomically; return those written."""
    out = stale(root)
    for path, text in out.items():
        with atomic_file(path) as tmp:
            Path(tmp).write_text(text)
    return list(out)


def _same(a, b, where: str) -> list[str]:
    """The places where ``a`` and ``b`` hold the same value (objects compared key by key, unless another
    component)."""
    if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
        return [where or "the whole file"]
    if isinstance(a, dict) and isinstance(b, dict) and not _other_component(a, b):
        return [m for k in a if k in b for m in _same(a[k], b[k], f"{where}#{k}" if where else k)]
    return []


def repeated_values(root: Path | None = None) -> list[str]:
    """Values that stand twice in the sources: a bundle's file repeating the shared file, or both bundles' files
    holding the same value at the same place (it belongs in the shared file)."""
    src, problems = sources_dir(root), []
    for name in sorted(set(_file_names(root, BUNDLES[0])) | set(_file_names(root, BUNDLES[1]))):
        shared, own = _read(src / SHARED / name), [_read(src / bundle / name) for bundle in BUNDLES]
        for bundle, config in zip(BUNDLES, own):
            problems += [f"{bundle}/{name}: {where} repeats the shared value of {SHARED}/{name}; delete it"
                         for where in (_same(shared, config, "") if config else [])]
        problems += [f"{' and '.join(BUNDLES)} both hold {name}'s {where}; move it to {SHARED}/{name}"
                     for where in (_same(*own, "") if all(own) else [])]
    return problems


def _diff(path: Path, text: str) -> str:
    old = path.read_text().splitlines(keepends=True) if path.is_file() else []
    return "".join(difflib.unified_diff(old, text.splitlines(keepends=True), f"{path} (now)", f"{path} (sources)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bim.bundle_configs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only list the configs that differ from the sources")
    args = parser.parse_args(argv)
    problems = repeated_values()
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if args.check:
        differ = stale()
        for path, text in differ.items():
            print(f"{path}: differs from bundles/config_sources (run python -m bim.bundle_configs)\n{_diff(path, text)}")
        return 1 if differ or problems else 0
    for path in write():
        print(f"wrote {path}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
