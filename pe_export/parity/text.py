"""Plain-text rendering of a parity report: the device-side harness prints it, and so does the CLI
(pe_export/report.py formats the rest)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: formatting a parity report must not load numpy (parity/supervisor.py)
    from pe_export.parity.result import OutputMetrics, ParityReport


def _task_lines(outputs: list[OutputMetrics], indent: str) -> list[str]:
    """Task-level agreement: worst mean-pooled row cosine for hidden states, argmax agreement for logits."""
    pooled: dict[str, float] = {}
    argmax: dict[str, float] = {}
    for m in outputs:
        if m.pooled_cosine is not None:
            pooled[m.name] = min(pooled.get(m.name, 1.0), m.pooled_cosine)
        if m.argmax_agreement is not None:
            argmax[m.name] = min(argmax.get(m.name, 1.0), m.argmax_agreement)
    lines = [f"{indent}task level: {name} mean-pooled rows, worst cosine {value:.7f}" for name, value in pooled.items()]
    lines += [f"{indent}task level: {name} argmax agreement {value:.4f}" for name, value in argmax.items()]
    return lines


def _profile_line(profile: tuple[float, ...]) -> str:
    """Where along the sequence the error sits: peak position and the spread across positions."""
    values = [(i, v) for i, v in enumerate(profile) if v == v]  # NaN: position never valid
    if not values:
        return "no valid positions"
    peak, peak_value = max(values, key=lambda item: item[1])
    ordered = sorted(v for _, v in values)
    median = ordered[len(ordered) // 2]
    return f"peak {peak_value:.3g} at position {peak}, median over positions {median:.3g}"


def format_parity_report(report: ParityReport) -> list[str]:
    """A parity check, against a bundle or an export's own (the export report indents it)."""
    positions = f", {report.positions} positions" if report.positions else ""
    case_width = max((len(m.case) + 1 for m in report.outputs if m.case), default=0)  # a column where cases are
    case_head = "case" if case_width else ""
    lines = [
        f"parity: {report.model} vs {report.reference} ({report.samples} samples{positions}) on {report.runtime}, "
        f"precision {report.precision}, model digest {report.digest}",
        f"  {case_head:<{case_width}}{'output':<18} {'max abs':>10} {'mean abs':>10} {'max rel':>10} "
        f"{'cosine':>10} {'argmax':>7} {'over tol':>9}  {'atol':>7} {'rtol':>7}  ok",
    ]
    for m in report.outputs:
        tol = report.tolerances[m.name]
        argmax = "-" if m.argmax_agreement is None else f"{m.argmax_agreement:.3f}"
        lines.append(
            f"  {m.case or '':<{case_width}}{m.name:<18} {m.max_abs:>10.3g} {m.mean_abs:>10.3g} {m.max_rel:>10.3g} "
            f"{m.cosine:>10.7f} {argmax:>7} {m.violations:>9}  {tol.atol:>7g} {tol.rtol:>7g}  "
            f"{'yes' if m.within_tolerance else 'NO'}"
            + (f"  NaN {m.nan_count} Inf {m.inf_count}" if m.nan_count or m.inf_count else "")
        )
    lines.extend(_task_lines(report.outputs, "  "))
    for m in report.outputs:
        if m.position_max_abs:
            lines.append(f"  {m.label} by position: {_profile_line(m.position_max_abs)}")
        if m.task_accuracy is not None:
            lines.append(
                f"  {m.name} task accuracy: {m.task_accuracy:.4f} (float32 reference {m.reference_accuracy:.4f})"
            )
    if report.layers is not None:
        from pe_export.parity.layers.render import format_layers

        lines.extend(format_layers(report.layers))
    lines.append(
        f"  time: load {report.load_s:.2f} s, first result {report.first_result_s:.2f} s, total {report.total_s:.2f} s"
    )
    lines.append("PASS" if report.passed else "FAIL")
    return lines
