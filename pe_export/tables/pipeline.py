"""Find, plan and rewrite position tables for an export (TensorFlow side)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pe_export.constants import MAX_COMPRESS, MAX_SEQ_LEN, TABLE_DTYPES
from pe_export.errors import BadInputError, check_range
from pe_export.graphdef import const_value, node_name
from pe_export.specs import any_fixed_length
from pe_export.tables.detect import TableInfo, find_tables, position_axis
from pe_export.tables.methods import METHODS, Compressed, get_method
from pe_export.tables.sinusoid import fit_sinusoid, sinusoid_values

POSITIONLESS_KINDS = ("relative", "relative-bucket")  # table kinds indexed by distance, not by absolute position
COMPRESS_METHODS = tuple(METHODS.choices())  # the CLI choices come from the registry


@dataclass(frozen=True)
class TableOptions:
    compress: int | None = None  # K: at most K stored values per position
    method: str = "auto"
    table_dtype: str = "float32"
    max_len: int | None = None
    allow_lossy: bool = False
    names: tuple[str, ...] = ()  # --table NAME: also treat these as learned position tables
    list_only: bool = False
    # auto takes a lossy method only when the table's own error stays within this (the export
    # precision's atol, set by the API); tables named in ``keep`` stay as they are (an auto choice
    # that the end-to-end check then refused).
    lossy_atol: float = 0.0
    keep: tuple[str, ...] = ()

    @property
    def rewrites(self) -> bool:
        return (
            self.compress is not None
            or self.method != "auto"
            or self.table_dtype != "float32"
            or self.max_len is not None
        )

    @property
    def active(self) -> bool:
        return self.rewrites or self.list_only or bool(self.names)

    def validate(self) -> None:
        if self.method not in COMPRESS_METHODS:
            raise BadInputError(
                f"--compress-method {self.method!r} is unknown; expected one of: {', '.join(COMPRESS_METHODS)}"
            )
        if self.table_dtype not in TABLE_DTYPES:
            raise BadInputError(f"--table-dtype {self.table_dtype!r}; expected one of: {', '.join(TABLE_DTYPES)}")
        check_range("--compress", self.compress, 1, MAX_COMPRESS, " values per position")
        check_range("--max-len", self.max_len, 2, MAX_SEQ_LEN)


@dataclass
class TableResult:
    table: TableInfo
    method: str  # "kept" when the table is left as it was
    exact: bool
    bytes_before: int
    bytes_after: int
    max_error: float  # the rebuilt table against the original (or the formula, for --max-len)
    rows: int
    notes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    compressed: Compressed | None = field(default=None, repr=False)

    @classmethod
    def unchanged(cls, table: TableInfo, rows: int, why: str | None = None) -> TableResult:
        """The table stored as it was (method "kept"), with the reason where one is worth reporting."""
        return cls(table, "kept", True, table.nbytes, table.nbytes, 0.0, rows, notes={"kept:": why} if why else {})

    def kept(self, why: str) -> TableResult:
        """This table as left in the file after all: stored as it was."""
        return TableResult.unchanged(self.table, self.rows, why)

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)


def plan_table(table: TableInfo, options: TableOptions) -> TableResult:
    rows = table.rows
    length = rows.shape[0]
    result_warnings: list[str] = []
    wanted, exact = rows, rows
    if options.max_len is not None and options.max_len != length:
        if table.fit is not None:
            wanted = exact = sinusoid_values(np.arange(options.max_len), table.fit.frequencies, table.fit.phases)
        else:
            wanted = exact = _resample_rows(rows, options.max_len)
            result_warnings.append(
                f"{table.name}: learned table stretched from {length} to {options.max_len} rows by linear "
                "interpolation — an approximation, not what the model was trained with"
            )
    within_budget = options.compress is not None and rows.shape[1] <= options.compress
    plain_otherwise = options.method == "auto" and options.table_dtype == "float32" and wanted is rows
    if not options.rewrites or (within_budget and plain_otherwise) or table.kind in POSITIONLESS_KINDS:
        # Nothing asked, the table already stores no more than K values per position, or it is a
        # relative table read by distance (small: 2K+1 rows), which is kept as it is.
        return TableResult.unchanged(table, length)
    if table.node in options.keep:
        return TableResult.unchanged(table, length, "a lossy auto choice broke the export's tolerance (see the note)")
    method = options.method
    if method == "auto":
        method = _auto_method(wanted, table, options)
        if method == "svd" and not options.allow_lossy:
            trial = _lossy_trial(table, wanted, exact, options)
            if trial is not None:
                return trial
    compressed = get_method(method).plan(wanted, table.fit, options.compress if method != "none" else None)
    if compressed is None:
        why = "it is not a sinusoid" if method == "angle" and table.fit is None else "it does not fit the budget"
        raise BadInputError(
            f"--compress-method {method} cannot serve table {table.name} ({table.kind}, {table.shape}): {why}; "
            "use --compress-method auto, svd or a larger --compress"
        )
    storage = np.dtype(options.table_dtype)
    stored = {
        k: (v.astype(storage).astype(np.float64) if np.issubdtype(v.dtype, np.floating) else v)
        for k, v in compressed.arrays.items()
    }
    rebuilt = compressed.rebuild(np.arange(wanted.shape[0]), stored)
    error = float(np.max(np.abs(rebuilt - exact)))
    if not np.isfinite(rebuilt).all():
        raise BadInputError(f"table {table.name}: the {method} rebuild in {options.table_dtype} is not finite")
    return TableResult(
        table=table,
        method=method,
        exact=compressed.exact and options.table_dtype == "float32",
        bytes_before=table.nbytes,
        bytes_after=compressed.stored_bytes(storage.itemsize),
        max_error=error,
        rows=wanted.shape[0],
        notes=compressed.notes,
        warnings=result_warnings,
        compressed=compressed,
    )


def _lossy_trial(table: TableInfo, wanted: np.ndarray, exact: np.ndarray, options: TableOptions) -> TableResult | None:
    """auto with no exact method in the budget: the SVD at the budget is taken only when the table's own
    error stays within ``lossy_atol``; otherwise the table is kept and the trade-off reported."""
    plan = get_method("svd").plan(wanted, table.fit, options.compress)
    if plan is None:
        return TableResult.unchanged(table, wanted.shape[0], f"no method fits {options.compress} values per position")
    error = float(np.max(np.abs(plan.rebuild(np.arange(wanted.shape[0]), plan.arrays) - exact)))
    if error <= options.lossy_atol:
        return None  # within the precision's tolerance: take it (the export's parity check confirms)
    bytes_after = plan.stored_bytes(np.dtype(options.table_dtype).itemsize)
    rank, energy = plan.notes["rank"], plan.notes["energy_kept"]
    return TableResult.unchanged(
        table,
        wanted.shape[0],
        f"svd rank {rank} would store {bytes_after:,} B, keep {energy:.1%} of the energy and err {error:.3g} "
        f"(over atol {options.lossy_atol:g}); --compress-method svd --allow-lossy takes it",
    )


def _auto_method(wanted: np.ndarray, table: TableInfo, options: TableOptions) -> str:
    """The exact method that fits, else the best lossy one (never the seed's recipe unasked)."""
    if options.compress is None:
        return "none"
    for name in ("angle", "svd"):
        plan = get_method(name).plan(wanted, table.fit, options.compress)
        if plan is not None and plan.exact:
            return name
    return "svd"


def _resample_rows(rows: np.ndarray, length: int) -> np.ndarray:
    old = np.linspace(0.0, 1.0, rows.shape[0])
    new = np.linspace(0.0, 1.0, length)
    return np.stack([np.interp(new, old, rows[:, c]) for c in range(rows.shape[1])], axis=1)


@dataclass
class PreparedGraph:
    folded: Any  # the frozen, constant-folded GraphDef
    inputs: dict[str, str]  # graph tensor → user name
    outputs: dict[str, str]
    tables: list[TableInfo]
    results: list[TableResult]
    replacements: dict[str, tuple[Compressed, tuple[int, ...], int, str]] = field(default_factory=dict)
    anchor: tuple[str, str, tuple[int | None, ...]] = ("", "", ())
    prefix_only: set[str] = field(default_factory=set)
    unfolded: int = 0  # relative gathers kept at run time (tables/graph.py gathers_at_run_time)
    arithmetic: int = 0  # conditions folded and indices frozen into tables by distance (tables/arithmetic.py)

    def position_length(self) -> int | None:
        """How many positions the model and this graph both serve: the fewest rows of any table read by
        position (a table rebuilt with other rows counts with the fewer), or None without such tables.

        Relative tables are indexed by distance and bound nothing.
        """
        lengths = []
        for table in self.tables:
            if table.kind in POSITIONLESS_KINDS:
                continue
            rows = int(np.prod(table.shape[:-1]))
            if table.node in self.replacements:
                rows = min(rows, self.replacements[table.node][2])
            lengths.append(rows)
        return min(lengths) if lengths else None

    def graph_def(self, file_format: str) -> Any:
        """The GraphDef to convert for "tflite" or "onnx", with every planned table rebuilt at run time.

        ONNX rebuilds every row: after conversion the rebuild is made constant-only, for onnxruntime to fold
        once at load (pe_export/converters/onnx/rewrites.py rebuild_tables_at_load); rows cut to the sequence length
        would keep it per call."""
        from pe_export.tables.graph import splice_rebuild

        if not self.replacements:
            return self.folded
        prefix_only = self.prefix_only if file_format == "tflite" else set()
        return splice_rebuild(self.folded, self.replacements, self.anchor, file_format, prefix_only)


def position_rows(loaded: Any, frozen: Any) -> int | None:
    """Rows of the tables the model reads by position, None without any (the tokens it takes: lengths.model_limit)."""
    return prepare_graph(loaded, frozen, TableOptions(list_only=True)).position_length()


def fixed_length(frozen: Any) -> bool:
    """True when the signature (a FrozenSignature) has a fixed sequence axis: there, folding can turn tables
    computed or gathered at run time into constants."""
    return any_fixed_length(frozen.specs)


def folds_relative_gather(frozen: Any) -> bool:
    """True when a fixed length would let the converters fold a relative-position gather into a T×T×d constant."""
    from pe_export.tables.graph import relative_gathers

    return fixed_length(frozen) and bool(relative_gathers(frozen.graph()[0]))


def prepare_graph(
    loaded: Any, frozen: Any, options: TableOptions, *, arithmetic: bool = False, arithmetic_limit: int | None = None
) -> PreparedGraph:
    """``frozen`` is the signature's FrozenSignature (pe_export.savedmodel). ``arithmetic``: position arithmetic
    is frozen first (tables/arithmetic.py), for a model taking ``arithmetic_limit`` tokens at most (None: any)."""
    from pe_export.tables.graph import (
        fold_constants,
        gathers_at_run_time,
        hybrid_sums,
        materialize_static_dims,
        prefix_slices_only,
        relative_gathers,
    )

    options.validate()
    graph_def, inputs, outputs = frozen.graph()
    arithmetic_results: list[TableResult] = []
    arithmetic_changes = 0
    if arithmetic:
        graph_def, arithmetic_results, arithmetic_changes = _frozen_arithmetic(
            graph_def, inputs, outputs, frozen, arithmetic_limit
        )
    original = {
        node.name: const_value(node)
        for node in graph_def.node
        if node.op == "Const"
        and node.attr["dtype"].type in (1, 19)
        and len(node.attr["value"].tensor.tensor_shape.dim) >= 2
    }
    hybrids = hybrid_sums(graph_def)
    anchor_tensor = next(iter(inputs))
    anchor_spec = next(s for s in frozen.specs if s.name == inputs[anchor_tensor])
    anchor = (node_name(anchor_tensor), anchor_spec.dtype, anchor_spec.shape)
    # Relative tables gathered by a distance index stay gathers (no T×T×d constant), asked or not.
    relatives = relative_gathers(graph_def) if fixed_length(frozen) else []  # dynamic: nothing can fold them
    graph_def = gathers_at_run_time(graph_def, relatives, anchor)
    input_nodes, output_nodes = [node_name(n) for n in inputs], [node_name(n) for n in outputs]
    folded = fold_constants(materialize_static_dims(graph_def), input_nodes, output_nodes)
    variables = {  # read when a candidate's shape matches (tables/detect.py), not copied up front
        getattr(v, "path", None) or node_name(v.name): v
        for v in getattr(loaded.obj, "variables", [])
        if len(v.shape) >= 2
    }
    tables = find_tables(
        folded,
        original_consts=original,
        variables=variables,
        hybrids=hybrids,
        wanted=options.names,
    )
    missing = [name for name in options.names if not any(name in t.name or name in t.node for t in tables)]
    if missing:
        raise BadInputError(f"--table {', '.join(missing)}: no constant or variable of that name is a 2-D table")
    folded_away = [plan_table(t, TableOptions()) for t in _folded_relative_tables(graph_def, folded, variables, tables)]
    arithmetic_results = folded_away + arithmetic_results  # listed, and kept: the projections hold their rows
    if options.list_only:
        listed = [plan_table(t, TableOptions()) for t in tables] + arithmetic_results
        return PreparedGraph(
            folded, inputs, outputs, tables, listed, unfolded=len(relatives), arithmetic=arithmetic_changes
        )
    results = [plan_table(table, options) for table in tables]
    for result in results:
        for message in result.warnings:
            warnings.warn(message, stacklevel=2)
    replacements = {}
    for result in results:
        if result.compressed is None:
            continue
        shape = list(result.table.shape)
        shape[position_axis(shape)] = result.rows
        replacements[result.table.node] = (result.compressed, tuple(shape), result.rows, options.table_dtype)
    prefix_only = set()
    if len(anchor_spec.shape) >= 2:
        prefix_only = {name for name in replacements if prefix_slices_only(folded, name)}
    return PreparedGraph(
        folded,
        inputs,
        outputs,
        tables,
        results + arithmetic_results,
        replacements,
        anchor,
        prefix_only,
        len(relatives),
        arithmetic_changes,
    )


def _folded_relative_tables(
    before: Any, folded: Any, variables: dict[str, Any], found: list[TableInfo]
) -> list[TableInfo]:
    """Relative tables that constant folding merged into their projections, as listed (DeBERTa-v2's
    ``rel_embeddings``: normalised, projected per head, then the scores it makes gathered by bucketed distances;
    folded into a [heads, rows, head width] constant no longer a table). Read from the graph before folding; not
    compressible, since no graph node holds their rows any more."""
    from pe_export.graphdef import GraphIndex
    from pe_export.tables.detect import origin, table_dims
    from pe_export.tables.uses import RELATIVE, uses_of

    kept = {node.name for node in folded.node}
    graph = GraphIndex(before)
    found_rows = [table.value.reshape(-1, table.value.shape[-1]) for table in found]
    # a relative table found after folding (normalised, repeated: keras-hub's DeBERTa-v3) is this one already
    relative_shapes = {tuple(table_dims(list(table.shape)) or ()) for table in found if table.kind == "relative"}
    listed = []
    for node in before.node:
        if node.op != "Const" or node.name in kept or node.attr["dtype"].type not in (1, 19):
            continue
        dims = table_dims([d.size for d in node.attr["value"].tensor.tensor_shape.dim])
        if dims is None:
            continue
        uses = uses_of(graph, node.name, dims[0])
        if not uses or {use.role for use in uses} != {RELATIVE}:
            continue
        value = const_value(node)
        rows = value.reshape(-1, value.shape[-1])
        if tuple(dims) in relative_shapes or any(_same_leading_rows(rows, other) for other in found_rows):
            continue  # found after folding too, under another node (repeated, sliced): listed once
        name = origin(rows, variables)
        info = TableInfo(
            node.name,
            name or node.name.split("StatefulPartitionedCall/")[-1],
            "variable" if name else "constant",
            "relative",
            tuple(value.shape),
            str(value.dtype),
            value,
            notes=[uses[0].reason, "folded into its projections by constant folding: kept as they hold it"],
        )
        listed.append(info)
    return listed


def _same_leading_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether one table's rows start the other's (the same width)."""
    if a.shape[-1] != b.shape[-1]:
        return False
    rows = min(len(a), len(b))
    return bool(np.array_equal(a[:rows], b[:rows]))


def _computed_at_run_time(graph_def: Any, inputs: dict[str, str], weights: Any, limit: int | None) -> list[TableResult]:
    """Sinusoid and rotary tables the graph computes from positions at run time, listed (kept as they are)."""
    from pe_export.tables.arithmetic import LISTING_LENGTH, computed_tables
    from pe_export.tables.detect import table_dims

    results = []
    for tensor, value in computed_tables(graph_def, inputs, weights, limit):
        squeezed = table_dims(list(value.shape))
        rows = value.reshape(-1, value.shape[-1]).astype(np.float64)
        fit = fit_sinusoid(rows) if squeezed is not None else None
        if fit is None:
            continue
        kind = {"cos-cache": "rotary-cos", "sin-cache": "rotary-sin"}.get(fit.layout, f"sinusoid-{fit.layout}")
        name = tensor.rsplit(":", 1)[0].split("StatefulPartitionedCall/")[-1]
        info = TableInfo(tensor, name, "run time", kind, tuple(value.shape), str(value.dtype), value, fit)
        info.notes.append(f"computed from positions at run time in builtins (shown at {LISTING_LENGTH} positions)")
        results.append(TableResult.unchanged(info, squeezed[0] if squeezed else 0))
    return results


def _frozen_arithmetic(
    graph_def: Any, inputs: dict[str, str], outputs: dict[str, str], frozen: Any, limit: int | None
) -> tuple[Any, list[TableResult], int]:
    """The graph with its position arithmetic frozen, a result per table made, and how many changes."""
    from pe_export.tables.arithmetic import rewrite_position_arithmetic

    rewrite = rewrite_position_arithmetic(graph_def, inputs, [node_name(o) for o in outputs], frozen.weights, limit)
    results = _computed_at_run_time(rewrite.graph_def, inputs, frozen.weights, limit)
    for table in rewrite.tables:
        if table.shape_type is not None:
            continue
        info = TableInfo(
            node=table.tensor,
            name=table.tensor.rsplit(":", 1)[0].split("StatefulPartitionedCall/")[-1],
            source="computed",
            kind="relative-bucket",
            shape=(table.values.size,),
            dtype=str(table.values.dtype),
            value=table.values,
            notes=[f"gathered by distance: position arithmetic computed in float, frozen ({table.describe()})"],
        )
        why = f"an index computed in float from positions, frozen by distance ({table.describe()})"
        nbytes = table.values.nbytes
        results.append(TableResult(info, "frozen", True, 0, nbytes, 0.0, table.values.size, notes={"frozen:": why}))
    return rewrite.graph_def, results, rewrite.folded_conditions + len(rewrite.tables)
