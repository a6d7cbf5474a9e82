"""`app report`: scaling arithmetic on hand-made results, files and plots produced, bad inputs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from app.cli import cli
from app.core import results as core_results
from app.core.errors import UsageError
from app.reports import app_report
from app.reports import benchmarks as report
from app.reports import runs as runs_mod


def result(batch, workers, ips, wait=0.01, model="resnet50", **kw):
    return {"kind": "train", "model": model, "image_size": 224, "precision": "mixed_bfloat16", "xla": False,
            "batch_size": batch, "workers": workers, "nodes": max(1, workers // 4),
            "images_per_s": {"mean": ips, "ci95": ips * 0.02}, "input_wait_fraction": wait, **kw}  # fmt: skip


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# A study in miniature: batch 256 scales nearly linearly, batch 32 does not.
STUDY = [result(256, 1, 100.0), result(256, 8, 760.0), result(256, 32, 3008.0),
         result(32, 1, 80.0), result(32, 8, 400.0), result(32, 32, 1562.0)]  # fmt: skip


def test_speedup_and_efficiency_arithmetic():
    table = report.scaling(STUDY)
    big = {p.workers: p for p in table[256]}
    assert big[32].speedup == pytest.approx(30.08)
    assert big[32].efficiency == pytest.approx(3008.0 / (32 * 100.0))  # throughput(N) / (N x throughput(1))
    assert big[8].per_worker == pytest.approx(95.0)
    small = {p.workers: p for p in table[32]}
    assert small[32].efficiency == pytest.approx(1562.0 / (32 * 80.0))


def test_efficiency_against_the_fewest_workers_and_repeats_averaged():
    table = report.scaling([result(64, 2, 200.0), result(64, 2, 220.0), result(64, 8, 640.0)])
    two, eight = table[64]
    assert two.images_per_s == pytest.approx(210.0) and two.samples == 2
    assert eight.efficiency == pytest.approx(640.0 * 2 / (8 * 210.0))


def test_verdicts():
    lines = report.verdicts(report.scaling(STUDY))
    assert lines[0] == "batch 32/worker scales at 61% to 32 workers: communication-bound"
    assert lines[1] == "batch 256/worker scales at 94% to 32 workers: near-linear"
    waiting = report.verdicts(
        report.scaling([result(64, 1, 100.0, wait=0.3), result(64, 4, 200.0, wait=0.35)])
    )
    assert waiting == ["batch 64/worker scales at 50% to 4 workers: input-bound: steps waited 35% for data"]


def test_mixed_models_are_one_clear_error():
    with pytest.raises(UsageError) as err:
        report.scaling([result(64, 1, 10.0), result(64, 2, 19.0, model="resnet20")])
    assert (
        str(err.value)
        == "results mix model resnet20 and resnet50; report one at a time (split the results file, e.g. with jq)"
    )


def make_run(root: Path, name: str, accs: list[float], epoch_time: float, workers: int) -> Path:
    run = root / name
    run.mkdir()
    rows = [
        {"epoch": i + 1, "val_accuracy": a, "val_loss": 1 - a, "epoch_time_s": epoch_time}
        for i, a in enumerate(accs)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"workers": workers, "global_batch": 256 * workers}))
    return run


def test_report_files_plots_and_time_to_accuracy(tmp_path):
    from PIL import Image

    results = write(tmp_path / "bench.jsonl", STUDY)
    a = make_run(tmp_path, "scaled", [0.5, 0.7, 0.76], 100.0, 32)
    b = make_run(tmp_path, "naive", [0.4, 0.6, 0.70], 100.0, 32)
    out = tmp_path / "report"
    console = Console(file=io.StringIO(), width=120)
    written = app_report.make_report([results, a, b], out, None, console)
    assert "batch 256/worker scales at 94% to 32 workers: near-linear" in console.file.getvalue()
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "scaling.md",
            "scaling.csv",
            "throughput.png",
            "efficiency.png",
            "training.md",
            "training.csv",
            "training.png",
        ]
    )
    csv_lines = (out / "scaling.csv").read_text().splitlines()
    assert csv_lines[0] == ("batch_per_worker,workers,nodes,images_per_s,images_per_s_ci95,images_per_s_per_worker,"
                            "speedup,efficiency,input_wait_fraction")  # fmt: skip
    assert len(csv_lines) == 1 + len(STUDY)
    # Numbers, not display strings: every cell parses as one (efficiency a fraction, no "x", "%" or ",").
    cells = [line.split(",") for line in csv_lines[1:]]
    assert all(float(c) >= 0 for row in cells for c in row)
    assert max(float(row[7]) for row in cells) <= 1.5 and min(float(row[7]) for row in cells) > 0
    assert "near-linear" in (out / "scaling.md").read_text()
    for png in ("throughput.png", "efficiency.png", "training.png"):
        with Image.open(out / png) as im:
            assert im.format == "PNG" and im.size[0] > 400
    training = (out / "training.csv").read_text().splitlines()
    # Target = the lowest best accuracy (0.70): "scaled" reaches it at epoch 2 (200 s), "naive" at epoch 3.
    assert training[0].split(",")[-2:] == ["train_seconds", "seconds_to_target"]
    assert float(training[1].split(",")[-1]) == 200 and float(training[2].split(",")[-1]) == 300


def test_time_to_accuracy_by_worker_count(tmp_path):
    # RQ2 in time to a target: 1 worker reaches 0.70 after 3 epochs of 100 s, 2 workers after 3 of 60 s
    # (the faster of its two runs), 4 workers never; one worker count alone gives no line.
    runs = [
        runs_mod.load_run(make_run(tmp_path, name, accs, t, workers))
        for name, accs, t, workers in (
            ("w1", [0.5, 0.6, 0.71], 100.0, 1),
            ("w2-slow", [0.5, 0.6, 0.65, 0.72], 60.0, 2),
            ("w2", [0.5, 0.6, 0.70], 60.0, 2),
            ("w4", [0.5, 0.6, 0.69], 30.0, 4),
        )
    ]
    (line,) = runs_mod.time_to_accuracy_by_workers(runs, 0.70)
    assert line.endswith(
        "1 worker(s) 5.0 min (w1); 2 worker(s) 3.0 min (w2, 1.67x vs 1 worker(s)); 4 worker(s) not reached"
    )
    assert line in runs_mod.training_verdicts(runs, 0.70)
    (line,) = runs_mod.time_to_accuracy_by_workers(runs[1:], 0.70)  # the fewest never reached it: no speedups
    assert line.endswith("2 worker(s) 3.0 min (w2); 4 worker(s) not reached")
    assert runs_mod.time_to_accuracy_by_workers(runs[:1], 0.70) == []  # one worker count
    zero = runs_mod.load_run(make_run(tmp_path, "w1-zero", [0.71], 0.0, 1))  # a 0 s time: no division by it
    assert runs_mod.time_to_accuracy_by_workers([zero, runs[2]], 0.70)[0].endswith("3.0 min (w2)")


def test_plot_has_the_expected_series(tmp_path, monkeypatch):
    captured = {}
    import matplotlib.figure

    real_savefig = matplotlib.figure.Figure.savefig

    def savefig(fig, path, *args, **kwargs):
        ax = fig.axes[0]
        bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
        captured[Path(path).name] = (
            sorted(t.get_text() for t in ax.get_legend().get_texts()),
            [(c.get_label(), len(c.lines[2][0].get_segments())) for c in bars],  # a 95% bar per point
        )
        return real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    table = report.scaling(STUDY)
    report.plot_scaling(table, tmp_path)
    points = len(table[32])
    assert captured["throughput.png"] == (
        ["batch 256/worker", "batch 32/worker", "ideal (256)", "ideal (32)"],
        [("batch 32/worker", points), ("batch 256/worker", len(table[256]))],
    )
    assert captured["efficiency.png"][0] == ["batch 256/worker", "batch 32/worker", "ideal"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json\n", "line 1: not JSON"),
        ("[1, 2]\n", "line 1: not a JSON object"),
        (
            '{"batch_size": 32}\n',
            "line 1: missing workers, images_per_s; is this an `app benchmark` results file?",
        ),
        ("\n", "no results in it"),
    ],
)
def test_bad_results_file_one_line(tmp_path, content, message):
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    result_ = CliRunner().invoke(cli, ["report", str(path), "--out", str(tmp_path / "out")])
    assert result_.exit_code == 2
    assert result_.output.strip().startswith(f"Error: {path}") and message in result_.output
    assert len(result_.output.strip().splitlines()) == 1


def test_missing_input_and_not_a_run(tmp_path):
    result_ = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.jsonl")])
    assert result_.exit_code == 2
    assert result_.output.strip() == (
        f"Error: {tmp_path / 'nope.jsonl'}: no such file or directory; pass results files of `app benchmark` or run directories"
    )
    result_ = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result_.exit_code == 2 and "not a training run (no metrics.jsonl)" in result_.output


def report_cli(*args):
    result_ = CliRunner().invoke(cli, ["report", *map(str, args)])
    assert "Traceback" not in result_.output
    assert result_.exception is None or isinstance(result_.exception, SystemExit), result_.exception
    return result_.exit_code, result_.output.strip()


def test_out_naming_an_existing_file_is_refused_and_kept(tmp_path):
    results = write(tmp_path / "bench.jsonl", STUDY)
    out = tmp_path / "report.md"
    out.write_text("my notes\n")
    code, text = report_cli(results, "--out", out)
    assert (code, text) == (
        2,
        f"Error: --out {out}: exists and is not a folder; name a folder (it is created if missing)",
    )
    assert out.read_text() == "my notes\n"
    code, text = report_cli(results, "--out", out / "sub")
    assert code == 2 and text.startswith(f"Error: --out {out / 'sub'}: cannot create the folder (")


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"workers": 8, "global_batch"', "summary.json: not JSON (Expecting ':' delimiter, line 1); the file is damaged"),
        ("", "summary.json: not JSON (Expecting value, line 1); the file is damaged"),
        ("[1, 2]", "summary.json: not a JSON object; the file is damaged: remove it"),
    ],
)  # fmt: skip
def test_damaged_summary_is_one_line(tmp_path, content, message):
    run = make_run(tmp_path, "run", [0.5, 0.6], 10.0, 2)
    (run / "summary.json").write_text(content)
    code, text = report_cli(run, "--out", tmp_path / "out")
    assert code == 2 and text.startswith(f"Error: {run}/{message}") and len(text.splitlines()) == 1


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"epoch": 1, "val_accuracy": 0.5}\n{"epoch": 2, "val_acc\n{"epoch": 3}\n', "line 2: not JSON"),
        ('{"epoch": 1}\n[1]\n', "line 2: not an epoch's metrics (no epoch number); the file is damaged"),
        ('{"epoch": 1, "val_accuracy": "high"}\n', "line 1: val_accuracy is not a number ('high'); the file is damaged"),
    ],
)  # fmt: skip
def test_damaged_metrics_are_one_line(tmp_path, content, message):
    run = make_run(tmp_path, "run", [0.5], 10.0, 2)
    (run / "metrics.jsonl").write_text(content)
    code, text = report_cli(run, "--out", tmp_path / "out")
    assert code == 2 and text.startswith(f"Error: {run / 'metrics.jsonl'} {message}")
    assert len(text.splitlines()) == 1


def test_a_torn_last_line_is_skipped_with_a_note(tmp_path):
    run = make_run(tmp_path, "run", [0.5, 0.6], 10.0, 2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "val_accu')  # a write cut short: no newline after it
    notes = []
    assert [r["epoch"] for r in core_results.read_metrics(run, notes.append)] == [1, 2]
    assert notes == [f"{run / 'metrics.jsonl'} line 3: ignoring a torn last line (an interrupted write)"]
    results = write(tmp_path / "bench.jsonl", STUDY)
    with open(results, "a") as f:
        f.write('{"kind": "train", "batch')
    code, text = report_cli(results, run, "--out", tmp_path / "out")
    assert code == 0
    words = " ".join(text.split())  # rich wraps long lines
    assert f"note: {results} line 7: ignoring a torn last line (an interrupted write)" in words
    assert f"note: {run / 'metrics.jsonl'} line 3: ignoring a torn last line" in words


def test_null_metrics_are_absent_values(tmp_path):
    run = make_run(tmp_path, "run", [0.5], 10.0, 2)
    (run / "metrics.jsonl").write_text(
        '{"epoch": 1, "loss": null, "val_accuracy": 0.5}\n{"epoch": 2, "val_accuracy": null}\n'
    )
    rows = core_results.read_metrics(run)
    assert rows == [{"epoch": 1, "val_accuracy": 0.5}, {"epoch": 2}]
    code, text = report_cli(run, "--out", tmp_path / "out")
    assert code == 0 and "best: run reached 50.00% validation accuracy" in text


@pytest.mark.parametrize(
    "row, message",
    [
        (result("x", 1, 10.0), "line 1: batch_size must be a positive integer, got 'x'"),
        (result(32, 0, 10.0), "line 1: workers must be a positive integer, got 0"),
        (result(32, 1, 0.0), "line 1: images_per_s.mean must be a positive number up to 1e+09, got 0.0"),
        (
            {**result(32, 1, 1.0), "images_per_s": {"mean": "fast"}},
            "line 1: images_per_s.mean must be a positive number up to 1e+09, got 'fast'",
        ),
        (
            result(32, 1, 10.0, wait="high"),
            "line 1: input_wait_fraction must be a number from 0 to 1 or null, got 'high'",
        ),
        # Issue 22, item 19: numbers no benchmark measures ("scales at inf%", "-500%" input wait, a plot crash).
        (result(32, 1, 1e300), "line 1: images_per_s.mean must be a positive number up to 1e+09, got 1e+300"),
        (
            {**result(32, 1, 10.0), "images_per_s": {"mean": 10.0, "ci95": 1e308}},
            "line 1: images_per_s.ci95 must be a number from 0 to 1e+09 or null, got 1e+308",
        ),
        (
            result(32, 1, 10.0, wait=-5.0),
            "line 1: input_wait_fraction must be a number from 0 to 1 or null, got -5.0",
        ),
    ],
)
def test_bad_values_in_results_are_one_line(tmp_path, row, message):
    path = write(tmp_path / "r.jsonl", [row])
    code, text = report_cli(path, "--out", tmp_path / "out")
    assert (code, text) == (2, f"Error: {path} {message}")


def test_binary_results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage")
    code, text = report_cli(path, "--out", tmp_path / "out")
    assert (code, text) == (2, f"Error: {path}: not a text file (undecodable byte at offset 0)")


def test_a_null_confidence_interval_is_read(tmp_path):
    rows = [result(64, 1, 100.0), result(64, 2, 190.0)]
    rows[0]["images_per_s"]["ci95"] = None
    code, text = report_cli(write(tmp_path / "r.jsonl", rows), "--out", tmp_path / "out")
    assert code == 0 and "batch 64/worker scales at 95% to 2 workers" in text


def test_runs_of_different_datasets_or_models_warn(tmp_path):
    a = make_run(tmp_path, "mnist", [0.8, 0.9], 10.0, 2)
    b = make_run(tmp_path, "imagenet", [0.3, 0.5], 100.0, 8)
    (a / "summary.json").write_text(
        json.dumps({"workers": 2, "model": "resnet20", "dataset": "fashion_mnist"})
    )
    # A run still going has no summary.json yet: its config.yaml says what it trains.
    (b / "summary.json").unlink()
    (b / "config.yaml").write_text("data:\n  source: imagenet\nmodel:\n  name: resnet50\n")
    out = tmp_path / "out"
    code, text = report_cli(a, b, "--out", out)
    assert code == 0
    lines = " ".join(text.split())  # rich wraps long lines
    assert (
        "warning: these runs mix datasets fashion_mnist and imagenet: their accuracies and times to a target are not comparable"
        in lines
    )
    assert "warning: these runs mix models resnet20 and resnet50" in lines
    assert "warning: these runs mix datasets" in (out / "training.md").read_text()
    same = make_run(tmp_path, "mnist2", [0.85], 10.0, 4)
    (same / "summary.json").write_text(json.dumps({"model": "resnet20", "dataset": "fashion_mnist"}))
    code, text = report_cli(a, same, "--out", out)
    assert code == 0 and "warning" not in text


@pytest.mark.parametrize("value", ["nan", "inf", "0", "75", "-0.5", "٠.٧٥", "1_0", "0.5x"])
def test_target_accuracy_must_be_a_fraction(tmp_path, value):
    run = make_run(tmp_path, "run", [0.5], 10.0, 2)
    code, text = report_cli(run, "--target-accuracy", value, "--out", tmp_path / "out")
    assert code == 2
    assert text.splitlines()[-1].startswith("Error: Invalid value for '--target-accuracy': ")
    assert "an accuracy is a fraction in (0, 1], e.g. 0.75" in text


# --- Hostile inputs: valid JSON that Python refuses, endless files, outputs that cannot be written ---------------
BIG = "9" * 5000  # int() refuses more than 4300 digits


@pytest.mark.parametrize(
    "line, message",
    [
        (
            '{"batch_size": ' + BIG + "}",
            "line 1: a number with too many digits to read; each line must be one",
        ),
        ("[" * 200000, "line 1: nested too deeply to read; each line must be one `app benchmark` result"),
    ],
)
def test_results_python_cannot_read_are_one_line(tmp_path, line, message):
    path = tmp_path / "r.jsonl"
    path.write_text(line + "\n")
    code, text = report_cli(path, "--out", tmp_path / "out")
    assert code == 2 and text.startswith(f"Error: {path} {message}") and len(text.splitlines()) == 1


def test_huge_numbers_in_a_run_are_one_line(tmp_path):
    run = make_run(tmp_path, "run", [0.5], 10.0, 2)
    (run / "metrics.jsonl").write_text('{"epoch": 1, "val_accuracy": ' + BIG + "}\n")
    code, text = report_cli(run, "--out", tmp_path / "out")
    assert (code, text) == (
        2,
        f"Error: {run / 'metrics.jsonl'} line 1: a number with too many digits to read; each line must be "
        "one epoch's metrics",
    )
    run = make_run(tmp_path, "run2", [0.5], 10.0, 2)
    (run / "summary.json").write_text('{"workers": ' + BIG + "}")
    code, text = report_cli(run, "--out", tmp_path / "out")
    assert (code, text) == (
        2,
        f"Error: {run / 'summary.json'}: a number with too many digits to read; the file is damaged: remove it "
        "(`app train --run-dir` on the finished run writes it again)",
    )


def test_devices_and_fifos_are_refused_not_read(tmp_path):
    import os

    fifo = tmp_path / "results.jsonl"
    os.mkfifo(fifo)  # nobody writes: reading would wait forever
    for path in ("/dev/zero", fifo):
        code, text = report_cli(path, "--out", tmp_path / "out")
        assert (code, text) == (
            2,
            f"Error: {path}: not a regular file (a device, pipe or socket); pass a JSON-lines file (at most 512 MB)",
        )


def test_a_results_file_over_the_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(core_results, "READ_LIMIT", 100)
    path = write(tmp_path / "bench.jsonl", STUDY)
    code, text = report_cli(path, "--out", tmp_path / "out")
    assert (code, text) == (
        2,
        f"Error: {path}: larger than 100 bytes, the limit for a JSON-lines file (at most 100 bytes); "
        "is it the right file?",
    )


def test_outputs_that_cannot_be_written_are_one_line(tmp_path):
    results = write(tmp_path / "bench.jsonl", STUDY)
    out = tmp_path / "out"
    (out / "scaling.md").mkdir(parents=True)  # a folder where the table goes
    code, text = report_cli(results, "--out", out)
    assert (code, text) == (
        1,
        f"Error: --out: cannot write {out / 'scaling.md'} (Is a directory); pass an --out folder you can write to",
    )
    assert (out / "scaling.md").is_dir()
    code, text = report_cli(results, "--out", "/proc/self")
    assert code == 1 and text.startswith("Error: --out: cannot write /proc/self (")
    assert len(text.splitlines()) == 1


def test_verdicts_follow_the_table_in_markdown(tmp_path):
    results = write(tmp_path / "bench.jsonl", STUDY)
    app_report.make_report([results], tmp_path / "out", None, Console(file=io.StringIO()))
    md = (tmp_path / "out" / "scaling.md").read_text()
    assert md.endswith("\n\n- batch 32/worker scales at 61% to 32 workers: communication-bound\n"
                       "- batch 256/worker scales at 94% to 32 workers: near-linear\n"
                       "- largest per-worker batch scales best here: batch 256/worker at 94%\n\n"
                       "Measured on:\n\n- (not recorded: measured before scaleout recorded its environment)\n")  # fmt: skip


def test_a_report_that_fails_half_way_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """Issue 22, item 16: a full disk while the plots are saved replaced the earlier report's files and left a
    0-byte PNG. Now every file is written aside and moved in only when all were written."""
    import errno

    import matplotlib.figure

    results = write(tmp_path / "bench.jsonl", STUDY)
    out = tmp_path / "out"
    assert report_cli(results, "--out", out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "throughput.png" in before and all(before.values())

    def full(fig, path, *args, **kwargs):
        Path(path).write_bytes(b"")  # what a full disk leaves
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    code, text = report_cli(results, "--out", out)
    assert (
        code == 1 and text.startswith("Error: --out: cannot write ") and "No space left on device" in text
    ), text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing replaced, nothing left over


def test_measured_on_names_each_environment_once_with_its_precision():
    from app.reports.tables import measured_on

    gh200 = {"gpu_count": 4, "gpu_model": "NVIDIA GH200 480GB", "gpu_driver": "NVIDIA 550.54.15",
             "tensorflow": "2.17.0", "keras": "tf_keras 2.17.0", "horovod": "0.28.1", "scaleout": "0.1.0",
             "scaleout_source": "0123456789ab"}  # fmt: skip
    cpu = {"gpu_count": 0, "cpu_count": 2, "cpu_model": "AMD EPYC\n7B13", "tensorflow": "2.18.1",
           "keras": "tf_keras 2.18.0", "horovod": None, "scaleout": "0.1.0"}  # fmt: skip
    lines = measured_on(
        [(gh200, "mixed_bfloat16"), (gh200, "mixed_bfloat16"), (cpu, "float32"), (None, None)]
    )
    assert lines == [
        "4 x NVIDIA GH200 480GB, driver NVIDIA 550.54.15; TensorFlow 2.17.0, Keras tf_keras 2.17.0, Horovod "
        "0.28.1, scaleout 0.1.0 (source 0123456789ab); precision mixed_bfloat16",
        "no GPU (2 x AMD EPYC 7B13 CPU cores); TensorFlow 2.18.1, Keras tf_keras 2.18.0, Horovod ?, scaleout "
        "0.1.0; precision float32",
        "(not recorded: measured before scaleout recorded its environment)",
    ]
    assert measured_on([]) == []


def test_results_and_runs_of_two_engines_are_kept_apart(tmp_path):
    # Issue 32: a tf point (3,000 images/s) and a Horovod point (3,800) at 32 workers averaged to 3,400.
    rows = [result(256, 1, 125.0, engine="horovod"), result(256, 32, 3800.0, engine="horovod"),
            result(256, 1, 125.0, engine="tf"), result(256, 32, 3000.0, engine="tf")]  # fmt: skip
    mixed = write(tmp_path / "mixed.jsonl", rows)
    code, out = report_cli(mixed, "--out", tmp_path / "r0")
    assert code == 2 and out == (
        "Error: results mix engines horovod and tf: one scaling table compares one engine; pass --engine "
        "horovod or --engine tf to report one"
    )
    assert not (tmp_path / "r0" / "scaling.md").exists()
    for engine, efficiency in (("horovod", 0.95), ("tf", 0.75)):
        table = report.scaling([r for r in rows if r["engine"] == engine])
        assert table[256][-1].efficiency == pytest.approx(efficiency)
        code, out = report_cli(mixed, "--out", tmp_path / engine, "--engine", engine)
        assert code == 0, out
        assert f"{efficiency:.0%}" in (tmp_path / engine / "scaling.md").read_text()
    code, out = report_cli(mixed, "--out", tmp_path / "none", "--engine", "unrecorded")
    assert (
        code == 2
        and out == "Error: --engine unrecorded: none of the inputs was measured or trained on that engine"
    )
    # Runs: a Horovod run against a tf-engine run is no worker-count speedup.
    a = make_run(tmp_path, "a", [0.5, 0.7], 10.0, 1)
    b = make_run(tmp_path, "b", [0.5, 0.7], 4.0, 4)
    for run, engine in ((a, "horovod"), (b, "tf")):
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "engine": engine}))
    code, out = report_cli(a, b, "--out", tmp_path / "runs")
    assert code == 2 and out.startswith("Error: these runs mix engines horovod and tf: their times compare")
    code, out = report_cli(a, b, "--out", tmp_path / "runs", "--engine", "tf")
    assert code == 0 and "note: --engine tf: 1 result(s) or run(s) of other engines left out" in out, out
    # Results and runs from before results named their engine ("unrecorded") go with either.
    old = make_run(tmp_path, "old", [0.5, 0.7], 5.0, 2)
    code, out = report_cli(a, old, "--out", tmp_path / "old")
    assert code == 0, out


@pytest.mark.parametrize(
    "line, words",
    [('{"epoch": 1, "epoch_time_s": 1e308}', "epoch_time_s is 1e+308, outside 0 to 3.2e+07"),
     ('{"epoch": 1, "val_accuracy": 1.5}', "val_accuracy is 1.5, outside 0 to 1"),
     ('{"epoch": 1, "accuracy": -0.1}', "accuracy is -0.1, outside 0 to 1"),
     ('{"epoch": 1000000000000000000000000000000}', "epoch 1000000000000000000000000000000 is above 1,000,000")],
)  # fmt: skip
def test_impossible_metrics_of_a_run_are_one_line(tmp_path, line, words):
    # Issue 32: an epoch time of 1e308 was printed as "inf min", accuracies above 1 were compared.
    run = make_run(tmp_path, "run", [0.5], 10.0, 2)
    (run / "metrics.jsonl").write_text(line + "\n")
    code, text = report_cli(run, "--out", tmp_path / "out")
    assert (code, text) == (2, f"Error: {run / 'metrics.jsonl'} line 1: {words}; the file is damaged")


def test_impossible_batch_sizes_and_workers_in_results_are_one_line(tmp_path):
    path = write(tmp_path / "r.jsonl", [result(10**30, 1, 100.0)])
    code, text = report_cli(path, "--out", tmp_path / "out")
    assert code == 2
    assert text.startswith(f"Error: {path} line 1: batch_size must be at most 10,000,000, got 1")


def on_nodes(per_step: float, counts, model="NVIDIA GH200 480GB", **kw) -> list[dict]:
    """Benchmark results of 4 GPUs per node at ``counts`` nodes, each count ``per_step`` as efficient per GPU
    as the one before it (a user's own jobs: throughput only, no --images)."""
    gh200 = {"gpu_count": 4, "gpu_model": model, "cpu_count": 288}
    return [
        {**result(64, 4 * n, 1000.0 * n * per_step**k, env=gh200, **kw), "nodes": n}
        for k, n in enumerate(counts)
    ]


def test_app_report_judges_cscs_test_on_results_over_three_node_counts(tmp_path):
    """Issue 36: `app report` on benchmark results of one GPU model over 3 or more node counts prints the scaling
    study's CSC section. 80% per doubling over 1, 2, 4, 8 nodes is 51% against 1 node: it fails; 90% per step
    over 1, 3, 9 nodes (no doubling at all) is 81% at 9: it passes."""
    code, text = report_cli(write(tmp_path / "d.jsonl", on_nodes(0.8, (1, 2, 4, 8))), "--out", tmp_path / "d")
    assert code == 0, text
    assert (
        "CSC gpularge test, batch 64/GPU: FAIL: parallel efficiency below 75% at 4, 8 nodes (E_N against 1 node, "
        "from throughput: 2 nodes 80% ±2%, 4 nodes 64% ±2%, 8 nodes 51% ±1%)" in " ".join(text.split())
    )
    md = (tmp_path / "d" / "csc.md").read_text()
    # 2% intervals on every count: each doubling's speedup 1.6 x hypot(2%, 2%), secondary to E_N
    assert "| 64 | 8 | 32 | 4,096.0 | 81.9 | 1 | - | - | 51% | 1% | throughput | 1.60x | 0.05 |" in md
    assert "- batch 64/GPU: judged from throughput (images/s per GPU against the fewest nodes)" in md
    # Issue 34: benchmark results do not know how large their data is: no epoch column, and why.
    assert "epoch of" not in md and "ImageNet" not in md
    assert (
        "- no epoch column: `app benchmark` results do not record how many training examples their data" in md
    )
    # Every count's interval is 2% of its images/s: E_N's is E_N x hypot(2%, 2%), 2.5% at 3 nodes, 2.3% at 9.
    code, text = report_cli(write(tmp_path / "t.jsonl", on_nodes(0.9, (1, 3, 9))), "--out", tmp_path / "t")
    assert code == 0, text
    assert (
        "CSC gpularge test, batch 64/GPU: PASS: 3 node counts, parallel efficiency 75% or more at each (E_N "
        "against 1 node, from throughput: 3 nodes 90% ±3%, 9 nodes 81% ±2%)" in " ".join(text.split())
    )
    csv_rows = (tmp_path / "t" / "csc.csv").read_text().splitlines()
    assert csv_rows[0].startswith("batch_per_gpu,nodes,gpus,images_per_s,images_per_s_ci95,jobs,")
    assert [float(r.split(",")[8]) for r in csv_rows[1:]] == [1.0, 0.9, 0.81]


@pytest.mark.parametrize(
    "rows, line",
    [
        (on_nodes(0.9, (1, 2)), None),  # 2 node counts: not a scalability test
        ([{**r, "env": {"gpu_count": 0, "cpu_count": 128}} for r in on_nodes(0.9, (1, 2, 4))], None),  # CPUs
        ([{k: v for k, v in r.items() if k != "env"} for r in on_nodes(0.9, (1, 2, 4))], None),  # unrecorded
        (
            [*on_nodes(0.9, (1, 2)), *on_nodes(0.9, (4,), model="NVIDIA A100")],
            "no CSC gpularge scalability test section: the results mix GPU models NVIDIA A100 and NVIDIA GH200 "
            "480GB; report one model's results",
        ),
    ],
)
def test_app_report_leaves_the_csc_section_out_where_it_does_not_apply(tmp_path, rows, line):
    code, text = report_cli(write(tmp_path / "r.jsonl", rows), "--out", tmp_path / "out")
    assert code == 0, text
    assert not (tmp_path / "out" / "csc.md").exists() and "CSC gpularge test" not in text
    md = (tmp_path / "out" / "scaling.md").read_text()
    assert (f"- {line}\n" in md) if line else "CSC" not in md


def test_efficiency_error_bars_hold_the_baselines_interval_and_repeats_give_a_between_job_one(
    tmp_path, monkeypatch
):
    """Issue 36: the efficiency plot's bars carried each point's own interval only; an efficiency divides by the
    fewest workers' throughput, so its interval is in the bar too. A cell measured in several jobs gets the
    interval between them (Student's t), not the mean of each job's windows."""
    import math
    import statistics

    import matplotlib.figure

    rows = [result(64, 1, 100.0), result(64, 1, 110.0), result(64, 1, 120.0), result(64, 4, 380.0)]
    table = report.scaling(rows)
    one, four = table[64]
    assert one.ci95 == pytest.approx(4.303 * statistics.stdev([100.0, 110.0, 120.0]) / math.sqrt(3))
    assert four.ci95 == pytest.approx(380.0 * 0.02)  # one job: its windows' interval
    expected = four.efficiency * math.hypot(four.ci95 / 380.0, one.ci95 / 110.0)
    assert report.efficiency_ci95(four, one) == pytest.approx(expected)
    assert report.efficiency_ci95(one, one) == 0.0
    bars = {}
    real_savefig = matplotlib.figure.Figure.savefig

    def savefig(fig, path, *args, **kwargs):
        (container,) = [c for c in fig.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
        bars[Path(path).name] = [abs(s[1][1] - s[0][1]) / 2 for s in container.lines[2][0].get_segments()]
        return real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    report.plot_scaling(table, tmp_path)
    assert bars["efficiency.png"] == pytest.approx([0.0, 100 * expected])


@pytest.mark.parametrize("width", [100, 200])
def test_terminal_tables_never_crop_a_header_or_a_value(width):
    from app.reports import csc_section
    from app.reports.tables import print_table

    columns = [c.title for c in csc_section.columns(None)]
    row = ["256", "2", "8", "12,345.6", "123.4", "3", "1234567", "600.0", "93%", "2%", "1 node", "1.87x"]
    row += ["0.05", "81", "40,000"]
    console = Console(file=io.StringIO(), width=width)
    print_table(console, "CSC", columns, [row])
    out = console.file.getvalue()
    assert "…" not in out
    shown = sorted(ch for ch in out if ch.isalnum() or ch in "%±,./()_'-")
    assert shown == sorted(ch for text in ["CSC", *columns, *row] for ch in text if not ch.isspace()), out
    if width == 200:  # wide enough: headers wrap between words, values stay whole
        words = {w for text in [*columns, *row] for w in text.split()}
        assert all(re.search(rf"(?<!\S){re.escape(w)}(?!\S)", out) for w in words), out
