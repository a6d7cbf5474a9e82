"""The experiment schema: shipped configs, precedence, and every bad-input message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from app import config
from app.cli import cli
from app.errors import UsageError
from conftest import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_defaults_are_valid():
    cfg = config.build()
    assert cfg.train.batch_size > 0 and cfg.model.name in config.MODELS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads_and_documents_itself(path: Path):
    cfg = config.build([str(path)], [], {"data.data_dir": "/data"})
    assert cfg.name == path.stem
    head = path.read_text().split("\n\n")[0].lower()
    assert head.startswith("#")
    for word in ("app train", "hardware", "expected"):
        assert word in head, f"{path.name}: the opening comment should say the {word!r}"


def test_shipped_configs_cover_the_study():
    names = {p.stem for p in CONFIGS}
    assert {"fashion_mnist", "resnet50_imagenet", "resnet50_imagenet_naive", "synthetic"} <= names
    recipe = config.build([str(ROOT / "configs" / "resnet50_imagenet.yaml")], [], {"data.data_dir": "/data"})
    assert (recipe.train.base_lr, recipe.train.reference_batch, recipe.train.momentum) == (0.1, 256, 0.9)
    assert recipe.train.warmup_epochs == 5 and recipe.train.decay_epochs == [30, 60, 80]
    assert recipe.train.epochs == 90 and recipe.model.weight_decay == 1e-4 and recipe.model.name == "resnet50"
    naive = config.build(
        [str(ROOT / "configs" / "resnet50_imagenet_naive.yaml")], [], {"data.data_dir": "/data"}
    )
    assert not naive.train.scale_lr and naive.train.warmup_epochs == 0


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_precedence_defaults_files_set_options(tmp_path):
    a = write(tmp_path, "a.yaml", "train:\n  batch_size: 32\n  epochs: 7\nmodel:\n  name: resnet32\n")
    b = write(tmp_path, "b.yaml", "train:\n  batch_size: 48\n")
    cfg = config.build([a, b], ["train.epochs=9", "train.base_lr=0.2"], {"train.base_lr": 0.3})
    assert cfg.train.batch_size == 48  # the later file wins
    assert cfg.train.epochs == 9  # --set beats files
    assert cfg.train.base_lr == 0.3  # explicit options beat --set
    assert cfg.model.name == "resnet32"  # untouched values flow through
    assert cfg.train.momentum == config.TrainConfig().momentum  # defaults last
    assert cfg.name == "b"


def test_base_chain(tmp_path):
    write(tmp_path, "base.yaml", "train:\n  epochs: 12\n  batch_size: 16\n")
    child = write(tmp_path, "child.yaml", "base: base.yaml\ntrain:\n  batch_size: 8\n")
    cfg = config.build([child])
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.name) == (12, 8, "child")


@pytest.mark.parametrize(
    "sets, message",
    [
        (["train.batchsize=3"], "--set: unknown key 'train.batchsize'; did you mean 'train.batch_size'?"),
        (["batch_size=3"], "--set: unknown key 'batch_size'; did you mean 'train.batch_size'?"),
        (["train.batch_size=abc"], "--set: train.batch_size must be int, got 'abc' (str)"),
        (["train.batch_size=0"], "train.batch_size: must be > 0, got 0"),
        (["train.base_lr=-0.1"], "train.base_lr: must be > 0, got -0.1"),
        (
            ["train.warmup_epochs=10", "train.epochs=10"],
            "train.warmup_epochs: 10.0 is not shorter than train.epochs (10)",
        ),
        (["model.name=resnet51"], "model.name: unknown value 'resnet51' (choose from"),
        (
            ["data.source=imagenett"],
            "data.source: unknown value 'imagenett' (choose from tfds, imagenet, synthetic); did you mean 'imagenet'?",
        ),
        (["data.source=synthetic"], "data.num_classes: must be set (> 0) for synthetic data"),
        (["data.source=imagenet"], "data.data_dir: must name the ImageNet TFRecord folder"),
        (["train.decay_epochs=[60, 30]"], "train.decay_epochs: must be increasing positive epochs"),
        (["oops"], "--set 'oops': expected KEY=VALUE"),
    ],
)
def test_bad_values_name_the_field(sets, message):
    with pytest.raises(UsageError) as err:
        config.build([], sets)
    assert str(err.value).startswith(message)


def test_bad_files(tmp_path):
    with pytest.raises(UsageError, match=r"--config .*nope.yaml: no such file"):
        config.build([str(tmp_path / "nope.yaml")])
    bad = write(tmp_path, "bad.yaml", "train: [1, 2\n")
    with pytest.raises(UsageError, match=r"bad.yaml: line \d+ is not valid YAML"):
        config.build([bad])
    unknown = write(tmp_path, "unknown.yaml", "train:\n  epoch: 3\n")
    with pytest.raises(
        UsageError, match=r"unknown.yaml: unknown key 'train.epoch'; did you mean 'train.epochs'\?"
    ):
        config.build([unknown])


def test_resume_uses_saved_config_and_rejects_conflicts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    saved = config.build([], ["train.batch_size=24", "train.epochs=4", "train.warmup_epochs=1"])
    (run / "config.yaml").write_text(config.dump(saved))
    cfg, run_dir = config.for_run([], [], {}, str(run))
    assert run_dir == run and cfg.train.batch_size == 24
    longer, _ = config.for_run([], ["train.epochs=8", "run.log_every=5"], {}, str(run))  # allowed changes
    assert (longer.train.epochs, longer.run.log_every) == (8, 5)
    with pytest.raises(UsageError) as err:
        config.for_run([], ["train.base_lr=0.5"], {"train.batch_size": 12}, str(run))
    assert str(err.value) == (
        f"--run-dir {run}: resuming with a different config (train.batch_size 24 (saved) vs 12 (given); "
        "train.base_lr 0.1 (saved) vs 0.5 (given)); drop those changes or start a new --run-dir"
    )


def test_new_run_dir_default(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _, run_dir = config.for_run([], [], {}, None)
    assert run_dir == Path("runs") / "default-4242"


def test_saved_config_round_trips():
    cfg = config.build([], ["train.decay_epochs=[2, 4]", "data.data_dir=/x"])
    again = config.build(base=config._flatten(yaml.safe_load(config.dump(cfg)), "saved"))
    assert again == cfg


# ----------------------------------------------------------------------------- through the CLI


@pytest.mark.parametrize(
    "args, code, line",
    [
        (["train", "--set", "train.batch_size=0"], 2, "Error: train.batch_size: must be > 0, got 0"),
        (
            ["train", "--set", "model.nam=resnet20"],
            2,
            "Error: --set: unknown key 'model.nam'; did you mean 'model.name'?",
        ),
        (
            ["train", "-c", "missing.yaml"],
            2,
            "Error: --config missing.yaml: no such file; the shipped configs are in configs/",
        ),
        (["train", "--batch-size", "-4"], 2, "Error: train.batch_size: must be > 0, got -4"),
        (
            ["evaluate", "/nonexistent-run"],
            2,
            "Error: RUN_DIR /nonexistent-run: no config.yaml there; pass the directory `app train` wrote",
        ),
    ],
)
def test_cli_bad_input_is_one_line(args, code, line):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code
    assert result.output.strip() == line
    assert "Traceback" not in result.output


def test_environment_overrides_config_file(tmp_path, monkeypatch):
    # Precedence: command line > environment (APP_*) > config file > default.
    monkeypatch.setenv("APP_TRAIN_BATCH_SIZE", "-1")
    result = CliRunner().invoke(cli, ["train", "-c", str(ROOT / "configs" / "fashion_mnist.yaml")])
    assert result.exit_code == 2 and "train.batch_size: must be > 0, got -1" in result.output
    result = CliRunner().invoke(cli, ["train", "--batch-size", "-2"])
    assert "got -2" in result.output
