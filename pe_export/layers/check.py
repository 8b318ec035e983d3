"""``parity --layers``: the file's layer tensors against the bundle's activations, on the device (TF-free).

The file's stamped layer map (pe_export/layers/mapping.py) says which tensor carries each layer; the runtime runs
with its intermediate tensors kept (a second pass: the outputs were judged by the runtime as it normally runs)
and each layer is judged by the output tolerance of the file's precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pe_export.errors import BadInputError
from pe_export.interrupts import raise_if_interrupted
from pe_export.layers.compare import LayerComparison
from pe_export.layers.mapping import LAYER_MAP, LayerMap
from pe_export.parity.bundle import Bundle
from pe_export.parity.result import LayerReport
from pe_export.parity.tolerances import Tolerance
from pe_export.runners.base import RUNNERS, create_runner

KERNELS = {
    "litert": "the interpreter's builtin kernels with every tensor kept (XNNPACK off: it keeps no intermediate)",
    "tflite-runtime": "the interpreter's builtin kernels with every tensor kept (XNNPACK off)",
    "tflite-tf": "the interpreter's builtin kernels with every tensor kept (XNNPACK off)",
    "onnxruntime": "the same session with every node's output also a graph output",
}


def layers_checkable(model: Path, stamps: dict[str, str], bundle: Bundle, runtime: str) -> LayerMap:
    """The file's layer map, once the file, the bundle and the runtime can all take part (before any work)."""
    if not bundle.layers:
        raise no_layers_in(bundle)
    if not RUNNERS.get(runtime).exposes_intermediates:
        capable = ", ".join(name for name, cls in RUNNERS.items() if cls.exposes_intermediates)
        raise BadInputError(
            f"--layers: runtime {runtime!r} cannot show a file's intermediate tensors without changing what it "
            f"computes; run --layers with {capable}"
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
) -> LayerReport:
    wanted = [spec.name for spec in bundle.layers]
    unmapped = {name: _why_unmapped(name, layer_map) for name in wanted if name not in layer_map.tensors}
    mapped = {name: layer_map.tensors[name] for name in wanted if name in layer_map.tensors}
    runner = create_runner(runtime, model, **options, preserve_tensors=True)
    comparison = LayerComparison(mapped, tolerance, bundle.sequence_layers)
    with runner:
        for batch in bundle.batches():
            raise_if_interrupted()
            runner.infer(batch.inputs)
            produced = runner.tapped(list(mapped.values()))
            for name, tensor in list(mapped.items()):
                if tensor not in produced:  # the map names a tensor this file does not have
                    unmapped[name] = f"the map names {tensor!r}, which the file does not compute"
                    del mapped[name]
            comparison = comparison if len(comparison.layers) == len(mapped) else comparison.only(mapped)
            comparison.update(produced, batch.layers, batch.valid)
            if progress:
                progress()
    return LayerReport(comparison.result(), unmapped, KERNELS.get(runtime, runtime))


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
