"""`app study large-batch`: the plan (pure, no TensorFlow), the study folder, status from files, the report on
hand-made metrics, bad input, and one tiny real study end to end with an interruption and a resume."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from app.cli import cli
from app.core import config
from app.core.errors import UsageError
from app.reports import large_batch as study_report
from app.study.dataset import train_examples
from app.study.executor import _record
from app.study.files import _Lock
from app.study.folder import load_plan, prepare
from app.study.large_batch import (
    VARIANTS,
    RunPlan,
    StudyPlan,
    parse_ks,
    plan_large_batch,
    run_dir,
    train_args,
    workers_for,
)
from app.study.local import run_local
from app.study.state import INTERRUPTED, RunState, running_run, states, todo
from conftest import ROOT, run_app

FASHION = str(ROOT / "configs" / "study_fashion_mnist.yaml")


def fashion(*sets: str) -> config.Config:
    return config.build([FASHION], list(sets))


def plan(ks=(1, 8), seeds=1, np_=1, examples=60000, cfg=None, name="s", small=True, margin=0.5) -> StudyPlan:
    """A plan of the shipped Fashion-MNIST study (``small``: accept runs under the update budget, which many
    of these cases are by design; test_a_plan_under_the_update_budget_is_refused checks the refusal)."""
    return plan_large_batch(cfg or fashion(), list(ks), seeds, np_, name, examples, "test", small, margin)


def app_main(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`app ARGS` in this process, through main() as the command line runs it: (status, stdout, stderr)."""
    from app.cli import main

    monkeypatch.setattr(sys, "argv", ["app", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


# ------------------------------------------------------------------------------------------- plan


def test_plan_is_goyals_table_1_grid_on_one_worker():
    p = plan()
    assert [r.name for r in p.runs] == [
        "baseline-k1-s1", "unscaled-k8-s1", "no-warmup-k8-s1", "constant-warmup-k8-s1", "gradual-warmup-k8-s1",
    ]  # fmt: skip
    base, unscaled, none, constant, gradual = p.runs
    assert (base.global_batch, base.lr, base.warmup, base.workers, base.accumulation_steps) == (
        128,
        0.1,
        "none",
        1,
        1,
    )
    for r in (unscaled, none, constant, gradual):  # k x 128 from accumulation, the batch-norm batch unchanged
        assert (r.global_batch, r.workers, r.accumulation_steps, r.batch_size, r.epochs) == (
            1024,
            1,
            8,
            128,
            10,
        )
    assert unscaled.lr == pytest.approx(0.1) and none.lr == constant.lr == gradual.lr == pytest.approx(0.8)
    assert (none.warmup, constant.warmup, gradual.warmup) == ("none", "constant", "gradual")
    assert constant.start_lr == gradual.start_lr == pytest.approx(0.1) and gradual.warmup_epochs == 2
    # Equal epochs: 60,000 // 128 = 468 micro-batches per epoch; k = 8 makes 58 updates of them.
    assert (base.updates, gradual.updates) == (4680, 580)
    assert "train.warmup=constant" in constant.sets and "train.scale_lr=false" in unscaled.sets
    assert "train.warmup_epochs=0" in none.sets and "run.seed=1" in base.sets


def test_the_runs_configs_give_the_planned_lr_and_warmup():
    # Each run's --set overrides on top of the study's config build the config `app train` will train.
    from app.training.schedule import make_schedule

    p, cfg = plan(), fashion()
    for run in p.runs:
        run_cfg = config.build(sets=list(run.sets), base=config.flat(cfg))
        s = make_schedule(run_cfg, run.workers)
        assert run_cfg.global_batch(run.workers) == run.global_batch
        assert (s.target_lr, s.start_lr, s.warmup) == pytest.approx(
            (run.lr, run.start_lr, run_cfg.train.warmup)
        )
    constant = config.build(sets=list(p.runs[3].sets), base=config.flat(cfg))
    s = make_schedule(constant, 1)
    assert (
        s.step_lr(0, 468) == s.step_lr(2 * 468 - 1, 468) == pytest.approx(0.1)
    )  # the warmup: the baseline's LR
    # then the jump, onto the cosine of the whole run (10 epochs) where the warmup ends: as without a warmup
    assert s.step_lr(2 * 468, 468) == pytest.approx(0.8 * 0.5 * (1 + math.cos(math.pi * 2 / 10)))


@pytest.mark.parametrize(
    ("np_", "expected"),
    [(1, (1, 8)), (2, (2, 4)), (3, (2, 4)), (8, (8, 1)), (16, (8, 1))],
)
def test_workers_then_accumulation_make_up_k(np_, expected):
    gradual = plan(np_=np_).runs[-1]
    assert (gradual.workers, gradual.accumulation_steps) == expected
    assert gradual.global_batch == 1024 and plan(np_=np_).runs[0].workers == 1


def test_a_huge_k_or_np_is_planned_at_once_and_local_workers_are_bounded(tmp_path, monkeypatch, capsys):
    started = time.monotonic()
    assert workers_for(999_999_937, 999_999_999) == 999_999_937  # a prime: only 1 or itself
    assert workers_for(2 * 999_999_937, 10**9) == 999_999_937
    assert workers_for(12, 5) == 4 and workers_for(7, 6) == 1
    assert time.monotonic() - started < 2  # it used to try every number up to --np (minutes)
    code, _, stderr = app_main(["study", "large-batch", "-c", str(ROOT / "configs" / "study_fashion_mnist.yaml"),
                                "--k", "1,8", "--np", "100000", "--out", str(tmp_path), "--dry-run"], monkeypatch, capsys)  # fmt: skip
    assert code == 2 and stderr.startswith("Error: --np 100000: more local workers than this machine holds (")


@pytest.mark.parametrize(
    "study, room",
    [(["large-batch", "-c", "configs/study_fashion_mnist.yaml", "--k", "1,8"], ("<name>-constant-warmup-k8-s1", 106)),
     (["scaling", "-c", "configs/synthetic.yaml", "--gpus", "1,2"], ("<name>-workers-1", 118))],
)  # fmt: skip
def test_a_study_name_too_long_for_its_job_names_is_named_as_the_study_name(
    tmp_path, monkeypatch, capsys, study, room
):
    study = [*study[:2], str(ROOT / study[2]), *study[3:]]
    name = "a" * 126  # a valid name of its own: the jobs' names (<name>-<part>) would pass 128
    code, stdout, stderr = app_main(["study", *study, "--name", name, "--cluster", "local", "--out",
                                     str(tmp_path / "o"), "--dry-run"], monkeypatch, capsys)  # fmt: skip
    assert (code, stdout) == (2, "") and not (tmp_path / "o").exists()
    line, example = room
    assert stderr == (
        f"Error: the study name '{name[:37]}...{name[-38:]}' (--name, else the config's name): 126 characters, too "
        f"long for this study's Slurm job names ({line} must fit in 128): give --name with at most {example} "
        "characters\n"
    )


def test_a_baseline_with_accumulation_spreads_over_workers_too():
    # The config's accumulation is part of the baseline: 2 x 64 = 128 per update, on 2 workers with --np 2.
    p = plan(
        np_=2, cfg=fashion("train.batch_size=64", "train.accumulation_steps=2", "train.reference_batch=128")
    )
    assert [(r.workers, r.accumulation_steps, r.global_batch) for r in p.runs[:2]] == [
        (2, 1, 128),
        (2, 8, 1024),
    ]
    assert p.runs[0].lr == pytest.approx(0.1) and p.runs[-1].lr == pytest.approx(0.8)


def test_lr_per_reference_batch_is_normalised_to_the_baseline():
    # resnet50_imagenet style: 0.1 per 256 images; a baseline of 128 trains at 0.05, unscaled k=4 at 0.05 too.
    p = plan(ks=(1, 4), cfg=fashion("train.base_lr=0.1", "train.reference_batch=256"))
    assert [round(r.lr, 6) for r in p.runs] == [0.05, 0.05, 0.2, 0.2, 0.2]
    assert p.runs[-1].start_lr == pytest.approx(0.05)


def test_capped_epochs_stay_equal_in_images():
    p = plan(ks=(1, 8), np_=2, cfg=fashion("train.steps_per_epoch=16"))
    base, gradual = p.runs[0], p.runs[-1]
    assert "train.steps_per_epoch=16" in base.sets and "train.steps_per_epoch=8" in gradual.sets  # 2 workers
    assert (base.updates_per_epoch, gradual.updates_per_epoch) == (16, 2)  # 16 x 128 images per epoch both
    with pytest.raises(UsageError) as err:
        plan(ks=(1, 8), cfg=fashion("train.steps_per_epoch=12"))
    assert str(err.value) == (
        "train.steps_per_epoch 12: at k=8 an epoch of 12 x 128 images is not a whole number of updates of "
        "1024; for equal epochs use a multiple of 8"
    )


def test_k_beyond_the_dataset_is_refused_and_the_largest_named():
    assert plan(ks=(1, 468)).runs[-1].updates_per_epoch == 1
    with pytest.raises(UsageError) as err:
        plan(ks=(1, 8, 469))
    assert str(err.value) == (
        "--k 469: a global batch of 60,032 (469 x 128) is more than the 60,000 training examples of "
        "fashion_mnist; the largest k is 468"
    )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["train.warmup_epochs=0"], "train.warmup_epochs is 0: the warmup variants need a length"),
        (["run.evaluate=false"], "run.evaluate is false: the study compares validation error"),
        (
            ["model.precision=mixed_float16"],
            "model.precision mixed_float16: at k=8 the runs use several workers",
        ),
    ],
)
def test_configs_the_study_cannot_use(sets, message):
    with pytest.raises(UsageError, match=message):
        plan(cfg=fashion(*sets), np_=2)
    if "precision" in sets[0]:  # on one worker, or on k workers without accumulation, it is fine
        assert plan(cfg=fashion(*sets), np_=1).runs and plan(cfg=fashion(*sets), np_=8).runs


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1,8", [1, 8]), ("8", [1, 8]), (" 32, 1 ,8", [1, 8, 32]), ("+2", [1, 2])],
)
def test_k_lists(text, expected):
    assert parse_ks(text) == expected


def test_train_args_are_an_argv_with_hostile_paths_kept_whole(tmp_path):
    folder = tmp_path / "a b$(touch x)'\"\nc"
    run = plan(np_=2).runs[-1]
    args = train_args(folder, run, data_dir="/d; rm -rf ~", threads=1)
    assert args[:3] == ["train", "-c", str(folder / "config.yaml")]
    assert args[args.index("--run-dir") + 1] == str(folder / "runs" / "gradual-warmup-k8-s1")
    assert args[args.index("--np") + 1] == "2" and args[args.index("--data-dir") + 1] == "/d; rm -rf ~"
    assert [a for a in args if a.startswith("train.")] == [s for s in run.sets if s.startswith("train.")]


def test_train_examples_without_tensorflow(tmp_path):
    info = tmp_path / "fashion_mnist" / "3.0.1" / "dataset_info.json"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"splits": [{"name": "test", "shardLengths": ["10000"]},
                                           {"name": "train", "shardLengths": ["30000", "30000"]}]}))  # fmt: skip
    assert train_examples(fashion(f"data.data_dir={tmp_path}")) == (60000, str(info))
    assert train_examples(fashion(f"data.data_dir={tmp_path}", "data.train_split=train[:50%]"))[0] is None
    synthetic = fashion("data.source=synthetic", "data.num_classes=10", "data.synthetic_examples=1000")
    assert train_examples(synthetic) == (1000, "data.synthetic_examples")
    (tmp_path / "counts.json").write_text(json.dumps({"train-00000-of-00002": 7, "train-00001-of-00002": 5,
                                                      "validation-00000-of-00001": 3}))  # fmt: skip
    imagenet = fashion("data.source=imagenet", f"data.data_dir={tmp_path}")
    assert train_examples(imagenet) == (12, str(tmp_path / "counts.json"))


# ----------------------------------------------------------------------------------- study folder


def make_run(folder: Path, run: RunPlan, val: list[float], train=None, done=True, state_json=None):
    """A run directory as `app train` leaves it: metrics.jsonl (and summary.json when finished)."""
    path = run_dir(folder, run)
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("data: {}\nmodel: {}\ntrain: {}\nrun: {}\n")
    train = train or [v - 0.02 for v in val]
    rows = [{"epoch": i + 1, "loss": 0.5, "accuracy": t, "val_accuracy": v, "epoch_time_s": 2.0}
            for i, (t, v) in enumerate(zip(train, val, strict=True))]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        env = {"gpu_count": 0, "cpu_count": 2, "cpu_model": "test CPU", "tensorflow": "2.18.1",
               "keras": "tf_keras 2.18.0", "horovod": "0.28.1", "scaleout": "0.1.0"}  # fmt: skip
        (path / "summary.json").write_text(
            json.dumps(
                {"epochs": len(rows), "global_batch": run.global_batch, "precision": "float32", "env": env}
            )
        )
    if state_json is not None:
        ckpt = path / "checkpoints" / f"epoch-{len(rows):04d}"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text(json.dumps(state_json))
    return path


def new_study(tmp_path, p=None) -> tuple[Path, StudyPlan]:
    p = p or plan()
    folder = tmp_path / "studies" / p.name
    assert prepare(folder, p, fashion(), ["app", "study"]) is True
    return folder, p


def test_prepare_writes_the_plan_and_takes_the_same_plan_again(tmp_path):
    folder, p = new_study(tmp_path)
    assert load_plan(folder) == p
    assert config.load_yaml(folder / "config.yaml")["train.batch_size"] == 128
    assert prepare(folder, plan(), fashion(), ["app"]) is False  # the same study: continue it
    # Another data_dir is the same study (data moved); the runs get the new one.
    assert prepare(folder, plan(cfg=fashion("data.data_dir=/elsewhere")), fashion(), ["app"]) is False


@pytest.mark.parametrize(
    ("other", "says"),
    [
        (lambda: plan(ks=(1, 8, 32)), "--k [1, 8] there vs [1, 8, 32] now"),
        (lambda: plan(seeds=2), "--seeds 1 there vs 2 now"),
        (lambda: plan(np_=2), "--np 1 there vs 2 now"),
        (lambda: plan(cfg=fashion("train.epochs=12")), "train.epochs 10 there vs 12 now"),
    ],
)
def test_a_different_plan_is_refused_and_nothing_is_overwritten(tmp_path, other, says):
    folder, _ = new_study(tmp_path)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(UsageError) as err:
        prepare(folder, other(), fashion(), ["app"])
    assert f"holds a different study ({says}" in str(err.value) and "pass another --name" in str(err.value)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_a_study_planned_before_the_whole_run_cosine_is_reported_but_not_continued(tmp_path):
    # Format 1 (before 2026-12-05): its runs trained on the cosine that restarted after the warmup; new runs
    # beside them would mix two schedules in one table. Reading it (report, status) still works.
    folder, p = new_study(tmp_path)
    meta = json.loads((folder / "study.json").read_text())
    (folder / "study.json").write_text(json.dumps({**meta, "format": 1}))
    before = {f: f.read_bytes() for f in folder.rglob("*") if f.is_file()}
    with pytest.raises(UsageError) as err:
        prepare(folder, plan(), fashion(), ["app"])
    assert "was planned before 2026-12-05, when cosine schedules restarted after the warmup" in str(err.value)
    assert "start the study under another --name" in str(err.value)
    assert {f: f.read_bytes() for f in folder.rglob("*") if f.is_file()} == before
    assert load_plan(folder) == p


def test_a_folder_that_is_not_a_study_is_refused(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty and not a study"):
        prepare(folder, plan(), fashion(), ["app"])
    (folder / "study.json").write_text("{not json")
    with pytest.raises(UsageError, match="study.json: not a study plan"):
        prepare(folder, plan(), fashion(), ["app"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("epochs", None), ("workers", "2"), ("name", "../../../elsewhere"), ("sets", [1]), ("lr", "0.8")],
)
def test_an_edited_study_json_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys, field, value):
    folder, p = new_study(tmp_path)
    data = json.loads((folder / "study.json").read_text())
    data["plan"]["runs"][1][field] = value
    (folder / "study.json").write_text(json.dumps(data))
    for command in ("status", "report"):
        code, _, stderr = app_main(["study", command, str(folder)], monkeypatch, capsys)
        assert code == 2 and stderr == (
            f"Error: {folder}/study.json: not a study plan this version of scaleout writes (damaged or edited); "
            "start the study again in a new folder (--name)\n"
        )


def test_status_and_what_is_left_to_train_come_from_the_files(tmp_path, monkeypatch, capsys):
    folder, p = new_study(tmp_path, plan(ks=(1, 2, 4)))
    runs = {r.name: r for r in p.runs}
    make_run(folder, runs["baseline-k1-s1"], [0.9] * 10)
    make_run(folder, runs["unscaled-k2-s1"], [0.9] * 3, done=False)  # interrupted after epoch 3
    make_run(folder, runs["no-warmup-k2-s1"], [0.9] * 2, done=False)
    make_run(folder, runs["constant-warmup-k2-s1"], [0.9], done=False)
    _record(folder, "no-warmup-k2-s1", 1)  # its last attempt failed
    _record(folder, "constant-warmup-k2-s1", 3)  # stopped by a signal: resumable
    _record(folder, "no-warmup-k4-s1", INTERRUPTED)  # Ctrl-C before its first epoch ended
    got = {r.name: s for r, s in zip(p.runs, states(folder, p), strict=True)}
    assert got["baseline-k1-s1"] == RunState("done", 10)
    assert got["unscaled-k2-s1"] == RunState("partial", 3)
    assert got["no-warmup-k2-s1"] == RunState("failed", 2, "exit status 1")
    assert got["constant-warmup-k2-s1"] == RunState("partial", 1, "stopped")
    assert got["gradual-warmup-k2-s1"] == RunState("pending", 0)
    assert got["no-warmup-k4-s1"] == RunState("partial", 0, "interrupted")
    left = [r.name for r, _ in todo(folder, p)]
    assert left == [r.name for r in p.runs[1:]]  # everything but the finished baseline, in order
    with _Lock(folder) as lock:  # an `app study` training a run right now
        lock.current("unscaled-k2-s1")
        assert states(folder, p)[1] == RunState("running", 3)
        code, out, err = app_main(["study", "status", str(folder)], monkeypatch, capsys)
    assert code == 0, err
    lines = {ln.split()[1]: ln for ln in out.splitlines() if "-k" in ln and "│" in ln}
    assert " done " in lines["baseline-k1-s1"] and " 10/10 " in lines["baseline-k1-s1"]
    assert " running " in lines["unscaled-k2-s1"] and "exit status 1" in lines["no-warmup-k2-s1"]
    assert out.strip().splitlines()[-1] == "1 done, 1 running, 2 partial, 1 failed, 4 pending of 9 runs"


def test_a_second_study_process_on_the_same_folder_is_refused(tmp_path):
    folder, p = new_study(tmp_path)
    with _Lock(folder), pytest.raises(UsageError, match="another `app study` is running it"):
        run_local(folder, p, None, 0, print, "app study ...")


# ----------------------------------------------------------------------------------------- report

# Two seeds per variant: errors (%) baseline 7.1/6.9, gradual 7.2/7.02, constant 8.2/8.02, none 20/21,
# unscaled 8.2/8.2 (as val_accuracy after the last epoch). Paired by seed: gradual +0.10/+0.12 (holds),
# constant +1.10/+1.12 (worse), none +12.9/+14.1 (worse), unscaled +1.1/+1.3 (an interval across the margin).
FINAL = {"baseline": (0.929, 0.931), "gradual-warmup": (0.928, 0.9298), "constant-warmup": (0.918, 0.9198),
         "no-warmup": (0.80, 0.79), "unscaled": (0.918, 0.918)}  # fmt: skip


def study_with_results(tmp_path, p=None, skip=()):
    folder, p = new_study(tmp_path, p or plan(seeds=2))
    for run in p.runs:
        if run.name not in skip:
            final = FINAL[run.variant][run.seed - 1]
            make_run(
                folder, run, [final - 0.05 * (run.epochs - 1 - e) / run.epochs for e in range(run.epochs)]
            )
    return folder, p


def test_table_1_layout_mean_std_and_differences(tmp_path):
    folder, p = study_with_results(tmp_path)
    table = study_report.cells(study_report.collect(folder, p))
    md, rows = study_report.table_rows(table)
    assert [r[2] for r in md] == [
        "baseline", "k x batch, LR unscaled", "scaled LR, no warmup", "scaled LR, constant warmup",
        "scaled LR, gradual warmup",
    ]  # fmt: skip
    assert md[0] == ["1", "128", "baseline", "0.1", "none", "7.00 ± 0.14", "-", "-", "4,680", "2/2"]
    assert md[3] == ["8", "1,024", "scaled LR, constant warmup", "0.8", "constant 0.1 for 2 epochs",
                     "8.11 ± 0.13", "+1.11 pp [+0.98, +1.24], 2 seeds", "worse", "580", "2/2"]  # fmt: skip
    assert md[4][4:8] == ["gradual 0.1 -> 0.8 over 2 epochs", "7.11 ± 0.13", "+0.11 pp [-0.02, +0.24], 2 seeds",
                          "holds"]  # fmt: skip
    assert md[1][5:8] == ["8.20 ± 0.00", "+1.20 pp [-0.07, +2.47], 2 seeds", "cannot tell"]
    base = rows[0]
    assert base[:3] == [1, 128, "baseline"] and base[9:11] == [7.0, 0.1414]
    assert (
        rows[2][9:18] == [20.5, 0.7071, 13.5, 5.8764, 21.1236, 2, "worse", "interval", 0.5]
        and rows[2][18] == 580
    )  # numbers


def test_the_notes_say_what_the_runs_trained_on():
    # The training-error note names the augmentation the runs had; one warmup epoch is "1 epoch".
    assert any("(augmented data," in n for n in study_report.notes(plan()))
    bare = plan(cfg=fashion("data.augment=false", "train.warmup_epochs=1"))
    assert any("(data without augmentation," in n for n in study_report.notes(bare))
    assert study_report.warmup_text(bare.runs[-1]) == "gradual 0.1 -> 0.8 over 1 epoch"


def test_verdicts_in_words(tmp_path):
    folder, p = study_with_results(tmp_path)
    lines = study_report.verdicts(study_report.cells(study_report.collect(folder, p)))
    assert lines == [
        "baseline (k=1, batch 128, LR 0.1): top-1 error 7.00 ± 0.14%",
        "k=8 (batch 1,024): scaled LR + gradual warmup holds (+0.11 pp [-0.02, +0.24], 2 seeds: not worse by more "
        "than 0.5 pp); constant warmup is worse (+1.11 pp [+0.98, +1.24], 2 seeds: the whole interval above 0.5 "
        "pp); without warmup is worse (+13.50 pp [+5.88, +21.12], 2 seeds: the whole interval above 0.5 pp); LR "
        "unscaled: cannot tell (+1.20 pp [-0.07, +2.47], 2 seeds; about 3 seeds would show it is worse with 80% "
        "power if the true difference were +1.20 pp (its plan has 2))",
        "the linear scaling rule with gradual warmup keeps the baseline's accuracy up to k=8 (batch 1,024) here",
        # "gradual beats constant" as a computed, paired row (issue 36)
        "k=8: gradual against constant warmup, paired: -1.00 pp [-1.00, -1.00], 2 seeds: gradual warmup better "
        "(the whole interval below 0)",
        "warning: only 2 seeds pair for every variant: with 1 degree of freedom each end of the interval lies 9.0 x "
        "the paired spread from the mean (1.24 x at 5 seeds), so such a verdict is seldom more than 'cannot tell'; "
        "plan --seeds 5 or more",
    ]


def test_gradual_warmup_better_than_the_baseline_keeps_its_accuracy(tmp_path, monkeypatch):
    # Beyond the margin, but better: the rule kept the baseline's accuracy (it used to say it did not).
    monkeypatch.setitem(FINAL, "gradual-warmup", (0.95, 0.951))
    folder, p = study_with_results(tmp_path)
    lines = study_report.verdicts(study_report.cells(study_report.collect(folder, p)))
    assert lines[1].startswith(
        "k=8 (batch 1,024): scaled LR + gradual warmup holds (-2.05 pp [-2.69, -1.41], 2 seeds"
    )
    assert lines[2] == (
        "the linear scaling rule with gradual warmup keeps the baseline's accuracy up to k=8 (batch 1,024) here"
    )


def test_unfinished_runs_and_one_seed(tmp_path):
    folder, p = study_with_results(tmp_path, plan(ks=(1, 2, 8)), skip={"gradual-warmup-k8-s1"})
    lines = study_report.verdicts(study_report.cells(study_report.collect(folder, p)))
    # One seed: the difference, and no verdict.
    assert lines[1].startswith("k=2 (batch 256): scaled LR + gradual warmup: cannot tell (+0.10 pp, 1 seed);")
    assert lines[2].startswith(
        "k=8 (batch 1,024): scaled LR + gradual warmup not finished, leaving out seed 1 (pending); constant warmup"
    )
    assert lines[3] == (
        "whether the linear scaling rule with gradual warmup keeps the baseline's accuracy cannot be told at k=2 "
        "with these seeds: more seeds narrow the intervals"
    )
    assert lines[4] == "one seed per variant: no interval, so no verdict (--seeds 3 or more gives one)"
    folder, p = study_with_results(tmp_path / "other", plan(), skip={"baseline-k1-s1"})
    assert study_report.verdicts(study_report.cells(study_report.collect(folder, p))) == [
        "the baseline (k=1) has not finished: nothing to compare yet"
    ]


def test_damaged_files_of_a_run_are_said_and_one_bad_metrics_line_keeps_its_result(tmp_path):
    """A finished baseline with one damaged metrics line still counts (the line is left out, with the fix);
    a finished run with a damaged summary.json or config.yaml stays done, said with the fix; one whose last
    metrics row was lost is resumable; `app study status` shows it all; a failed baseline says why it has no
    result."""
    folder, p = study_with_results(tmp_path, plan())
    base, other, third = (run_dir(folder, r) for r in p.runs[:3])
    lines = (base / "metrics.jsonl").read_text().splitlines()
    lines[1] = '{"epoch": 2, "val_accuracy": 7}'
    (base / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (other / "summary.json").write_text("{not json")
    (third / "config.yaml").write_text("- a list\n")
    got = states(folder, p)
    assert got[0].state == "done" and got[0].damage == (
        f"{base / 'metrics.jsonl'}: damaged line(s) 2 left out; `app train --run-dir {base}` (as any resume) sets "
        "them aside in metrics.damaged.jsonl"
    )
    # finished: its results are in its metrics, so it stays done, and the note says how to write it again
    assert (got[1].state, got[1].epochs_done) == ("done", 10)
    assert got[1].damage.startswith(f"{other / 'summary.json'}: not JSON (")
    assert got[1].damage.endswith(f"; `app train --run-dir {other}` sets it aside and writes it again")
    assert (
        got[2].state == "done"
        and "the run's results do not need it; training it further does" in got[2].damage
    )
    # A finished run (its summary says so) whose last metrics row was lost: resumable, which restores it.
    fourth = run_dir(folder, p.runs[3])
    rows = (fourth / "metrics.jsonl").read_text().splitlines()
    (fourth / "metrics.jsonl").write_text("\n".join(rows[:-1]) + "\n")
    lost = states(folder, p)[3]
    assert (lost.state, lost.epochs_done, lost.detail) == ("partial", 9, "metrics lost")
    assert (
        lost.damage
        == f"{fourth / 'metrics.jsonl'} lacks epoch(s) after 9; resuming restores them from the checkpoint"
    )
    shown = CliRunner().invoke(cli, ["study", "status", str(folder)], env={"COLUMNS": "2000"})
    assert shown.exit_code == 0 and "not JSON" in shown.output and "lacks epoch(s) after 9" in shown.output
    results = study_report.collect(folder, p, note=lambda message: None)
    assert results[0].final_error is not None and results[0].epochs_done == 9
    verdicts = study_report.verdicts(study_report.cells(results))
    assert verdicts[0].startswith("baseline (k=1, batch 128, LR 0.1): top-1 error")
    (base / "summary.json").unlink()
    (folder / "attempts.jsonl").write_text(json.dumps({"run": "baseline-k1-s1", "exit": 1}) + "\n")
    assert study_report.verdicts(study_report.cells(study_report.collect(folder, p, lambda m: None))) == [
        "the baseline (k=1) has not finished (failed: exit status 1): nothing to compare yet"
    ]


def test_too_few_updates_are_warned_and_no_verdict_on_the_rule(tmp_path):
    # 6,400 examples: the baseline makes 50 updates per epoch (500), k = 8 only 6 (60 in 10 epochs).
    folder, p = study_with_results(tmp_path, plan(examples=6400))
    results = study_report.collect(folder, p)
    warnings = study_report.warnings(results)
    assert warnings == [
        "warning: unscaled-k8-s1, no-warmup-k8-s1, constant-warmup-k8-s1, gradual-warmup-k8-s1 make only 60 "
        "updates (fewer than the 500 a verdict needs): the error measures the budget as much as the batch, so its "
        "verdicts are budget-limited; train more epochs"
    ]
    lines = study_report.verdicts(study_report.cells(results))
    assert lines[1].endswith("[budget-limited: only 60 updates per run, under 500]")
    assert lines[2].startswith("too few updates at every k to judge the linear scaling rule here")
    # Enough updates (50 an epoch at k=8, 500 in all), but a warmup of 0.15 epochs is 8 updates: no ramp.
    folder, p = study_with_results(
        tmp_path / "w", plan(examples=51200, cfg=fashion("train.warmup_epochs=0.15"))
    )
    assert study_report.warnings(study_report.collect(folder, p)) == [
        "warning: the warmup of constant-warmup-k8-s1, gradual-warmup-k8-s1 is only 8 updates (fewer than 10): "
        "hardly a ramp; train more epochs or lengthen train.warmup_epochs"
    ]


def test_updates_come_from_the_runs_checkpoints_when_there(tmp_path):
    folder, p = new_study(tmp_path, plan(examples=None))  # the dataset's size was not known when planning
    gradual = p.runs[-1]
    assert gradual.updates is None
    make_run(folder, gradual, [0.9] * 10, state_json={"epoch": 10, "steps_per_epoch": 400, "workers": 1,
                                                      "global_batch": 1024})  # fmt: skip
    (result,) = [r for r in study_report.collect(folder, p) if r.run is gradual]
    assert (result.updates_per_epoch, result.updates, result.warmup_updates) == (50, 500, 100)


@pytest.mark.parametrize(
    "damage",
    [
        '{"epoch": 1, "accuracy": [0.5], "val_accuracy": 0.5}\n',
        '{"epoch": 1, "val_accuracy": "x"}\n',
        b"\x00\xff",
    ],
)
def test_one_damaged_run_is_left_out_of_the_report_not_the_whole_report(tmp_path, damage):
    folder, p = study_with_results(tmp_path)
    metrics = run_dir(folder, p.runs[-1]) / "metrics.jsonl"  # gradual-warmup-k8-s2
    metrics.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    checkpoint = run_dir(folder, p.runs[1]) / "checkpoints" / "epoch-0010"  # a damaged state.json too
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text('{"steps_per_epoch": 1e400, "workers": 1, "global_batch": 1024}')
    console = Console(file=io.StringIO(), width=300)
    study_report.write_report(folder, p, console)
    said = console.file.getvalue()
    assert f"note: {metrics}" in said
    # a file that is not text leaves the run out; a damaged line, only itself
    left_out = (
        "gradual-warmup-k8-s2 left out" if isinstance(damage, bytes) else "left out of gradual-warmup-k8-s2"
    )
    assert left_out in said
    md = (folder / "report" / "large_batch.md").read_text()
    assert (
        "| 8 | 1,024 | scaled LR, gradual warmup | 0.8 | gradual 0.1 -> 0.8 over 2 epochs | 7.20 | +0.10 pp, 1 seed "
        "| cannot tell | 580 | 1/2 |" in md
    )


def test_report_files_table_csv_and_figure(tmp_path):
    folder, p = study_with_results(tmp_path)
    console = Console(file=io.StringIO(), width=200)
    written = study_report.write_report(folder, p, console)
    out = folder / "report"
    assert written == [out / "large_batch.md", out / "large_batch.csv", out / "large_batch_runs.csv",
                       out / "large_batch.png", out / "large_batch_vs_k.png"]  # fmt: skip
    md = (out / "large_batch.md").read_text()
    assert (
        "| k | global batch | variant | LR | warmup | top-1 error (%) | vs baseline, paired (pp, 95% CI) | verdict "
        "| updates |" in md
    )
    assert (
        "| 8 | 1,024 | scaled LR, gradual warmup | 0.8 | gradual 0.1 -> 0.8 over 2 epochs | 7.11 ± 0.13 |"
        in md
    )
    assert "each micro-batch of 128 images is normalised by its own batch-norm statistics" in md
    assert "k=8 (batch 1,024): scaled LR + gradual warmup holds (+0.11 pp [-0.02, +0.24], 2 seeds" in md
    with open(out / "large_batch.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == list(VARIANTS)
    assert (
        rows[4]["top1_error_mean"] == "7.11"
        and rows[4]["vs_baseline_pp"] == "0.11"
        and (rows[4]["ci95_low_pp"], rows[4]["ci95_high_pp"], rows[4]["verdict"])
        == ("-0.0171", "0.2371", "holds")
        and (rows[4]["updates_min"], rows[4]["updates_max"]) == ("580", "580")
    )
    with open(out / "large_batch_runs.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    text = {"run", "state", "precision"}
    assert runs and all(
        float(cell) == float(cell) for r in runs for k, cell in r.items() if k not in text and cell
    )
    assert {r["precision"] for r in runs} == {"float32"}  # each run's, from its summary.json
    assert (
        "## Measured on\n\n- no GPU (2 x test CPU CPU cores); TensorFlow 2.18.1, Keras tf_keras 2.18.0, "
        in md
    )
    assert {r["workers"] for r in runs} >= {"1"} and all(
        int(r["epochs"]) >= int(r["epochs_done"]) for r in runs
    )
    png = (out / "large_batch.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    vs_k = (out / "large_batch_vs_k.png").read_bytes()  # Goyal's Figure 1 shape: error vs global batch
    assert vs_k[:8] == b"\x89PNG\r\n\x1a\n" and len(vs_k) > 20_000
    assert "![error vs batch size](large_batch_vs_k.png)" in md
    assert "gradual warmup holds (+0.11 pp" in console.file.getvalue()


# ------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "0"], "Invalid value for '--k': '0': 0 is not a positive integer; k multiplies the baseline's batch"),
        (["--k", "1,-1"], "'1,-1': -1 is not a positive integer"),
        (["--k", "1,1.5"], "'1.5' is not a positive integer"),
        (["--k", "nan"], "'nan' is not a positive integer"),
        (["--k", ""], "no values; give the k to compare with the baseline"),
        (["--k", "1,8,8"], "k 8 is given twice; give each k once"),
        (["--k", "1"], "only k = 1, the baseline: add at least one k > 1"),
        (["--k", "\u0668"], "is not a positive integer"),
        (["--k", "1,8", "--seeds", "0"], "--seeds '0': baseline with 0 seeds: give 1 to 100"),
        (["--k", "1,8", "--seeds", "-1"], "--seeds '-1': baseline with -1 seeds: give 1 to 100"),
        (["--k", "1,8", "--seeds", "1.5"], "--seeds '1.5': '1.5' is not a whole number; give N seeds, or N,NAME=M"),
        (["--k", "1,8", "--seeds", "nan"], "'nan' is not a whole number"),
        (["--k", "1,8", "--seeds", "101"], "--seeds '101': baseline with 101 seeds: give 1 to 100"),
        (["--k", "1,8", "--seeds", "99999999999"], "--seeds '99999999999': '99999999999': give 1 to 100 seeds"),
        (["--k", "1,8", "--seeds", "unscaled=3"], "--seeds 'unscaled=3': 'unscaled=3': start with N, the baseline's"),
        (["--k", "1,8", "--seeds", "7,foo=3"], "--seeds '7,foo=3': 'foo' is not a variant; name baseline or one of "
         "unscaled,no-warmup,constant-warmup,gradual-warmup"),
        (["--k", "1,8", "--seeds", "7,unscaled=0"], "--seeds '7,unscaled=0': unscaled with 0 seeds: give 1 to 100"),
        (["--k", "1,8", "--seeds", "7,unscaled=-2"], "unscaled with -2 seeds: give 1 to 100"),
        (["--k", "1,8", "--seeds", "7,unscaled=x"], "'unscaled=x' is not NAME=M with M a whole number"),
        (["--k", "1,8", "--seeds", "7,unscaled"], "'unscaled' is not NAME=M with M a whole number"),
        (["--k", "1,8", "--seeds", "3,no-warmup=5"], "no-warmup has 5 seeds, more than the baseline's 3: its seeds "
         "pair with the baseline's seed by seed; give it at most 3"),
        (["--k", "1,8", "--seeds", "7,baseline=2"], "unscaled has 7 seeds, more than the baseline's 2"),
        (["--k", "1,8", "--seeds", "7,constant-warmup=3", "--variants", "unscaled,gradual-warmup"],
         "constant-warmup is not in --variants (unscaled,gradual-warmup); add it there or leave it out here"),
        (["--k", "1,8", "--seeds", "7,unscaled=3,unscaled=2"], "unscaled is given twice; give each name once"),
        (["--k", "1,8", "--variants", "foo"], "--variants 'foo': 'foo' is not a k > 1 variant; give one or more "
         "of unscaled,no-warmup,constant-warmup,gradual-warmup"),
        (["--k", "1,8", "--variants", "baseline"], "'baseline' is not a k > 1 variant (it always runs)"),
        (["--k", "1,8", "--variants", "unscaled,no-warmup,unscaled"], "unscaled is given twice"),
        (["--k", "1,8", "--variants", ""], "--variants '': no variant named; give one or more of unscaled,"),
        (["--k", "1,8", "--variants", " , "], "no variant named"),
        (["--k", "1,8", "--margin", "0"], "Invalid value for '--margin': 0.0: a positive number of percentage"),
        (["--k", "1,8", "--margin", "nan"], "Invalid value for '--margin': nan: a positive number of percentage"),
        (["--k", "1,8", "--margin", "1e999"], "Invalid value for '--margin': inf: a positive number of"),
        (["--k", "1,8", "--name", "../x"], "--name ../x: cannot name a study folder; use letters, digits"),
        (["--k", "1,8", "--parallel", "0"], "Invalid value for '--parallel': 0 is not in the range x>=1"),
        (["--k", "1,8", "--parallel", "2", "--cluster", "local"], "--parallel is for runs on this machine; on"),
        (["--k", "1,8", "--parallel", "100000"], "--parallel 100000 x --np 1 = 100000 processes on this machine's"),
        (["--k", "1,8", "--set", "data.source=synthetic", "--set", "data.num_classes=10",
          "--set", "data.synthetic_examples=1000"], "--k 8: a global batch of 1,024 (8 x 128) is more than"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(tmp_path, monkeypatch, capsys, args, message):
    out = tmp_path / "studies"
    code, stdout, stderr = app_main(["study", "large-batch", "-c", FASHION, "--out", str(out), *args],
                                    monkeypatch, capsys)  # fmt: skip
    assert code == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("Error: ") and message in stderr, stderr
    assert not out.exists()


def test_parallel_runs_are_refused_where_there_are_gpus(tmp_path, monkeypatch, capsys):
    # Every run would train on the first GPU (no GPU here: the device listing is replaced, nothing else).
    import app.engines.world as world

    monkeypatch.setattr(world, "gpu_device_nodes", lambda: ["/dev/nvidia0", "/dev/nvidia1"])
    out = tmp_path / "studies"
    code, _, stderr = app_main(["study", "large-batch", "-c", FASHION, "--k", "1,8", "--parallel", "2",
                                "--out", str(out)], monkeypatch, capsys)  # fmt: skip
    assert code == 2 and stderr.startswith("Error: --parallel 2: this machine has GPUs") and not out.exists()


def test_unknown_study_kind(monkeypatch, capsys):
    code, _, stderr = app_main(["study", "large-batches", "--k", "1,8"], monkeypatch, capsys)
    assert (code, stderr) == (
        2,
        "Error: unknown study kind 'large-batches': the kinds are large-batch, scaling (and `app study "
        "status|report STUDY_DIR`); "
        "did you mean 'large-batch'?\n",
    )


def test_status_of_a_folder_without_a_study(tmp_path, monkeypatch, capsys):
    code, _, stderr = app_main(["study", "status", str(tmp_path)], monkeypatch, capsys)
    assert (
        code == 2
        and stderr.startswith(f"Error: STUDY_DIR {tmp_path}: no study.json there")
        and stderr.count("\n") == 1
    )


def test_a_different_study_in_the_folder_through_the_command_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "studies"
    folder, _ = new_study(tmp_path)  # k 1,8 under tmp_path/studies/s
    before = (folder / "study.json").read_bytes()
    code, _, stderr = app_main(["study", "large-batch", "-c", FASHION, "--k", "1,2", "--name", "s", "--out", str(out)],
                               monkeypatch, capsys)  # fmt: skip
    assert code == 2 and "holds a different study (--k [1, 8] there vs [1, 2] now" in stderr, stderr
    assert (folder / "study.json").read_bytes() == before and not (
        folder / "runs" / "baseline-k1-s1"
    ).exists()


def test_dry_run_prints_the_plan_quoted_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import shlex

    out = tmp_path / "st $(touch pwned) 'q'"
    code, stdout, stderr = app_main(["study", "large-batch", "-c", FASHION, "--k", "1,8", "--np", "2", "--seeds", "1",
                                     "--out", str(out), "--dry-run"], monkeypatch, capsys)  # fmt: skip
    assert code == 0, stderr
    commands = [shlex.split(ln) for ln in stdout.splitlines() if ln.startswith("  app train")]
    assert len(commands) == 5 and commands[-1][commands[-1].index("--run-dir") + 1] == str(
        out / "study_fashion_mnist" / "runs" / "gradual-warmup-k8-s1"
    )
    assert "gradual-warmup-k8-s1: 2 worker(s) x 4 accumulation x 128 = 1024, LR 0.8, warmup gradual" in stdout
    # The folder on the last line is a shell word too (issue 32: it was echoed raw after the last command).
    assert f"would create {shlex.quote(str(out / 'study_fashion_mnist'))}: 5 to train" in stdout
    assert not out.exists() and not (Path.cwd() / "pwned").exists()


def test_study_commands_do_not_import_tensorflow(tmp_path):
    folder, _ = new_study(tmp_path)
    code = (
        "import sys; from app.cli import cli\n"
        f"for args in ({['study', 'status', str(folder)]!r}, "
        f"{['study', 'large-batch', '-c', FASHION, '--k', '1,8', '--out', str(tmp_path / 'o'), '--dry-run']!r}):\n"
        "    try:\n        cli.main(args, standalone_mode=False)\n    except BaseException:\n        pass\n"
        "print(sorted(m for m in ('tensorflow', 'horovod', 'tf_keras') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------------------------- real, end to end

# ResNet-20 on 8x8 Fashion-MNIST, 4 micro-batches of 16 per epoch, 2 epochs (1 of warmup): seconds per run.
TINY = ["--set", "data.image_size=8", "--set", "train.batch_size=16", "--set", "train.steps_per_epoch=4",
        "--set", "train.eval_steps=2", "--set", "train.epochs=2", "--set", "train.warmup_epochs=1",
        "--set", "data.cache=false", "--set", "data.shuffle_buffer=64", "--set", "run.tensorboard=false",
        "--set", "run.log_every=1", "--allow-small-budget"]  # fmt: skip


def test_tiny_real_study_stopped_by_a_signal_continues_and_reports(tmp_path, tfds_dir):
    out = tmp_path / "studies"
    model = ["--set", "model.name=examples/small_cnn.py:build"]  # RQ3 for a researcher's own model (issue 34)
    args = ["study", "large-batch", "-c", FASHION, "--k", "1,2", "--seeds", "1", "--name", "tiny", "--out",
            str(out), "--data-dir", str(tfds_dir), *TINY, *model]  # fmt: skip
    folder = out / "tiny"
    # 1. SIGTERM to the study once its second run trained a step: that run checkpoints at the end of the epoch and
    # exits with status 3, and the study stops there with status 3 (no further run starts).
    proc = subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    second = folder / "runs" / "unscaled-k2-s1"
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("epoch 1/2 step 1/4") and any("[2/5] unscaled-k2-s1" in ln for ln in seen):
            proc.send_signal(signal.SIGTERM)  # evaluation and the epoch's checkpoint are still ahead
            break
    rest, _ = proc.communicate(timeout=300)
    stdout = stderr = "".join(seen) + rest
    assert proc.returncode == 3, stdout + stderr
    assert (
        "scaleout: study stopped by SIGTERM: every run in progress checkpointed or finished, none started after; "
        "`app study large-batch" in stderr
    )
    p = load_plan(folder)
    first = states(folder, p)
    assert [s.state for s in first] == ["done", "partial", "pending", "pending", "pending"], first
    assert first[1] == RunState("partial", 1, "stopped") and (second / "checkpoints" / "epoch-0001").is_dir()
    assert sorted(os.listdir(folder / "runs")) == ["baseline-k1-s1", "unscaled-k2-s1"]
    assert (folder / "runs" / "baseline-k1-s1" / "model" / "small_cnn.py").is_file()  # her model, kept
    status = run_app(["study", "status", str(folder)]).stdout
    assert "1 done, 1 partial, 3 pending of 5 runs" in status

    # 2. The same command again: the finished run is skipped, the stopped one resumes, the rest run; a report.
    kept = (folder / "runs" / "baseline-k1-s1" / "summary.json").stat().st_mtime_ns
    proc = run_app(args, timeout=900)
    assert "[1/5] baseline-k1-s1: done, skipped" in proc.stdout
    assert "[2/5] unscaled-k2-s1: resuming after epoch 1/2:" in proc.stdout and "resumed from" in proc.stdout
    assert kept == (folder / "runs" / "baseline-k1-s1" / "summary.json").stat().st_mtime_ns
    assert [s.state for s in states(folder, p)] == ["done"] * 5
    report = folder / "report"
    for name in (
        "large_batch.md",
        "large_batch.csv",
        "large_batch_runs.csv",
        "large_batch.png",
        "large_batch_vs_k.png",
    ):
        assert (report / name).stat().st_size > 0, name
    md = (report / "large_batch.md").read_text()
    assert md.count("| 2 | 32 | ") == 4 and "| 1 | 16 | baseline | 0.0125 | none |" in md
    # One seed: no verdict. 8 updates of 8x8 images may leave a run at chance (10 classes): then it is named as
    # diverged, and a baseline at chance pairs with nothing (issue 36).
    k2 = next(ln for ln in md.splitlines() if ln.startswith("- k=2 (batch 32): scaled LR + gradual warmup"))
    assert "scaled LR + gradual warmup: cannot tell (+" in k2 or "chance with 10 classes" in k2, k2
    # The plan's arithmetic is what app train did: 4 micro-batches per epoch, 2 of them per update at k = 2.
    for run in p.runs:
        state = json.loads((run_dir(folder, run) / "checkpoints" / "epoch-0002" / "state.json").read_text())
        assert state["global_batch"] == run.global_batch and state["steps_per_epoch"] == 4
        assert run.updates == (8 if run.k == 1 else 4)
        assert len((run_dir(folder, run) / "metrics.jsonl").read_text().splitlines()) == 2
    saved = config.load_yaml(run_dir(folder, p.runs[3]) / "config.yaml")
    assert (saved["train.warmup"], saved["train.accumulation_steps"]) == ("constant", 2)


def test_two_runs_at_once_share_the_cores_stop_together_and_continue(tmp_path, tfds_dir):
    # --parallel 2: two `app train` processes at a time, each with 1 of the 2 cores' threads (or its share) and
    # its output in logs/<run>.log. SIGTERM to the study reaches both: each checkpoints or finishes, no third
    # starts, the study exits 3; the same command then trains the rest, again two at a time.
    out = tmp_path / "studies"
    args = ["study", "large-batch", "-c", FASHION, "--k", "1,2", "--seeds", "1", "--name", "two", "--out",
            str(out), "--data-dir", str(tfds_dir), *TINY, "--set", "train.steps_per_epoch=100",
            "--parallel", "2"]  # fmt: skip
    folder = out / "two"
    proc = subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    logs = [folder / "logs" / "baseline-k1-s1.log", folder / "logs" / "unscaled-k2-s1.log"]
    deadline = time.monotonic() + 240
    together = set()  # what `app study status` reads: the runs the study's lock names as training now
    while not all(p.is_file() and "epoch 1/2 step 1/100" in p.read_text() for p in logs):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        together.add(running_run(folder))
        time.sleep(0.1)
    assert "baseline-k1-s1,unscaled-k2-s1" in together, together
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, stdout
    assert (
        "study stopped by SIGTERM: every run in progress checkpointed or finished, none started after"
        in stdout
    )
    assert "(output: " in stdout
    # Every run that started either finished before the signal or checkpointed at it; those that had not
    # started have no run directory; the two in progress at the signal (at least one) stopped. A run the study
    # started a moment before the signal (the first had finished meanwhile, on a loaded machine) may have been
    # stopped before it made its directory: said as interrupted or stopped, with nothing trained.
    p = load_plan(folder)
    first = states(folder, p)
    started = [s for r, s in zip(p.runs, first, strict=True) if run_dir(folder, r).is_dir()]
    unmade = [(s.state, s.epochs_done, s.detail) for s in first[len(started) :] if s.state != "pending"]
    assert first[: len(started)] == started, first
    assert unmade in ([], [("partial", 0, "interrupted")], [("partial", 0, "stopped")]), first
    assert all(s.state == "done" or (s.state, s.detail) == ("partial", "stopped") for s in started), first
    assert sum(s.state == "partial" for s in started) >= 1, first
    started_lines = stdout.count("+ app train ")
    assert stdout.count(f"--threads {max(1, (os.cpu_count() or 1) // 2)}  (output: ") == started_lines >= 2

    proc = run_app(args, timeout=900)
    assert [s.state for s in states(folder, p)] == ["done"] * 5, proc.stdout
    assert sorted(x.name for x in (folder / "logs").iterdir()) == sorted(f"{r.name}.log" for r in p.runs)
    assert (folder / "report" / "large_batch.md").stat().st_size > 0


def test_runs_in_different_precisions_are_a_warning(tmp_path):
    """Issue 21, item 3: precision: auto picks per machine; a table mixing precisions says so."""
    folder, p = study_with_results(tmp_path)
    summary = run_dir(folder, p.runs[-1]) / "summary.json"
    data = json.loads(summary.read_text())
    summary.write_text(json.dumps({**data, "precision": "mixed_float16"}))
    lines = study_report.warnings(study_report.collect(folder, p))
    assert lines[-1].startswith("warning: the runs trained in different precisions (float32: ")
    assert f"mixed_float16: {p.runs[-1].name})" in lines[-1]
    summary.write_text(json.dumps(data))
    assert not any("precisions" in line for line in study_report.warnings(study_report.collect(folder, p)))


def test_a_plan_under_the_update_budget_is_refused_with_the_epochs_that_would_do(
    tmp_path, monkeypatch, capsys
):
    """Issue 21, item 2: 4 epochs of batch 128 make 232 updates per run at k=8 (the make study of 2026-12-03),
    where the calibration got Goyal's order wrong: refused at plan time (one line, exit 2, nothing written)
    unless accepted, and then every verdict says budget-limited. make study's own config plans enough."""
    from app.study.large_batch import MIN_BUDGET_UPDATES

    two_core = config.build([str(ROOT / "configs" / "study_fashion_mnist_2core.yaml")], [])
    assert {r.updates for r in plan(cfg=two_core, seeds=3, small=False).runs if r.k == 8} == {936}

    assert not plan(small=False).budget_limited  # the shipped 10 epochs: 580 updates at k=8
    with pytest.raises(UsageError) as err:
        plan(cfg=fashion("train.epochs=4"), small=False)
    assert str(err.value) == (
        f"at k=8 each run makes only 232 updates (4 epochs x 58): under the {MIN_BUDGET_UPDATES} a verdict needs "
        "(docs/study.md, the update budget); train 9 or more epochs (--set train.epochs=9), use a smaller baseline "
        "batch, or accept it with --allow-small-budget (the report then calls its verdicts budget-limited)"
    )
    assert plan(cfg=fashion("train.epochs=4")).budget_limited
    assert not plan(examples=None, small=False).budget_limited  # a dataset not counted here is not judged
    out = tmp_path / "studies"
    args = ["study", "large-batch", "-c", FASHION, "--k", "1,8", "--set", "train.epochs=4", "--out", str(out)]
    code, _, stderr = app_main([*args, "--dry-run"], monkeypatch, capsys)
    assert (
        code == 2 and stderr.startswith("Error: at k=8 each run makes only 232 updates") and not out.exists()
    )
    code, stdout, _ = app_main([*args, "--dry-run", "--allow-small-budget"], monkeypatch, capsys)
    assert code == 0 and "the report calls its verdicts budget-limited" in stdout
    assert (
        "gradual-warmup-k8-s1: 1 worker(s) x 8 accumulation x 128 = 1024, LR 0.8, warmup gradual, 4 epochs, 232 updates"
        in stdout
    )


def test_a_budget_limited_report_says_so_in_every_verdict(tmp_path):
    """Judged per k from the updates its runs plan: at k=2 4 epochs make 936 (enough), at k=8 232 (not)."""
    folder, p = study_with_results(tmp_path, plan(ks=(1, 2, 8), seeds=2, cfg=fashion("train.epochs=4")))
    console = Console(file=io.StringIO(), width=300)
    study_report.write_report(folder, p, console)
    md = (folder / "report" / "large_batch.md").read_text()
    assert "- budget-limited: the runs at k=8 make fewer than 500 updates" in md
    k8 = next(line for line in md.splitlines() if line.startswith("- k=8 (batch 1,024): "))
    k2 = next(line for line in md.splitlines() if line.startswith("- k=2 (batch 256): "))
    assert k8.endswith("[budget-limited: only 232 updates per run, under 500]") and "budget-limited" not in k2
    with open(folder / "report" / "large_batch.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["budget_limited"] for r in rows if r["k"] == "8"} == {"True"}
    assert {r["budget_limited"] for r in rows if r["k"] in ("1", "2")} == {"False"}
    assert all("budget" not in r["verdict"] for r in rows)  # the verdict column stays one of its words
