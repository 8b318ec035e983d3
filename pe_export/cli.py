"""The `pe-export` command: each command parses options, makes one library call, prints the result."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from pe_export import __version__
from pe_export.constants import (
    BENCH_BATCH,
    BENCH_RUNS,
    BENCH_SEQ_LEN,
    BENCH_WARMUP,
    DEFAULT_ONNX_OPSET,
    DEFAULT_TIMEOUT_S,
    GOLDEN_BATCH,
    GOLDEN_SAMPLES,
    GOLDEN_SEQ_LEN,
    HOLDOUT_EVERY,
    MAX_CHECKED_POSITIONS,
    ONNX_INT8_KERNEL,
    ONNX_INT8_KERNELS,
    OUTLIER_CHANNELS,
    TABLE_DTYPES,
)
from pe_export.errors import (
    EXIT_CODE_MEANINGS,
    INTERRUPTED_SIGINT,
    INTERRUPTED_SIGTERM,
    BadInputError,
    ExitCode,
    ParityError,
    PeExportError,
)
from pe_export.interrupts import Terminated, interruptible, received_interruption
from pe_export.parity.tolerances import DEFAULT_TOLERANCES
from pe_export.precisions import all_precisions
from pe_export.precisions import names as precision_names
from pe_export.runtime_options import DEFAULT_GPU_PRECISION, DEFAULT_PROVIDERS, GPU_PRECISIONS

EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(f"  {int(code)}  {text}" for code, text in EXIT_CODE_MEANINGS.items())
VERBOSE_FLAGS = ("--verbose", "-v")
MASK_INPUT_HELP = (
    "With --text: this integer input is the padding mask (ones on tokens, zeros on padding), where its graph does "
    "not show it. Repeatable."
)


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pe-export")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks and the converters' own logs.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Export Transformer encoders (TF SavedModel) to TFLite and ONNX, and prove parity."""
    ctx.obj = {"verbose": verbose}


class _CompressMethods(click.Choice):
    """--compress-method's choices, read from the method registry when first needed: importing the registry
    loads numpy, which `pe-export parity` (this same CLI) must not pay for."""

    def __init__(self) -> None:
        self.case_sensitive = True

    @property
    def choices(self) -> Sequence[str]:  # type: ignore[override]
        from pe_export.tables.pipeline import COMPRESS_METHODS

        return list(COMPRESS_METHODS)


def export_options(file_format: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Options shared by `tflite` and `onnx`; --quantize's choices are ``file_format``'s precisions."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.argument("saved_model", type=click.Path(path_type=Path)),
            click.option(
                "-o",
                "--output",
                type=click.Path(path_type=Path),
                default=None,
                help="File to write (default: <SAVED_MODEL folder name>.tflite/.onnx here).",
            ),
            click.option("--signature", default=None, help="SavedModel signature (default: serving_default)."),
            click.option("--seq-len", type=int, default=None, help="Fix the sequence axis to this length."),
            click.option("--dynamic-seq", is_flag=True, help="Make the sequence axis dynamic."),
            click.option("--batch", type=int, default=None, help="Fix the batch axis (default: keep the model's)."),
            click.option(
                "--quantize",
                type=click.Choice(list(precision_names(file_format))),
                default="none",
                show_default=True,
                help="; ".join(f"{p.name}: {p.summary}" for p in all_precisions(file_format)) + ".",
            ),
            click.option("--no-verify", is_flag=True, help="Skip the parity check against TensorFlow."),
            click.option(
                "--json",
                "json_path",
                type=click.Path(path_type=Path),
                default=None,
                help="Also write the report as JSON: notes, parity, and each int8/float16 search's measured ranking.",
            ),
            click.option(
                "--no-layer-map",
                is_flag=True,
                help="Stamp no layer map (which tensor carries each layer, for parity --layers).",
            ),
            click.option(
                "--text",
                type=click.Path(path_type=Path),
                default=None,
                help="Verify (and calibrate or judge int8) on these sentences, one per line.",
            ),
            click.option(
                "--tokenizer",
                type=click.Path(path_type=Path),
                default=None,
                help="tokenizer.json for --text (default: beside or inside the SavedModel).",
            ),
            click.option("--mask-input", multiple=True, help=MASK_INPUT_HELP),
            click.option(
                "--inputs",
                type=click.Path(path_type=Path),
                default=None,
                help="Verify (and calibrate or judge int8) on these inputs (.npz by input name).",
            ),
            click.option(
                "--holdout",
                type=click.Path(path_type=Path),
                default=None,
                help="A precision that chooses by accuracy (int8, ONNX float16) chooses on --text / --inputs and is "
                f"judged on these samples (the same form) instead of on every {HOLDOUT_EVERY}th of them, which its "
                "choices then never see.",
            ),
            click.option(
                "--min-cosine",
                type=float,
                default=None,
                help="Ask more than the precision's cosine (the check, and what int8 must reach).",
            ),
            click.option(
                "--keep-float",
                "keep_float",
                multiple=True,
                help="dynamic-int8 and ONNX int8: leave this weight (or node) float (ONNX float16: this node float32; "
                "TFLite int8: this op float); its name, or a layer path in names. Repeatable.",
            ),
            click.option(
                "--keep-int16",
                "keep_int16",
                multiple=True,
                help="TFLite int8: keep this op's activations int16 (its output's name, or a layer path in names). "
                "Repeatable.",
            ),
            click.option("--overwrite", is_flag=True, help="Replace an existing output file."),
            click.option(
                "--force", is_flag=True, help="Export even where the memory estimate says the machine is too small."
            ),
            click.option(
                "--keep-failed",
                is_flag=True,
                help="Keep a file that fails verification, as NAME.FAILED.ext (default: nothing is written).",
            ),
            click.option("--compress", type=int, default=None, help="Store at most K values per position in tables."),
            click.option(
                "--compress-method",
                type=_CompressMethods(),
                default="auto",
                show_default=True,
                help="angle: exact for sinusoids; svd: lossy; interp: the seed's recipe.",
            ),
            click.option(
                "--table-dtype",
                type=click.Choice(list(TABLE_DTYPES)),
                default="float32",
                show_default=True,
                help="Storage precision of position tables (computed in float64 first).",
            ),
            click.option("--max-len", type=int, default=None, help="Regenerate/extend position tables to N rows."),
            click.option("--allow-lossy", is_flag=True, help="Accept lossy table compression that breaks parity."),
            click.option("--table", "table_names", multiple=True, help="Also treat this constant as a position table."),
            click.option("--list-tables", is_flag=True, help="Only list the position tables found; write nothing."),
        ]
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def _text_inputs(text: Path | None, tokenizer: Path | None, mask_inputs: tuple[str, ...]) -> Any:
    """--text with its tokenizer and --mask-input names (None without --text; --mask-input alone is refused)."""
    from pe_export.errors import BadInputError
    from pe_export.text_inputs import TextInputs

    if text is None:
        if mask_inputs:
            raise BadInputError(f"--mask-input {mask_inputs[0]} names a mask for --text; give --text FILE with it")
        return None
    return TextInputs(text, tokenizer, mask_inputs=tuple(mask_inputs))


# Export flags that say the opposite of the option they set, and --compress's flags by TableOptions field; every
# other export flag has its option's name (ExportOptions' fields), so a new option needs no line here.
_NEGATED_FLAGS = {"no_verify": "verify", "no_layer_map": "layer_map", "no_fuse": "fuse"}
_TABLE_FLAGS = {
    "compress": "compress",
    "compress_method": "method",
    "table_dtype": "table_dtype",
    "max_len": "max_len",
    "allow_lossy": "allow_lossy",
    "table_names": "names",
}


def _export_options(**values: Any) -> Any:
    """The command's values as ExportOptions: a flag fills the field of its name (lists as tuples)."""
    from dataclasses import fields

    from pe_export.converters.options import ExportOptions
    from pe_export.tables.pipeline import TableOptions

    def value(flag: str) -> Any:
        given = values[flag]
        return tuple(given) if isinstance(given, list | tuple) else given

    named = {f.name for f in fields(ExportOptions)} - {"text", "tables"}
    options = {name: value(name) for name in named if name in values}
    options.update({field: not values[flag] for flag, field in _NEGATED_FLAGS.items() if flag in values})
    tables = TableOptions(**{field: value(flag) for flag, field in _TABLE_FLAGS.items()})
    text = _text_inputs(values["text"], values["tokenizer"], values["mask_input"])
    return ExportOptions(**options, text=text, tables=tables)


def _gpu_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--gpu-precision and --cpu-fallback: what litert-gpu computes in and whether the CPU may help."""
    command = click.option(
        "--cpu-fallback", is_flag=True, help="litert-gpu: run ops the GPU lacks on the CPU (listed in the report)."
    )(command)
    return click.option(
        "--gpu-precision",
        type=click.Choice(GPU_PRECISIONS),
        default=DEFAULT_GPU_PRECISION,
        show_default=True,
        help="litert-gpu arithmetic: fp16 (the GPU's default, judged by the fp16 tolerance) or fp32.",
    )(command)


def _tensorrt_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--tf32, --trt-fp16, --trt-int8 and --trt-cache: how CUDA and TensorRT compute (onnxruntime's providers)."""
    for option in (
        click.option(
            "--trt-cache",
            type=click.Path(path_type=Path, file_okay=False),
            default=None,
            help="Keep TensorRT's engines and timing data in this folder (an engine build takes minutes on a Jetson).",
        ),
        click.option(
            "--trt-int8",
            is_flag=True,
            help="TensorRT may build int8 layers from the file's Q/DQ scales (judged by the int8 tolerance).",
        ),
        click.option(
            "--trt-fp16", is_flag=True, help="TensorRT may build float16 layers (judged by the fp16 tolerance)."
        ),
        click.option(
            "--tf32", is_flag=True, help="Allow TF32 math on CUDA/TensorRT (off: float32 files compute float32)."
        ),
    ):
        command = option(command)
    return command


def _tensorrt_values(values: dict[str, Any]) -> dict[str, Any]:
    """The TensorRT/CUDA options as ParityOptions and BenchOptions take them."""
    cache = values["trt_cache"]
    return {
        "tf32": values["tf32"],
        "trt_fp16": values["trt_fp16"],
        "trt_int8": values["trt_int8"],
        "trt_cache": str(cache.resolve()) if cache is not None else None,
    }


def _target_runtime(
    model: Path, target: str | None, runtime: str | None, providers: str | None
) -> tuple[str | None, tuple[str, ...], Any]:
    """(runtime, providers, the target's profile or None): explicit options win, a --target profile fills
    what was not given, then library defaults."""
    chosen = tuple(p for p in providers.split(",") if p) if providers else None
    profile = None
    if target:
        from pe_export.runners import installed_runners
        from pe_export.targets import get_profile

        profile = get_profile(target)
        runtime = runtime or profile.runtime_for(model, installed_runners(model))
        chosen = chosen or profile.providers
    return runtime, chosen or DEFAULT_PROVIDERS, profile


def _list_tables(saved_model: Path, options: Any) -> int:
    from pe_export.api import find_position_tables
    from pe_export.report import format_tables

    click.echo(
        "\n".join([f"position tables in {saved_model}:", *format_tables(find_position_tables(saved_model, options))])
    )
    return ExitCode.OK


def _checked_json_path(values: dict[str, Any]) -> Path | None:
    """--json's path, checked before the export's work starts (--overwrite applies to it too)."""
    from pe_export.fileio import check_output_path

    json_path: Path | None = values["json_path"]
    if json_path is not None:
        check_output_path(json_path, overwrite=values["overwrite"], suffix=".json", flag="--json")
    return json_path


def _print_export(report: Any, verbose: bool, json_path: Path | None = None) -> int:
    from pe_export.fileio import atomic_write_bytes
    from pe_export.report import format_parity_report, format_summary, format_tables

    if json_path is not None:  # written whether the file passed or not: a refused export's report says why
        atomic_write_bytes(json_path, json.dumps(report.to_dict(), indent=2).encode(), overwrite=True)
    if verbose and report.converter_log.strip():
        click.echo(report.converter_log.rstrip(), err=True)
    lines = [f"pe-export {report.file_format}: {report.source} → {report.output}"]
    lines += format_summary(report.summary)
    lines += [f"  note: {note}" for note in report.notes]
    if report.layer_map:
        lines.append(f"  layer map: {report.layer_map}")
    if report.tables:
        lines += format_tables(report.tables)
    if report.parity is not None:
        lines += [f"  {line}" for line in format_parity_report(report.parity)]
    click.echo("\n".join(lines))
    report.raise_for_status()
    verdict = "verified" if report.parity is not None else "not verified (--no-verify)"
    if report.lossy_tables and report.parity is not None and not report.parity.passed:
        verdict += (
            ", OVER TOLERANCE: lossy tables accepted by --allow-lossy (against the model computed with the "
            "compressed tables the file is within tolerance)"
        )
    click.echo(f"OK: wrote {report.output} ({report.summary.file_bytes:,} B), {verdict}")
    return ExitCode.OK


@cli.command()
@export_options("tflite")
@click.option("--builtins-only", is_flag=True, help="Refuse models that need select TF (Flex) ops.")
@click.pass_context
def tflite(ctx: click.Context, saved_model: Path, output: Path | None, **values: Any) -> int:
    """Export SAVED_MODEL to a .tflite file (builtins + select TF ops unless --builtins-only)."""
    from pe_export.api import export_tflite

    verbose = ctx.obj["verbose"]
    if values["list_tables"]:
        return _list_tables(saved_model, _export_options(**values))
    json_path = _checked_json_path(values)
    report = export_tflite(saved_model, output, _export_options(**values), quiet=not verbose)
    return _print_export(report, verbose, json_path)


@cli.command()
@export_options("onnx")
@click.option("--opset", type=int, default=DEFAULT_ONNX_OPSET, show_default=True, help="ONNX opset.")
@click.option(
    "--no-fuse",
    is_flag=True,
    help="Keep tf2onnx's graph as written: LayerNorms as 13 elementwise nodes, each Dense as Reshape, MatMul, "
    "Reshape (by default one LayerNormalization op at opset 17+, one MatMul), for a runtime without "
    "LayerNormalization (TensorRT before 8.6).",
)
@click.option(
    "--outlier-channels",
    type=int,
    default=None,
    help=f"dynamic-int8 and int8: compute up to N outlier channels of each MatMul input in float beside its int8 "
    f"product (default {OUTLIER_CHANNELS}; 0: none).",
)
@click.option(
    "--int8-kernel",
    type=click.Choice(list(ONNX_INT8_KERNELS)),
    default=None,
    help=f"dynamic-int8's integer products (default {ONNX_INT8_KERNEL}): rows = a range per row into onnxruntime's "
    "integer GEMM (MatMulIntegerToFloat), inputs rotated where it pays, GPTQ's weights, kept weights float; "
    "matmulinteger = standard ops, one activation range per call, kept weights float; blocks = onnxruntime's "
    "MatMulNBits (1.22+), int8 per block of 32 channels; mixed = matmulinteger, the weights the search keeps as "
    "blocks. Which is faster depends on the device (MatMulNBits ran at float32's speed on x86 with VNNI): "
    "benchmarks/int8_kernels.py measures it there.",
)
@click.pass_context
def onnx(ctx: click.Context, saved_model: Path, output: Path | None, **values: Any) -> int:
    """Export SAVED_MODEL to a .onnx file that passes onnx.checker and loads in onnxruntime."""
    from pe_export.api import export_onnx

    verbose = ctx.obj["verbose"]
    if values["list_tables"]:
        return _list_tables(saved_model, _export_options(**values))
    json_path = _checked_json_path(values)
    report = export_onnx(saved_model, output, _export_options(**values), quiet=not verbose)
    return _print_export(report, verbose, json_path)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--signature", default=None, help="SavedModel signature whose graph to inventory.")
def inspect(path: Path, signature: str | None) -> int:
    """Show signatures, ops, Flex ops, largest constants and runtimes of a .tflite, .onnx or SavedModel."""
    from pe_export.inspection import inspect_path
    from pe_export.report import format_summary

    click.echo("\n".join(format_summary(inspect_path(path, signature))))
    return ExitCode.OK


@cli.command()
@click.argument("saved_model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory to write.")
@click.option("--signature", default=None, help="SavedModel signature (default: serving_default).")
@click.option("--samples", type=int, default=GOLDEN_SAMPLES, show_default=True, help="Samples to generate.")
@click.option("--batch", type=int, default=GOLDEN_BATCH, show_default=True, help="Samples per stored batch.")
@click.option(
    "--seq-len",
    type=int,
    default=None,
    help=f"Sequence length (default: the model's fixed one, else its position table's rows up to "
    f"{MAX_CHECKED_POSITIONS}, else {GOLDEN_SEQ_LEN}).",
)
@click.option("--inputs", type=click.Path(path_type=Path), default=None, help="Your own inputs (.npz by name).")
@click.option(
    "--labels",
    type=click.Path(path_type=Path),
    default=None,
    help="Task labels for --inputs (.npz by output name; class ids, -1 = ignore).",
)
@click.option("--text", type=click.Path(path_type=Path), default=None, help="Sentences, one per line, as the inputs.")
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    default=None,
    help="tokenizer.json for --text (default: beside or inside the SavedModel).",
)
@click.option("--mask-input", multiple=True, help=MASK_INPUT_HELP)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--layers",
    default=None,
    help="Also store the reference's activations at its layers: blocks, all, or a regular expression over the "
    "layer paths (for parity --layers).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle.")
def golden(
    saved_model: Path,
    output: Path,
    text: Path | None,
    tokenizer: Path | None,
    mask_input: tuple[str, ...],
    **values: Any,
) -> int:
    """Write a golden bundle: representative inputs and SAVED_MODEL's float32 outputs."""
    from pe_export.golden import GoldenOptions, make_golden

    sentences = _text_inputs(text, tokenizer, mask_input)
    result = make_golden(saved_model, output, GoldenOptions(**values, text=sentences))
    layers = f", {result.layers} layers' activations ({result.layer_bytes:,} B)" if result.layers else ""
    click.echo(
        f"OK: wrote {result.path} ({result.samples} samples of {result.seq_len} positions in {result.batches} "
        f"batches{layers}, {result.bytes:,} B, "
        f"model digest {result.digest[:12]}…)"
    )
    return ExitCode.OK


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--runtime",
    default=None,
    help="litert, litert-gpu, tflite-runtime, tflite-tf or onnxruntime (default: first installed, never litert-gpu).",
)
@click.option(
    "--providers", default=None, help="onnxruntime providers in order, e.g. tensorrt,cuda,cpu (default: cpu)."
)
@click.option("--target", default=None, help="Apply a device profile (see `pe-export targets`).")
@click.option(
    "--precision",
    type=click.Choice(list(DEFAULT_TOLERANCES)),
    default=None,
    help="Tolerance set (default: stamped in the file, else fp32).",
)
@click.option("--atol", multiple=True, help="Absolute tolerance, for all outputs or OUTPUT:VALUE. Repeatable.")
@click.option("--rtol", multiple=True, help="Relative tolerance, for all outputs or OUTPUT:VALUE. Repeatable.")
@click.option("--ignore-digest", is_flag=True, help="Compare even if the bundle was made from another model.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the full report.")
@click.option(
    "--plot",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a PNG of error by position (with --layers: by layer, and layer × position).",
)
@click.option(
    "--layers",
    "layers",
    is_flag=True,
    help="Also compare the bundle's layer activations (golden --layers) with the file's tensors; exit 1 when "
    "any is over tolerance, naming the first.",
)
@click.option(
    "--bisect",
    is_flag=True,
    help="With --layers: find the first layer over tolerance in files cut at a layer, each run as the runtime runs "
    "it (XNNPACK, fused kernels; the way on LiteRT GPU, TensorRT and CUDA), about log2(layers) of them.",
)
@click.option(
    "--model-explorer",
    "model_explorer",
    type=click.Path(path_type=Path),
    default=None,
    help="With --layers: write the per-layer error as Model Explorer node data (JSON).",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help=f"Seconds per runtime call (default: the target's, else {DEFAULT_TIMEOUT_S:g}).",
)
@click.option("--threads", type=int, default=None, help="Runtime threads.")
@_tensorrt_options
@_gpu_options
@click.option("--no-isolate", is_flag=True, help="Run the runtime in this process (faster; a crash is fatal).")
@click.option("--overwrite", is_flag=True, help="Replace existing --json and --plot files.")
def parity(
    model: Path,
    bundle: Path,
    json_path: Path | None,
    plot: Path | None,
    model_explorer: Path | None,
    overwrite: bool,
    **values: Any,
) -> int:
    """Check MODEL (.tflite/.onnx) against a golden BUNDLE; exit 1 when it is over tolerance."""
    from pe_export.fileio import atomic_write_bytes, check_output_path
    from pe_export.parity.harness import ParityOptions, check_parity
    from pe_export.parity.plot import check_plot_output
    from pe_export.parity.tolerances import parse_overrides
    from pe_export.report import format_parity_report

    if json_path:  # every output path is checked before the work starts
        check_output_path(json_path, overwrite=overwrite, suffix=".json", flag="--json")
    if plot:
        check_plot_output(plot, overwrite=overwrite)
    if model_explorer:
        if not values["layers"]:
            raise BadInputError("--model-explorer writes per-layer errors; it needs --layers")
        check_output_path(model_explorer, overwrite=overwrite, suffix=".json", flag="--model-explorer")
    atol, output_atol = parse_overrides(values["atol"], "--atol")
    rtol, output_rtol = parse_overrides(values["rtol"], "--rtol")
    runtime, providers, profile = _target_runtime(model, values["target"], values["runtime"], values["providers"])
    timeout = values["timeout"]
    if timeout is None:  # an explicit --timeout wins, then the target's (TensorRT engine builds take minutes)
        timeout = profile.parity.get("timeout_s", DEFAULT_TIMEOUT_S) if profile else DEFAULT_TIMEOUT_S
    options = ParityOptions(
        runtime=runtime,
        providers=providers,
        precision=values["precision"],
        atol=atol,
        rtol=rtol,
        output_atol=output_atol,
        output_rtol=output_rtol,
        ignore_digest=values["ignore_digest"],
        timeout_s=timeout,
        threads=values["threads"],
        isolate=not values["no_isolate"],
        **_tensorrt_values(values),
        gpu_precision=values["gpu_precision"],
        cpu_fallback=values["cpu_fallback"],
        target_tolerances=profile.tolerances if profile else {},
        layers=values["layers"],
        bisect=values["bisect"],
    )
    report = check_parity(model, bundle, options)
    click.echo("\n".join(format_parity_report(report)))
    if json_path:
        atomic_write_bytes(json_path, json.dumps(report.to_dict(), indent=2).encode(), overwrite=overwrite)
    if plot and report.layers is not None:
        from pe_export.parity.layers.render import write_layer_plot

        write_layer_plot(report, plot, overwrite=overwrite)
    elif plot:
        from pe_export.parity.plot import write_profile_plot

        write_profile_plot([(model.name, report)], plot, overwrite=overwrite)
    if model_explorer and report.layers is not None:
        from pe_export.parity.layers.render import write_model_explorer

        write_model_explorer(report, model_explorer, overwrite=overwrite)
    if not report.passed:
        raise ParityError(report.failure_message())
    return ExitCode.OK


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--runtime", default=None, help="litert, litert-gpu, tflite-runtime, tflite-tf or onnxruntime.")
@click.option("--providers", default=None, help="onnxruntime providers in order, e.g. tensorrt,cuda,cpu.")
@click.option("--target", default=None, help="Apply a device profile's runtime, providers and settings.")
@click.option("--threads", type=int, default=None, help="Runtime threads (default: the runtime's).")
@click.option("--batch", type=int, default=None, help=f"Batch for dynamic axes (default {BENCH_BATCH}).")
@click.option("--seq-len", type=int, default=None, help=f"Sequence length for dynamic axes (default {BENCH_SEQ_LEN}).")
@click.option("--runs", type=int, default=None, help=f"Timed runs (default {BENCH_RUNS}).")
@click.option("--warmup", type=int, default=None, help=f"Untimed warm-up runs (default {BENCH_WARMUP}).")
@_tensorrt_options
@_gpu_options
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the result as JSON.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --json file.")
def bench(model: Path, json_path: Path | None, overwrite: bool, **values: Any) -> int:
    """Measure latency, throughput and memory of MODEL (.tflite/.onnx) on one runtime."""
    from pe_export.bench import BenchOptions, run_bench
    from pe_export.fileio import atomic_write_bytes, check_output_path
    from pe_export.report import format_bench

    if json_path:
        check_output_path(json_path, overwrite=overwrite, suffix=".json", flag="--json")

    runtime, providers, profile = _target_runtime(model, values["target"], values["runtime"], values["providers"])
    settings = dict(profile.bench) if profile else {}
    given = {key: values[key] for key in ("threads", "batch", "seq_len", "runs", "warmup") if values[key] is not None}
    options = BenchOptions(
        runtime=runtime,
        providers=providers,
        gpu_precision=values["gpu_precision"],
        cpu_fallback=values["cpu_fallback"],
        **_tensorrt_values(values),
        **{**settings, **given},
    )
    options.validate()  # before the progress bar: a bad option is one line
    with click.progressbar(length=options.runs, label="timing", file=sys.stderr) as bar:

        def advance(done: int, total: int) -> None:
            bar.update(1)

        result = run_bench(model, options, progress=advance)
    click.echo("\n".join(format_bench(result)))
    if json_path:
        atomic_write_bytes(json_path, json.dumps(result.to_dict(), indent=2).encode(), overwrite=overwrite)
    return ExitCode.OK


@cli.command()
def targets() -> int:
    """List the device target profiles (`--target NAME` on parity and bench)."""
    from pe_export.targets import get_profile, profile_names

    for name in profile_names():
        profile = get_profile(name)
        click.echo(f"{name:<16} {profile.description}")
        click.echo(
            f"{'':<16} providers {','.join(profile.providers)}; tflite {','.join(profile.runtimes['tflite'])}; "
            f"docker {profile.docker or '-'}; bench {profile.bench}; parity {profile.parity}"
            + (f"; tolerances {profile.tolerances}" if profile.tolerances else "")
        )
    return ExitCode.OK


@cli.command()
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Folder for the demo's files.")
@click.option("--overwrite", is_flag=True, help="Replace the demo's file names in a folder it did not make.")
@click.pass_context
def demo(ctx: click.Context, out: Path | None, overwrite: bool) -> int:
    """Export the bundled task encoder to TFLite and ONNX (fp32, fp16, int8) and verify each."""
    from pe_export.demo import DEFAULT_DEMO_DIR, run_demo
    from pe_export.report import format_demo

    def progress(message: str) -> None:
        click.echo(f"… {message}", err=True)

    result = run_demo(out or DEFAULT_DEMO_DIR, progress=progress, quiet=not ctx.obj["verbose"], overwrite=overwrite)
    click.echo("\n".join(format_demo(result)))
    return int(result.exit_code)


def _interruption(err: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM behind an error, if any.

    A signal that lands inside a C extension (numpy, TensorFlow) surfaces as that call's
    SystemError, with the KeyboardInterrupt or Terminated as its cause or context.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, (KeyboardInterrupt, Terminated)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _report_interruption(interruption: BaseException) -> int:
    """One line for Ctrl-C or SIGTERM; the exit code a shell gives them (130, 143)."""
    if isinstance(interruption, Terminated):
        click.echo("error: terminated (SIGTERM); nothing partial was left behind", err=True)
        return INTERRUPTED_SIGTERM
    click.echo("error: interrupted (SIGINT); nothing partial was left behind", err=True)
    return INTERRUPTED_SIGINT


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = any(flag in args for flag in VERBOSE_FLAGS)
    if verbose:  # accepted anywhere on the line, not only before the command
        args = ["--verbose", *(arg for arg in args if arg not in VERBOSE_FLAGS)]
    with interruptible():
        code = _run(args, verbose)
    sys.exit(int(code) if isinstance(code, int) else 0)


def _run(args: list[str], verbose: bool) -> int:
    """The command's exit code; every failure one line (tracebacks with --verbose)."""
    try:
        code = cli.main(args=args, prog_name="pe-export", standalone_mode=False)
    except PeExportError as err:
        if verbose:
            traceback.print_exc()
        interruption = received_interruption()
        if interruption is not None:  # the error is the signal's doing (a killed child, a cut-off read)
            code = _report_interruption(interruption)
        else:
            click.echo(f"error: {err}", err=True)
            code = err.exit_code
    except click.exceptions.UsageError as err:
        command = err.ctx.command_path if err.ctx else "pe-export"
        click.echo(f"error: {err.format_message()} (see `{command} --help`)", err=True)
        code = ExitCode.BAD_INPUT
    except click.exceptions.Abort:  # click's form of Ctrl-C
        code = _report_interruption(KeyboardInterrupt())
    except Terminated as err:
        code = _report_interruption(err)
    except click.exceptions.ClickException as err:
        click.echo(f"error: {err.format_message()}", err=True)
        code = ExitCode.BAD_INPUT
    except Exception as err:
        interruption = _interruption(err) or received_interruption()
        if interruption is not None:
            code = _report_interruption(interruption)
        else:  # a bug: one line, traceback with --verbose
            if verbose:
                traceback.print_exc()
            click.echo(f"error: unexpected {type(err).__name__}: {err} (a bug; rerun with --verbose)", err=True)
            code = ExitCode.INTERNAL_ERROR
    return int(code) if isinstance(code, int) else 0


if __name__ == "__main__":
    main()
