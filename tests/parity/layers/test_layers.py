"""Layer-wise parity on a keras-hub backbone: the layers found from the graph, the map proven by values at
export, and `parity --layers` naming the block a deliberately altered weight sits in (TFLite and ONNX)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pe_export.api import export_onnx, export_tflite
from pe_export.converters.options import ExportOptions
from pe_export.errors import BadInputError
from pe_export.golden import GoldenOptions, make_golden
from pe_export.parity.harness import ParityOptions, check_parity
from pe_export.parity.layers.mapping import LAYER_MAP, LayerMap, carried_over, match_layers
from pe_export.parity.result import ParityReport
from tests.fixtures.keras_hub_models import export_random_bert

SEQ_LEN = 16
BLOCKS = [
    "token_embedding",
    "segment_embedding",
    "position_embedding",
    "embeddings_add",
    "embeddings_layer_norm",
    "transformer_layer_0",
    "transformer_layer_1",
    "pooled_dense",
]
# Inside each block: the attention LayerNorm's output and both residual sums must be mapped in every faithful
# export (the feed-forward LayerNorm's output is the block's own: the outermost scope names a tensor).
MUST_MAP = [f"transformer_layer_{i}/{part}" for i in (0, 1) for part in ("self_attention_layer_norm", "add", "add_1")]
ALTERED = "transformer_layer_1/feedforward_output_dense"  # the kernel multiplied by 1.05 in the file


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layers")
    saved = export_random_bert(root / "bert")
    files = {
        "tflite": export_tflite(saved, root / "bert.tflite", ExportOptions(seq_len=SEQ_LEN)).output,
        "onnx": export_onnx(saved, root / "bert.onnx", ExportOptions(seq_len=SEQ_LEN)).output,
    }
    make_golden(saved, root / "golden", GoldenOptions(samples=6, batch=3, seq_len=SEQ_LEN, layers="all"))
    return {"saved": saved, "golden": root / "golden", "root": root, **files}


def layer_check(model: Path, bundle: Path, **options: object) -> ParityReport:
    return check_parity(model, bundle, ParityOptions(layers=True, isolate=False, **options))  # type: ignore[arg-type]


def test_blocks_are_the_backbone_layers_and_the_last_is_its_output(bert: dict[str, Path]) -> None:
    from pe_export.parity.layers.tap import LayerTap
    from pe_export.runners.savedmodel import SavedModelRunner
    from pe_export.savedmodel import FrozenSignature, load_savedmodel, signature_input_specs

    loaded = load_savedmodel(bert["saved"])
    signature = loaded.signature(None)
    specs = [spec.at_length(SEQ_LEN) for spec in signature_input_specs(signature)]
    tap = LayerTap(FrozenSignature(signature, specs), "blocks")
    assert [layer.name for layer in tap.layers] == BLOCKS
    rng = np.random.default_rng(0)
    feed = {
        "token_ids": rng.integers(0, 500, (2, SEQ_LEN)).astype(np.int32),
        "segment_ids": np.zeros((2, SEQ_LEN), np.int32),
        "padding_mask": np.ones((2, SEQ_LEN), np.int32),
    }
    activations = tap.activations(feed)
    with SavedModelRunner(bert["saved"], loaded=loaded) as reference:  # the signature itself, independently
        outputs = reference.infer(feed)
    np.testing.assert_allclose(activations["transformer_layer_1"], outputs["sequence_output"], atol=1e-6)
    np.testing.assert_allclose(activations["pooled_dense"], outputs["pooled_output"], atol=1e-6)


def test_the_bundle_holds_the_layers_in_graph_order(bert: dict[str, Path]) -> None:
    manifest = json.loads((bert["golden"] / "manifest.json").read_text())
    names = [entry["name"] for entry in manifest["layers"]]
    assert set(BLOCKS + MUST_MAP) <= set(names)
    positions = [names.index(name) for name in BLOCKS]
    assert positions == sorted(positions)  # embeddings, then block 0, block 1, the pooler
    sequence = {entry["name"] for entry in manifest["layers"] if entry["sequence"]}
    assert "transformer_layer_1" in sequence and "pooled_dense" not in sequence
    axes = {entry["name"]: entry["sequence_axes"] for entry in manifest["layers"]}
    assert axes["transformer_layer_1"] == [1] and axes["pooled_dense"] == []
    scores = [name for name, found in axes.items() if found == [2, 3]]  # each block's attention scores and probs
    assert scores and all("self_attention_layer" in name for name in scores), scores


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_a_faithful_export_passes_every_layer(bert: dict[str, Path], file_format: str) -> None:
    report = layer_check(bert[file_format], bert["golden"])
    assert report.passed and report.layers is not None
    assert report.layers.first_divergence is None
    compared = {layer.name: layer for layer in report.layers.layers}
    assert set(BLOCKS + MUST_MAP) <= set(compared)
    assert all(layer.relative_error < 1e-5 for layer in compared.values())
    # a layer the file fused is listed with the reason, never silently dropped
    manifest = json.loads((bert["golden"] / "manifest.json").read_text())
    assert set(compared) | set(report.layers.unmapped) == {entry["name"] for entry in manifest["layers"]}


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_our_own_encoder_passes_every_layer(saved_model, file_format: str, tmp_path: Path) -> None:
    export = export_tflite if file_format == "tflite" else export_onnx
    path = export(saved_model("encoder_dynamic"), tmp_path / f"m.{file_format}", ExportOptions()).output
    make_golden(saved_model("encoder_dynamic"), tmp_path / "golden", GoldenOptions(samples=4, batch=2, layers="blocks"))
    report = layer_check(path, tmp_path / "golden")
    assert report.passed and report.layers is not None and len(report.layers.layers) >= 3
    assert report.layers.first_divergence is None


def altered_copy(model: Path, target: Path) -> Path:
    """``model`` with the feed-forward output kernel of block 1 multiplied by 1.05 (its metadata kept)."""
    needle = "transformer_layer_1_1/feedforward_output_dense_1/"
    if model.suffix == ".tflite":
        from tensorflow.lite.tools import flatbuffer_utils

        flat = flatbuffer_utils.read_model(str(model))
        for tensor in flat.subgraphs[0].tensors:
            data = flat.buffers[tensor.buffer].data
            if needle in tensor.name.decode() and data is not None and len(data) > 0:
                kernel = np.frombuffer(bytes(data), np.float32) * np.float32(1.05)
                flat.buffers[tensor.buffer].data = np.frombuffer(kernel.tobytes(), np.uint8)
                break
        else:
            raise AssertionError("no kernel of block 1's feed-forward output in the file")
        flatbuffer_utils.write_model(flat, str(target))
        return target
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(model))
    weights = {init.name: init for init in proto.graph.initializer}
    name = next(
        i
        for node in proto.graph.node
        if needle in node.name
        for i in node.input
        if i in weights and len(weights[i].dims) == 2 and weights[i].data_type == onnx.TensorProto.FLOAT
    )
    kernel = numpy_helper.to_array(weights[name]) * np.float32(1.05)
    weights[name].CopyFrom(numpy_helper.from_array(kernel.astype(np.float32), name))
    onnx.save(proto, str(target))
    return target


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_an_altered_weight_is_found_in_its_block(bert: dict[str, Path], file_format: str, tmp_path: Path) -> None:
    altered = altered_copy(bert[file_format], tmp_path / f"altered.{file_format}")
    report = layer_check(altered, bert["golden"])
    assert not report.passed and report.layers is not None
    assert report.layers.first_divergence == ALTERED
    layers = [layer.name for layer in report.layers.layers]
    before = report.layers.layers[: layers.index(ALTERED)]
    assert before and all(layer.ok for layer in before)  # every earlier layer within tolerance
    assert ALTERED in report.failure_message()


def test_a_quantized_export_reports_per_layer_error_growth(bert: dict[str, Path]) -> None:
    path = bert["root"] / "int8.tflite"
    export_tflite(bert["saved"], path, ExportOptions(seq_len=SEQ_LEN, quantize="dynamic-int8"))
    from pe_export.inspection.tflite_metadata import tflite_metadata

    layer_map = LayerMap.from_json(tflite_metadata(path)[LAYER_MAP], path.name)
    assert layer_map.source == "float32 file" and set(BLOCKS) <= set(layer_map.tensors)
    report = layer_check(path, bert["golden"])
    assert report.layers is not None
    layers = {layer.name: layer for layer in report.layers.layers}
    # int8 weights: every layer after the first quantized product carries int8's error, far above float32's
    assert layers["transformer_layer_1"].relative_error > 1e-3
    assert all(layer.growth is not None for layer in report.layers.layers[1:])
    assert layers["transformer_layer_1"].atol == 0.5  # judged by int8's tolerance, stamped in the file


def test_a_file_cut_at_a_layer_computes_that_layer(bert: dict[str, Path], tmp_path: Path) -> None:
    """What the GPU bisection runs: the same file, the layer's tensor its one output, read by LiteRT whole."""
    from pe_export.inspection.tflite_metadata import tflite_metadata
    from pe_export.parity.bundle import load_bundle
    from pe_export.parity.layers.cut import cut_at
    from pe_export.runners import create_runner

    layer_map = LayerMap.from_json(tflite_metadata(bert["tflite"])[LAYER_MAP], "bert.tflite")
    batch = next(load_bundle(bert["golden"]).batches())
    for layer in ("embeddings_layer_norm", "transformer_layer_0/add", "transformer_layer_1"):
        path = tmp_path / "cut.tflite"
        path.write_bytes(cut_at(bert["tflite"].read_bytes(), layer_map.tensors[layer]))
        with create_runner("litert", path) as runner:  # XNNPACK on: the kernels the file normally runs with
            (value,) = runner.infer(batch.inputs).values()
        np.testing.assert_allclose(value, batch.layers[layer], atol=1e-4, rtol=1e-4)
    with pytest.raises(BadInputError, match="has no tensor 'nope' to cut at"):
        cut_at(bert["tflite"].read_bytes(), "nope")


def test_mapping_decides_by_values_and_names_only_order_the_search() -> None:
    rng = np.random.default_rng(1)
    reference = {"block": rng.normal(size=(2, 4, 8)).astype(np.float32)}
    graph = {"block": "StatefulPartitionedCall/model/block/add:0"}
    decoy = reference["block"] + np.float32(0.01)
    candidates = {"model/block/add": decoy, "Reshape_7": reference["block"].reshape(8, 8).copy()}
    assert match_layers(reference, graph, candidates).tensors == {"block": "Reshape_7"}
    assert match_layers(reference, graph, {"model/block/add": decoy}).unmapped == ("block",)
    float_map = LayerMap({"block": "model/block/add", "other": "x"})
    carried = carried_over(float_map, {"model/block/add": 64}, {"model/block/add": 64, "x": 10})
    assert carried.tensors == {"block": "model/block/add"} and carried.fused == ("other",)


def test_refusals_are_one_line_before_any_work(bert: dict[str, Path], tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    make_golden(bert["saved"], plain, GoldenOptions(samples=2, batch=2, seq_len=SEQ_LEN))
    with pytest.raises(BadInputError, match="holds no layer activations; write one with `pe-export golden"):
        layer_check(bert["tflite"], plain)
    unmapped = export_tflite(
        bert["saved"], tmp_path / "nomap.tflite", ExportOptions(seq_len=SEQ_LEN, layer_map=False)
    ).output
    with pytest.raises(BadInputError, match="carries no layer map"):
        layer_check(unmapped, bert["golden"])
    with pytest.raises(BadInputError, match="neither blocks nor all nor a regular expression"):
        make_golden(bert["saved"], tmp_path / "bad", GoldenOptions(layers="(", seq_len=SEQ_LEN))


def test_the_layer_store_is_bounded(bert: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pe_export.constants

    monkeypatch.setattr(pe_export.constants, "MAX_LAYER_BYTES", 100_000)
    with pytest.raises(BadInputError, match="pass --layers blocks, a narrower regular expression, or fewer --samples"):
        make_golden(bert["saved"], tmp_path / "big", GoldenOptions(samples=8, batch=2, seq_len=SEQ_LEN, layers="all"))
    assert not (tmp_path / "big").exists()  # nothing half-written


def test_cli_writes_json_plot_and_model_explorer(bert: dict[str, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pe_export.cli import cli

    out = {name: tmp_path / name for name in ("report.json", "layers.png", "explorer.json")}
    result = CliRunner().invoke(
        cli,
        [
            "parity",
            str(bert["onnx"]),
            str(bert["golden"]),
            "--layers",
            "--no-isolate",
            "--json",
            str(out["report.json"]),
            "--plot",
            str(out["layers.png"]),
            "--model-explorer",
            str(out["explorer.json"]),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "first divergence: none" in result.output
    report = json.loads(out["report.json"].read_text())
    assert report["first_divergence"] is None and report["layers"][0]["name"] == "token_embedding"
    assert out["layers.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    explorer = json.loads(out["explorer.json"].read_text())
    import onnx

    values = {output for node in onnx.load(str(bert["onnx"])).graph.node for output in node.output}
    assert explorer["results"] and set(explorer["results"]) <= values  # keyed by the file's own tensor names
    assert {round(v["value"], 12) for v in explorer["results"].values()} == {
        round(layer["relative_error"], 12) for layer in report["layers"]
    }
    refused = CliRunner().invoke(
        cli, ["parity", str(bert["onnx"]), str(bert["golden"]), "--model-explorer", str(tmp_path / "x.json")]
    )
    assert isinstance(refused.exception, BadInputError) and "it needs --layers" in str(refused.exception)


@pytest.mark.parametrize("file_format", ["tflite", "onnx"])
def test_bisection_over_cut_files_finds_the_altered_layer(
    bert: dict[str, Path], file_format: str, tmp_path: Path
) -> None:
    """--bisect: the file cut at a layer and run as the runtime normally runs it (XNNPACK on; onnxruntime's own
    fusions), halving the mapped layers: the altered layer in about log2(layers) files; a faithful file in one."""
    from pe_export.parity.result import bisection_steps

    faithful = layer_check(bert[file_format], bert["golden"], bisect=True)
    assert faithful.passed and faithful.layers is not None and len(faithful.layers.layers) == 1
    assert "bisected: 1 of" in faithful.layers.kernels
    altered = layer_check(altered_copy(bert[file_format], tmp_path / f"a.{file_format}"), bert["golden"], bisect=True)
    assert not altered.passed and altered.layers is not None
    assert altered.layers.first_divergence == ALTERED
    found = re.search(r"bisected: (\d+) of (\d+) layers run", altered.layers.kernels)
    assert found, altered.layers.kernels
    run, mapped = map(int, found.groups())
    assert run == len(altered.layers.layers) and 2 <= run <= bisection_steps(mapped) < mapped
    names = [layer.name for layer in altered.layers.layers]  # the layers run, in graph order
    assert all(layer.ok for layer in altered.layers.layers[: names.index(ALTERED)])
    assert not any(layer.ok for layer in altered.layers.layers[names.index(ALTERED) :])  # bad from there on


def test_cut_onnx_files_compute_the_layer(bert: dict[str, Path], tmp_path: Path) -> None:
    """The ONNX cut: the layer's value the only output, the nodes after it left out; onnxruntime reads it whole."""
    import onnx

    from pe_export.parity.bundle import load_bundle
    from pe_export.parity.layers.cut import cut_onnx_at
    from pe_export.runners import create_runner

    stamps = {p.key: p.value for p in onnx.load(str(bert["onnx"]), load_external_data=False).metadata_props}
    layer_map = LayerMap.from_json(stamps[LAYER_MAP], "bert.onnx")
    batch = next(load_bundle(bert["golden"]).batches())
    whole = len(onnx.load(str(bert["onnx"])).graph.node)
    for layer in ("embeddings_layer_norm", "transformer_layer_0/add", "transformer_layer_1"):
        path = cut_onnx_at(bert["onnx"], layer_map.tensors[layer], tmp_path / "cut.onnx")
        assert len(onnx.load(str(path)).graph.node) < whole  # what only later layers read is gone
        with create_runner("onnxruntime", path) as runner:
            (value,) = runner.infer(batch.inputs).values()
        np.testing.assert_allclose(value.reshape(batch.layers[layer].shape), batch.layers[layer], atol=1e-4, rtol=1e-4)
    with pytest.raises(BadInputError, match="has no tensor 'nope' to cut at"):
        cut_onnx_at(bert["onnx"], "nope", tmp_path / "x.onnx")
    # weights in a data file beside the model (past 2 GiB): the cut, written elsewhere, reaches them by a link
    (tmp_path / "external").mkdir()
    external = tmp_path / "external" / "m.onnx"
    onnx.save(onnx.load(str(bert["onnx"])), str(external), save_as_external_data=True, location="m.data")
    (tmp_path / "cuts").mkdir()
    path = cut_onnx_at(external, layer_map.tensors["transformer_layer_1"], tmp_path / "cuts" / "cut.onnx")
    assert (tmp_path / "cuts" / "m.data").stat().st_nlink == 2  # the same file, not a copy
    with create_runner("onnxruntime", path) as runner:
        (value,) = runner.infer(batch.inputs).values()
    expected = batch.layers["transformer_layer_1"]
    np.testing.assert_allclose(value.reshape(expected.shape), expected, atol=1e-4, rtol=1e-4)


def test_gpu_providers_are_bisected_and_the_cpu_keeps_its_tensors() -> None:
    """TensorRT builds its engine around the graph's outputs (CUDA's fused kernels likewise): values made outputs
    there are not the ones it computes, so those providers are judged on cut files; the CPU keeps the tensors."""
    from pe_export.runners.base import RUNNERS

    onnxruntime = RUNNERS.get("onnxruntime")
    assert onnxruntime.keeps_intermediates({"providers": ("cpu",)})
    assert not onnxruntime.keeps_intermediates({"providers": ("tensorrt", "cuda")})
    assert not onnxruntime.keeps_intermediates({"providers": ("cuda",)})
    assert not RUNNERS.get("litert-gpu").keeps_intermediates({})
    with pytest.raises(BadInputError, match=r"--bisect .* needs --layers"):
        ParityOptions(bisect=True).validate()
