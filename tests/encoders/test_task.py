"""The trained task encoder: solves its order-sensitive task; without positions it cannot."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pe_export.encoders import task


def test_shipped_weights_solve_the_task() -> None:
    from pe_export.native import import_tensorflow

    import_tensorflow()
    model = task.load_trained_model()
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    score = task.accuracy(model.predict(tokens, verbose=0)[task.LABEL_OUTPUT], labels)
    print(f"trained shift-task encoder: accuracy {score:.4f} on {task.TEST_SAMPLES} held-out sequences")
    assert score >= 0.95
    assert task.WEIGHTS.stat().st_size <= 2 * 2**20


@pytest.mark.slow  # tens of seconds: out of the quick run
def test_without_positions_it_is_near_chance() -> None:
    from pe_export.native import import_tensorflow

    import_tensorflow()
    ablated = task.train(positions=False)
    tokens, labels = task.task_data(task.TEST_SAMPLES, task.TEST_SEED)
    score = task.accuracy(ablated.predict(tokens, verbose=0)[task.LABEL_OUTPUT], labels)
    chance = 1 / (task.VOCAB - 1)
    print(f"same encoder, position encoding removed: accuracy {score:.4f} (chance {chance:.4f})")
    assert score < 2 * chance


@pytest.mark.slow  # tens of seconds: out of the quick run
def test_training_is_deterministic() -> None:
    """Retraining in two fresh processes gives the same weights bit for bit, and the task is learnt.

    Bit-identity with the shipped weights holds only on a CPU whose kernels round like the one that
    trained them: on an AVX-512 AMD EPYC the retrained weights differ from the shipped ones by up to
    0.028 (training amplifies the last-bit differences), with the same task accuracy. So the shipped
    digest is reported, not required; determinism is checked where the test runs.
    """
    with np.load(task.WEIGHTS, allow_pickle=False) as archive:
        shipped = task.weights_digest([archive[key] for key in sorted(archive.files)])
    digests = []
    # Both at once: each fresh process is mostly single-threaded Python, so two share the cores (half the wait).
    trainings = [
        subprocess.Popen(
            [sys.executable, "-m", "pe_export.encoders.task", "--check"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for training in trainings:
        stdout, stderr = training.communicate(timeout=600)
        assert training.returncode == 0, stderr[-2000:]
        assert "task accuracy 1.0000" in stdout, stdout
        digests.append(stdout.rsplit("weights sha256 ", 1)[-1].strip())
    assert digests[0] == digests[1], digests
    verdict = "same" if digests[0] == shipped else "trained on another CPU"
    print(f"retrained weights sha256 {digests[0]}; shipped {shipped} ({verdict})")
