"""The docs stay short enough to read: the results page, the README and each bundle's README, and every training key
of a bundle is in its README's configuration table."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = ("pretrain_bim", "finetune_seg", "meanteacher_seg")


def test_the_results_page_is_at_most_1500_words_and_opens_with_the_answer():
    text = (ROOT / "docs" / "results" / "README.md").read_text()
    assert len(text.split()) <= 1500
    assert text.splitlines()[2].startswith("**Yes on ACDC")


def test_the_readme_is_at_most_150_lines_with_table_cells_of_at_most_30_words():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    cells = [c for line in lines if line.startswith("|") for c in line.strip("|").split("|")]
    assert cells and max(len(c.split()) for c in cells) <= 30


@pytest.mark.parametrize("bundle", BUNDLES)
def test_a_bundle_readme_is_at_most_1200_words_and_names_every_training_key(bundle):
    text = (ROOT / "bundles" / bundle / "docs" / "README.md").read_text()
    assert len(text.split()) <= 1200
    table = "\n".join(line for line in text.splitlines() if line.startswith("| `"))
    keys = json.loads((ROOT / "bundles" / bundle / "configs" / "train.json").read_text())
    assert [k for k in keys if f"`{k}`" not in table] == []
    for heading in ("## Overview", "## Data", "## Training configuration", "## Performance", "## Commands",
                    "## References"):
        assert heading in text
