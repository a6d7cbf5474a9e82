"""Issue 34's speed target: a built-in ResNet reached through the user-model entry point trains as fast as by
name (ratio >= 0.98), measured in turn in one run (`bench/run.py --only entry`)."""

from __future__ import annotations

ENTRY_TURNS = 5


def entry_group(out, synthetic, steps, measured, rows, app_benchmark, ips, ratio_interval) -> None:
    # ResNet-20 on 28 px, batch 32, one worker: by name, and as a user's function returning the same model.
    common = [*synthetic, "--set", "data.image_size=28", "--batch-sizes", "32", "--steps", str(steps * 8)]
    by_name = ["--set", "model.name=resnet20"]
    by_entry = ["--set", "model.name=bench/peers/entry_resnet.py:build"]
    pairs = []
    for _ in range(ENTRY_TURNS):
        entry = app_benchmark(out, [*common, *by_entry])[0]
        name = app_benchmark(out, [*common, *by_name])[0]
        pairs.append((ips(entry), ips(name)))
    measured |= {
        "resnet20_by_entry_point": [a for a, _ in pairs],
        "resnet20_by_name": [b for _, b in pairs],
    }
    rows.append(
        (
            f"ResNet-20 through the model entry point / by name, 28 px, batch 32 ({ENTRY_TURNS} turns)",
            ratio_interval(pairs),
            0.98,
        )
    )
