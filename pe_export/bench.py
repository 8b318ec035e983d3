"""`pe-export bench`: latency, throughput and memory of an exported file, on the parity runners.

Field names follow TFLite's benchmark_model and onnxruntime_perf_test where they overlap
(init time, first inference, warm-up, P50/P90/P99 latency, peak memory); the JSON schema
is BENCH_SCHEMA below and in README.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pe_export.constants import (
    BENCH_BATCH,
    BENCH_RUNS,
    BENCH_SEQ_LEN,
    BENCH_WARMUP,
    MAX_BATCH,
    MAX_RUNS,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_WARMUP,
)
from pe_export.errors import BadInputError, check_range
from pe_export.host import describe_host
from pe_export.inputs import generate_inputs
from pe_export.runners import create_runner, resolve_runtime, runner_options_for
from pe_export.runtime_options import (
    DEFAULT_GPU_PRECISION,
    DEFAULT_PROVIDERS,
    check_gpu_precision,
    check_tensorrt_modes,
)
from pe_export.specs import feed_shape

BENCH_SCHEMA_VERSION = 1
BENCH_SCHEMA = {
    "schema": "pe-export-bench, integer version",
    "model": "path of the file measured",
    "file_bytes": "size of the file (bytes)",
    "runtime": "runner and providers, e.g. onnxruntime[cuda,cpu]; ' tf32' when TF32 math was allowed",
    "threads": "intra-op threads asked for (null: the runtime's default)",
    "batch / seq_len": "the input shape the model ran: the options' for dynamic axes, the model's own for fixed ones",
    "runs / warmup": "timed and untimed calls",
    "init_ms": "model load and session/interpreter creation (benchmark_model: 'Init')",
    "first_inference_ms": "the first call (benchmark_model: 'First inference')",
    "latency_ms": "p50, p90, p99, mean, std, min, max over the timed runs",
    "sequences_per_s / tokens_per_s": "batch / p50 and batch·seq_len / p50",
    "peak_rss_mb": "peak resident memory of the process (onnxruntime_perf_test: 'Peak working set')",
    "host": "machine, cpus, CPU model and its int8 instructions (pe_export/host.py): int8 speed follows them",
}


@dataclass(frozen=True)
class BenchOptions:
    runtime: str | None = None
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    threads: int | None = None
    batch: int = BENCH_BATCH
    seq_len: int = BENCH_SEQ_LEN
    runs: int = BENCH_RUNS
    warmup: int = BENCH_WARMUP
    tf32: bool = False  # allow TF32 math on CUDA/TensorRT (see runners.onnxrt)
    gpu_precision: str = DEFAULT_GPU_PRECISION  # litert-gpu's arithmetic (see runners.litert_gpu)
    cpu_fallback: bool = False  # litert-gpu: let the CPU run ops the GPU lacks
    trt_fp16: bool = False  # TensorRT may build float16 layers
    trt_int8: bool = False  # TensorRT may build int8 layers from the file's Q/DQ scales
    trt_cache: str | None = None  # folder of TensorRT engines and timing data, kept between sessions

    def validate(self) -> None:
        check_gpu_precision(self.gpu_precision)
        check_tensorrt_modes(self.providers, self.trt_fp16, self.trt_int8, self.trt_cache)
        check_range("--batch", self.batch, 1, MAX_BATCH)
        check_range("--seq-len", self.seq_len, 1, MAX_SEQ_LEN)
        check_range("--runs", self.runs, 1, MAX_RUNS)
        check_range("--warmup", self.warmup, 0, MAX_WARMUP)
        check_range("--threads", self.threads, 1, MAX_THREADS)


@dataclass
class BenchResult:
    schema: int
    model: str
    file_bytes: int
    runtime: str
    threads: int | None
    batch: int
    seq_len: int
    runs: int
    warmup: int
    init_ms: float
    first_inference_ms: float
    latency_ms: dict[str, float]
    sequences_per_s: float
    tokens_per_s: float
    peak_rss_mb: float
    host: dict[str, Any] = field(default_factory=lambda: describe_host().to_dict())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_rss_mb() -> float:
    """VmHWM of this process (Linux); ru_maxrss elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_calls(
    runner: Any,
    feed: dict[str, np.ndarray],
    runs: int,
    warmup: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Milliseconds per call of an activated runner, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        runner.infer(feed)
    times = []
    for run in range(runs):
        started = time.perf_counter()
        runner.infer(feed)
        times.append((time.perf_counter() - started) * 1e3)
        if progress:
            progress(run + 1, runs)
    return times


def _feed_batch_and_length(feed: dict[str, np.ndarray], options: BenchOptions) -> tuple[int, int]:
    """What the model is really fed: a fixed-shape model keeps its own batch and length, not the options'."""
    return feed_shape(feed) or (options.batch, options.seq_len)


def run_bench(model: Path, options: BenchOptions, progress: Callable[[int, int], None] | None = None) -> BenchResult:
    options.validate()
    model = Path(model)
    if not model.is_file():
        raise BadInputError(f"{model} is not a file; expected a .tflite or .onnx model")
    runtime = resolve_runtime(model, options.runtime)

    def feeds() -> list[dict[str, np.ndarray]]:  # TensorRT's profile: the shapes the timed calls will feed
        from pe_export.inspection.onnx_file import onnx_input_specs

        specs = onnx_input_specs(model)
        return [generate_inputs(specs, {}, batch=options.batch, seq_len=options.seq_len, seed=0, padded=False)]

    extra = runner_options_for(runtime, options, feeds)
    started = time.perf_counter()
    runner = create_runner(runtime, model, **extra)
    runner.activate()
    try:
        init_ms = (time.perf_counter() - started) * 1e3
        feed = generate_inputs(
            runner.input_specs(), {}, batch=options.batch, seq_len=options.seq_len, seed=0, padded=False
        )
        batch, seq_len = _feed_batch_and_length(feed, options)
        started = time.perf_counter()
        try:
            runner.infer(feed)
        except BadInputError as err:
            raise BadInputError(
                f"{err} (at batch {batch}, sequence length {seq_len}: a model whose position table has fewer "
                "rows needs a --seq-len within it)"
            ) from err
        first_ms = (time.perf_counter() - started) * 1e3
        times = time_calls(runner, feed, options.runs, options.warmup, progress)
        describe = runner.describe()
    finally:
        runner.deactivate()
    samples = np.array(times)
    p50 = float(np.percentile(samples, 50))
    latency = {
        "p50": p50,
        "p90": float(np.percentile(samples, 90)),
        "p99": float(np.percentile(samples, 99)),
        "mean": float(samples.mean()),
        "std": float(statistics.pstdev(times)),
        "min": float(samples.min()),
        "max": float(samples.max()),
    }
    return BenchResult(
        schema=BENCH_SCHEMA_VERSION,
        model=str(model),
        file_bytes=model.stat().st_size,
        runtime=describe,
        threads=options.threads,
        batch=batch,
        seq_len=seq_len,
        runs=options.runs,
        warmup=options.warmup,
        init_ms=init_ms,
        first_inference_ms=first_ms,
        latency_ms=latency,
        sequences_per_s=batch * 1e3 / p50,
        tokens_per_s=batch * seq_len * 1e3 / p50,
        peak_rss_mb=peak_rss_mb(),
    )
