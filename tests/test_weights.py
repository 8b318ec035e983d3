"""Weights held once (pe_export/weights.py): the weightless frozen graph binds to exactly what plain freezing
writes, position tables are never stood in for, and both converters write the plain path's weights from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pe_export.converters.options import ExportOptions
from tests.fixtures.keras_hub_models import export_random_bert

ALL_STAND_INS, NO_STAND_INS = 0, 10**15  # min_stand_in_bytes: every float weight of rank ≥ 2, none


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_random_bert(tmp_path_factory.mktemp("weights") / "bert")


def _frozen(path: Path, min_bytes: int):  # type: ignore[no-untyped-def]
    from pe_export.savedmodel import FrozenSignature, load_savedmodel, signature_input_specs

    loaded = load_savedmodel(path)
    signature = loaded.signature(None)
    return loaded, FrozenSignature(
        signature, signature_input_specs(signature), name="serving_default", min_stand_in_bytes=min_bytes
    )


def _consts(graph_def) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    from pe_export.graphdef import const_value

    return {node.name: const_value(node) for node in graph_def.node if node.op == "Const"}


def test_stand_ins_bind_to_what_plain_freezing_writes(bert: Path) -> None:
    from pe_export.savedmodel import frozen_graph_def
    from pe_export.weights import is_stand_in

    _loaded, frozen = _frozen(bert, ALL_STAND_INS)  # the loaded model holds the variables the store reads
    graph_def, _, _ = frozen.graph()
    stand_ins = [node.name for node in graph_def.node if is_stand_in(node)]
    weights = sum(node.attr["value"].tensor.ByteSize() for node in graph_def.node if node.op == "Const")
    assert len(stand_ins) >= 2 * 6 + 1  # per block: q, k, v, output, two feed-forward kernels; the token table
    assert frozen.weights.nbytes > 10 * weights  # the graph analysed holds a small part of the weights
    plain = _consts(frozen_graph_def(frozen.concrete))
    bound = _consts(frozen.weights.bind(graph_def))
    assert bound.keys() == plain.keys()
    for name in stand_ins:
        np.testing.assert_array_equal(bound[name], plain[name])
        assert bound[name].dtype == plain[name].dtype


def test_a_position_table_is_never_a_stand_in(bert: Path) -> None:
    from pe_export.tables.pipeline import TableOptions, prepare_graph
    from pe_export.weights import is_stand_in

    loaded, frozen = _frozen(bert, ALL_STAND_INS)
    graph_def, _, _ = frozen.graph()
    token_rows = 500  # export_random_bert's vocabulary
    shapes = {tuple(d.size for d in n.attr["shape"].shape.dim) for n in graph_def.node if is_stand_in(n)}
    assert (token_rows, 64) in shapes  # the vocabulary table, looked up by token id
    tables = prepare_graph(loaded, frozen, TableOptions(list_only=True)).tables
    assert [(t.kind, t.shape) for t in tables] == [("learned", (64, 64))]
    # read by position: frozen with its values, which match the variable's (a stand-in holds none)
    assert tables[0].source == "variable" and tables[0].name.endswith("position_embedding/embeddings")


def test_weightless_onnx_has_the_plain_path_weights_and_outputs(bert: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from pe_export.converters.onnx.convert import convert_onnx

    results = {}
    for min_bytes in (ALL_STAND_INS, NO_STAND_INS):
        loaded, frozen = _frozen(bert, min_bytes)
        data, _, _ = convert_onnx(frozen, ExportOptions())
        results[min_bytes] = (frozen, onnx.load_from_string(data), data)
        del loaded
    (weightless, model, data), (plain_frozen, plain, plain_data) = results[ALL_STAND_INS], results[NO_STAND_INS]
    assert len(weightless.weights.variables) >= 13 and not plain_frozen.weights.variables

    def values(m: onnx.ModelProto) -> list[tuple[tuple[int, ...], str, bytes]]:
        arrays = (numpy_helper.to_array(init) for init in m.graph.initializer)
        return sorted((a.shape, a.dtype.str, a.tobytes()) for a in arrays)

    assert values(model) == values(plain)  # bit for bit, as a multiset (initializer names differ)
    assert sorted(n.op_type for n in model.graph.node) == sorted(n.op_type for n in plain.graph.node)
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    feed = {
        "token_ids": rng.integers(0, 500, (2, 16)).astype(np.int32),
        "padding_mask": np.ones((2, 16), np.int32),
        "segment_ids": np.zeros((2, 16), np.int32),
    }
    got = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)
    want = ort.InferenceSession(plain_data, providers=["CPUExecutionProvider"]).run(None, feed)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_tflite_from_stand_ins_has_the_plain_path_buffers(bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--compress rewrites the table, so the converter gets the bound weightless graph: same weights."""
    from tensorflow.lite.tools import flatbuffer_utils

    from pe_export.api import export_tflite
    from pe_export.tables.pipeline import TableOptions

    def weight_buffers(data: bytes) -> list[bytes]:
        model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
        found = (bytes(buffer.data) for buffer in model.buffers if buffer.data is not None)
        return sorted(b for b in found if len(b) >= 1024)

    options = ExportOptions(tables=TableOptions(compress=16, method="svd", allow_lossy=True), verify=False)
    files = {}
    for min_bytes in (ALL_STAND_INS, NO_STAND_INS):
        monkeypatch.setattr("pe_export.weights.MIN_STAND_IN_BYTES", min_bytes)
        output = bert.parent / f"stand_ins_{min_bytes}.tflite"
        export_tflite(bert, output, options)
        files[min_bytes] = weight_buffers(output.read_bytes())
    assert len(files[NO_STAND_INS]) >= 13
    assert files[ALL_STAND_INS] == files[NO_STAND_INS]


def test_frozen_weights_are_named_by_their_variables_on_every_load(bert: Path) -> None:
    """TensorFlow names a loaded SavedModel's captures by a process-wide counter (1596 on the first load, 4186 on
    the next): frozen, each weight takes its variable's name, so the same model freezes to the same graph."""
    from pe_export.weights import is_stand_in

    graphs = []
    for _ in range(2):
        loaded, frozen = _frozen(bert, ALL_STAND_INS)
        graph_def, _, _ = frozen.graph()
        variables = {var.name.split(":")[0] for var in loaded.obj.variables}
        graphs.append(graph_def)
        stand_ins = [node.name for node in graph_def.node if is_stand_in(node)]
        assert stand_ins and set(stand_ins) <= variables, stand_ins[:4]
        assert any(name.endswith("query/kernel") for name in stand_ins), stand_ins
    first, second = ([(node.name, node.op, list(node.input)) for node in g.node] for g in graphs)
    assert first == second
