"""The segmentation bundles' configs are written from one source (bim.bundle_configs): the committed files match
their sources, each shared value stands once, and the merge follows the rules of the module's docstring."""

from __future__ import annotations

import json
from pathlib import Path

from bim import bundle_configs
from bim.bundle_configs import json_text, merge, repeated_values, stale, write

COMMAND = "python -m bim.bundle_configs"


def test_the_committed_configs_are_the_ones_their_sources_give():
    differ = [str(p.relative_to(bundle_configs.bundles_dir().parent)) for p in stale()]
    assert not differ, (
        f"{', '.join(differ)} differ from bundles/config_sources/: edit the sources there (the shared part in "
        f"segmentation/, a bundle's own in <bundle>/), then run `{COMMAND}` (`{COMMAND} --check` shows the diff)")


def test_each_shared_value_stands_once_in_the_sources():
    assert repeated_values() == []


def test_both_bundles_get_every_config_they_run_with():
    names = {p.relative_to(bundle_configs.bundles_dir()).as_posix() for p in bundle_configs.generated()}
    assert names == {f"{b}/configs/{n}.json" for b in ("finetune_seg", "meanteacher_seg")
                     for n in ("train", "evaluate", "inference", "multi_gpu_train")}


def test_merge_replaces_values_merges_objects_and_keeps_the_order():
    shared = {"imports": ["$import torch"], "seed": 0, "net": {"_target_": "A", "x": 1, "y": 2},
              "trainer": {"device": "@device", "epochs": 2}, "initialize": ["@a"], "run": ["$@b"]}
    own = {"seed": 1, "net": {"_target_": "B", "z": 3}, "imports": ["$import os"], "extra": None,
           "trainer": {"epochs": 3, "_target_": "T", "step": "@step"}}
    merged = merge(shared, own)
    assert merged == {"imports": ["$import os"], "seed": 1, "net": {"_target_": "B", "z": 3},
                      "trainer": {"_target_": "T", "device": "@device", "epochs": 3, "step": "@step"},
                      "extra": None, "initialize": ["@a"], "run": ["$@b"]}
    assert list(merged) == ["imports", "seed", "net", "trainer", "extra", "initialize", "run"]
    assert list(merged["trainer"]) == ["_target_", "device", "epochs", "step"]
    assert merge({"a": {"_target_": "A", "x": 1}}, {"a": {"_target_": "A", "y": 2}}) == {"a": {"_target_": "A", "x": 1, "y": 2}}
    assert list(merge({"a": {"run": 1}}, {"a": {"b": 2}})["a"]) == ["run", "b"]  # workflow keys only at the top level
    assert merge(shared, {}) == shared and list(merge(shared, {})) == list(shared)


def _sources(root: Path, files: dict) -> None:
    for name, config in files.items():
        path = root / "config_sources" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json_text(config))


def test_repeated_values_names_each_value_written_twice(tmp_path):
    _sources(tmp_path, {"segmentation/train.json": {"seed": 0, "net": {"_target_": "A", "x": 1}},
                        "finetune_seg/train.json": {"seed": 0, "net": {"x": 2}, "extra": {"k": [1]}},
                        "meanteacher_seg/train.json": {"net": {"_target_": "B", "x": 1}, "extra": {"k": [1]}}})
    assert repeated_values(tmp_path) == [
        "finetune_seg/train.json: seed repeats the shared value of segmentation/train.json; delete it",
        "finetune_seg and meanteacher_seg both hold train.json's extra; move it to segmentation/train.json"]


def test_write_replaces_links_and_changed_files_and_leaves_the_rest(tmp_path):
    _sources(tmp_path, {"segmentation/evaluate.json": {"a": 1}, "meanteacher_seg/evaluate.json": {"b": 2}})
    configs = tmp_path / "finetune_seg" / "configs"
    configs.mkdir(parents=True)
    (configs / "evaluate.json").write_text("{}\n")
    (tmp_path / "meanteacher_seg" / "configs").mkdir(parents=True)
    (tmp_path / "meanteacher_seg" / "configs" / "evaluate.json").symlink_to(configs / "evaluate.json")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in write(tmp_path)) == [
        "finetune_seg/configs/evaluate.json", "meanteacher_seg/configs/evaluate.json"]
    assert json.loads((configs / "evaluate.json").read_text()) == {"a": 1}
    written = tmp_path / "meanteacher_seg" / "configs" / "evaluate.json"
    assert not written.is_symlink() and json.loads(written.read_text()) == {"a": 1, "b": 2}
    assert written.stat().st_mode & 0o777 == 0o644
    assert write(tmp_path) == [] and stale(tmp_path) == {}
    assert sorted(p.name for p in configs.iterdir()) == ["evaluate.json"]  # no temporary file left


def test_check_lists_what_differs_and_exits_1(tmp_path, monkeypatch, capsys):
    _sources(tmp_path, {"segmentation/train.json": {"a": 1}})
    monkeypatch.setattr(bundle_configs, "bundles_dir", lambda: tmp_path)
    assert bundle_configs.main(["--check"]) == 1
    assert "finetune_seg/configs/train.json: differs" in capsys.readouterr().out
    assert bundle_configs.main([]) == 0 and bundle_configs.main(["--check"]) == 0
