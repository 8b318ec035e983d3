"""At export: the layer map of the file, proven on its float32 form, stamped in it (TensorFlow side).

The reference's activations at every layer boundary (``all``) are computed on the export's first check inputs;
the float32 file of the same graph (the file itself, or for another precision one converted beside it) runs with
its tensors kept, and each layer maps to the tensor that reproduces it (pe_export/parity/layers/mapping.py). A quantized
or float16 file takes that map over by tensor name.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.parity.layers.mapping import LayerMap, carried_over, match_layers
from pe_export.parity.layers.select import ALL
from pe_export.parity.layers.tap import LayerTap

RUNTIMES = {"tflite": "litert", "onnx": "onnxruntime"}
# Which tensor carries a layer does not depend on the length: a dynamic-length file is mapped on one sample of this
# many positions (MiniLM at its 512 checked positions: +30 s and +3 GB for the map; at 32 positions, about 2 s).
MAP_POSITIONS = 32


def layer_map_for(
    job: Any, data: Any, file_format: str, float_file: bytes | None = None
) -> tuple[LayerMap | None, str | None]:
    """(the map, None) for the exported ``data``; (None, why) where it cannot be proven here. ``float_file``: the
    float32 file of the same graph the conversion made on the way (else one is converted here)."""
    if not isinstance(data, bytes):
        return None, "none: a file past 2 GiB is not run with its tensors kept here"
    feeds, _ = job.check_feeds()
    feed = _short(next(iter(feeds.values())), job.specs)
    tap = LayerTap(job.frozen, ALL)
    reference = tap.activations(feed)
    if not reference:
        return None, "none: the graph has no layer boundaries (name scopes that hand on one activation)"
    graph_tensors = {layer.name: layer.tensor for layer in tap.layers}
    float_data = data if job.options.precision == "fp32" else float_file or _float_file(job, file_format)
    if not isinstance(float_data, bytes):
        return None, "none: its float32 file is past 2 GiB"
    float_tensors = _tensors(float_data, file_format, feed, None)
    float_map = match_layers(reference, graph_tensors, float_tensors)
    if float_data is data:
        return float_map, None
    here = _tensors(data, file_format, feed, list(float_map.tensors.values()))
    sizes = {name: value.size for name, value in here.items() if value.dtype.kind == "f"}  # real numbers only
    return carried_over(float_map, sizes, {name: value.size for name, value in float_tensors.items()}), None


def _short(feed: dict[str, np.ndarray], specs: list[Any]) -> dict[str, np.ndarray]:
    """The first sample, and its first MAP_POSITIONS positions where every input's length is dynamic."""
    dynamic = {spec.name: spec for spec in specs}
    batch_open = all(spec.shape and spec.shape[0] is None for spec in specs)
    length_open = all(spec.dynamic_length for spec in specs)
    short = {}
    for name, value in feed.items():
        part = value[:1] if batch_open else value
        if length_open and dynamic[name].has_sequence:
            part = part[:, :MAP_POSITIONS]
        short[name] = np.ascontiguousarray(part)
    return short


def _float_file(job: Any, file_format: str) -> Any:
    """The same graph converted at float32 (the tables as the export rebuilt them)."""
    options = replace(job.options, quantize="none", keep_float=())
    if file_format == "tflite":
        from pe_export.converters.tflite.convert import convert_tflite

        return convert_tflite(job.loaded, job.frozen, options, prepared=job.rewritten)[0]
    from pe_export.converters.onnx.convert import convert_onnx

    return convert_onnx(job.frozen, options, prepared=job.rewritten)[0]


def _tensors(data: bytes, file_format: str, feed: dict[str, np.ndarray], names: list[str] | None) -> dict[str, Any]:
    from pe_export.runners import create_runner

    # From the bytes in memory: the file is not written to be read back (BERT-base: 1 s of disk I/O)
    with create_runner(
        RUNTIMES[file_format], Path(f"model.{file_format}"), serialized=data, preserve_tensors=True
    ) as runner:
        runner.infer(feed)
        return runner.tapped(names)
