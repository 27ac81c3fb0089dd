"""Bad inputs a careful user tries (issue 53, docs/reliability.md): each stops with one clear last line that names
the key or file, what was expected and what was given, and leaves nothing behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bundle_helpers import BUNDLES, workflow

ROOT = Path(__file__).resolve().parents[1]


def last_line_of(fn) -> str:
    """The ``error: ...`` line that ``bim.errors.excepthook`` prints last for the error ``fn()`` raises."""
    from bim.errors import last_line

    with pytest.raises(Exception) as err:
        fn()
    return last_line(err.value) or f"error: {err.value}"


CONFIGS = [("pretrain_bim", "train.json", "cluster_quality"), ("pretrain_bim", ["train.json", "evaluate.json"], "amp"),
           ("finetune_seg", "train.json", "amp"), ("finetune_seg", ["train.json", "evaluate.json"], "amp"),
           ("finetune_seg", "inference.json", "amp"), ("meanteacher_seg", "train.json", "unlabelled_bn_stats"),
           ("meanteacher_seg", "inference.json", "amp")]


@pytest.mark.parametrize("bundle, configs, key", CONFIGS)
def test_a_boolean_key_given_as_a_lowercase_string_stops_every_config_with_the_key_named(bundle, configs, key, tmp_path):
    """``--amp false`` arrives as the string 'false', which ``if @amp`` takes for true: every config (train, evaluate,
    inference) checks its options first and names the key and the spelling to use."""
    line = last_line_of(lambda: workflow(bundle, configs, output_dir=str(tmp_path), **{key: "false"}))
    assert line == f"error: {key} must be True or False, got 'false' (write --{key} False)"
    assert not any(tmp_path.iterdir())  # stopped before anything was built


def test_every_config_checks_its_options_first():
    for path in sorted(BUNDLES.glob("*/configs/*.json")):
        config = json.loads(path.read_text())
        if "initialize" in config:  # files without one (pretrain_bim's evaluate.json) run train.json's
            assert config["initialize"][0] == "@check_options", path


@pytest.mark.parametrize("bundle, overrides, message", [
    ("finetune_seg", {"learning_rate": "abc"}, "learning_rate must be a number (default 2e-05), got 'abc'"),
    ("finetune_seg", {"seed": "abc"}, "seed must be an integer (default 0), got 'abc'"),
    ("finetune_seg", {"iters_per_epoch": 0}, "iters_per_epoch must be >= 1 (default 200), got 0"),
    ("finetune_seg", {"epochs": -1}, "epochs must be >= 1 (default 50), got -1"),
    ("pretrain_bim", {"crop_size": 8}, "crop_size must be >= 16 (default 224), got 8"),
    ("finetune_seg", {"learning_rate": -0.1}, "learning_rate must be > 0 (default 2e-05), got -0.1"),
    ("meanteacher_seg", {"method": "foo"}, "method must be one of supervised, mean_teacher, ua_mt, ict, entropy_min, "
                                           "mixup, adversarial (default 'mean_teacher'), got 'foo'"),
    ("finetune_seg", {"epoch": 1}, "--epoch is not an option of this bundle (did you mean --epochs? --help True lists them)"),
    ("meanteacher_seg", {"consistency_weigth": 2}, "--consistency_weigth is not an option of this bundle (did you mean "
                                                    "--consistency_weight? --help True lists them)"),
])
def test_a_bad_option_value_or_an_unknown_key_stops_with_the_key_named(bundle, overrides, message, tmp_path):
    line = last_line_of(lambda: workflow(bundle, "train.json", output_dir=str(tmp_path), **overrides))
    assert line == f"error: {message}"
    assert not any(tmp_path.iterdir())


def test_help_lists_the_options_with_defaults_and_meanings_and_runs_nothing(tmp_path, capsys):
    from bim.options import main

    with pytest.raises(SystemExit) as done:
        workflow("finetune_seg", "train.json", dataset_dir=str(tmp_path / "absent"), help=True)
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert main([str(BUNDLES / "finetune_seg" / "configs" / "train.json")]) == 0
    listed = capsys.readouterr().out  # the same options, with the config's own defaults
    assert [line.split()[0] for line in listed.splitlines()] == [line.split()[0] for line in printed.splitlines()]
    assert [line.split()[1] for line in listed.splitlines() if line.startswith("--dataset_dir")] == ["null"]
    lines = {line.split()[0]: line for line in printed.splitlines()[1:]}
    assert lines["--dataset_dir"].split()[1] == json.dumps(str(tmp_path / "absent"))
    assert lines["--learning_rate"].split()[1:3] == ["2e-05", "peak"]
    assert lines["--epochs"].split()[1] == "50"
    assert "--help" not in lines and "--train" not in lines


def test_the_last_line_printed_for_a_wrapped_error_is_the_projects_message(capsys):
    """MONAI wraps a component's error in RuntimeError('Failed to instantiate ...'); the hook ends with ours."""
    from bim.errors import excepthook
    from bim.options import check_value

    try:
        try:
            raise ValueError(check_value("epochs", 0, 50))
        except ValueError as e:
            raise RuntimeError("Failed to instantiate component 'x'\n set '_mode_=debug'") from e
    except RuntimeError as e:
        excepthook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "error: epochs must be >= 1 (default 50), got 0"
    assert sys.excepthook is excepthook  # installed by importing bim
