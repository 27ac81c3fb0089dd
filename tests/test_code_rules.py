"""Rules of the code base that a reviewer would otherwise check by hand: short functions, one atomic file writer, one
way to take a network out of its wrappers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80
SHORT_FUNCTION_FOLDERS = ("bim", "bundles", "data_prep")
SOURCE_FOLDERS = ("bim", "bundles", "data_prep", "tools")


def python_files(folders) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, lines)`` of every function and method of ``source``, decorators and docstring included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, first, node.end_lineno - first + 1))
    return out


def test_function_lengths_count_every_line_of_a_def():
    source = "def f():\n    pass\n\n\nclass A:\n    @staticmethod\n    def g(x):\n        '''doc'''\n\n        return x\n"
    assert function_lengths(source) == [("f", 1, 2), ("g", 6, 5)]


def test_no_function_of_the_package_bundles_or_data_prep_is_over_80_lines():
    long = [f"{path.relative_to(ROOT)}:{line} {name} ({n} lines)" for path in python_files(SHORT_FUNCTION_FOLDERS)
            for name, line, n in function_lengths(path.read_text()) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines, split them: " + "; ".join(long)


# a temporary file made and renamed by hand (bim.files.atomic_file does it, and cleans up after killed writers)
HAND_MADE_ATOMIC_WRITE = re.compile(r"\bmkstemp\(|\btmp\w*\.replace\(|os\.replace\(\s*tmp|with_name\(f\"\.\{")
# a network taken out of DistributedDataParallel / torch.compile by hand (bim.engine.unwrap does it)
HAND_MADE_UNWRAP = re.compile(r"getattr\([^)]*[\"'](_orig_mod|module)[\"']|hasattr\([^)]*[\"']module[\"']\)")


@pytest.mark.parametrize("pattern, home", [(HAND_MADE_ATOMIC_WRITE, "bim/files.py"), (HAND_MADE_UNWRAP, "bim/engine.py")])
def test_atomic_writing_and_unwrapping_live_in_one_function_each(pattern, home):
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in python_files(SOURCE_FOLDERS)
             if path.relative_to(ROOT).as_posix() != home
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"written by hand again; use the one in {home}: " + "; ".join(found)
    assert pattern.search((ROOT / home).read_text()), f"{home} no longer holds it: update this test"


@pytest.mark.parametrize("line", ["    fd, tmp = tempfile.mkstemp(dir=path.parent)", "    tmp.replace(out)",
                                  "    os.replace(tmp, path)", "    model = engine.network.module if hasattr(net, 'module') else net",
                                  '    return getattr(network, "_orig_mod", network)'])
def test_the_patterns_catch_what_they_are_for(line):
    assert HAND_MADE_ATOMIC_WRITE.search(line) or HAND_MADE_UNWRAP.search(line)
