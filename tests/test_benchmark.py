"""`app benchmark`: warmup exclusion, windows and confidence intervals, a tiny real run on 2 workers."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from app.cli import cli
from app.core import results
from app.core.compat import import_tensorflow
from app.training import benchmark
from conftest import ROOT, run_app

TINY = ["-c", "configs/synthetic.yaml", "--set", "model.name=resnet20", "--set", "data.image_size=32"]


def test_warmup_excludes_slow_first_steps():
    times = [
        3.0,
        1.5,
        0.8,
        0.11,
        0.1,
        0.1,
        0.12,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
    ]
    assert benchmark.warmup_steps(times) == 3
    assert benchmark.warmup_steps([0.1] * 50) == 5  # at least 10%, even when steady from the start
    assert benchmark.warmup_steps([0.1] * 5) == 1


def test_windows_and_ci95():
    times = [0.5] * 4 + [1.0] * 4  # two windows: 4 steps of 0.5 s, then 4 of 1.0 s, 10 images per step
    assert benchmark.windows(times, 10, 2) == pytest.approx([20.0, 10.0])
    mean, ci = benchmark.mean_ci95([20.0, 10.0, 15.0])
    assert mean == pytest.approx(15.0)
    assert ci == pytest.approx(4.303 * statistics.stdev([20.0, 10.0, 15.0]) / 3**0.5)
    assert benchmark.mean_ci95([5.0])[1] != benchmark.mean_ci95([5.0])[1]  # NaN: one window has no spread


def test_summary_of_steps():
    times = [2.0, 1.0] + [0.2] * 18
    waits = [0.0, 0.0] + [0.05] * 18
    s = benchmark.summarize_steps(times, waits, images_per_step=40, n_windows=3)
    assert s["warmup_steps"] == 2 and s["measured_steps"] == 18 and s["windows"] == 3
    assert s["images_per_s"]["mean"] == pytest.approx(200.0)
    assert s["input_wait_fraction"] == pytest.approx(0.25)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.compat
def test_tiny_benchmark_on_two_workers_writes_one_line_per_batch_size(tmp_path):
    results = tmp_path / "results.jsonl"
    proc = run_app(
        [
            "benchmark",
            *TINY,
            "--batch-sizes",
            "4,8",
            "--steps",
            "8",
            "--windows",
            "2",
            "--results",
            str(results),
            "--np",
            "2",
        ]
    )
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["batch_size"] for r in lines] == [4, 8]  # rank 0 alone writes, once per batch size
    for r in lines:
        assert r["workers"] == 2 and r["global_batch"] == 2 * r["batch_size"] and r["model"] == "resnet20"
        assert r["measured_steps"] + r["warmup_steps"] == 8 and r["images_per_s"]["mean"] > 0
        assert r["images_per_s"]["per_worker"] == pytest.approx(r["images_per_s"]["mean"] / 2)
        # the TensorFlow of this venv (2.18.1 in .venv, 2.16.1 in make test-compat's)
        assert (
            r["env"]["launcher"] == "horovodrun" and r["env"]["tensorflow"] == import_tensorflow().__version__
        )
        assert {"cpu_model", "cpu_count", "gpu_count", "horovod", "git_revision", "date", "host"} <= set(
            r["env"]
        )
        assert r["peak_memory_mb"] > 0
    assert proc.stdout.count("train batch 4/worker x 2") == 1
    report = CliRunner().invoke(cli, ["report", str(results), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0 and "only 2 worker(s) measured" in report.output


@pytest.mark.slow
def test_pipeline_only_on_fashion_mnist(tmp_path, tfds_dir):
    results = tmp_path / "pipeline.jsonl"
    run_app(["benchmark", "-c", "configs/fashion_mnist.yaml", "--data-dir", str(tfds_dir), "--pipeline-only",
             "--steps", "10", "--windows", "2", "--results", str(results), "--threads", "1,2"])  # fmt: skip
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [line["threads_per_worker"] for line in lines] == [1, 2]  # one line per thread count
    for line in lines:
        ips = line["images_per_s"]
        assert line["kind"] == "pipeline" and line["model"] is None and ips["mean"] > 0
        assert line["input_threads"]["per_worker"] == line["threads_per_worker"]
        assert line["input_threads"]["private_pool"] is True
        assert ips["per_thread"] == pytest.approx(ips["mean"] / line["threads_per_worker"])


@pytest.mark.parametrize(
    "value, good",
    [("1500", 1500.0), (" 2e3 ", 2000.0), ("931.5", 931.5), ("", None), ("0", None), ("-5", None), ("inf", None),
     ("nan", None), ("abc", None), ("1_000", None), ("\u0661\u0665\u0660\u0660", None), ("1e400", None),
     ("9" * 400, None)],
)  # fmt: skip
def test_the_profiles_gpu_rate_is_a_positive_number_or_named_and_ignored(value, good):
    from app.training.benchmark import expected_gpu_rate

    rate, problem = expected_gpu_rate({"SCALEOUT_GPU_IMAGES_PER_S": value})
    assert rate == good
    assert (problem is None) == (good is not None or value == "")
    if problem:
        assert problem.startswith(
            f"SCALEOUT_GPU_IMAGES_PER_S={value.strip()[:40]!r} is not a positive number"
        )


def test_a_gpu_that_would_wait_for_its_pipeline_is_warned_about():
    from app.training.train import starved

    line = starved(900.0, 2500.0, 7, on_gpu=True)
    assert line.startswith("Warning: the input pipeline delivered 900 images/s on 7 thread(s) per GPU, below")
    assert starved(2600.0, 2500.0, 7, on_gpu=True) is None  # fast enough
    assert starved(900.0, 2500.0, 7, on_gpu=False) is None  # CPU training: the CPU is the bottleneck anyway
    assert starved(None, 2500.0, 7, on_gpu=True) is None and starved(900.0, None, 7, on_gpu=True) is None
    # [tf] one process feeding 4 GPUs: 6,000 images/s on 28 threads is 1,500 per GPU on 7 threads each
    assert starved(6000.0, 2500.0, 28, on_gpu=True, replicas=4) == line.replace("900", "1,500")
    assert starved(12000.0, 2500.0, 28, on_gpu=True, replicas=4) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--batch-sizes", "32,x"],
            "Invalid value for '--batch-sizes': '32,x': expected comma-separated integers",
        ),
        (
            ["--batch-sizes", "0"],
            "Invalid value for '--batch-sizes': '0': batch sizes must be positive integers",
        ),
        (["--pipeline-only"], "Error: --pipeline-only measures an input pipeline; synthetic data has none"),
        (["--steps", "2"], "Invalid value for '--steps': 2 is not in the range x>=5."),
        (["--threads", "1,x"], "Invalid value for '--threads': '1,x': expected comma-separated integers"),
        (["--threads", "-1"], "Invalid value for '--threads': '-1': thread counts must be 0 (automatic) or"),
        (
            ["--threads", "0,2"],
            "Invalid value for '--threads': '0,2': thread counts must be 0 (automatic) or",
        ),
        (["--threads", ""], "Invalid value for '--threads': '': thread counts must be 0 (automatic) or"),
        (["--threads", "1,2"], "Error: --threads 1,2: a list of thread counts needs --pipeline-only"),
        (
            ["--images", "40", "--steps", "10"],
            "Error: --images 40 sets the steps per batch size; drop --steps 10",
        ),
        (["--images", "0"], "Invalid value for '--images': 0 is not in the range x>=1."),
        (["--images", "100000000000"], "Error: --images 100000000000: at most 10,000,000,000"),
        (["--threads", "2,1,1"], "Invalid value for '--threads': '2,1,1': a thread count is given twice"),
        (
            ["--threads", "5000"],
            "Invalid value for '--threads': '5000': at most 16 counts of at most 4096 threads",
        ),
    ],
)
def test_bad_benchmark_input(args, message):
    result = CliRunner().invoke(cli, ["benchmark", "-c", str(ROOT / "configs" / "synthetic.yaml"), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_results_never_hold_nan():
    s = benchmark.summarize_steps([0.2] * 10, [0.0] * 10, images_per_step=8, n_windows=1)
    assert s["images_per_s"]["ci95"] is None  # one window has no spread: null, not NaN
    line = json.dumps(
        results.finite({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}}),
        allow_nan=False,
    )
    assert json.loads(line) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


@pytest.mark.parametrize(
    "args, env, line",
    [
        (["--windows", "1"], None, "Error: Invalid value for '--windows': 1 is not in the range x>=2."),
        ([], {"APP_BENCHMARK_WINDOWS": "1"},
         "Error: environment variable APP_BENCHMARK_WINDOWS (sets --windows): 1 is not in the range x>=2; fix or unset it"),
    ],
)  # fmt: skip
def test_one_window_is_refused(args, env, line):
    result = CliRunner().invoke(
        cli, ["benchmark", "-c", str(ROOT / "configs" / "synthetic.yaml"), *args], env=env
    )
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == line


def test_a_report_never_averages_pipeline_results_of_different_thread_counts():
    from app.core.errors import UsageError
    from app.reports.benchmarks import check_comparable

    line = {"kind": "pipeline", "model": None, "image_size": 224, "precision": "float32", "xla": False}
    check_comparable([{**line, "threads_per_worker": 2}, {**line, "threads_per_worker": 2}])
    with pytest.raises(UsageError, match="results mix threads_per_worker 1 and 2; report one at a time"):
        check_comparable([{**line, "threads_per_worker": 1}, {**line, "threads_per_worker": 2}])


def test_images_set_the_steps_of_each_batch_size_and_the_wall_time_is_recorded(tmp_path):
    results = tmp_path / "results.jsonl"
    args = ["benchmark", *TINY, "--images", "40", "--windows", "2", "--results", str(results)]
    run_app([*args, "--batch-sizes", "2,5"])
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [(r["batch_size"], r["steps"], r["images_target"]) for r in lines] == [(2, 20, 40), (5, 8, 40)]
    for r in lines:  # every step's time, warm-up included: at least what the measured steps took
        assert r["wall_s"] >= r["step_time_s"] * r["measured_steps"] * 0.99 > 0
    proc = run_app([*args, "--batch-sizes", "10"], expect=2)
    assert proc.stderr.strip().splitlines()[-1] == (
        "Error: --images 40: only 4 step(s) at batch 10 on 1 worker(s); give at least 50 (5 steps, and one per window)"
    )


def test_only_jpeg_data_is_measured_before_training():
    # Synthetic batches are uint8 like ImageNet's (the same Pixels model) but need no decoding: no measurement.
    from app.core import config
    from app.data.sources import open_source
    from app.engines.world import RankThreads, World
    from app.training.output import Reporter
    from app.training.train import input_rate

    cfg = config.build([str(ROOT / "configs" / "synthetic.yaml")], ["data.image_size=32"])
    source = open_source(cfg.data)
    assert source.spec.pixels is not None
    assert input_rate(cfg, source, World(), RankThreads(1, "--threads"), Reporter(0)) is None
