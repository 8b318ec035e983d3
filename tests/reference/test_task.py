"""The trained reference encoder: solves its order-sensitive task; without positions it cannot."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from pe_export.reference import task


def test_shipped_weights_solve_the_task() -> None:
    from pe_export.native import import_tensorflow

    import_tensorflow()
    model = task.load_trained_model()
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    score = task.accuracy(model.predict(tokens, verbose=0)[task.LABEL_OUTPUT], labels)
    print(f"trained shift-task encoder: accuracy {score:.4f} on {task.TEST_SAMPLES} held-out sequences")
    assert score >= 0.95
    assert task.WEIGHTS.stat().st_size <= 2 * 2**20


def test_without_positions_it_is_near_chance() -> None:
    from pe_export.native import import_tensorflow

    import_tensorflow()
    ablated = task.train(positions=False)
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    score = task.accuracy(ablated.predict(tokens, verbose=0)[task.LABEL_OUTPUT], labels)
    chance = 1 / (task.VOCAB - 1)
    print(f"same encoder, position encoding removed: accuracy {score:.4f} (chance {chance:.4f})")
    assert score < 2 * chance


def test_training_is_deterministic() -> None:
    """Retraining in a fresh process reproduces the shipped weights bit for bit."""
    with np.load(task.WEIGHTS, allow_pickle=False) as archive:
        shipped = task.weights_digest([archive[key] for key in sorted(archive.files)])
    retrained = subprocess.run(
        [sys.executable, "-m", "pe_export.reference.task", "--check"], capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert retrained.returncode == 0, retrained.stderr[-2000:]
    assert f"weights sha256 {shipped}" in retrained.stdout, retrained.stdout
