"""Plain-text rendering of summaries and reports (the CLI prints these)."""

from __future__ import annotations

from pe_export.inspection.summary import ModelSummary
from pe_export.parity.check import ParityResult

TOP_OPS_SHOWN = 12


def human_bytes(count: int) -> str:
    return f"{count:,} B"


def format_summary(summary: ModelSummary) -> list[str]:
    lines = [f"{summary.path}  [{summary.format}, {human_bytes(summary.file_bytes)}]"]
    for key, value in summary.details.items():
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


def format_parity(result: ParityResult) -> list[str]:
    tol = result.tolerance
    lines = [
        f"  parity vs TensorFlow float32 on {result.runtime} ({result.precision}: atol {tol.atol:g}, "
        f"rtol {tol.rtol:g}, cosine ≥ {tol.min_cosine:g})",
        f"    {'case':<8} {'output':<16} {'max abs':>10} {'mean abs':>10} {'max rel':>10} {'cosine':>10}  ok",
    ]
    for case in result.cases:
        for m in case.outputs:
            lines.append(
                f"    {case.case:<8} {m.name:<16} {m.max_abs:>10.3g} {m.mean_abs:>10.3g} {m.max_rel:>10.3g} "
                f"{m.cosine:>10.7f}  {'yes' if m.within_tolerance else 'NO'}"
                + (f"  (NaN {m.nan_count}, Inf {m.inf_count})" if m.nan_count or m.inf_count else "")
            )
    return lines
