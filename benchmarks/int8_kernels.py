"""Which ONNX int8 product is fast on this device: each weight shape of an encoder timed as one MatMul in
onnxruntime (batch 1, one thread) as float32, with a range per row (``--int8-kernel rows``, the default:
``pe_export/converters/onnx/row_int8.py``), as ``quantize_dynamic`` writes it (DynamicQuantizeLinear → MatMulInteger,
which
onnxruntime fuses into DynamicQuantizeMatMul: ``--int8-kernel matmulinteger``) and as block-wise int8
``MatMulNBits`` (``--int8-kernel blocks``, and what ``mixed`` moves the weights it keeps to), side by side, then
summed over the model's weights.

    python benchmarks/int8_kernels.py [model.onnx] [--tokens 14] [--runs 1000]

Without a model: all-MiniLM-L6-v2's shapes (6 layers, hidden 384, feed-forward 1536). Needs onnxruntime, onnx
and numpy only (the device extra): run it on the device itself. Where ``MatMulNBits`` is no faster than float32
(measured on x86 with AVX-512 VNNI and AMX, onnxruntime 1.32), a file whose search moved weights to blocks runs
at float32's speed there, and ``--int8-kernel matmulinteger`` is the faster choice at the same target.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.converters.onnx.block_int8 import block_int8_node, with_microsoft_domain
from pe_export.converters.onnx.rewrites import folded_by_onnxruntime
from pe_export.converters.onnx.row_int8 import row_int8_matmuls
from pe_export.host import describe_host

KERNELS = ("float32", "rows", "matmulinteger", "blocks")
MINILM_SHAPES = Counter({(384, 384): 25, (384, 1536): 6, (1536, 384): 6})  # q, k, v, output ×6 and the pooler
NBITS_SLOWER = 0.9  # blocks at this fraction of float32's time or more: the note says to prefer matmulinteger


def weight_shapes(model_path: Path) -> Counter[tuple[int, int]]:
    """[K, N] of every MatMul or Gemm by a constant 2-D weight of ``model_path``, with how many there are: after
    onnxruntime's constant folding (tf2onnx leaves some kernels behind a Reshape of a constant)."""
    model = folded_by_onnxruntime(str(model_path))
    dims = {init.name: tuple(init.dims) for init in model.graph.initializer}
    shapes: Counter[tuple[int, int]] = Counter()
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(dims.get(node.input[1], ())) != 2:
            continue
        k, n = dims[node.input[1]]
        trans_b = any(attribute.name == "transB" and attribute.i == 1 for attribute in node.attribute)
        shapes[(n, k) if node.op_type == "Gemm" and trans_b else (k, n)] += 1
    return shapes


def product_models(k: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, bytes]]:
    """A weight [K, N] and one MatMul by it in each of ``KERNELS``' forms (serialized models)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight = rng.normal(0.0, 0.05, (k, n)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "weight"], ["y"], name="product")
    graph = helper.make_graph(
        [node],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "tokens", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "tokens", n])],
        [numpy_helper.from_array(weight, "weight")],
    )
    # IR 8 (opset 17's): the onnx package writes its newest IR, which an older onnxruntime (JetPack's) refuses
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    forms = {"float32": model.SerializeToString()}
    with tempfile.TemporaryDirectory(prefix="pe-export-") as work:
        source, target = Path(work) / "float.onnx", Path(work) / "int8.onnx"
        onnx.save(model, str(source))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint on every call
        try:
            quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
        finally:
            root.setLevel(level)
        forms["matmulinteger"] = target.read_bytes()
    blocked = onnx.ModelProto()
    blocked.CopyFrom(model)
    replaced, initializers = block_int8_node(blocked.graph.node[0], weight)
    del blocked.graph.node[:], blocked.graph.initializer[:]
    blocked.graph.node.append(replaced)
    blocked.graph.initializer.extend(initializers)
    with_microsoft_domain(blocked)
    forms["blocks"] = blocked.SerializeToString()
    rows = onnx.ModelProto()
    rows.CopyFrom(model)
    row_int8_matmuls(rows, set())
    forms["rows"] = rows.SerializeToString()
    return weight, {kernel: forms[kernel] for kernel in KERNELS}


def time_form(model: bytes, feed: np.ndarray, runs: int) -> tuple[float, np.ndarray]:
    """Median microseconds of one call (one thread, after a warm-up) and the output."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for _ in range(max(runs // 20, 5)):
        output = session.run(None, {"x": feed})[0]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, {"x": feed})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6, output


def measure(shapes: Counter[tuple[int, int]], tokens: int, runs: int, seed: int = 0) -> list[dict[str, Any]]:
    """One row per shape: its count, each kernel's median µs and its largest error relative to the exact product's
    largest value (float64 numpy on the same input)."""
    rng = np.random.default_rng(seed)
    rows = []
    for (k, n), count in sorted(shapes.items()):
        weight, forms = product_models(k, n, rng)
        feed = rng.normal(0.0, 1.0, (1, tokens, k)).astype(np.float32)
        exact = feed.astype(np.float64) @ weight.astype(np.float64)
        row: dict[str, Any] = {"shape": (k, n), "count": count}
        for kernel, model in forms.items():
            micros, output = time_form(model, feed, runs)
            row[kernel] = micros
            row[f"{kernel} error"] = float(np.abs(output - exact).max() / np.abs(exact).max())
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], tokens: int) -> list[str]:
    int8 = KERNELS[1:]
    lines = [
        f"one MatMul per weight shape, {tokens} tokens, batch 1, one thread (median µs; error: largest |Δ| over the "
        "exact product's largest value)",
        f"{'K x N':>11} {'count':>5} {'float32':>9} "
        + " ".join(f"{kernel:>13} {'× fp32':>7} {'error':>8}" for kernel in int8),
    ]
    totals = dict.fromkeys(KERNELS, 0.0)
    for row in rows:
        k, n = row["shape"]
        for kernel in KERNELS:
            totals[kernel] += row[kernel] * row["count"]
        lines.append(
            f"{f'{k} x {n}':>11} {row['count']:>5} {row['float32']:>9.1f} "
            + " ".join(
                f"{row[kernel]:>13.1f} {row[kernel] / row['float32']:>6.2f}x {row[f'{kernel} error']:>8.1e}"
                for kernel in int8
            )
        )
    lines.append(
        f"{'all weights':>11} {sum(r['count'] for r in rows):>5} {totals['float32']:>9.1f} "
        + " ".join(f"{totals[kernel]:>13.1f} {totals[kernel] / totals['float32']:>6.2f}x {'':>8}" for kernel in int8)
    )
    if totals["blocks"] >= NBITS_SLOWER * totals["float32"]:
        lines.append(
            f"note: MatMulNBits ran at {totals['blocks'] / totals['float32']:.2f}x float32's time here: a weight "
            "moved to blocks (--int8-kernel mixed at a high --min-cosine, or blocks) costs about what float32 "
            "does on this device; --int8-kernel rows or matmulinteger is a fast int8 product"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, help="an exported .onnx (default: all-MiniLM-L6-v2's shapes)")
    parser.add_argument("--tokens", type=int, default=14)
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args(argv)
    shapes = weight_shapes(args.model) if args.model else MINILM_SHAPES
    if not shapes:
        raise SystemExit(f"{args.model}: no MatMul or Gemm by a constant 2-D weight: nothing to time")
    print(f"host: {describe_host().line()}")
    print("\n".join(table(measure(shapes, args.tokens, args.runs), args.tokens)))


if __name__ == "__main__":
    main()
