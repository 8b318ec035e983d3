"""Padding masks and token ids found from how the graph uses each input (pe_export/input_roles.py), the name only a
hint: models whose inputs are named otherwise (Keras' input_1/input_2, x/y, ids/m, a "mask" that is token ids) get
ones on real tokens in their mask, in --text, generated verification inputs and golden bundles alike; an input
the graph cannot place is refused by --text in one line, never fed zeros."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.errors import ExitCode
from pe_export.savedmodel import FrozenSignature, input_bounds, input_masks, load_savedmodel, signature_input_specs
from tests.helpers import assert_one_line_error, run_cli
from tests.test_text_inputs import write_tokenizer

VOCAB, WIDTH = 64, 8


def _save(path: Path, ids_name: str, mask_name: str, *, extra: str | None = None) -> Path:
    """An attention block over embedded ids whose scores the mask input makes -1e9 at padding; ``extra``: an
    integer input added to the output, neither a table index nor a mask."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    table = tf.Variable(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32))
    spec = tf.TensorSpec([None, None], tf.int32)
    names = [ids_name, mask_name] + ([extra] if extra else [])

    def serve(**inputs: Any) -> dict[str, Any]:
        x = tf.gather(table, inputs[ids_name])
        scores = tf.matmul(x, x, transpose_b=True)
        padding = (1.0 - tf.cast(inputs[mask_name], tf.float32))[:, None, :] * -1e9
        out = tf.matmul(tf.nn.softmax(scores + padding), x)
        if extra:
            out += tf.cast(inputs[extra], tf.float32)[:, :, None]
        return {"out": out}

    signature = tf.function(
        lambda *args: serve(**dict(zip(names, args, strict=True))),
        input_signature=[tf.TensorSpec(spec.shape, spec.dtype, name=name) for name in names],
    )
    module = tf.Module()
    module.table = table
    tf.saved_model.save(module, str(path), signatures={"serving_default": signature})
    return path


def _masks(path: Path) -> frozenset[str]:
    loaded = load_savedmodel(path)
    signature = loaded.signature(None)
    frozen = FrozenSignature(signature, signature_input_specs(signature))
    return input_masks(frozen, input_bounds(frozen))


@pytest.mark.parametrize(
    ("ids_name", "mask_name"),
    [("input_1", "input_2"), ("y", "x"), ("ids", "m"), ("mask", "tokens")],
    ids=["keras-names", "x-y", "ids-m", "mask-named-ids"],
)
def test_the_mask_is_the_input_that_reaches_the_softmax(tmp_path: Path, ids_name: str, mask_name: str) -> None:
    assert _masks(_save(tmp_path / "m", ids_name, mask_name)) == {mask_name}


def test_text_gives_the_graphs_mask_the_valid_positions(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Keras' names: input_2 was fed zeros by --text (the reference then masked every token and parity passed on
    both sides' wrong input). Now its valid positions, in the export's verification and in the golden bundle."""
    from pe_export.text_inputs import TextInputs, text_feed

    saved = _save(tmp_path / "m", "input_1", "input_2")
    sentences = tmp_path / "s.txt"
    sentences.write_text("w3 w4 w5\nw6 w7 w8 w9 w10 w11\n", encoding="utf-8")
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", VOCAB)
    loaded = load_savedmodel(saved)
    specs = signature_input_specs(loaded.signature(None))
    frozen = FrozenSignature(loaded.signature(None), specs)
    bounds = input_bounds(frozen)
    feed, valid = text_feed(
        specs, bounds, TextInputs(sentences, tokenizer), saved, None, masks=input_masks(frozen, bounds)
    )
    assert valid.sum(axis=1).tolist() == [3, 6]
    assert np.array_equal(feed["input_2"], valid.astype(np.int32)) and feed["input_1"][0, :3].tolist() == [3, 4, 5]
    exported = run_cli(capfd, "onnx", saved, "-o", tmp_path / "m.onnx", "--text", sentences, "--tokenizer", tokenizer)
    assert exported.exit_code == 0, exported.stderr
    golden = run_cli(capfd, "golden", saved, "-o", tmp_path / "g", "--text", sentences, "--tokenizer", tokenizer)
    assert golden.exit_code == 0, golden.stderr
    batches = sorted((tmp_path / "g").glob("batches/*.npz"))
    assert batches
    for path in batches:
        with np.load(path) as batch:
            assert np.array_equal(batch["input/input_2"].astype(bool), batch["valid"]), path
            assert batch["valid"].any()


def test_an_input_the_graph_cannot_place_is_refused_by_text(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    saved = _save(tmp_path / "m", "ids", "m", extra="offsets")
    assert _masks(saved) == {"m"}
    sentences = tmp_path / "s.txt"
    sentences.write_text("w3 w4 w5\n", encoding="utf-8")
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", VOCAB)
    result = run_cli(capfd, "tflite", saved, "-o", tmp_path / "m.tflite", "--text", sentences, "--tokenizer", tokenizer)
    assert_one_line_error(result, ExitCode.BAD_INPUT, "'offsets' indexes no table", "--mask-input offsets", "--inputs")
    assert not (tmp_path / "m.tflite").exists()
    # named by the user, it is taken as a mask: ones on the sentence's tokens
    named = run_cli(
        capfd, "golden", saved, "-o", tmp_path / "g", "--text", sentences, "--tokenizer", tokenizer,
        "--mask-input", "offsets",
    )  # fmt: skip
    assert named.exit_code == 0, named.stderr
    with np.load(next((tmp_path / "g").glob("batches/*.npz"))) as batch:
        assert np.array_equal(batch["input/offsets"].astype(bool), batch["valid"]) and batch["valid"].all()
    unknown = run_cli(
        capfd, "golden", saved, "-o", tmp_path / "g2", "--text", sentences, "--tokenizer", tokenizer,
        "--mask-input", "nope",
    )  # fmt: skip
    assert_one_line_error(unknown, ExitCode.BAD_INPUT, "--mask-input nope", "ids, m, offsets")
    alone = run_cli(capfd, "golden", saved, "-o", tmp_path / "g3", "--mask-input", "m")
    assert_one_line_error(alone, ExitCode.BAD_INPUT, "--mask-input m", "--text FILE")
