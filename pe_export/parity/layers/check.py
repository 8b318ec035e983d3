"""``parity --layers``: the file's layer tensors against the bundle's activations, on the device (TF-free).

The file's stamped layer map (pe_export/parity/layers/mapping.py) says which tensor carries each layer; the runtime runs
with its intermediate tensors kept (a second pass: the outputs were judged by the runtime as it normally runs)
and each layer is judged by the output tolerance of the file's precision. A runtime that keeps no intermediate
without computing otherwise (LiteRT's GPU accelerator; onnxruntime's TensorRT and CUDA providers) runs the file
cut at a layer instead (layers/cut.py: that layer's tensor its only output), bisecting the layers in graph order
for the first over tolerance: one cut file per step, about log2(layers) of them. ``--bisect`` asks for the cut
files where the runtime could keep the tensors (to judge XNNPACK's or onnxruntime's fused kernels as they run).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError
from pe_export.interrupts import raise_if_interrupted
from pe_export.parity.bundle import Bundle
from pe_export.parity.layers.compare import LayerComparison
from pe_export.parity.layers.mapping import LAYER_MAP, LayerMap
from pe_export.parity.result import LayerReport
from pe_export.parity.tolerances import Tolerance
from pe_export.runners.base import RUNNERS, create_runner, infer_rows

KERNELS = {
    "litert": "the interpreter's builtin kernels with every tensor kept (XNNPACK off: it keeps no intermediate)",
    "tflite-runtime": "the interpreter's builtin kernels with every tensor kept (XNNPACK off)",
    "tflite-tf": "the interpreter's builtin kernels with every tensor kept (XNNPACK off)",
    "onnxruntime": "the same session with every node's output also a graph output (no fusion across one)",
}


def layers_checkable(
    model: Path, stamps: dict[str, str], bundle: Bundle, runtime: str, options: dict[str, Any], bisect: bool = False
) -> LayerMap:
    """The file's layer map, once the file, the bundle and the runtime can all take part (before any work)."""
    if not bundle.layers:
        raise no_layers_in(bundle)
    if _by_cut_files(runtime, options, bisect) and not _cuts(model, runtime):
        capable = ", ".join(name for name, cls in RUNNERS.items() if cls.exposes_intermediates)
        raise BadInputError(
            f"--layers: runtime {runtime!r} cannot show {model.name}'s intermediate tensors without changing what "
            f"it computes, nor run it cut at a layer; run --layers with {capable}"
        )
    return stamped_map(model, stamps)


def stamped_map(model: Path, stamps: dict[str, str]) -> LayerMap:
    text = stamps.get(LAYER_MAP)
    if text is None:
        raise BadInputError(
            f"{model.name} carries no layer map; export it again with pe-export (every export stamps one unless "
            "--no-layer-map), then run parity --layers"
        )
    return LayerMap.from_json(text, model.name)


def check_layers(
    model: Path,
    bundle: Bundle,
    runtime: str,
    options: dict[str, Any],
    tolerance: Tolerance,
    layer_map: LayerMap,
    progress: Any = None,
    bisect: bool = False,
) -> LayerReport:
    wanted = [spec.name for spec in bundle.layers]
    unmapped = {name: _why_unmapped(name, layer_map) for name in wanted if name not in layer_map.tensors}
    mapped = {name: layer_map.tensors[name] for name in wanted if name in layer_map.tensors}
    if _by_cut_files(runtime, options, bisect):
        return _bisected(model, bundle, runtime, options, tolerance, mapped, unmapped, progress)
    comparison = None
    with create_runner(runtime, model, **options, preserve_tensors=True) as runner:
        for batch in bundle.batches():
            raise_if_interrupted()
            runner.infer(batch.inputs)
            produced = runner.tapped(list(mapped.values()))
            if comparison is None:  # the same file every batch: a tensor it lacks is known from the first
                for name in [name for name, tensor in mapped.items() if tensor not in produced]:
                    unmapped[name] = f"the map names {mapped.pop(name)!r}, which the file does not compute"
                comparison = LayerComparison(mapped, tolerance, bundle.sequence_axes)
            comparison.update(produced, batch.layers, batch.valid)
            if progress:
                progress()
    return LayerReport([] if comparison is None else comparison.result(), unmapped, KERNELS.get(runtime, runtime))


def _by_cut_files(runtime: str, options: dict[str, Any], bisect: bool) -> bool:
    """Whether the layers are read from cut files: asked for (--bisect), or the runtime keeps none faithfully."""
    return bisect or not RUNNERS.get(runtime).keeps_intermediates(options)


def _cuts(model: Path, runtime: str) -> bool:
    """Whether ``runtime`` runs the cut files of ``model``'s format (layers/cut.py cuts .tflite and .onnx)."""
    suffix = model.suffix.lower()
    return suffix in (".tflite", ".onnx") and suffix in RUNNERS.get(runtime).file_suffixes


def _bisected(
    model: Path,
    bundle: Bundle,
    runtime: str,
    options: dict[str, Any],
    tolerance: Tolerance,
    mapped: dict[str, str],
    unmapped: dict[str, str],
    progress: Any,
) -> LayerReport:
    """The first layer over tolerance by bisection over cut files (a layer past a bad one is taken to be bad)."""
    import tempfile

    from pe_export.parity.layers.compare import with_growth
    from pe_export.parity.layers.cut import cut_file

    names, judged, sequence = list(mapped), {}, bundle.sequence_axes
    with tempfile.TemporaryDirectory(prefix="pe-export-cut-") as folder:
        cut = cut_file(model, Path(folder))

        def judge(index: int) -> bool:
            if index not in judged:
                name = names[index]
                path = cut(mapped[name])
                with create_runner(runtime, path, **options) as runner:
                    output = runner.output_names()[0]
                    comparison = LayerComparison({name: output}, tolerance, sequence)
                    for batch in bundle.batches():
                        raise_if_interrupted()
                        comparison.update(infer_rows(runner, batch.inputs), batch.layers, batch.valid)
                        if progress:
                            progress()
                (metrics,) = comparison.result()
                judged[index] = replace(metrics, tensor=mapped[name])
                path.unlink()
            return judged[index].ok

        low, high = 0, len(names) - 1
        if names and not judge(high):
            while low < high:  # the first bad layer is in [low, high]; high is bad
                middle = (low + high) // 2
                if judge(middle):
                    low = middle + 1
                else:
                    high = middle
    checked = [judged[index] for index in sorted(judged)]
    note = (
        f"{runtime}: the file cut at a layer and run as the runtime runs it, bisected: {len(checked)} of "
        f"{len(names)} layers run"
    )
    return LayerReport(with_growth(checked), unmapped, note)


def no_layers_in(bundle: Bundle) -> BadInputError:
    return BadInputError(
        f"bundle {bundle.path} holds no layer activations; write one with `pe-export golden SAVED_MODEL -o DIR "
        "--layers blocks` (or all, or a regular expression)"
    )


def _why_unmapped(name: str, layer_map: LayerMap) -> str:
    if name in layer_map.fused:
        return "fused: this file has no tensor of the float32 file's for it"
    if name in layer_map.unmapped:
        return "no tensor of the float32 file reproduced it (fused into another op)"
    return "not in the file's map (the bundle's model has a layer the exported graph does not)"
