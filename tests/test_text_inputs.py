"""--text: exports verified on real sentences tokenized with the model's tokenizer.json, with the
task-level line (worst mean-pooled row cosine); bad tokenizers and files are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_one_line_error, run_cli


def write_tokenizer(path: Path, size: int) -> Path:
    """A word-level tokenizer.json: [PAD]=0, [UNK]=1, words w2 … w{size-1}."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, size)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(path))
    return path


@pytest.fixture
def sentences(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    lines = [" ".join(f"w{i}" for i in rng.integers(2, 64, size=length)) for length in (5, 12, 9, 20)]
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


def test_export_is_verified_on_the_sentences(
    saved_model, sentences: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    model = saved_model("encoder_multi_io")  # token ids, attention mask and segment ids
    result = run_cli(capfd, "tflite", model, "-o", tmp_path / "m.tflite", "--text", sentences, "--tokenizer", tokenizer)
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().startswith("text ")]
    assert {row[1] for row in rows} == {"pooled_output", "sequence_output"}, result.stdout
    assert all(float(row[2]) <= 1e-4 for row in rows), rows
    assert "20 positions" in result.stdout  # padded to the longest sentence, not to the table
    task = next(line for line in result.stdout.splitlines() if "mean-pooled rows" in line)
    assert float(task.rsplit(" ", 1)[1]) > 0.99999, task


def test_text_feed_masks_padding_and_takes_ids_for_the_vocabulary_input(tmp_path: Path, sentences: Path) -> None:
    from pe_export.specs import TensorSpec
    from pe_export.text_inputs import TextInputs, text_feed

    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    specs = [
        TensorSpec("attention_mask", "int32", (None, None)),
        TensorSpec("segment_ids", "int32", (None, None)),
        TensorSpec("token_ids", "int32", (None, None)),
    ]
    feed, valid = text_feed(specs, {"token_ids": 64, "segment_ids": 2}, TextInputs(sentences, tokenizer), tmp_path, 16)
    assert valid.sum(axis=1).tolist() == [5, 12, 9, 16]  # the 20-word line truncated to 16
    assert feed["token_ids"].shape == (4, 16) and (feed["token_ids"][~valid] == 0).all()
    assert (feed["attention_mask"] == valid).all() and not feed["segment_ids"].any()


def test_text_feed_pads_and_cuts_to_a_given_length(tmp_path: Path, sentences: Path) -> None:
    from pe_export.specs import TensorSpec
    from pe_export.text_inputs import TextInputs, text_feed

    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    specs = [TensorSpec("token_ids", "int32", (None, None))]
    given = TextInputs(sentences, tokenizer)
    longer, valid = text_feed(specs, {"token_ids": 64}, given, tmp_path, 64, length=24)
    assert longer["token_ids"].shape == (4, 24) and valid.sum(axis=1).tolist() == [5, 12, 9, 20]
    shorter, valid = text_feed(specs, {"token_ids": 64}, given, tmp_path, 64, length=8)
    assert shorter["token_ids"].shape == (4, 8) and valid.sum(axis=1).tolist() == [5, 8, 8, 8]
    assert (shorter["token_ids"] == longer["token_ids"][:, :8]).all()


def test_a_tokenizer_for_another_vocabulary_is_one_line(
    saved_model, sentences: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 200)
    lines = sentences.read_text().replace("w5 ", "w150 ")
    sentences.write_text(lines + "w199\n")
    result = run_cli(
        capfd,
        "tflite",
        saved_model("encoder_dynamic"),
        "-o",
        tmp_path / "m.tflite",
        "--text",
        sentences,
        "--tokenizer",
        tokenizer,
    )
    assert_one_line_error(result, 2, "gives token id 199", "table has 64 rows", "tokenizer.json")
    assert not (tmp_path / "m.tflite").exists()


def test_text_without_a_tokenizer_is_one_line(
    saved_model, sentences: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = run_cli(capfd, "onnx", saved_model("encoder_dynamic"), "-o", tmp_path / "m.onnx", "--text", sentences)
    assert_one_line_error(result, 2, "--text needs the model's tokenizer", "--tokenizer")


def test_golden_bundle_from_sentences(
    saved_model, sentences: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    model = saved_model("encoder_multi_io")
    made = run_cli(
        capfd, "golden", model, "-o", tmp_path / "golden", "--text", sentences, "--tokenizer", tokenizer, "--batch", "3"
    )
    assert made.exit_code == 0, made.stderr
    assert "4 samples of 20 positions in 2 batches" in made.stdout, made.stdout
    exported = run_cli(capfd, "onnx", model, "-o", tmp_path / "m.onnx", "--no-verify")
    assert exported.exit_code == 0, exported.stderr
    checked = run_cli(capfd, "parity", tmp_path / "m.onnx", tmp_path / "golden")
    assert checked.exit_code == 0, (checked.stdout, checked.stderr)
    assert "mean-pooled rows, worst cosine" in checked.stdout
    both = run_cli(capfd, "golden", model, "-o", tmp_path / "g2", "--text", sentences, "--inputs", sentences)
    assert_one_line_error(both, 2, "--text and --inputs")


def test_export_is_verified_on_given_arrays(saved_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    model = saved_model("encoder_multi_io")
    rng = np.random.default_rng(2)
    tokens = rng.integers(1, 64, (3, 24)).astype(np.int32)
    mask = (np.arange(24)[None, :] < np.array([[24], [10], [17]])).astype(np.int32)
    arrays = tmp_path / "inputs.npz"
    np.savez(arrays, token_ids=tokens * mask, attention_mask=mask, segment_ids=np.zeros_like(tokens))
    result = run_cli(capfd, "onnx", model, "-o", tmp_path / "m.onnx", "--inputs", arrays)
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().startswith("inputs ")]
    assert {row[1] for row in rows} == {"pooled_output", "sequence_output"} and "24 positions" in result.stdout
    np.savez(arrays, token_ids=tokens + 60, attention_mask=mask, segment_ids=np.zeros_like(tokens))
    refused = run_cli(capfd, "onnx", model, "-o", tmp_path / "n.onnx", "--inputs", arrays)
    assert_one_line_error(refused, 2, "'token_ids' holds ids", "has 64 rows", "expected ids from 0 to 63")
    assert not (tmp_path / "n.onnx").exists()
    both = run_cli(capfd, "onnx", model, "-o", tmp_path / "b.onnx", "--inputs", arrays, "--text", arrays)
    assert_one_line_error(both, 2, "--text and --inputs")


def test_int8_chooses_on_part_of_the_sentences_and_is_judged_on_the_rest(
    saved_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Every 4th sentence is held out of int8's choices (smoothing, the weights kept float) and judges them;
    --holdout FILE gives the judging sentences instead; the report says which, and counts only those."""
    from pe_export.api import export_tflite
    from pe_export.converters.options import ExportOptions
    from pe_export.text_inputs import TextInputs

    rng = np.random.default_rng(4)
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    lines = [" ".join(f"w{i}" for i in rng.integers(2, 64, size=n)) for n in (3, 14, 7, 22, 5, 11, 18, 9)]
    given, held = tmp_path / "given.txt", tmp_path / "held.txt"
    given.write_text("\n".join(lines) + "\n", encoding="utf-8")
    held.write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    model = saved_model("encoder_multi_io")
    text = TextInputs(given, tokenizer)
    split = export_tflite(model, tmp_path / "a.tflite", ExportOptions(quantize="dynamic-int8", text=text))
    assert "int8 chose on 6 of the 8 samples and is judged on the other 2, held out" in " ".join(split.notes)
    assert split.parity is not None and split.parity.samples == 2  # the judge is the held-out part alone
    options = ExportOptions(quantize="dynamic-int8", text=text, holdout=held)
    apart = export_tflite(model, tmp_path / "b.tflite", options)
    assert "int8 chose on the 8 samples given, judged on the 3 of --holdout" in " ".join(apart.notes)
    assert apart.parity is not None and apart.parity.samples == 3 and apart.exit_code == 0
    # No choice to make (float32): every sentence judges the file, none is held out.
    plain = export_tflite(model, tmp_path / "c.tflite", ExportOptions(text=text))
    assert plain.parity is not None and plain.parity.samples == 8 and not any("int8 chose" in n for n in plain.notes)
    refused = run_cli(
        capfd, "tflite", model, "-o", tmp_path / "d.tflite", "--quantize", "dynamic-int8", "--holdout", held
    )
    assert_one_line_error(refused, 2, "--holdout", "needs --text or --inputs")
    # A --holdout that cannot be read is named as --holdout (it had been called --text).
    missing = tmp_path / "missing.txt"
    unread = run_cli(
        capfd,
        "tflite",
        model,
        "-o",
        tmp_path / "e.tflite",
        "--quantize",
        "dynamic-int8",
        "--text",
        given,
        "--tokenizer",
        tokenizer,
        "--holdout",
        missing,
    )
    assert_one_line_error(unread, 2, f"--holdout {missing}", "cannot be read as UTF-8 text")
    assert not (tmp_path / "e.tflite").exists()


def test_a_fixed_shape_export_and_its_bundle_take_the_sentences_at_that_shape(
    saved_model, sentences: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """--batch 3 --seq-len 24: the export runs the 4 sentences as two batches of 3 (the last filled with the first
    rows again), and the golden bundle pads them to 24 positions, so parity of that file on it runs."""
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    model = saved_model("encoder_multi_io")
    text = ("--text", sentences, "--tokenizer", tokenizer)
    fixed = ("--batch", "3", "--seq-len", "24")
    result = run_cli(capfd, "tflite", model, "-o", tmp_path / "m.tflite", *fixed, *text)
    assert result.exit_code == 0, result.stderr
    cases = {line.split()[0:2][1] for line in result.stdout.splitlines() if line.strip().startswith("text ")}
    assert cases == {"1", "2"} and "24 positions" in result.stdout, result.stdout
    made = run_cli(capfd, "golden", model, "-o", tmp_path / "golden", *text, *fixed)
    assert made.exit_code == 0, made.stderr
    assert "4 samples of 24 positions in 2 batches" in made.stdout, made.stdout
    checked = run_cli(capfd, "parity", tmp_path / "m.tflite", tmp_path / "golden")
    assert checked.exit_code == 0, (checked.stdout, checked.stderr)


def test_one_sentence_is_chosen_and_judged_on_and_the_report_says_so(
    saved_model, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A single sample cannot be split: int8 chooses on it and is judged on it, which the printed report says (and
    how to give others), never silently."""
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json", 64)
    one = tmp_path / "one.txt"
    one.write_text("w3 w17 w40 w9 w22\n", encoding="utf-8")
    output, report = tmp_path / "one.tflite", tmp_path / "report.json"
    result = run_cli(
        capfd, "tflite", saved_model("encoder_multi_io"), "-o", output, "--quantize", "dynamic-int8",
        "--text", one, "--tokenizer", tokenizer, "--json", report,
    )  # fmt: skip
    said = "int8 chose on the one sample given and is judged on it (--holdout FILE: others)"
    assert said in result.stdout, result.stdout[-2000:]
    written = json.loads(report.read_text())
    assert said in written["notes"] and written["parity"]["samples"] == 1
    assert (result.exit_code == 0) == output.exists()
