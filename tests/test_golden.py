"""`pe-export golden`'s options that only a bundle shows (pe_export/golden.py): --seed draws other inputs and the same
seed the same ones; --labels puts task labels in the bundle that parity then scores the file and the reference on;
--signature bundles another signature of the SavedModel, and an export of that signature passes parity on it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pe_export.errors import ExitCode
from pe_export.parity.bundle import load_bundle
from tests.helpers import assert_one_line_error, reference_outputs, run_cli

TOKENS, SAMPLES = 12, 8


def bundle_inputs(bundle: Path) -> list[dict[str, np.ndarray]]:
    return [batch.inputs for batch in load_bundle(bundle).batches()]


def test_the_seed_draws_the_inputs(capfd, saved_model, tmp_path: Path) -> None:
    model = saved_model("encoder_multi_io")
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        made = run_cli(capfd, "golden", model, "-o", tmp_path / name, "--samples", "4", "--seed", seed)
        assert made.exit_code == 0, made.stderr
    a, b, c = (bundle_inputs(tmp_path / name) for name in "abc")
    for first, again, other in zip(a, b, c, strict=True):
        assert sorted(first) == sorted(other) == ["attention_mask", "segment_ids", "token_ids"]
        assert all(np.array_equal(first[k], again[k]) for k in first)  # the same seed, the same inputs
        assert not np.array_equal(first["token_ids"], other["token_ids"])  # another seed, other ids
    exported = tmp_path / "m.tflite"
    assert run_cli(capfd, "tflite", model, "-o", exported, "--no-verify").exit_code == 0
    for name in "ac":
        checked = run_cli(capfd, "parity", exported, tmp_path / name, "--runtime", "litert")
        assert checked.exit_code == 0 and "PASS" in checked.stdout, checked.stdout[-1500:]


def test_labels_are_scored_on_the_file_and_the_reference(capfd, saved_model, tmp_path: Path) -> None:
    """Labels made from the reference's own argmax (computed here by TensorFlow), every fourth position ignored
    (-1): the reference scores exactly 1, the float32 file all but ties."""
    model = saved_model("encoder_fixed")
    rng = np.random.default_rng(7)
    from tests.fixtures.models import MODEL_CASES

    length = MODEL_CASES["encoder_fixed"].seq_len or TOKENS
    ids = rng.integers(1, 64, size=(SAMPLES, length), dtype=np.int32)  # the tiny encoder's vocabulary: 64
    np.savez(tmp_path / "inputs.npz", token_ids=ids)
    labels = np.argmax(reference_outputs(model, {"token_ids": ids})["sequence_output"], axis=-1).astype(np.int64)
    labels[:, ::4] = -1
    np.savez(tmp_path / "labels.npz", sequence_output=labels)
    made = run_cli(
        capfd, "golden", model, "-o", tmp_path / "g", "--inputs", tmp_path / "inputs.npz",
        "--labels", tmp_path / "labels.npz", "--batch", "4",
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    exported = tmp_path / "m.onnx"
    assert run_cli(capfd, "onnx", model, "-o", exported, "--no-verify").exit_code == 0
    checked = run_cli(capfd, "parity", exported, tmp_path / "g", "--runtime", "onnxruntime")
    assert checked.exit_code == 0, checked.stdout[-1500:]
    line = next(line for line in checked.stdout.splitlines() if "task accuracy" in line)
    found = re.search(r"task accuracy: ([\d.]+) \(float32 reference ([\d.]+)\)", line)
    assert found, line
    accuracy, reference = float(found[1]), float(found[2])
    assert reference == 1.0 and accuracy >= 0.99, line


def test_labels_are_refused_without_inputs_or_for_another_output(capfd, saved_model, tmp_path: Path) -> None:
    model = saved_model("encoder_fixed")
    np.savez(tmp_path / "labels.npz", logits=np.zeros((2, 4), np.int64))
    alone = run_cli(capfd, "golden", model, "-o", tmp_path / "g", "--labels", tmp_path / "labels.npz")
    assert_one_line_error(alone, ExitCode.BAD_INPUT, "--labels needs --inputs")
    np.savez(tmp_path / "inputs.npz", token_ids=np.ones((2, 8), np.int32))
    other = run_cli(
        capfd, "golden", model, "-o", tmp_path / "g", "--inputs", tmp_path / "inputs.npz",
        "--labels", tmp_path / "labels.npz",
    )  # fmt: skip
    assert_one_line_error(other, ExitCode.BAD_INPUT, "'logits' is not an output", "sequence_output")
    assert not (tmp_path / "g").exists()


@pytest.fixture(scope="module")
def two_signatures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SavedModel with two signatures that compute different things from the same table."""
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()

    class Two(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            values = np.random.default_rng(3).normal(size=(50, 16)).astype(np.float32)
            self.table = tf.Variable(values)

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")])
        def embed(self, token_ids: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"sequence_output": tf.gather(self.table, token_ids)}

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")])
        def pooled(self, token_ids: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"pooled_output": tf.reduce_mean(tf.tanh(tf.gather(self.table, token_ids)), axis=1)}

    module = Two()
    path = tmp_path_factory.mktemp("two") / "two"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.embed, "pooled": module.pooled})
    return path


def test_another_signature_is_bundled_and_its_export_passes_on_it(capfd, two_signatures: Path, tmp_path: Path) -> None:
    made = run_cli(capfd, "golden", two_signatures, "-o", tmp_path / "g", "--signature", "pooled", "--samples", "4")
    assert made.exit_code == 0, made.stderr
    assert [spec.name for spec in load_bundle(tmp_path / "g").outputs] == ["pooled_output"]
    exported = tmp_path / "pooled.tflite"
    assert run_cli(capfd, "tflite", two_signatures, "-o", exported, "--signature", "pooled").exit_code == 0
    checked = run_cli(capfd, "parity", exported, tmp_path / "g", "--runtime", "litert")
    assert checked.exit_code == 0 and "PASS" in checked.stdout, checked.stdout[-1500:]
    # the file of the default signature computes something else: the bundle says so
    default = tmp_path / "default.tflite"
    assert run_cli(capfd, "tflite", two_signatures, "-o", default).exit_code == 0
    refused = run_cli(capfd, "parity", default, tmp_path / "g", "--runtime", "litert")
    assert refused.exit_code != 0
    unknown = run_cli(capfd, "golden", two_signatures, "-o", tmp_path / "u", "--signature", "nope")
    assert_one_line_error(unknown, ExitCode.BAD_INPUT, "nope", "pooled", "serving_default")


def test_inputs_the_savedmodel_rejects_are_one_line_and_write_nothing(capfd, saved_model, tmp_path: Path) -> None:
    """Rows longer than the position table: TensorFlow's own refusal, in one line with the shapes and the node."""
    from pe_export.encoders.tiny import MAX_LEN

    np.savez(tmp_path / "long.npz", token_ids=np.ones((2, MAX_LEN + 5), np.int32))
    refused = run_cli(
        capfd, "golden", saved_model("encoder_dynamic"), "-o", tmp_path / "g", "--inputs", tmp_path / "long.npz"
    )
    assert_one_line_error(
        refused,
        ExitCode.BAD_INPUT,
        "the SavedModel rejects the inputs",
        f"token_ids int32[2, {MAX_LEN + 5}]",
        "at node",
    )
    assert not (tmp_path / "g").exists()
