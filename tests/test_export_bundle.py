"""`python -m bim.export_bundle`: each exported bundle, copied alone into an empty folder outside the repository and
with the `bim` and `data_prep` packages made unimportable, passes MONAI's checks and runs, as a model-zoo download or
a MONAI Label app gets it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from bundle_helpers import BUNDLES, ROOT

from bim.export_bundle import export_bundle, vendored_targets

SCHEMA_2024 = "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/meta_schema_20240725.json"
# the packages the bundles import at run time beyond monai, torch and numpy
RUNTIME_PACKAGES = {"pytorch-ignite", "nibabel", "tensorboard", "pillow"}

# Loaded by the interpreter at start-up (sitecustomize): `bim` and `data_prep` cannot be imported, whatever is installed.
BLOCKER = '''
import sys

class _BlockRepositoryPackages:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("bim", "data_prep"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _BlockRepositoryPackages())
'''


def _alone(bundle: str, tmp_path: Path, weights: Path | None = None) -> Path:
    """Export ``bundle`` and copy the folder alone into an empty folder outside the repository."""
    exported = Path(export_bundle(bundle, weights=str(weights) if weights else None, out=str(tmp_path / "dist")))
    alone = tmp_path / "elsewhere" / bundle
    shutil.copytree(exported, alone)
    assert ROOT not in alone.parents
    return alone


def _isolated_env(tmp_path: Path, **extra: str) -> dict:
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(blocker), "PYTHONUNBUFFERED": "1", **extra}


def _python(code: str, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _bundle_run(cwd: Path, env: dict, config: str, **overrides) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", config]
    for k, v in overrides.items():
        cmd += [f"--{k}", str(v)]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_vendored_targets_renames_only_the_packages_targets():
    config = {"a": {"_target_": "bim.network.build_unet", "x": "bim.not_a_target"},
              "b": [{"_target_": "monai.networks.nets.BasicUNet"}, {"_target_": "bim.pretrain.model.X"}],
              "c": "$bim.something", "_target_": "bimx.y"}
    assert vendored_targets(config) == {
        "a": {"_target_": "scripts.bim.network.build_unet", "x": "bim.not_a_target"},
        "b": [{"_target_": "monai.networks.nets.BasicUNet"}, {"_target_": "scripts.bim.pretrain.model.X"}],
        "c": "$bim.something", "_target_": "bimx.y"}


def test_configs_name_the_package_only_in_targets():
    """The export rewrites ``_target_`` entries; a ``$`` expression naming the package would break the copy."""
    for path in sorted(BUNDLES.glob("*/configs/**/*.json")):
        def walk(node, where):
            if isinstance(node, dict):
                for k, v in node.items():
                    walk(v, f"{where}#{k}")
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, f"{where}#{i}")
            elif isinstance(node, str) and not where.endswith("#_target_"):
                assert "bim." not in node.replace("scripts.bim.", "") or path.name == "metadata.json", (path, where)
        walk(json.loads(path.read_text()), path.name)


@pytest.mark.parametrize("bundle", ["pretrain_bim", "finetune_seg", "meanteacher_seg"])
def test_export_is_complete_and_self_contained(bundle, tmp_path):
    alone = _alone(bundle, tmp_path)
    for name in ("configs/metadata.json", "configs/train.json", "configs/evaluate.json", "configs/multi_gpu_train.json",
                 "configs/logging.conf", "docs/README.md", "docs/data_license.txt", "LICENSE", "scripts/__init__.py",
                 "scripts/bim/__init__.py", "scripts/bim/network.py", "scripts/bim/pretrain/losses.py",
                 "scripts/bim/data_prep/__init__.py", "scripts/bim/data_prep/splits/acdc_reference.json"):
        assert (alone / name).is_file(), name
    files = [p for p in alone.rglob("*")]
    assert not any(p.is_symlink() for p in files)
    assert not any(p.name == "__pycache__" for p in files)
    assert all(p.stat().st_mode & 0o777 == (0o755 if p.is_dir() else 0o644) for p in files)
    for path in (alone / "configs").rglob("*.json"):
        if path.name != "metadata.json":
            assert '"bim.' not in path.read_text(), path
    assert "scripts.bim." in (alone / "configs" / "train.json").read_text()
    meta = json.loads((alone / "configs" / "metadata.json").read_text())
    assert meta["schema"] == SCHEMA_2024
    assert meta["version"] in meta["changelog"]
    assert RUNTIME_PACKAGES <= set(meta["required_packages_version"])
    assert "optional_packages_version" not in meta
    if bundle != "pretrain_bim":
        assert meta["supported_apps"] == {"monai-label": "0.8.5"}
    assert "ACDC" in (alone / "docs" / "data_license.txt").read_text()
    with zipfile.ZipFile(tmp_path / "dist" / f"{bundle}.zip") as archive:
        names = set(archive.namelist())
    assert f"{bundle}/configs/train.json" in names and f"{bundle}/scripts/bim/__init__.py" in names


def test_export_refuses_bad_input_and_keeps_an_earlier_export(tmp_path):
    with pytest.raises(ValueError, match="bundle 'nope': expected one of pretrain_bim, finetune_seg, meanteacher_seg"):
        export_bundle("nope", out=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--weights .*missing.pt: not found"):
        export_bundle("finetune_seg", weights=str(tmp_path / "missing.pt"), out=str(tmp_path))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt: not a valid weights file"):
        export_bundle("finetune_seg", weights=str(junk), out=str(tmp_path))
    first = Path(export_bundle("finetune_seg", out=str(tmp_path)))
    with pytest.raises(FileExistsError, match="pass --overwrite True to replace it"):
        export_bundle("finetune_seg", out=str(tmp_path))
    assert first.is_dir() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _monais_checks(alone: Path, env: dict, demo_dataset: Path, scan: Path, evaluate: bool = True,
                   infer: dict | None = None, **network) -> None:
    """MONAI's ``verify_net_in_out`` and ``ckpt_export`` (as the model zoo's CI calls them, ``network`` overriding the
    network's keys) and ``check_properties`` of the train / evaluate (``evaluate``) / inference entry points, in the
    bundle's folder; the exported TorchScript file loads. First, in the same interpreter, ``infer``: the overrides of
    an inference.json run through ``monai.bundle.run``, the function that ``python -m monai.bundle run`` calls."""
    _python(f"""
        from monai.bundle import ConfigWorkflow, ckpt_export, run, verify_net_in_out
        root, network, evaluate, infer = {str(alone)!r}, {network!r}, {evaluate!r}, {infer!r}
        if infer is not None:
            run(config_file="configs/inference.json", **infer)
        verify_net_in_out(net_id="network_def", meta_file=root + "/configs/metadata.json",
                          config_file=root + "/configs/inference.json", bundle_root=root, **network)
        ckpt_export(net_id="network_def", filepath=root + "/models/model.ts", ckpt_file=root + "/models/model.pt",
                    meta_file=root + "/configs/metadata.json", config_file=root + "/configs/inference.json",
                    bundle_root=root, **network)
        data = {{"dataset_dir": {str(demo_dataset)!r}}}
        for files, kind, extra in ((["train.json"], "train", data), (["train.json", "evaluate.json"], "infer", data),
                                   (["inference.json"], "infer", {{"dataset_dir": {str(scan)!r}}})):
            if files[-1] == "evaluate.json" and not evaluate:
                continue
            wf = ConfigWorkflow(config_file=[root + "/configs/" + f for f in files], workflow_type=kind, **extra)
            wf.initialize()
            assert wf.check_properties() == [], (files, wf.check_properties())
        print("checks passed")
        """, cwd=alone, env=env)
    import torch

    assert torch.jit.load(str(alone / "models" / "model.ts")) is not None


@pytest.mark.parametrize("bundle", ["finetune_seg", "meanteacher_seg"])
def test_a_segmentation_bundle_copied_alone_trains_infers_and_passes_monais_checks(bundle, tmp_path, demo_dataset):
    """Train a few iterations and segment a raw demo scan with the bundle's own configs, then run MONAI's
    ``verify_net_in_out`` and ``ckpt_export`` (as the model zoo's CI calls them) and ``check_properties`` of every
    entry point, all with ``bim`` and ``data_prep`` unimportable and the bundle's folder as the working directory."""
    alone = _alone(bundle, tmp_path)
    env = _isolated_env(tmp_path)
    _bundle_run(alone, env, "configs/train.json", dataset_dir=demo_dataset, epochs=1, iters_per_epoch=2, batch_size=2, crop_size=64,
                progress_bar=False, compile=False)
    assert (alone / "models" / "model.pt").is_file()
    raw = demo_dataset / "raw" / "training" / "patient002" / "patient002_frame01.nii.gz"
    # inference.json in the interpreter of MONAI's checks (one start of python less; the command line: train.json's)
    _monais_checks(alone, env, demo_dataset, raw,
                   infer={"dataset_dir": str(raw), "output_dir": str(tmp_path / "pred")})
    import nibabel as nib

    mask, image = nib.load(tmp_path / "pred" / "patient002_frame01_seg.nii.gz"), nib.load(raw)
    assert mask.shape == image.shape


def test_the_pretraining_bundle_copied_alone_trains_maps_clusters_and_passes_monais_checks(tmp_path, demo_dataset):
    alone = _alone("pretrain_bim", tmp_path)
    env = _isolated_env(tmp_path)
    network = {"features": [8, 8, 16, 16, 32, 8], "num_subheads": 1}  # K stays 40, the width metadata.json declares
    _bundle_run(alone, env, "configs/train.json", dataset_dir=demo_dataset, epochs=1, iters_per_epoch=2, crop_size=64,
                scans_per_batch=2, panel_every=100, save_every=100, progress_bar=False, compile=False,
                features="[8,8,16,16,32,8]", num_subheads=1)
    assert (alone / "models" / "model.pt").is_file() and (alone / "models" / "cluster_quality.json").is_file()
    raw = demo_dataset / "raw" / "training" / "patient002" / "patient002_frame01.nii.gz"
    # its evaluate.json scores the clusters of a checkpoint: not a MONAI inference workflow (no evaluator); its
    # inference.json runs in the interpreter of MONAI's checks (one start of python less; the command line: train.json's)
    _monais_checks(alone, env, demo_dataset, raw, evaluate=False, **network,
                   infer={"dataset_dir": str(raw), "output_dir": str(tmp_path / "clusters"), **network})
    import nibabel as nib

    clusters, image = nib.load(tmp_path / "clusters" / "patient002_frame01_clusters.nii.gz"), nib.load(raw)
    assert clusters.shape == image.shape and (tmp_path / "clusters" / "patient002_frame01_clusters.png").is_file()
