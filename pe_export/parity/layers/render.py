"""``parity --layers`` as people and tools read it: the table, a PNG, and Model Explorer's node data."""

from __future__ import annotations

import json
from pathlib import Path

from pe_export.fileio import atomic_write_bytes
from pe_export.parity.result import LayerReport, ParityReport

NAME_WIDTH = 56


def format_layers(report: LayerReport) -> list[str]:
    """The layers in graph order; the first over tolerance marked; the ones the file cannot show listed."""
    first = report.first_divergence
    lines = [
        f"  layers ({len(report.layers)} compared; {report.kernels}):",
        f"    {'layer':<{NAME_WIDTH}} {'max abs':>10} {'mean abs':>10} {'cosine':>10} {'rel err':>9} {'growth':>7}"
        f"  {'atol':>7} {'rtol':>7}  ok",
    ]
    for layer in report.layers:
        growth = "-" if layer.growth is None else f"{layer.growth:.2f}x"
        name = layer.name if len(layer.name) <= NAME_WIDTH else "…" + layer.name[-(NAME_WIDTH - 1) :]
        mark = "  ← first over tolerance" if layer.name == first else ""
        lines.append(
            f"    {name:<{NAME_WIDTH}} {layer.max_abs:>10.3g} {layer.mean_abs:>10.3g} {layer.cosine:>10.7f} "
            f"{layer.relative_error:>9.2e} {growth:>7}  {layer.atol:>7g} {layer.rtol:>7g}  "
            f"{'yes' if layer.ok else 'NO'}{mark}"
        )
    lines.append(f"  first divergence: {first or 'none (every compared layer is within tolerance)'}")
    if report.unmapped:
        lines.append(f"  not compared ({len(report.unmapped)} of the bundle's layers):")
        lines.extend(f"    {name}: {why}" for name, why in report.unmapped.items())
    return lines


def write_model_explorer(report: ParityReport, path: Path, *, overwrite: bool = True) -> None:
    """Per-layer relative error as Model Explorer node data (one graph's ``GraphNodeData``): keyed by the file's
    tensor names, which Model Explorer matches to each op's output tensor; green to red from least to most."""
    assert report.layers is not None
    data = {
        "results": {layer.tensor: {"value": layer.relative_error} for layer in report.layers.layers},
        "gradient": [
            {"stop": 0, "bgColor": "#2e7d32"},
            {"stop": 0.5, "bgColor": "#f9a825"},
            {"stop": 1, "bgColor": "#c62828"},
        ],
    }
    atomic_write_bytes(Path(path), json.dumps(data, indent=2).encode(), overwrite=overwrite)


def write_layer_plot(report: ParityReport, path: Path, *, overwrite: bool = True) -> None:
    """Relative error by layer (log scale, over tolerance in red) and, for the sequence layers, layer × position."""
    from pe_export.parity.plot import pyplot, save_png

    assert report.layers is not None
    plt = pyplot()
    layers = report.layers.layers
    profiles = [layer for layer in layers if layer.position_max_abs]
    rows = 2 if profiles else 1
    figure, axes = plt.subplots(rows, 1, figsize=(12, 4.5 * rows), squeeze=False)
    errors = [max(layer.relative_error, 1e-12) for layer in layers]
    colors = ["#2e7d32" if layer.ok else "#c62828" for layer in layers]
    top = axes[0][0]
    top.bar(range(len(layers)), errors, color=colors)
    top.set_yscale("log")
    top.set_ylabel("‖file − reference‖ / ‖reference‖")
    top.set_title(f"{report.model.name} on {report.runtime}: error by layer (red: over tolerance)")
    step = max(1, len(layers) // 40)
    top.set_xticks(range(0, len(layers), step))
    top.set_xticklabels([layers[i].name for i in range(0, len(layers), step)], rotation=90, fontsize=6)
    if profiles:
        import numpy as np

        grid = np.array([[max(v, 1e-12) for v in layer.position_max_abs or ()] for layer in profiles])
        image = axes[1][0].imshow(np.log10(grid), aspect="auto", cmap="magma")
        axes[1][0].set_xlabel("sequence position (padding excluded)")
        axes[1][0].set_ylabel("sequence layers, graph order")
        figure.colorbar(image, ax=axes[1][0], label="log10 max abs error")
    save_png(figure, path, overwrite=overwrite)
