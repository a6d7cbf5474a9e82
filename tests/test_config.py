"""The experiment schema: shipped configs, precedence, and every bad-input message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from app.cli import cli
from app.core import config, rundir, yamlfile
from app.core.errors import UsageError
from conftest import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# What a missing config's error lists: what -c configs/NAME.yaml finds from any folder (app.core.shipped).
SHIPS = ", ".join(f"configs/{p.name}" for p in CONFIGS)


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
            "data.source: unknown value 'imagenett' (choose from tfds, imagenet, synthetic, python); did you mean 'imagenet'?",
        ),
        (["data.source=synthetic"], "data.num_classes: must be set (> 0) for synthetic data"),
        (["data.source=imagenet"], "data.data_dir: must name the ImageNet TFRecord folder"),
        (["train.decay_epochs=[60, 30]"], "train.decay_epochs: must be strictly increasing positive epochs"),
        (
            ["train.warmup=linear"],
            "train.warmup: unknown value 'linear' (choose from gradual, constant)",
        ),
        (
            ["train.warmup=constnat"],
            "train.warmup: unknown value 'constnat' (choose from gradual, constant); did you mean 'constant'?",
        ),
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
    cfg, run_dir = rundir.for_run([], [], {}, str(run))
    assert run_dir == run and cfg.train.batch_size == 24
    longer, _ = rundir.for_run([], ["train.epochs=8", "run.log_every=5"], {}, str(run))  # allowed changes
    assert (longer.train.epochs, longer.run.log_every) == (8, 5)
    with pytest.raises(UsageError) as err:
        rundir.for_run([], ["train.base_lr=0.5"], {"train.batch_size": 12}, str(run))
    assert str(err.value) == (
        f"--run-dir {run}: resuming with a different config (train.batch_size 24 (saved) vs 12 (given); "
        "train.base_lr 0.1 (saved) vs 0.5 (given)); drop those changes or start a new --run-dir"
    )
    with pytest.raises(UsageError, match=r"run.seed 0 \(saved\) vs 7 \(given\)"):  # the data order
        rundir.for_run([], ["run.seed=7"], {}, str(run))


def test_new_run_dir_default(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _, run_dir = rundir.for_run([], [], {}, None)
    assert run_dir == Path("runs") / "default-4242"


def test_saved_config_round_trips():
    cfg = config.build([], ["train.decay_epochs=[2, 4]", "data.data_dir=/x"])
    again = config.build(base=config.flatten(yaml.safe_load(config.dump(cfg)), "saved"))
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
            f"Error: --config missing.yaml: no such file; scaleout ships {SHIPS}",
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


# ----------------------------------------------------------------------------- every bad input: one line


def one_line(args, env=None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, env=env)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output.strip()


@pytest.mark.parametrize(
    "text, message",
    [
        ("- 1\n- 2\n", "must be a mapping of sections (data, model, train, run), got list"),
        ("just words\n", "must be a mapping of sections (data, model, train, run), got str"),
        ("train: 5\n", "section 'train' must be a mapping of its keys (e.g. 'train:' with '  epochs: 10' below it), got int 5"),
        ("model: [resnet50]\n", "section 'model' must be a mapping of its keys (e.g. 'model:' with '  name: resnet20' below it), got list ['resnet50']"),
        ("trian:\n  batch_size: 3\n", "unknown section 'trian'; did you mean 'train'?"),
        ("optimizer:\n  lr: 0.1\n", "unknown section 'optimizer'; the sections are data, model, train, run"),
        ("optimizer: sgd\n", "unknown key 'optimizer'; top-level keys are the sections data, model, train, run and 'name'"),
        ("train:\n  base_lr: .inf\n", "train.base_lr must be a finite number, got inf"),
        ("train:\n  momentum: .nan\n", "train.momentum must be a finite number, got nan"),
        ("model:\n  weight_decay: -.inf\n", "model.weight_decay must be a finite number, got -inf"),
        ("train:\n  decay_factor: 1.0e+400\n", "train.decay_factor must be a finite number, got inf"),
        ("run:\n  run_dir: runs/x\n", "run.run_dir: the run directory is not a config key; pass it as `app train --run-dir DIR`"),
        ("base: [a.yaml]\n", "'base:' must name one YAML file, got ['a.yaml']"),
    ],
)  # fmt: skip
def test_bad_file_contents_are_one_line(tmp_path, text, message):
    path = write(tmp_path, "exp.yaml", text)
    code, out = one_line(["train", "-c", path])
    assert (code, out) == (2, f"Error: {path}: {message}")


def test_an_empty_section_is_fine(tmp_path):
    cfg = config.build([write(tmp_path, "exp.yaml", "train:\nmodel:\n  name: resnet32\n")])
    assert cfg.train == config.TrainConfig() and cfg.model.name == "resnet32"


def deny_open(monkeypatch, name: str) -> None:
    """Opening a file called ``name`` fails with EACCES (root reads a chmod 0 file: simulate the refusal)."""
    real = os.open

    def denied(path, *args, **kwargs):
        if os.path.basename(path) == name:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)


def test_unreadable_and_binary_config_files(tmp_path, monkeypatch):
    binary = tmp_path / "model.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    code, out = one_line(["train", "-c", str(binary)])
    assert (code, out) == (
        2,
        f"Error: --config {binary}: not a UTF-8 text file (undecodable byte at offset 0); is it a YAML file?",
    )
    code, out = one_line(["train", "-c", str(tmp_path)])
    assert (code, out) == (2, f"Error: --config {tmp_path}: is a directory, not a YAML file")
    # Permission denied: root reads a chmod 0 file anyway, so the refusal of open() is simulated too.
    locked = Path(write(tmp_path, "locked.yaml", "train:\n  epochs: 3\n"))
    locked.chmod(0)

    deny_open(monkeypatch, "locked.yaml")
    code, out = one_line(["train", "-c", str(locked)])
    assert (code, out) == (
        2,
        f"Error: --config {locked}: cannot be read (Permission denied); check its permissions",
    )


def test_missing_base_file_names_the_file_that_points_to_it(tmp_path):
    child = write(tmp_path, "child.yaml", "base: gone.yaml\n")
    with pytest.raises(UsageError) as err:
        config.build([child])
    assert str(err.value) == f"{tmp_path / 'gone.yaml'} (the base: of child.yaml): no such file"


@pytest.mark.parametrize(
    "item, message",
    [
        ("optimizer.lr=0.1", "unknown key 'optimizer.lr': no section 'optimizer'; the sections are data, model, train, run"),
        ("trian.batch_size=3", "unknown key 'trian.batch_size'; did you mean 'train.batch_size'?"),
        ("train=5", "'train' is a section; set one of its keys, e.g. train.epochs=10"),
        ("data.seed=1", "unknown key 'data.seed'; did you mean 'run.seed'?"),
        ("epochs=3", "unknown key 'epochs'; did you mean 'train.epochs'?"),
        ("train.optimizer=sgd", "unknown key 'train.optimizer'; the keys of 'train' are epochs, batch_size,"),
        ("run.run_dir=/tmp/x", "run.run_dir: the run directory is not a config key; pass it as `app train --run-dir DIR`"),
        ("train.base_lr=.inf", "train.base_lr must be a finite number, got inf"),
        ("train.base_lr=.nan", "train.base_lr must be a finite number, got nan"),
        ("train.warmup_epochs=-.inf", "train.warmup_epochs must be a finite number, got -inf"),
        ("model.label_smoothing=.NaN", "model.label_smoothing must be a finite number, got nan"),
    ],
)  # fmt: skip
def test_unknown_keys_suggest_only_close_matches(item, message):
    with pytest.raises(UsageError) as err:
        config.build([], [item])
    assert str(err.value).startswith(f"--set: {message}")
    assert "image_size" not in str(err.value)


def test_every_float_key_refuses_nan_and_inf():
    floats = [k for k, tp in config.FIELDS.items() if tp is float]
    assert {"train.base_lr", "train.warmup_epochs", "model.weight_decay"} <= set(floats)
    for key in floats:
        for value in (".inf", "-.inf", ".nan"):
            with pytest.raises(UsageError, match=f"{key} must be a finite number"):
                config.build([], [f"{key}={value}"])


def test_a_null_run_dir_of_an_older_saved_config_is_ignored():
    assert config.build(base={"run.run_dir": None, "train.epochs": 30}).train.epochs == 30


@pytest.mark.parametrize(
    "sets, message",
    [
        (["model.name=resnet50", "data.image_size=1"],
         "data.image_size: resnet50 needs images of at least 32 px, got 1; use >= 32, or 0 for the dataset's own size"),
        (["model.name=resnet50", "data.image_size=31"], "data.image_size: resnet50 needs images of at least 32 px, got 31"),
        (["model.name=resnet18", "data.image_size=4"], "data.image_size: resnet18 needs images of at least 8 px, got 4"),
        (["model.name=resnet20", "data.image_size=2"], "data.image_size: resnet20 needs images of at least 4 px, got 2"),
        (["run.seed=-1"], "run.seed: must be in 0..2147483647, got -1"),
        (["run.seed=2147483648"], "run.seed: must be in 0..2147483647, got 2147483648"),
    ],
)  # fmt: skip
def test_sizes_and_seeds_out_of_range(sets, message):
    with pytest.raises(UsageError) as err:
        config.build([], sets)
    assert str(err.value).startswith(message)


def test_smallest_image_sizes_are_accepted():
    for model, size in config.MIN_IMAGE_SIZE.items():
        assert config.build([], [f"model.name={model}", f"data.image_size={size}"]).data.image_size == size
    assert config.build([], ["run.seed=2147483647"]).run.seed == 2**31 - 1


@pytest.mark.parametrize(
    "args, line",
    [
        (["train", "--seed", "-1"], "Error: run.seed: must be in 0..2147483647, got -1"),
        (["train", "--np", "0"], "Error: Invalid value for '--np': 0 is not in the range x>=1."),
        (["train", "--np", "-2"], "Error: Invalid value for '--np': -2 is not in the range x>=1."),
        (["benchmark", "--np", "0"], "Error: Invalid value for '--np': 0 is not in the range x>=1."),
        (["train", "--threads", "-5"], "Error: Invalid value for '--threads': -5 is not in the range x>=0."),
        (["evaluate", "/nonexistent-run", "--epoch", "0"], "Error: Invalid value for '--epoch': 0 is not in the range x>=1."),
        (["train", "--set", "train.base_lr=.inf"], "Error: --set: train.base_lr must be a finite number, got inf"),
        (["train", "--set", "model.name=resnet50", "--set", "data.image_size=1"],
         "Error: data.image_size: resnet50 needs images of at least 32 px, got 1; use >= 32, or 0 for the dataset's own size"),
    ],
)  # fmt: skip
def test_cli_values_out_of_range(args, line):
    code, out = one_line(args)
    assert code == 2
    assert out.splitlines()[-1] == line
    assert sum(ln.startswith("Error:") for ln in out.splitlines()) == 1


@pytest.mark.parametrize(
    "env, line",
    [
        ({"APP_TRAIN_BATCH_SIZE": "abc"},
         "Error: environment variable APP_TRAIN_BATCH_SIZE (sets --batch-size): 'abc' is not a valid integer (ASCII digits 0-9); fix or unset it"),
        ({"APP_TRAIN_BATCH_SIZE": "-3"},
         "Error: train.batch_size: must be > 0, got -3 (from environment variable APP_TRAIN_BATCH_SIZE)"),
        ({"APP_TRAIN_SEED": "-1"}, "Error: run.seed: must be in 0..2147483647, got -1 (from environment variable APP_TRAIN_SEED)"),
        ({"APP_TRAIN_THREADS": "-5"},
         "Error: environment variable APP_TRAIN_THREADS (sets --threads): -5 is not in the range x>=0; fix or unset it"),
        ({"APP_TRAIN_PRECISION": "fp8"},
         "Error: environment variable APP_TRAIN_PRECISION (sets --precision): 'fp8' is not one of 'auto', 'float32', 'mixed_float16', 'mixed_bfloat16'; fix or unset it"),
    ],
)  # fmt: skip
def test_environment_variables_are_named_as_such(env, line):
    code, out = one_line(["train"], env=env)
    assert (code, out) == (2, line)


def test_option_typed_on_the_command_line_is_not_blamed_on_the_environment():
    code, out = one_line(["train", "--batch-size", "abc"], env={"APP_TRAIN_EPOCHS": "3"})
    assert (
        code == 2
        and "Invalid value for '--batch-size': 'abc' is not a valid integer (ASCII digits 0-9)" in out
    )
    assert "environment" not in out


# ----------------------------------------------------------------------------- a run's saved config.yaml


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "the run's saved config is empty; restore it, or start a new --run-dir"),
        (b"# nothing but a comment\n", "the run's saved config is empty; restore it, or start a new --run-dir"),
        (b"train: [1, 2\n", "line 2 is not valid YAML"),
        (b"\x00\xff\xfe garbage", "(the run's saved config): not a UTF-8 text file (undecodable byte at offset 1)"),
        (b"- a\n- b\n", "not a saved run config (a mapping of sections), got list; restore it, or start a new --run-dir"),
        (b"name: x\ntrain:\n  epochs: 3\n", "the run's saved config lacks section(s) data, model, run; restore it"),
        (b"data: {}\nmodel: {}\ntrain: {batch_size: 0}\nrun: {}\n",
         "train.batch_size: must be > 0, got 0; restore it, or start a new --run-dir"),
        (b"data: {}\nmodel: {}\ntrain: {batchsize: 3}\nrun: {}\n", "unknown key 'train.batchsize'; did you mean 'train.batch_size'?"),
    ],
)  # fmt: skip
def test_damaged_saved_config_is_one_line_never_defaults(tmp_path, content, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_bytes(content)
    for args in (["train", "--run-dir", str(run)], ["evaluate", str(run)]):
        code, out = one_line(args)
        assert code == 2 and out.startswith(f"Error: {run / 'config.yaml'}") and message in out, out
        assert len(out.splitlines()) == 1
    assert (run / "config.yaml").read_bytes() == content  # nothing rewritten


def test_unreadable_saved_config(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config.dump(config.build()))
    (run / "config.yaml").chmod(0)
    deny_open(monkeypatch, "config.yaml")
    with pytest.raises(UsageError) as err:
        rundir.for_run([], [], {}, str(run))
    assert str(err.value) == (
        f"{run / 'config.yaml'} (the run's saved config): cannot be read (Permission denied); check its permissions"
    )
    monkeypatch.undo()
    (run / "config.yaml").unlink()
    (run / "config.yaml").mkdir()
    with pytest.raises(UsageError, match="config.yaml \\(the run's saved config\\): is a directory"):
        rundir.for_run([], [], {}, str(run))


def test_run_dir_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("not a directory")
    code, out = one_line(["train", "--run-dir", str(path)])
    assert (code, out) == (2, f"Error: --run-dir {path}: exists and is not a directory; pass a run directory")
    assert path.read_text() == "not a directory"


def test_old_saved_config_with_a_null_run_dir_resumes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    text = config.dump(config.build([], ["train.epochs=4", "train.warmup_epochs=1"]))
    (run / "config.yaml").write_text(text.replace("run:\n", "run:\n  run_dir: null\n"))
    cfg, _ = rundir.for_run([], [], {}, str(run))
    assert cfg.train.epochs == 4


def test_unreadable_config_for_real_without_capabilities(tmp_path):
    # As root a chmod 0 file stays readable; without CAP_DAC_OVERRIDE it does not (as for any user).
    import shutil
    import subprocess
    import sys

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is not on PATH")
    locked = Path(write(tmp_path, "locked.yaml", "train:\n  epochs: 3\n"))
    locked.chmod(0)
    proc = subprocess.run(
        [setpriv, "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-m", "app", "train", "-c", str(locked)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        == f"Error: --config {locked}: cannot be read (Permission denied); check its permissions"
    )


def test_run_dir_that_cannot_be_written_fails_before_tensorflow(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out = one_line(["train", "--run-dir", str(blocker / "run")])
    assert (code, out) == (
        2,
        f"Error: --run-dir {blocker / 'run'}: {blocker} is not a directory; pass another --run-dir",
    )
    code, out = one_line(["train", "--run-dir", "/proc/scaleout/run"])
    assert code == 2 and out.startswith("Error: --run-dir /proc/scaleout/run: cannot write in /proc (")
    import errno
    import tempfile

    def read_only(**kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    code, out = one_line(["train", "--run-dir", str(tmp_path / "a" / "b")])
    assert (code, out) == (
        2,
        f"Error: --run-dir {tmp_path / 'a' / 'b'}: cannot write in {tmp_path} (Read-only file system); pass a writable --run-dir",
    )
    assert not (tmp_path / "a").exists()


# ----------------------------------------------------------------------------- hostile YAML and values


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    # 600 bytes that expand to 10**8 strings: quoting it in a message took 28 s and 2.3 GB.
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    path = write(tmp_path, "bomb.yaml", "\n".join([*lines, "train:\n  epochs: *i\n"]))
    import time

    start = time.monotonic()
    code, out = one_line(["train", "-c", path])
    assert time.monotonic() - start < 5
    assert (code, out) == (
        2,
        f"Error: {path}: line 2: YAML aliases (*a) are not allowed in a config; write the value out",
    )
    with pytest.raises(UsageError, match=r"^--set train.decay_epochs: YAML aliases \(\*x\) are not allowed"):
        config.build([], ["train.decay_epochs=[&x 1, *x]"])


def test_quoted_values_are_short_and_one_line():
    from app.core.errors import brief

    bomb = ["lol"] * 10
    for _ in range(8):
        bomb = [bomb] * 10  # 10**9 strings by reference: repr() would never finish
    assert len(brief(bomb)) <= 80
    assert brief(10**5000) == "<an integer of 5001 digits>"
    assert brief("a\nb\x1b[31mc\u2028") == "'a\\nb\\x1b[31mc\\u2028'"
    assert brief("x" * 1000) == "'" + "x" * 37 + "..." + "x" * 38 + "'"
    with pytest.raises(UsageError) as err:
        config.apply(config.Config(), {"train.epochs": bomb}, "f.yaml")
    assert len(str(err.value)) < 160 and str(err.value).startswith(
        "f.yaml: train.epochs must be int, got [[[["
    )


@pytest.mark.parametrize(
    "item, message",
    [
        ("train.epochs=" + "9" * 5000, "--set train.epochs: an integer of 5000 digits is out of range"),
        ("train.decay_epochs=" + "[" * 5000 + "]" * 5000,
         "--set train.decay_epochs: nested deeper than 50 levels; a config has sections, keys and values"),
        ("train.decay_epochs=" + "[" * 5000, "--set train.decay_epochs: nested deeper than 50 levels"),
        ("train.decay_epochs=" + "[" * 20, "--set: train.decay_epochs must be a list of int, got '[[[[[["),
        ("train.epochs=1:30", "--set: train.epochs must be int, got '1:30' (str)"),  # not 90 (YAML 1.1 base 60)
        ("train.epochs=1_0", "--set: train.epochs must be int, got '1_0' (str)"),
        ("train.decay_epochs=[1,2,2]", "train.decay_epochs: must be strictly increasing positive epochs (each once), got [1, 2, 2]"),
        ("foo\nbar=1", "--set: unknown key 'foo\\nbar'; top-level keys are"),
        ("model.name=\x1b[31mred", "model.name: unknown value '\\x1b[31mred' (choose from"),
    ],
)  # fmt: skip
def test_hostile_set_values_are_one_short_line(item, message):
    with pytest.raises(UsageError) as err:
        config.build([], [item])
    assert str(err.value).startswith(message)
    assert len(str(err.value)) < 300 and str(err.value).isprintable()


def test_yaml_12_numbers():
    cfg = config.build(
        [], ["train.base_lr=1e-3", "model.weight_decay=5E-5", "train.epochs=010", "run.seed=+7"]
    )
    assert (cfg.train.base_lr, cfg.model.weight_decay, cfg.train.epochs, cfg.run.seed) == (1e-3, 5e-5, 10, 7)
    # Strings that only one YAML version reads as a number are quoted when saved, and read back as strings.
    cfg = config.build(
        base={"data.data_dir": "1e-3", "data.train_split": "1:30", "data.eval_split": "2024-01-01"}
    )
    text = config.dump(cfg)
    assert "data_dir: '1e-3'" in text and "train_split: '1:30'" in text
    for tree in (yaml.safe_load(text), yamlfile.parse_yaml(text, "saved")):
        assert config.build(base=config.flatten(tree, "saved")) == cfg


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  epochs: " + "9" * 5000 + "\n", "line 2: an integer of 5000 digits is out of range"),
        ("train:\n  decay_epochs: " + "[" * 5000 + "]" * 5000 + "\n",
         "line 2: nested deeper than 50 levels; a config has sections, keys and values"),
        ('"tra\\nin":\n  epochs: 3\n', "unknown section 'tra\\nin'; did you mean 'train'?"),
        ("train:\n  epochs: !!timestamp soon\n", "not a valid config value ("),
        ("train:\n  decay_epochs: [30, 30]\n", None),
    ],
)  # fmt: skip
def test_hostile_config_files_are_one_line(tmp_path, text, message):
    path = write(tmp_path, "exp.yaml", text)
    code, out = one_line(["train", "-c", path])
    expected = f"Error: {path}: {message}" if message else "Error: train.decay_epochs: must be strictly"
    assert code == 2 and out.startswith(expected) and len(out.splitlines()) == 1, out


def test_only_regular_config_files_of_sane_size(tmp_path, monkeypatch):
    child = write(tmp_path, "child.yaml", "base: /dev/zero\n")
    code, out = one_line(["train", "-c", child])
    assert (code, out) == (
        2,
        "Error: /dev/zero (the base: of child.yaml): not a regular file (a device, pipe or socket); "
        "pass a YAML file",
    )
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # nobody writes to it: reading would block forever
    code, out = one_line(["train", "-c", str(fifo)])
    assert code == 2 and out.startswith(f"Error: --config {fifo}: not a regular file")
    big = write(tmp_path, "big.yaml", "# " + "x" * (2**20) + "\n")
    code, out = one_line(["train", "-c", big])
    assert (code, out) == (
        2,
        f"Error: --config {big}: larger than 1 MB, the limit for a YAML file; is it the right file?",
    )


@pytest.mark.parametrize(
    "name", ["/tmp/ABS", "../../outside", "a/b", ".hidden", "-x", "a b", "x;y", "n" * 129]
)
def test_a_name_that_is_no_safe_folder_name_is_refused(name):
    with pytest.raises(UsageError) as err:
        config.build([], [f"name={name}"])
    assert str(err.value).endswith(
        f"cannot name a run directory or job; {config.SAFE_HINT}; rename the config file or pass "
        "--set name=NAME (from --set name)"
    )


@pytest.mark.parametrize("stem", ["x;y", "a b"])
def test_a_config_file_name_that_is_no_safe_name_is_refused(tmp_path, stem):
    path = write(tmp_path, f"{stem}.yaml", "train:\n  epochs: 30\n")
    code, out = one_line(["train", "-c", path])
    assert (code, out) == (
        2,
        f"Error: name: '{stem}' cannot name a run directory or job; {config.SAFE_HINT}; rename the config "
        f"file or pass --set name=NAME (from config {path!r})",
    )
    assert config.build([path], ["name=renamed"]).name == "renamed"


def test_safe_names_pass():
    for name in ("resnet50_imagenet", "resnet50_imagenet_naive", "a.b+c-1", "_x", "9"):
        assert config.build([], [f"name={name}"]).name == name


def test_control_characters_never_reach_the_terminal_raw(tmp_path):
    # Any message, whoever built it: AppGroup escapes line breaks and escape sequences.
    code, out = one_line(
        ["train", "--set", "data.source=\x1b]0;owned\x07", "-c", str(tmp_path / "a\nb.yaml")]
    )
    assert code == 2 and out == f"Error: --config {tmp_path}/a\\nb.yaml: no such file; scaleout ships {SHIPS}"


def test_warmup_kind_defaults_to_gradual_and_is_fixed_on_resume(tmp_path):
    assert config.build().train.warmup == "gradual"
    assert config.build([], ["train.warmup=constant"]).train.warmup == "constant"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        config.dump(config.build([], ["train.warmup_epochs=1", "train.epochs=4"]))
    )
    with pytest.raises(UsageError, match=r"train.warmup 'gradual' \(saved\) vs 'constant' \(given\)"):
        rundir.for_run([], ["train.warmup=constant"], {}, str(run))
    # A config saved before train.warmup existed resumes with the gradual warmup it trained with.
    old = {k: v for k, v in config.build().to_dict()["train"].items() if k != "warmup"}
    (run / "config.yaml").write_text(yaml.safe_dump({**config.build().to_dict(), "train": old}))
    assert rundir.load_run_config(run / "config.yaml").train.warmup == "gradual"
