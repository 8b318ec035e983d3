"""Plain-text rendering of summaries and reports (the CLI prints these)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pe_export.host import Host
from pe_export.parity.text import format_parity_report

if TYPE_CHECKING:  # types only: formatting a parity report must not load numpy (parity/supervisor.py)
    from pe_export.bench import BenchResult
    from pe_export.demo import DemoResult
    from pe_export.inspection.summary import ModelSummary
    from pe_export.tables.pipeline import TableResult

TOP_OPS_SHOWN = 12
__all__ = ["format_parity_report"]  # the CLI prints parity reports from here with the rest


def human_bytes(count: int) -> str:
    return f"{count:,} B"


def format_summary(summary: ModelSummary) -> list[str]:
    lines = [f"{summary.path}  [{summary.format}, {human_bytes(summary.file_bytes)}]"]
    for key, value in summary.details.items():
        lines.append(f"  {key}: {value}")
    for key, value in summary.metadata.items():
        if key.startswith("pe_export.") or key == "min_runtime_version":
            lines.append(f"  {key}: {value}")
    for signature in summary.signatures:
        lines.append(f"  signature {signature.name}")
        lines.extend(f"    in   {spec.describe()}" for spec in signature.inputs)
        lines.extend(f"    out  {spec.describe()}" for spec in signature.outputs)
    total = sum(summary.op_counts.values())
    ops = ", ".join(f"{name}×{count}" for name, count in summary.op_counts.most_common(TOP_OPS_SHOWN))
    more = len(summary.op_counts) - TOP_OPS_SHOWN
    lines.append(f"  ops: {total} in {len(summary.op_counts)} kinds: {ops}" + (f", +{more} kinds" if more > 0 else ""))
    lines.append(f"  flex ops: {', '.join(summary.flex_ops) if summary.flex_ops else 'none'}")
    if summary.custom_ops:
        lines.append(f"  custom/unknown ops: {', '.join(summary.custom_ops)}")
    lines.append(f"  constants: {len(summary.constants)} tensors, {human_bytes(summary.constant_bytes)}; largest:")
    for constant in summary.largest_constants():
        shape = "x".join(str(d) for d in constant.shape) or "scalar"
        lines.append(f"    {constant.nbytes:>12,} B  {constant.dtype:<8} {shape:<14} {constant.name}")
    lines.append("  runs on:")
    for verdict in summary.runs_on:
        lines.append(f"    {verdict.runtime:<16} {'yes' if verdict.runs else 'NO '}  {verdict.why}")
    return lines


def format_tables(results: list[TableResult]) -> list[str]:
    """The per-table block of an export report (and of --list-tables)."""
    if not results:
        return ["  position tables: none found"]
    lines = [
        "  position tables:",
        f"    {'name':<44} {'source':<9} {'shape':<12} {'kind':<21} {'method':<7} {'bytes':>10} {'→ stored':>10} "
        f"{'table err':>9}",
    ]
    for r in results:
        table = r.table
        shape = "x".join(str(d) for d in table.shape)
        name = table.name if len(table.name) <= 44 else "…" + table.name[-43:]
        lines.append(
            f"    {name:<44} {table.source:<9} {shape:<12} {table.kind:<21} {r.method:<7} {r.bytes_before:>10,} "
            f"{r.bytes_after:>10,} {r.max_error:>9.2g}" + ("" if r.exact else "  LOSSY")
        )
        details = list(table.notes)
        details += [
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}" for key, value in r.notes.items()
        ]
        if details:
            lines.append(f"      {'; '.join(details)}")
        lines.extend(f"      warning: {w}" for w in r.warnings)
    return lines


def format_demo(result: DemoResult) -> list[str]:
    """The demo's one summary table."""

    def number(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        f"trained task encoder (shift task): {result.saved_model}",
        f"{'variant':<20} {'file B':>8} {'table B':>8} {'max abs err':>11} {'cosine':>9} {'task acc':>8} "
        f"{'p50 ms':>7}  {'runtimes':<22} verdict",
    ]
    for row in result.rows():
        lines.append(
            f"{row['variant']:<20} {row['file_bytes']:>8,} {number(row['table_bytes'], ','):>8} "
            f"{number(row['max_abs_error'], '.3g'):>11} {number(row['min_cosine'], '.6f'):>9} "
            f"{number(row['task_accuracy'], '.4f'):>8} {number(row['p50_ms'], '.3f'):>7}  "
            f"{','.join(row['runtimes']):<22} {row['verdict']}"
        )
        lines.extend(f"    {error}" for error in row["errors"])
    reference = next((r["reference_accuracy"] for r in result.rows() if r["reference_accuracy"] is not None), None)
    if reference is not None:
        lines.append(f"float32 TensorFlow task accuracy on the same samples: {reference:.4f}")
    if any(r["variant"].startswith("learned ") for r in result.rows()):
        lines.append(
            "learned …: the same task and encoder, trained with a learned 64x32 position table "
            "(learned_table_encoder/); svd rank r stores r·(64+32) values of its 2,048"
        )
    lines.append(f"report: {result.directory / 'report.json'}" + (f", plot: {result.plot}" if result.plot else ""))
    return lines


def format_bench(result: BenchResult) -> list[str]:
    lat = result.latency_ms
    return [
        f"bench: {result.model} ({result.file_bytes:,} B) on {result.runtime}, batch {result.batch}, "
        f"seq {result.seq_len}, threads {result.threads or 'default'}, "
        f"{result.runs} runs after {result.warmup} warm-up",
        f"  init {result.init_ms:.1f} ms, first inference {result.first_inference_ms:.3f} ms",
        f"  latency ms: p50 {lat['p50']:.3f}  p90 {lat['p90']:.3f}  p99 {lat['p99']:.3f}  mean {lat['mean']:.3f}  "
        f"std {lat['std']:.3f}  min {lat['min']:.3f}  max {lat['max']:.3f}",
        f"  throughput: {result.sequences_per_s:,.1f} sequences/s, {result.tokens_per_s:,.0f} tokens/s; "
        f"peak RSS {result.peak_rss_mb:.1f} MB",
        f"  host: {Host.from_dict(result.host).line()}",
    ]
