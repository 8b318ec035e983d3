"""Which tensor of an exported file carries each layer of the reference, proven by values (numpy only).

At export the float32 file runs with its intermediate tensors kept beside the reference's layer activations on
the same inputs; a layer maps to a file tensor only where that tensor reproduces the activation within the
float32 tolerance (same element count, reshaped to the layer's shape). Names only order the search: the
converters name most tensors after the TensorFlow op that made them. A quantized or float16 file of the same
graph takes the float32 map over where a tensor of the same name and size exists; the layers it fused away are
listed. The map is stamped in the file (``LAYER_MAP``), so the device needs nothing but the file and the bundle.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from pe_export.errors import BadInputError
from pe_export.inspection.tflite_metadata import LAYER_MAP_KEY
from pe_export.parity.tolerances import FP32_TOLERANCE, Tolerance

LAYER_MAP = LAYER_MAP_KEY  # metadata key (tflite_metadata reads it whatever its size)
_CALL_SCOPE = re.compile(r"^((Stateful)?PartitionedCall(_\d+)?/)+")
_PROBES = 64  # elements compared first, to set most wrong candidates aside cheaply


@dataclass(frozen=True)
class LayerMap:
    tensors: dict[str, str]  # layer → the file's tensor, in graph order
    unmapped: tuple[str, ...] = ()  # layers no tensor of the float32 file reproduced
    fused: tuple[str, ...] = ()  # mapped in the float32 file; this file has no tensor of that name and size
    source: str = "values"  # "values": proven on this file; "float32 file": carried over by name

    def to_json(self) -> str:
        return json.dumps(
            {
                "tensors": self.tensors,
                "unmapped": list(self.unmapped),
                "fused": list(self.fused),
                "source": self.source,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> LayerMap:
        try:
            data = json.loads(text)
            tensors = data["tensors"]
            if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
                raise TypeError("tensors")
            return cls(
                dict(tensors),
                tuple(str(n) for n in data.get("unmapped", [])),
                tuple(str(n) for n in data.get("fused", [])),
                str(data.get("source", "values")),
            )
        except (ValueError, TypeError, KeyError) as err:
            raise BadInputError(
                f"{where}: its layer map ({LAYER_MAP}) is damaged ({err}); re-export the file"
            ) from None


def op_path(graph_tensor: str) -> str:
    """A graph tensor's op path without the call scopes and output index: what converters name tensors after."""
    return _CALL_SCOPE.sub("", graph_tensor).rsplit(":", 1)[0]


def match_layers(
    reference: dict[str, np.ndarray],
    graph_tensors: dict[str, str],
    candidates: dict[str, np.ndarray],
    tolerance: Tolerance = FP32_TOLERANCE,
) -> LayerMap:
    """Map each layer of ``reference`` (layer → activation, in graph order; ``graph_tensors``: layer → its graph
    tensor) to the one of ``candidates`` (file tensor → value, same inputs) that reproduces it."""
    by_size: dict[int, list[str]] = {}
    for name, value in candidates.items():
        if value.dtype.kind == "f":
            by_size.setdefault(value.size, []).append(name)
    tensors, unmapped = {}, []
    for layer, expected in reference.items():
        hint = op_path(graph_tensors.get(layer, ""))
        pool = sorted(by_size.get(expected.size, []), key=lambda name: _distance(name, hint))
        found = next((name for name in pool if _reproduces(candidates[name], expected, tolerance)), None)
        if found is None:
            unmapped.append(layer)
        else:
            tensors[layer] = found
    return LayerMap(tensors, tuple(unmapped))


def carried_over(float_map: LayerMap, sizes: dict[str, int], float_sizes: dict[str, int]) -> LayerMap:
    """``float_map`` for a file of the same graph at another precision, whose tensors are ``sizes`` (name →
    elements): a layer keeps its tensor where this file has one of that name and size."""
    kept, fused = {}, []
    for layer, tensor in float_map.tensors.items():
        if sizes.get(tensor) == float_sizes.get(tensor):
            kept[layer] = tensor
        else:
            fused.append(layer)
    return LayerMap(kept, float_map.unmapped, tuple(fused), source="float32 file")


def _distance(name: str, hint: str) -> int:
    """0: the file tensor is named after the layer's op; 1: a fused name that lists it; 2: the name says nothing."""
    if not hint:
        return 2
    parts = [re.sub(r":\d+$", "", part) for part in name.split(";")]
    if any(part == hint or part.endswith("/" + hint) or hint.endswith("/" + part) for part in parts):
        return 0
    return 1 if any(hint in part for part in parts) else 2


def _reproduces(actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance) -> bool:
    flat_a, flat_e = actual.reshape(-1), expected.reshape(-1)  # in their own dtype: no float64 copies
    probes = np.linspace(0, flat_e.size - 1, min(_PROBES, flat_e.size)).astype(np.int64)
    if not _close(flat_a[probes], flat_e[probes], tolerance):
        return False
    return _close(flat_a, flat_e, tolerance) and bool(np.any(flat_e != 0) or not np.any(flat_a != 0))


def _close(a: np.ndarray, e: np.ndarray, tolerance: Tolerance) -> bool:
    return bool(np.all(np.abs(a - e) <= tolerance.atol + tolerance.rtol * np.abs(e)))
