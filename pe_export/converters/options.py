"""Export options shared by both converters, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pe_export.constants import (
    DEFAULT_ONNX_OPSET,
    MAX_BATCH,
    MAX_ONNX_OPSET,
    MAX_OUTLIER_CHANNELS,
    MAX_SEQ_LEN,
    MIN_ONNX_OPSET,
    ONNX_INT8_KERNEL,
    ONNX_INT8_KERNELS,
    OUTLIER_CHANNELS,
)
from pe_export.errors import BadInputError, check_range
from pe_export.parity.tolerances import Tolerance, tolerance_for
from pe_export.precisions import Precision, judged_at, precision
from pe_export.specs import BATCH_AXIS, SEQUENCE_AXIS, TensorSpec
from pe_export.tables.pipeline import TableOptions
from pe_export.text_inputs import TextInputs


@dataclass(frozen=True)
class ExportOptions:
    signature: str | None = None
    seq_len: int | None = None  # fix the sequence axis to this length
    dynamic_seq: bool = False  # make the sequence axis dynamic
    batch: int | None = None  # fix the batch axis; None keeps the SavedModel's
    quantize: str = "none"
    builtins_only: bool = False  # TFLite: refuse select TF (Flex) ops
    opset: int = DEFAULT_ONNX_OPSET  # ONNX only
    fuse: bool = True  # ONNX: LayerNorms and Tensordots as single ops (pe_export/converters/onnx/fusions.py)
    verify: bool = True
    overwrite: bool = False
    keep_failed: bool = False  # a file that fails verification is kept as NAME.FAILED.ext instead of dropped
    tables: TableOptions = field(default_factory=TableOptions)  # find / compress / retarget position tables
    text: TextInputs | None = None  # --text FILE (--tokenizer): real inputs to verify, calibrate and judge on
    inputs: Path | None = None  # --inputs FILE.npz: the same, as arrays by input name (samples on axis 0)
    holdout: Path | None = None  # --holdout FILE: held-out samples (as --text or --inputs) that judge int8's choices
    min_cosine: float | None = None  # ask more than the precision's default cosine (verification, int8 target)
    keep_float: tuple[str, ...] = ()  # --keep-float NAME: dynamic-int8 weights left float, ONNX float16 nodes float32
    keep_int16: tuple[str, ...] = ()  # --keep-int16 NAME: TFLite full-integer activations kept int16
    outlier_channels: int | None = None  # ONNX dynamic-int8: channels per MatMul input in float beside int8
    int8_kernel: str | None = None  # ONNX dynamic-int8's integer products: one of constants.ONNX_INT8_KERNELS
    force: bool = False  # export even where the memory estimate says the machine is too small (pe_export/memory.py)
    layer_map: bool = (
        True  # stamp which tensor carries each layer, proven on the float32 file (pe_export/parity/layers)
    )

    @property
    def precision(self) -> str:
        """The precision the export is judged at: the looser of the weights' and the tables'."""
        judged = judged_at(self.quantize)
        if judged == "fp32" and self.tables.table_dtype == "float16":
            return "fp16"
        return judged

    def precision_spec(self, file_format: str) -> Precision:
        """What --quantize is for ``file_format`` (pe_export/precisions.py)."""
        return precision(file_format, self.quantize)

    @property
    def outliers(self) -> int:
        """Outlier channels per MatMul input that ONNX dynamic-int8 computes in float (0: none)."""
        return OUTLIER_CHANNELS if self.outlier_channels is None else self.outlier_channels

    @property
    def kernel(self) -> str:
        """ONNX dynamic-int8's integer products (pe_export/converters/onnx/quantize.py)."""
        return ONNX_INT8_KERNEL if self.int8_kernel is None else self.int8_kernel

    @property
    def tolerance(self) -> Tolerance:
        """The tolerance the file is judged at: the precision's, with --min-cosine where given."""
        tolerance = tolerance_for(self.precision)
        return tolerance if self.min_cosine is None else replace(tolerance, min_cosine=self.min_cosine)

    def _validate_keeps(self, file_format: str, asked: Precision) -> None:
        """--keep-float and --keep-int16 apply where ``asked``'s search chooses what they steer."""
        searching = asked.searches
        if self.keep_float and not searching:
            raise BadInputError(
                f"--keep-float applies to --quantize dynamic-int8 (the weights its search keeps float), TFLite's "
                f"--quantize int8 (ops left float) and ONNX's --quantize int8 and float16 (the nodes kept float, "
                f"float32), not --quantize {self.quantize} for {file_format}; "
                "pass one of those or drop --keep-float"
            )
        if self.keep_int16 and not asked.keep_int16:
            raise BadInputError(
                f"--keep-int16 applies to TFLite's --quantize int8 (the activations kept int16), not --quantize "
                f"{self.quantize} for {file_format}; drop --keep-int16"
            )
        if self.keep_int16 and not self.verify:
            raise BadInputError(
                "--keep-int16 steers the int8 search, which runs with the verification: drop --no-verify"
            )
        # the int8 searches run with the verification; float16's measures whatever is asked (pe_export/api.py)
        if self.keep_float and not self.verify and searching and asked.chooser == "int8":
            raise BadInputError(
                "--keep-float takes weights out of the int8 search, which runs with the verification: drop --no-verify"
            )

    def validate(self, file_format: str) -> None:
        self.tables.validate()
        if self.text is not None and self.inputs is not None:
            raise BadInputError("--text and --inputs both give the inputs to judge on; pass one of them")
        if self.holdout is not None and self.text is None and self.inputs is None:
            raise BadInputError(
                f"--holdout {self.holdout} needs --text or --inputs: it holds out samples of the same form "
                "(sentences, or arrays by input name) from the choices they judge"
            )
        asked = self.precision_spec(file_format)  # an unknown --quantize is refused here, listing the known ones
        self._validate_keeps(file_format, asked)
        if self.outlier_channels is not None and not asked.outliers:
            raise BadInputError(
                f"--outlier-channels applies to ONNX --quantize dynamic-int8 and int8 (the channels split off the int8 "
                f"products), not --quantize {self.quantize} for {file_format}; drop --outlier-channels"
            )
        check_range("--outlier-channels", self.outlier_channels, 0, MAX_OUTLIER_CHANNELS)
        if self.int8_kernel is not None and not asked.int8_kernels:
            raise BadInputError(
                f"--int8-kernel applies to ONNX --quantize dynamic-int8 (its integer products), not --quantize "
                f"{self.quantize} for {file_format}; drop --int8-kernel"
            )
        if self.int8_kernel is not None and self.int8_kernel not in ONNX_INT8_KERNELS:
            raise BadInputError(
                f"--int8-kernel {self.int8_kernel!r} is not one of: {', '.join(ONNX_INT8_KERNELS)}; pass one of them"
            )
        if self.min_cosine is not None and not 0.0 < self.min_cosine <= 1.0:
            raise BadInputError(f"--min-cosine {self.min_cosine} is out of range; expected a number in (0, 1]")
        if self.seq_len is not None and self.dynamic_seq:
            raise BadInputError("--seq-len and --dynamic-seq contradict each other; give one of them")
        check_range("--seq-len", self.seq_len, 1, MAX_SEQ_LEN)
        check_range("--batch", self.batch, 1, MAX_BATCH)
        if file_format == "onnx":
            check_range("--opset", self.opset, MIN_ONNX_OPSET, MAX_ONNX_OPSET)

    def export_specs(self, specs: list[TensorSpec]) -> list[TensorSpec]:
        """The SavedModel's input specs with the requested batch and sequence axes applied.

        An axis the SavedModel fixes stays fixed: its graph was traced at that size, so a
        file that advertised another size (or a dynamic one) would fail at run time.
        """
        result = []
        for spec in specs:
            if self.batch is not None:
                spec = _retarget(spec, BATCH_AXIS, self.batch, "--batch", "batch")
            if self.seq_len is not None:
                spec = _retarget(spec, SEQUENCE_AXIS, self.seq_len, "--seq-len", "sequence length")
            elif self.dynamic_seq:
                spec = _retarget(spec, SEQUENCE_AXIS, None, "--dynamic-seq", "sequence length")
            result.append(spec)
        return result


def _retarget(spec: TensorSpec, axis: int, size: int | None, flag: str, what: str) -> TensorSpec:
    if axis >= len(spec.shape):
        return spec
    fixed = spec.shape[axis]
    if fixed is not None and fixed != size:
        raise BadInputError(
            f"{flag}: input {spec.name!r} has a fixed {what} of {fixed} in the SavedModel ({spec.describe()}); "
            f"drop {flag}, or re-export the Keras model with a dynamic axis (keras.Input(shape=(None,)))"
        )
    return spec.with_axis(axis, size)
