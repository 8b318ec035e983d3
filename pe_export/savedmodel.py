"""SavedModel loading, signatures, input specs, shape overrides and freezing (TensorFlow side)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pe_export.constants import DEFAULT_SIGNATURE
from pe_export.errors import BadInputError, one_line
from pe_export.graphdef import consumers_of, node_name
from pe_export.native import import_tensorflow
from pe_export.specs import TensorSpec

# Ops that pass integer indices through unchanged on the way to an embedding lookup.
# Pad: Longformer pads its ids to a multiple of its attention window with the pad id
_INDEX_PASSTHROUGH_OPS = {"Identity", "Cast", "ExpandDims", "Reshape", "Squeeze", "IdentityN", "Pad", "PadV2"}
_GATHER_OPS = {"GatherV2", "ResourceGather", "Gather"}
# Index arithmetic that keeps an id an id, by input position: keras-hub wraps negative ids as
# SelectV2(ids < 0, ids + rows, ids), and offsets or clips them.
_INDEX_KEEPING_OPS = {
    "SelectV2": (1, 2),
    "Select": (1, 2),
    "Add": (0, 1),
    "AddV2": (0, 1),
    "Minimum": (0, 1),
    "Maximum": (0, 1),
    "ClipByValue": (0,),
}


def is_savedmodel_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in ("saved_model.pb", "saved_model.pbtxt"))


def check_savedmodel_dir(path: Path) -> None:
    if not path.exists():
        raise BadInputError(f"{path} does not exist; expected a SavedModel directory")
    if not path.is_dir():
        raise BadInputError(f"{path} is a file; expected a SavedModel directory (keras.Model.export(path) writes one)")
    if not is_savedmodel_dir(path):
        raise BadInputError(
            f"{path} is not a SavedModel: no saved_model.pb inside; export the model with "
            "keras.Model.export(path) or tf.saved_model.save(obj, path)"
        )


def savedmodel_digest(path: Path) -> str:
    """sha256 over the graph and variable files, so a golden bundle can name its model."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != "fingerprint.pb")
    for file in files:
        digest.update(str(file.relative_to(path)).encode())
        with file.open("rb") as handle:  # streamed: a large model's variables file would be read whole
            for chunk in iter(lambda: handle.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()


def choose_signature(path: Path, names: list[str], name: str | None) -> str:
    """The signature to use of ``names`` (sorted): ``name``, else serving_default, else the first; checked to exist."""
    if not names:
        raise BadInputError(
            f"{path} has no serving signature; export it with keras.Model.export(path) or save it with signatures="
        )
    if name is None:
        return DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in names else names[0]
    if name not in names:
        raise BadInputError(f"signature {name!r} is not in {path}; it has: {', '.join(names)} (use --signature)")
    return name


@dataclass
class LoadedSavedModel:
    path: Path
    obj: Any  # the object tf.saved_model.load returned; keeps variables alive

    @property
    def signature_names(self) -> list[str]:
        return sorted(self.obj.signatures.keys())

    def resolve_signature_name(self, name: str | None) -> str:
        return choose_signature(self.path, self.signature_names, name)

    def signature(self, name: str | None) -> Any:
        return self.obj.signatures[self.resolve_signature_name(name)]


def load_savedmodel(path: Path) -> LoadedSavedModel:
    path = Path(path)
    check_savedmodel_dir(path)
    tf = import_tensorflow()
    try:
        obj = tf.saved_model.load(str(path))
    except Exception as err:  # TF raises several types for a damaged SavedModel
        first = one_line(err)
        raise BadInputError(f"{path} could not be loaded as a SavedModel: {first}") from err
    return LoadedSavedModel(path, obj)


def signature_input_specs(signature: Any) -> list[TensorSpec]:
    _, kwargs = signature.structured_input_signature
    return [
        TensorSpec(name, spec.dtype.as_numpy_dtype.__name__, tuple(spec.shape.as_list()))
        for name, spec in sorted(kwargs.items())
    ]


def signature_output_specs(signature: Any) -> list[TensorSpec]:
    outputs = signature.structured_outputs
    return [
        TensorSpec(name, spec.dtype.as_numpy_dtype.__name__, tuple(spec.shape.as_list()))
        for name, spec in sorted(outputs.items())
    ]


def signature_function(signature: Any, specs: list[TensorSpec]) -> Any:
    """A tf.function calling ``signature`` with inputs of the given (possibly new) shapes."""
    tf = import_tensorflow()
    names = [spec.name for spec in specs]
    tf_specs = [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec in specs]

    def call(*args: Any) -> Any:
        return signature(**dict(zip(names, args, strict=True)))

    return tf.function(call, input_signature=tf_specs, autograph=False)


def wrap_signature(signature: Any, specs: list[TensorSpec]) -> Any:
    """The concrete function of :func:`signature_function`, or a one-line error when shapes conflict."""
    try:
        return signature_function(signature, specs).get_concrete_function()
    except (ValueError, TypeError) as err:
        wanted = ", ".join(spec.describe() for spec in specs)
        raise BadInputError(
            f"the SavedModel's signature does not accept inputs {wanted}: "
            f"{one_line(err)}; drop --seq-len/--dynamic-seq/--batch or match the "
            "model's own shapes"
        ) from err


def frozen_function(concrete: Any) -> Any:
    """The concrete function with variables and captured tensors as constants, calls inlined."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    return convert_variables_to_constants_v2(concrete)


def frozen_graph_def(concrete: Any) -> Any:
    """Plain freezing's GraphDef, its weights named by their variables as the export's own graph names them."""
    from pe_export.weights import captured_variables, stable_capture_names

    graph_def = frozen_function(concrete).graph.as_graph_def()
    stable_capture_names(graph_def, captured_variables(concrete))
    return graph_def


def input_masks(frozen: FrozenSignature, bounds: dict[str, int]) -> frozenset[str]:
    """The integer or boolean inputs that are padding masks, from how the graph uses them (input_roles.py)."""
    from pe_export.input_roles import mask_inputs

    names = [s.name for s in frozen.specs if s.has_sequence and (s.is_integer or s.dtype == "bool")]
    if not names:
        return frozenset()
    return mask_inputs(frozen.graph()[0], names, bounds)


def integer_input_bounds(graph_def: Any, input_names: list[str]) -> dict[str, int]:
    """For integer inputs that index an embedding table: the table's row count (exclusive bound).

    Follows each input through casts and reshapes to the gather it feeds, and reads the
    gathered constant's first dimension. Inputs that feed no gather are left out.
    """
    nodes = {node.name: node for node in graph_def.node}
    consumers = consumers_of(graph_def)
    bounds: dict[str, int] = {}
    for name in input_names:
        frontier, seen = [name], set()
        while frontier:
            current = frontier.pop()
            if current in seen:
                continue
            seen.add(current)
            for node, position in consumers.get(current, []):
                if node.op in _GATHER_OPS and position == 1:
                    table = nodes.get(node_name(node.input[0]))
                    while table is not None and table.op == "Identity":  # a frozen variable read
                        table = nodes.get(node_name(table.input[0]))
                    rows = _const_rows(table)
                    if rows:
                        bounds[name] = min(bounds.get(name, rows), rows)
                elif (node.op in _INDEX_PASSTHROUGH_OPS and position == 0) or position in _INDEX_KEEPING_OPS.get(
                    node.op, ()
                ):
                    frontier.append(node.name)
    return bounds


def _const_rows(node: Any) -> int | None:
    """Rows of a frozen weight (a Const, or a stand-in for one)."""
    from pe_export.weights import stored_shape

    dims = stored_shape(node)
    return dims[0] if dims else None


class FrozenSignature:
    """One signature at given input specs, traced once and frozen once, when first asked.

    Input bounds, the table pipeline and both converters read the same frozen graph, frozen without its large
    weights (pe_export/weights.py: stand-ins, bound only for a converter), so analysing and rewriting it copies
    no weight. ``name`` is the signature's key, where the plain SavedModel path may be converted as it is.
    """

    def __init__(
        self, signature: Any, specs: list[TensorSpec], *, name: str | None = None, min_stand_in_bytes: int | None = None
    ) -> None:
        from pe_export.weights import MIN_STAND_IN_BYTES, WeightStore

        self.signature, self.specs, self.name = signature, specs, name
        self.min_stand_in_bytes = MIN_STAND_IN_BYTES if min_stand_in_bytes is None else min_stand_in_bytes
        self._concrete: Any = None
        self._frozen: tuple[Any, dict[str, str], dict[str, str]] | None = None
        self.weights = WeightStore()

    @property
    def concrete(self) -> Any:
        if self._concrete is None:
            self._concrete = wrap_signature(self.signature, self.specs)
        return self._concrete

    @property
    def native_specs(self) -> bool:
        """True when the export keeps the signature's own input specs (no --seq-len, --batch, --dynamic-seq)."""
        return self.specs == signature_input_specs(self.signature)

    def graph(self) -> tuple[Any, dict[str, str], dict[str, str]]:
        """(GraphDef with weight stand-ins, inputs, outputs), tensor names mapped to the signature's names.

        Do not modify it; ``weights.bind`` gives a converter a copy with the weights in.
        """
        if self._frozen is None:
            from pe_export.weights import weightless_freeze

            concrete = self.concrete
            graph_def, self.weights, input_tensors = weightless_freeze(concrete, self.min_stand_in_bytes)
            inputs = {tensor: node_name(tensor) for tensor in input_tensors}
            keys = sorted(concrete.structured_outputs)  # a signature returns a flat dict, flattened sorted
            outputs = {tensor.name: key for tensor, key in zip(concrete.outputs, keys, strict=True)}
            self._frozen = (graph_def, inputs, outputs)
        return self._frozen


def input_bounds(frozen: FrozenSignature) -> dict[str, int]:
    """Exclusive upper bounds of integer inputs that index tables (vocabulary, segment types)."""
    if not any(spec.is_integer for spec in frozen.specs):
        return {}
    return integer_input_bounds(frozen.graph()[0], [spec.name for spec in frozen.specs])
