"""Where the dynamic-int8 search should get each weight's cost: its per-place runs, or one layer-wise pass.

The search (pe_export/converters/search/keep_float.py) measures each place of the repeated block (query kernels,
feed-forward outputs, …) by quantizing it alone and running the model on a probe of two rows: one file per place.
A layer-wise pass (`parity --layers`, pe_export/parity/layers) runs the all-int8 file once with its tensors kept and
gives
every layer's error growth. This prints both on all-MiniLM-L6-v2, TFLite, side by side: files run and seconds for
the costs, and how the two rank the places (the search keeps float first where the cost is highest).

    python benchmarks/int8_sensitivity.py

Needs the pretrained encoder of the suite (tests/fixtures/pretrained.py fetches it once) and the dev extra.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pe_export.converters.tflite.dynamic_int8 as tflite_int8  # noqa: E402
from pe_export.api import export_tflite  # noqa: E402
from pe_export.converters.options import ExportOptions  # noqa: E402
from pe_export.converters.search.keep_float import repeated_places  # noqa: E402
from pe_export.golden import GoldenOptions, make_golden  # noqa: E402
from pe_export.inspection.tflite_metadata import tflite_metadata  # noqa: E402
from pe_export.parity.harness import ParityOptions, check_parity  # noqa: E402
from pe_export.parity.layers.mapping import LAYER_MAP, LayerMap  # noqa: E402
from pe_export.text_inputs import TextInputs  # noqa: E402
from tests.fixtures.pretrained import held_out_sentences, minilm  # noqa: E402

MIN_COSINE = 0.999
PROBE_SENTENCES = 2  # the search's probe: PROBE_ROWS single rows


def searched(saved: Path, text: TextInputs, output: Path) -> dict[str, Any]:
    """The --min-cosine search, its runs timed: the place measurements are the runs right after the first
    verdict, one per place (repeated_places)."""
    original = tflite_int8.keep_float_to_target
    record: dict[str, Any] = {"calls": []}

    def timed(candidates, sizes, build, run, judging, tolerance, kinds, asked=None):  # type: ignore[no-untyped-def]
        record["places"] = repeated_places([c for c in candidates if c not in set(asked or [])], kinds)
        record["kinds"] = kinds

        def build_and_time(kept: list[str]) -> Any:
            started = time.perf_counter()
            model = build(kept)
            record["calls"].append(["build", time.perf_counter() - started])
            return model

        def run_and_time(model: Any, feeds: list[dict[str, np.ndarray]]) -> Any:
            started = time.perf_counter()
            outputs = run(model, feeds)
            record["calls"].append(["run", time.perf_counter() - started, len(feeds)])
            return outputs

        started = time.perf_counter()
        outcome = original(candidates, sizes, build_and_time, run_and_time, judging, tolerance, kinds, asked)
        record["search_s"], record["outcome"] = time.perf_counter() - started, outcome
        return outcome

    tflite_int8.keep_float_to_target = timed
    try:
        options = ExportOptions(quantize="dynamic-int8", text=text, holdout=held_out_sentences(), min_cosine=MIN_COSINE)
        started = time.perf_counter()
        report = export_tflite(saved, output, options)
        record["export_s"], record["report"] = time.perf_counter() - started, report
    finally:
        tflite_int8.keep_float_to_target = original
    return record


def place_runs(record: dict[str, Any]) -> tuple[int, float]:
    """(files, seconds) of the place measurements: build + run pairs 2 … 1 + places."""
    pairs = [record["calls"][i : i + 2] for i in range(0, len(record["calls"]), 2)]
    measured = pairs[1 : 1 + len(record["places"])]
    return len(measured), sum(call[1] for pair in measured for call in pair)


def layer_costs(all_int8: Path, saved: Path, text: TextInputs, work: Path) -> tuple[dict[str, Any], float, float]:
    """Each layer (by its file tensor) of the all-int8 file on the probe's sentences (one pass, tensors kept): its
    metrics; the seconds of the reference's activations and of the pass."""
    bundle = work / "probe.golden"
    first = work / "probe.txt"
    lines = [line for line in text.text.read_text(encoding="utf-8").splitlines() if line.strip()]
    first.write_text("\n".join(lines[:PROBE_SENTENCES]) + "\n", encoding="utf-8")
    started = time.perf_counter()
    make_golden(
        saved,
        bundle,
        GoldenOptions(text=TextInputs(first, text.tokenizer), layers="all", batch=1, samples=PROBE_SENTENCES),
    )
    reference_s = time.perf_counter() - started
    started = time.perf_counter()
    report = check_parity(all_int8, bundle, ParityOptions(layers=True, isolate=False))
    pass_s = time.perf_counter() - started
    assert report.layers is not None
    return {layer.tensor: layer for layer in report.layers.layers}, reference_s, pass_s


def weight_layers(path: Path) -> dict[str, str]:
    """Each weight tensor of the file → the first mapped layer tensor its op's output reaches (through ops with
    one data input: bias adds, reshapes), from the graph's edges."""
    from tensorflow.lite.tools import flatbuffer_utils

    mapped = set(LayerMap.from_json(tflite_metadata(path)[LAYER_MAP], path.name).tensors.values())
    flat = flatbuffer_utils.read_model(str(path))
    graph = flat.subgraphs[0]
    names = [tensor.name.decode() for tensor in graph.tensors]
    constant = {i for i, tensor in enumerate(graph.tensors) if flat.buffers[tensor.buffer].data is not None}
    consumers: dict[int, list[Any]] = defaultdict(list)
    for op in graph.operators:
        for i in op.inputs:
            if i >= 0:
                consumers[int(i)].append(op)
    found = {}
    for op in graph.operators:
        for weight in (int(i) for i in op.inputs if i >= 0 and int(i) in constant and graph.tensors[i].shape.size >= 2):
            tensor = int(op.outputs[0])
            for _ in range(6):
                if names[tensor] in mapped:
                    found[names[weight]] = names[tensor]
                    break
                following = consumers.get(tensor, [])
                if len(following) != 1:
                    break
                tensor = int(following[0].outputs[0])
    return found


def spearman(a: list[float], b: list[float]) -> float:
    ranks = [np.argsort(np.argsort(values)) for values in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def main() -> None:
    saved, tokenizer, sentences = minilm()
    text = TextInputs(sentences, tokenizer)
    with tempfile.TemporaryDirectory(prefix="pe-export-bench-") as folder:
        work = Path(folder)
        record = searched(saved, text, work / "strict.tflite")
        all_int8 = work / "int8.tflite"
        export_tflite(saved, all_int8, ExportOptions(quantize="dynamic-int8", text=text, holdout=held_out_sentences()))
        layers, reference_s, pass_s = layer_costs(all_int8, saved, text, work)
        layers_of = weight_layers(all_int8)
    outcome = record["outcome"]
    files, place_s = place_runs(record)
    print(f"all-MiniLM-L6-v2, TFLite dynamic-int8 --min-cosine {MIN_COSINE}: export {record['export_s']:.1f} s, search")
    print(
        f"{record['search_s']:.1f} s, {outcome.runs} files ({outcome.verdicts} on every input), "
        f"{len(outcome.kept_float)} of {outcome.candidates} weights kept float"
    )
    print()
    print("| cost of the places | files run | seconds |")
    print("|---|---|---|")
    print(f"| per-place runs (the search, on its probe) | {files} | {place_s:.2f} |")
    print(
        f"| one layer-wise pass (reference activations + tensors kept) | 1 | {reference_s + pass_s:.2f} "
        f"({reference_s:.2f} + {pass_s:.2f}) |"
    )
    print()
    print("| place | weights | cost by its runs (1 - cosine) | one pass: mean rel err | mean growth | layers found |")
    print("|---|---|---|---|---|---|")
    measured, errors, growths = [], [], []
    for place in record["places"]:
        cost = sum(outcome.sensitivity.get(name, 0.0) for name in place)
        found = [layers[layers_of[name]] for name in place if layers_of.get(name) in layers]
        error = float(np.mean([layer.relative_error for layer in found])) if found else float("nan")
        growth = float(np.mean([layer.growth or 1.0 for layer in found])) if found else float("nan")
        kind = record["kinds"][place[0]]
        shape = "x".join(map(str, kind[1]))
        print(f"| {kind[0]} {shape} | {len(place)} | {cost:.2e} | {error:.2e} | {growth:.3f} | {len(found)} |")
        if found:
            measured.append(cost)
            errors.append(error)
            growths.append(growth)
    if len(measured) >= 3:
        print(
            f"\nrank agreement (Spearman) with the runs' costs over {len(measured)} places: relative error "
            f"{spearman(measured, errors):+.2f}, growth {spearman(measured, growths):+.2f}"
        )


if __name__ == "__main__":
    main()
