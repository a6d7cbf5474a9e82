"""The experiment's schema: the typed dataclasses of a config (data, model, train, run) with their defaults.

Also the values and limits the checks (app.core.validation) hold them to. Loading a config from files and
``--set`` is app.core.config's.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Optional

from app.core import modelref

MODELS = modelref.BUILTIN
SOURCES = ("tfds", "imagenet", "synthetic", "python")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
SCHEDULES = ("step", "cosine", "constant")
ENGINES = ("auto", "horovod", "tf")  # app.engines.engine: auto is Horovod where it imports, else tf
WARMUPS = ("gradual", "constant")  # Goyal et al.'s two warmups (see app.training.schedule)
# The experiment's name names its run directory (runs/<name>-<date>) and, through app submit, its Slurm job:
# letters, digits and . _ + - only, never a path, never an option. One definition, used by submit too.
NAME_MAX = 128  # characters; Slurm's own limit for a job name is 1024
SAFE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.+-]{{0,{NAME_MAX - 1}}}")
SAFE_HINT = f"use letters, digits and . _ + - only (first a letter, digit or _; at most {NAME_MAX})"


@dataclass
class DataConfig:
    source: str = "tfds"  # tfds | imagenet (TFRecords) | synthetic | python (your function)
    name: str = "fashion_mnist"  # TFDS dataset name (source tfds); file.py:function (source python)
    data_dir: Optional[str] = None  # noqa: UP045 (evaluated by get_type_hints: Python 3.9 has no X | None)
    # TFDS data dir or ImageNet TFRecord dir; None: TFDS_DATA_DIR or TFDS default
    train_split: str = "train"
    eval_split: str = "test"
    image_size: int = 0  # 0: the dataset's own size (28 for Fashion-MNIST, 224 for ImageNet), else resized
    num_classes: int = 0  # 0: from the dataset; required for synthetic data
    channels: int = 0  # 0: from the dataset (synthetic: 3)
    synthetic_examples: int = 1281167  # the epoch length of synthetic data (ImageNet-1k's train split)
    shuffle_buffer: int = 10000
    augment: bool = True
    cache: bool = False  # cache decoded examples in memory (small datasets only)
    # Keep the exact example order through parallel decoding: what makes --seed and resume reproducible.
    # false: elements leave the parallel map as they finish, with the same examples and augmentations per
    # epoch in a slightly different order; no measurable throughput difference here (docs/development.md,
    # make bench).
    deterministic: bool = True


@dataclass
class ModelConfig:
    # A built-in ResNet, applications.<Name>, path/to/file.py:function or package.module:function
    # (app.core.modelref; docs/your-model.md).
    name: str = "resnet20"
    # Zero-init each built-in ResNet block's last batch-norm gamma (Goyal et al.). None: on for the built-in
    # ResNets; set for another model, a note says it does not apply.
    zero_init_residual: Optional[bool] = None  # noqa: UP045
    weight_decay: float = 1e-4  # on conv/dense kernels only, never on batch-norm parameters or biases
    label_smoothing: float = 0.0
    precision: str = "auto"  # bf16: AVX512_BF16 CPUs, Ampere+/MI200+ GPUs; fp16: other GPUs; else float32
    jit_compile: bool = False  # XLA; for GPUs (on the CPU it is ~5x slower for ResNet-50)
    # The pretrained base of an applications.<Name> model: a local weights file (never downloaded).
    weights: str = ""


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 128  # per worker, per backward pass
    accumulation_steps: int = 1  # backward passes per optimizer step (Horovod backward_passes_per_step)
    base_lr: float = 0.1  # the learning rate for a global batch of reference_batch images
    reference_batch: int = 256
    scale_lr: bool = True  # linear scaling rule: lr = base_lr * global_batch / reference_batch
    warmup_epochs: float = 5.0  # warmup from base_lr to the schedule's scaled lr (0: none)
    # gradual: a linear ramp from base_lr to the schedule where the warmup ends (the scaled lr; under cosine a
    # little less); constant: base_lr for warmup_epochs, then the schedule at once (Goyal et al. compare both;
    # gradual is their recipe). app/training/schedule.py has the details.
    warmup: str = "gradual"
    schedule: str = "step"  # step | cosine | constant, over the whole run: a warmup replaces its start
    decay_epochs: list[int] = field(default_factory=lambda: [30, 60, 80])
    decay_factor: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    fp16_allreduce: bool = False  # Horovod compression of gradients on the wire
    # Who distributes: horovod (Horovod's Keras integration, the reference study's), tf (TensorFlow's own
    # strategies, for site modules without Horovod) or auto (Horovod where it imports, else tf).
    engine: str = "auto"
    # The tf engine across hosts runs TensorFlow's gRPC server on every interface with no authentication:
    # anyone who reaches a node can run code as you. Refused unless this says yes (docs/engines.md).
    tf_accept_unauthenticated_grpc: bool = False
    # Seconds the tf engine's workers across hosts wait for each other at the start before ending, naming the
    # ones that never came (a peer that never started would otherwise keep the allocation waiting for ever).
    tf_join_timeout_s: float = 600.0
    steps_per_epoch: int = 0  # 0: the whole training split; >0 caps an epoch (quick tests, benchmarks)
    eval_steps: int = 0  # 0: the whole evaluation split


@dataclass
class RunConfig:
    # The run directory is not a config key: it is `app train --run-dir DIR` (default runs/<name>-<date>,
    # under Slurm runs/<name>-<job id>), so one config file can serve many runs.
    seed: int = 0  # 0 .. 2**31-1 (NumPy, TensorFlow and the data pipeline's stateless seeds all accept it)
    keep_checkpoints: int = 3
    log_every: int = 50  # steps between plain progress lines when stdout is not a terminal
    tensorboard: bool = True
    evaluate: bool = True  # evaluate on the eval split after every epoch
    # Extra checkpoints inside epochs that take hours: "30m", "2h", "90s" (wall-clock) or "2000" (steps).
    # "" (default): at epoch ends, and whenever SIGUSR1/SIGTERM asks the run to stop.
    checkpoint_every: str = ""
    # Optimizer updates between the workers' agreement on a stop signal (one tiny allreduce each).
    stop_check_every: int = 10
    # TensorFlow's op determinism: a resumed run ends bitwise equal to an uninterrupted one (slower on GPUs).
    deterministic_ops: bool = False
    # A resume on another number of workers keeps the global batch through train.accumulation_steps; where
    # no whole number of steps can, it stops, unless this accepts the new global batch (and its LR).
    allow_new_global_batch: bool = False


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    name: str = "default"  # the experiment's name (from the last config file unless set)

    # Derived values: one definition each, used by training, the header and the tests.
    def global_batch(self, workers: int) -> int:
        return self.train.batch_size * workers * self.train.accumulation_steps

    def scaled_lr(self, workers: int) -> float:
        t = self.train
        return t.base_lr * self.global_batch(workers) / t.reference_batch if t.scale_lr else t.base_lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SEED_MAX = 2**31 - 1
# The smallest image each model takes: its total stride (ResNet-50: the stride-2 stem conv and max-pool and
# three stride-2 stages, 2**5 = 32; ResNet-18 with its 3x3 stem: three stride-2 stages, 8; the CIFAR ResNets:
# two, 4). Below it the last stages convolve 1x1 maps that are mostly zero padding.
MIN_IMAGE_SIZE = {"resnet50": 32, "resnet18": 8, "resnet20": 4, "resnet32": 4, "resnet56": 4}

FP16_ON_TF = (
    "Horovod's compression of gradients on the wire, which the tf engine lacks; set it to false, "
    "or use --engine horovod"
)
