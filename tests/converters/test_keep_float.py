"""The keep-float search measures a repeated block's weights one place at a time: the places found from the
graph's order, and a real multi-layer encoder brought to a strict target in fewer quantized files than one
per weight, each run in the installed runtime."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import onnx
import pytest

from pe_export.api import export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.converters.search.keep_float import repeated_places, resolve_asked
from pe_export.errors import BadInputError, ExitCode, ParityError
from tests.fixtures.keras_hub_models import export_random_bert
from tests.helpers import assert_judged_on_the_held_out_part, chosen_cosine, stricter_target

LAYERS = 4


def test_places_are_the_offsets_of_the_repeated_block() -> None:
    block = ["q", "k", "v", "o", "ff_in", "ff_out"]
    kinds = {"table": "gather", "pooler": "dense"}
    names = ["table"]
    for layer in range(3):
        for role in block:
            names.append(f"{layer}/{role}")
            kinds[names[-1]] = "square" if role in ("q", "k", "v", "o") else role
    names.append("pooler")
    places = repeated_places(names, kinds)
    assert sorted(places) == sorted(
        [[f"{layer}/{role}" for layer in range(3)] for role in block] + [["table"], ["pooler"]]
    )


def test_without_a_repeat_every_weight_is_its_own_place() -> None:
    names = ["a", "b", "c", "d"]
    assert repeated_places(names, {"a": 1, "b": 2, "c": 3, "d": 4}) == [["a"], ["b"], ["c"], ["d"]]
    # one repeat of a two-weight pattern is not a block: it needs the pattern twice over, as here
    assert repeated_places(["x", "a", "b", "a2", "b2"], {"x": 0, "a": 1, "b": 2, "a2": 1, "b2": 2}) == [
        ["a", "a2"],
        ["b", "b2"],
        ["x"],
    ]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_random_bert(
        tmp_path_factory.mktemp("keep_float") / "bert", num_layers=LAYERS, hidden_dim=64, intermediate_dim=256
    )


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_strict_target_met_in_fewer_files_than_weights(encoder: Path, file_format: str, tmp_path: Path) -> None:
    export = export_tflite if file_format == "tflite" else export_onnx
    what = "int8 weights" if file_format == "tflite" else "quantizable nodes"
    default = export(encoder, tmp_path / f"default.{file_format}", ExportOptions(quantize="dynamic-int8"))
    assert default.parity is not None and default.parity.min_cosine < 1 - 1e-7
    target = stricter_target(default.notes)  # one the default misses where it chooses, whatever the init
    output = tmp_path / f"strict.{file_format}"
    strict = export(encoder, output, ExportOptions(quantize="dynamic-int8", min_cosine=target))
    note = next(n for n in strict.notes if n.startswith("int8:"))
    print(note, default.parity.min_cosine, strict.parity.min_cosine if strict.parity else None)
    # ONNX (--int8-kernel rows, the default): kept float (mixed: block-wise int8, or float where that misses); TFLite:
    # kept FCs in groups of input channels, or float on top of every FC in groups
    kinds = "float|block-wise int8|int8 in groups"
    found = re.search(rf"(\d+) of (\d+) {what} kept in ({kinds}).*; (\d+) quantized files tried, (\d+) on every", note)
    assert found, note
    kept, candidates, files, verdicts = (int(g) for g in found.groups()[:2] + found.groups()[3:])
    if file_format == "onnx":  # the file written holds what the note says
        written = onnx.load(str(output))
        blocked = {node.name for node in written.graph.node if node.op_type == "MatMulNBits"}
        kept_matmuls = {name for name in strict.searches[0]["kept_float"] if "Gather" not in name}
        escalated = found[3] == "block-wise int8"
        assert blocked == (kept_matmuls if escalated else set()) and (blocked or not escalated), blocked
        assert strict.searches[0]["kept_as"].startswith("block-wise" if escalated else "float")
        assert ("8-bit MatMulNBits' speed depends on the CPU" in note) == bool(blocked), note  # said where it is so
    else:  # kept FCs in groups: each one's SPLIT is in the file (float on top of groups: the rest are)
        from ai_edge_litert.interpreter import Interpreter

        splits = [op for op in Interpreter(model_path=str(output))._get_ops_details() if op["op_name"] == "SPLIT"]
        last = strict.searches[-1]  # groups cut back after float, where it came to that
        grouped = last["kept_as"].startswith("int8 in groups") and bool(set(last["kept_float"]) - set(last["asked"]))
        assert bool(splits) == grouped or not output.exists(), (len(splits), strict.searches)
    assert chosen_cosine(strict.notes) >= target and 1 <= kept < candidates and candidates >= 6 * LAYERS
    assert_judged_on_the_held_out_part(strict, target, output)
    # all-int8, one per place (6 in the block, the rest alone), then the bisections over the ranking on the probe
    # (the rows all-int8 got worst), each count it finds taken to a verdict on every input
    places = 6 + (candidates - 6 * LAYERS)
    assert files <= 1 + places + 2 * math.ceil(math.log2(candidates + 1)) + 1 < 1 + candidates
    assert verdicts <= 3  # all-int8's, and the probe's count (once more where that verdict failed)
    _the_record_says_what_the_search_did(strict.to_dict(), kept, candidates, files)


def _the_record_says_what_the_search_did(report: dict, kept: int, candidates: int, files: int) -> None:
    """--json's record of the search: the note's figures, every candidate ranked by its measured cost per
    weight byte, and the weights kept float the top of that ranking (bisection keeps a prefix of it)."""
    report = json.loads(json.dumps(report))  # what --json writes
    searches = report["searches"]  # TFLite: float first, then the groups cut back (a second record)
    assert len(searches) in (1, 2)
    search = searches[0]  # the note's
    assert (len(search["kept_float"]), search["candidates"], search["files_tried"]) == (kept, candidates, files)
    ranking = search["ranking"]
    assert len(ranking) == candidates and all(entry["weight_bytes"] > 0 for entry in ranking)
    per_byte = [entry["cost"] / entry["weight_bytes"] for entry in ranking]
    assert per_byte == sorted(per_byte, reverse=True)
    assert [entry["kept"] for entry in ranking] == [True] * kept + [False] * (candidates - kept)
    assert {entry["name"] for entry in ranking if entry["kept"]} == set(search["kept_float"])
    assert report["parity"]["passed"] and report["written"] and report["exit_code"] == 0


def test_a_target_only_float_meets_is_refused_not_stamped_int8(encoder: Path, tmp_path: Path) -> None:
    """Where only every weight in float passes, there is no int8 file to write: exit 1, nothing written."""
    output = tmp_path / "float_really.tflite"
    with pytest.raises(ParityError, match="no file with an int8 weight meets the target") as raised:
        export_tflite(encoder, output, ExportOptions(quantize="dynamic-int8", min_cosine=1.0))
    assert raised.value.exit_code == ExitCode.PARITY_FAILED
    assert not output.exists() and not list(tmp_path.iterdir())


def test_the_probe_grows_by_the_rows_a_verdict_fails_on_and_the_count_is_the_fewest() -> None:
    """The search's own logic on a model whose rows need different weights: row 7 (in the second batch) is hurt
    only by weights w10–w19, which the all-int8 probe (rows 0 and 1, hurt by w0–w9) cannot see. The verdict at the
    probe's count fails on row 7, row 7 joins the probe, and the count found is the fewest in the ranking's order
    that passes every row alone (checked against every count)."""
    import numpy as np

    from pe_export.converters.search.keep_float import Judging, keep_float_to_target
    from pe_export.parity.tolerances import Tolerance

    rng = np.random.default_rng(0)
    direction, error = rng.normal(size=16), rng.normal(size=16)
    names = [f"w{i}" for i in range(20)]
    hurt = np.zeros((8, 20))  # hurt[row, weight]: the error a row takes while that weight is int8
    hurt[0, :10], hurt[1, :10] = np.linspace(0.02, 0.2, 10), np.linspace(0.01, 0.1, 10)
    hurt[7, 10:] = np.linspace(0.002, 0.02, 10)
    feeds = [{"row": np.arange(4)[:, None]}, {"row": np.arange(4, 8)[:, None]}]
    expected = [{"y": np.tile(direction, (4, 1))} for _ in feeds]

    def run(kept: frozenset[str], given: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        quantized = np.array([name not in kept for name in names], float)
        return [{"y": direction + (hurt[feed["row"][:, 0]] @ quantized)[:, None] * error} for feed in given]

    tolerance = Tolerance(atol=10.0, rtol=10.0, min_cosine=0.9995)
    judging = Judging(feeds, [None, None], expected, rows_alone=True)
    outcome = keep_float_to_target(names, dict.fromkeys(names, 4), frozenset, run, judging, tolerance, {})
    assert outcome.passed and 0 < len(outcome.kept_float) < len(names)
    assert any(int(name[1:]) >= 10 for name in outcome.kept_float)  # row 7's weights, seen once it joined
    assert outcome.verdicts >= 3  # all-int8, the probe's first count (failed on row 7), the count found

    def passes(count: int) -> bool:
        got = run(frozenset(ranked[:count]), feeds)
        return all(
            float(np.dot(g, w) / np.linalg.norm(g) / np.linalg.norm(w)) >= tolerance.min_cosine
            for o, e in zip(got, expected, strict=True)
            for g, w in zip(o["y"], e["y"], strict=True)
        )

    ranked = sorted(names, key=lambda n: -outcome.sensitivity[n])  # the search's order (sizes are equal)
    assert outcome.kept_float == ranked[: len(outcome.kept_float)]
    assert len(outcome.kept_float) == next(count for count in range(len(names) + 1) if passes(count))


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_keep_float_leaves_the_named_weights_float(encoder: Path, file_format: str, tmp_path: Path) -> None:
    """--keep-float NAME: the weights it names (a Keras layer path in TFLite's tensor names; ONNX's node names)
    stay float in the written file; a name that matches none is one line."""
    export = export_tflite if file_format == "tflite" else export_onnx
    output = tmp_path / f"m.{file_format}"
    with pytest.raises(BadInputError, match="--keep-float 'no_such_layer' names no int8 weight of this file"):
        export(encoder, output, ExportOptions(quantize="dynamic-int8", keep_float=("no_such_layer",)))
    assert not output.exists()
    if file_format == "tflite":
        wanted, float_weights = "transformer_layer_1/feedforward_output_dense", _tflite_float_weights
    else:
        wanted, float_weights = _first_quantizable_onnx_node(encoder, tmp_path), _onnx_float_nodes
    report = export(encoder, output, ExportOptions(quantize="dynamic-int8", keep_float=(wanted,)))
    note = next(n for n in report.notes if n.startswith("int8:"))
    assert report.exit_code == ExitCode.OK and "1 kept in float as --keep-float asked" in note, note
    kept = float_weights(output)
    if file_format == "tflite":  # that layer's one kernel, and no other (the default target needs none)
        assert [("transformer_layer_1" in n, "feedforward_output_dense" in n) for n in kept] == [(True, True)], kept
    else:
        assert wanted in kept, kept


def _tflite_float_weights(path: Path) -> list[str]:
    """Names of the FULLY_CONNECTED weights read straight from the file that are float32 (not int8)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    weights = set()
    for op in interpreter._get_ops_details():
        if op["op_name"] == "FULLY_CONNECTED":
            weights.add(op["inputs"][1])
    details = {d["index"]: d for d in interpreter.get_tensor_details()}
    return [details[i]["name"] for i in weights if details[i]["dtype"].__name__ == "float32"]


def _first_quantizable_onnx_node(encoder: Path, tmp_path: Path) -> str:
    from pe_export.converters.onnx.quantize import int8_ready, quantizable_nodes

    export_onnx(encoder, tmp_path / "fp32.onnx", ExportOptions(verify=False))
    import onnx

    return quantizable_nodes(int8_ready(onnx.load(str(tmp_path / "fp32.onnx")))[0])[0]


def _onnx_float_nodes(path: Path) -> list[str]:
    """Nodes of the written file that still multiply by (or look up) a float weight (MatMul, not MatMulInteger):
    a float32 one, or a float16 one cast back (how dynamic-int8 stores a kept weight)."""
    import onnx

    model = onnx.load(str(path))
    types = {i.name: i.data_type for i in model.graph.initializer}
    weights = {name for name, kind in types.items() if kind == onnx.TensorProto.FLOAT}
    weights |= {
        n.output[0]
        for n in model.graph.node
        if n.op_type == "Cast" and types.get(n.input[0]) == onnx.TensorProto.FLOAT16
    }
    return [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gather") and set(n.input) & weights]


def test_a_layer_path_finds_its_layer_however_keras_numbered_it() -> None:
    """Keras numbers a layer of a name already used in the process (``softmax_2``) and the SavedModel's trace adds
    ``_1``: a layer path still names it, and only it."""
    names = [
        "bert_backbone_1_1/transformer_layer_0_1/self_attention_layer_1/softmax_2_1/Softmax",
        "bert_backbone_1_1/transformer_layer_1_1/self_attention_layer_1/softmax_3_1/Softmax",
        "bert_backbone_1_1/transformer_layer_11_1/self_attention_layer_1/softmax_4_1/Softmax",
    ]
    assert resolve_asked(("transformer_layer_0/self_attention_layer/softmax",), names) == names[:1]
    assert resolve_asked(("transformer_layer_1/self_attention_layer",), names) == names[1:2]
    assert resolve_asked(("softmax",), names) == names
    with pytest.raises(BadInputError, match="--keep-float 'transformer_layer_2' names no int8 weight"):
        resolve_asked(("transformer_layer_2",), names)
