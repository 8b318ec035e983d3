"""The same SavedModel exports to the same ONNX file, byte for byte, in every process
(pe_export/converters/onnx/tf2onnx_order.py, stable_capture_names in pe_export/weights.py). A keras-hub BERT of 2
layers has what made tf2onnx's output change between runs: per-layer attention-mask chains that duplicate merging
folds into one, and Einsum decompositions (without the fixes, three processes wrote three different files)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="keras-hub 0.32 needs Python 3.11+")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.keras_hub_models import export_random_bert

    return export_random_bert(tmp_path_factory.mktemp("order") / "bert")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_model_exports_to_the_same_bytes_in_every_process(bert: Path, tmp_path: Path) -> None:
    """Each export as a user runs it: a process of its own (what an export decides by graph order repeats)."""
    import onnx

    files = [tmp_path / f"process_{index}.onnx" for index in range(3)]
    for path in files:
        command = [sys.executable, "-c", "from pe_export.cli import main; main()", "onnx", str(bert), "-o", str(path)]
        other = subprocess.run([*command, "--no-layer-map"], capture_output=True, text=True, check=False)
        assert other.returncode == 0, other.stderr[-2000:]
    model = onnx.load(str(files[0]))
    ops = {node.op_type for node in model.graph.node}
    assert {"Einsum", "MatMul"} & ops and len(model.graph.node) > 100, ops  # the graph the causes were seen in
    assert len({digest(path) for path in files}) == 1, [
        [node.name for node in onnx.load(str(path)).graph.node][:5] for path in files
    ]


def test_the_patches_last_only_for_the_conversion() -> None:
    """tf2onnx is as it was after a conversion: its own subgraph order, ``id`` and name counter (past both)."""
    from tf2onnx import utils
    from tf2onnx.graph import Graph
    from tf2onnx.optimizer import einsum_optimizer

    from pe_export.converters.onnx.tf2onnx_order import repeatable_conversion

    before = Graph.extract_sub_graph_nodes
    utils.INTERNAL_NAME = max(utils.INTERNAL_NAME, 5000)
    with repeatable_conversion():
        assert Graph.extract_sub_graph_nodes is not before
        assert utils.INTERNAL_NAME == 1
        first, second = object(), object()
        serials = [einsum_optimizer.id(first), einsum_optimizer.id(second), einsum_optimizer.id(first)]
        assert serials[1] == serials[0] + 1 == serials[2] + 1 and serials[0] > 1 << 32
        utils.make_name("x")
    assert Graph.extract_sub_graph_nodes is before
    assert "id" not in vars(einsum_optimizer)
    assert utils.INTERNAL_NAME >= 5000
