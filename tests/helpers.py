"""Helpers for tests: run the CLI in-process and compare files against TensorFlow independently."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pe_export.cli import main

REPO = Path(__file__).resolve().parents[1]
VENV_CACHE = Path(os.environ.get("PE_EXPORT_TEST_CACHE", Path.home() / ".cache" / "pe-export-tests"))


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(capfd: pytest.CaptureFixture[str], *args: str) -> CliResult:
    """Run `pe-export ARGS` in this process, capturing fd-level output."""
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capfd.readouterr()
    return CliResult(int(exit_info.value.code or 0), out, err)


def assert_one_line_error(result: CliResult, code: int, *fragments: str) -> None:
    """Exit ``code``, exactly one non-empty stderr line starting "error: ", no traceback, every fragment in it."""
    assert result.exit_code == code, (result.stdout[-500:], result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def reference_outputs(saved_model: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tensorflow as tf

    signature = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    return {k: v.numpy() for k, v in signature(**{k: tf.constant(v) for k, v in feed.items()}).items()}


def litert_outputs(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Straight through ai-edge-litert, not through pe-export's runner."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    return {k: np.array(v) for k, v in runner(**feed).items()}


def onnxruntime_outputs(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def token_feed(
    input_names: tuple[str, ...], batch: int, seq_len: int, vocab: int, seed: int = 7
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for name in input_names:
        if name == "attention_mask":
            mask = np.ones((batch, seq_len), np.int32)
            mask[1:, seq_len // 2 :] = 0
            feed[name] = mask
        elif name == "segment_ids":
            feed[name] = rng.integers(0, 2, (batch, seq_len)).astype(np.int32)
        else:
            feed[name] = rng.integers(1, vocab, (batch, seq_len)).astype(np.int32)
    return feed


def independent_verdict(
    actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], tolerance: Any, valid: np.ndarray | None = None
) -> dict[str, tuple[int, float]]:
    """(elements over atol + rtol·|expected|, cosine) per output, computed here with numpy and nothing of
    pe-export's comparison: a second judge of a file run straight in its runtime against TensorFlow's
    outputs. ``valid`` ([batch, seq] mask) keeps the real positions of [batch, seq, …] outputs."""
    assert sorted(actual) == sorted(expected)
    verdict = {}
    for name, want in expected.items():
        got = np.asarray(actual[name], np.float64)
        want = np.asarray(want, np.float64)
        if valid is not None and want.ndim >= 3 and want.shape[:2] == valid.shape:
            got, want = got[valid.astype(bool)], want[valid.astype(bool)]
        over = int((np.abs(got - want) > tolerance.atol + tolerance.rtol * np.abs(want)).sum())
        cosine = float(got.ravel() @ want.ravel() / max(np.linalg.norm(got) * np.linalg.norm(want), 1e-30))
        verdict[name] = (over, cosine)
    return verdict


def chosen_cosine(notes: list[str]) -> float:
    """The int8 note's worst cosine on the inputs the search chose on (the export's parity is the held-out one)."""
    note = next(n for n in notes if n.startswith("int8:"))
    found = re.search(r"worst cosine ([\d.]+) against the float model on the inputs it chose on", note)
    assert found, note
    return float(found[1])


def assert_chosen_with_margin(notes: list[str], target: float) -> None:
    """Dynamic int8 chose against ``DYNAMIC_INT8_CHOICE_SHARE`` of the error ``target`` allows, and says so."""
    from pe_export.parity.tolerances import DYNAMIC_INT8_CHOICE_SHARE

    tighter = 1 - DYNAMIC_INT8_CHOICE_SHARE * (1 - target)
    note = next(n for n in notes if n.startswith("int8:"))
    assert chosen_cosine(notes) >= tighter > target, (tighter, note)
    assert f"chosen against cosine >= {tighter:g} ({DYNAMIC_INT8_CHOICE_SHARE:g} of the error the target" in note


def stricter_target(notes: list[str]) -> float:
    """A target the all-int8 file misses on the inputs the search chooses on, whatever the random init: a third
    of its distance from cosine 1 there."""
    return 1 - (1 - chosen_cosine(notes)) / 3


def assert_judged_on_the_held_out_part(report: Any, target: float, output: Path) -> None:
    """The export's verdict is the held-out part's, which the choices never saw: the file is written exactly
    when those inputs meet the target, and the report says what was held out."""
    assert report.parity is not None and any("int8 chose on" in note for note in report.notes), report.notes
    passed = report.parity.min_cosine >= target and report.parity.passed
    print(f"held out: worst cosine {report.parity.min_cosine:.6f} against target {target:.6f}: passed {passed}")
    assert (report.exit_code == 0) == passed == output.exists()


def max_abs_error(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> float:
    assert sorted(actual) == sorted(expected)
    return max(float(np.max(np.abs(actual[k] - expected[k]))) for k in expected)


MEASURED_PARITY = """
import json, resource, sys, time
started = time.perf_counter()
from pe_export.parity.harness import check_parity
report = check_parity(sys.argv[1], sys.argv[2])
print(json.dumps({
    "passed": report.passed,
    "samples": report.samples,
    "first_result_s": report.first_result_s,
    "total_s": report.total_s,
    "imports_s": report.first_result_s and (time.perf_counter() - started - report.total_s),
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the forking process.
    "parent_peak_rss_mb": next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024,
    "child_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "tensorflow_imported": "tensorflow" in sys.modules,
}))
"""


def measured_parity(python: Path | str, model: Path, bundle: Path, cwd: Path) -> dict[str, float]:
    """Run check_parity in a fresh process; return its figures plus the process's own wall time."""
    import json
    import subprocess
    import time

    started = time.perf_counter()
    done = subprocess.run(
        [str(python), "-c", MEASURED_PARITY, str(model), str(bundle)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=900,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise AssertionError(done.stderr[-2000:])
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["wall_s"] = wall
    figures["cold_start_s"] = wall - (figures["total_s"] - figures["first_result_s"])
    return figures


def run_outside_repo(
    *args: str | Path, timeout: int = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command from the venv cache, so that `python -c` cannot import the checkout instead of the install;
    ``env`` adds to this process's environment."""
    VENV_CACHE.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=VENV_CACHE,
        env={**os.environ, **(env or {})},
    )


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """One holder at a time across processes (pytest-xdist's workers): ``checkout`` for pip builds of this
    checkout (setuptools writes build/ and *.egg-info into it), others for a shared cache folder."""
    VENV_CACHE.mkdir(parents=True, exist_ok=True)
    with open(VENV_CACHE / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_venv(name: str, requirements: list[str], *, base: str = sys.executable, root: Path = VENV_CACHE) -> Path:
    """A real venv with ``requirements`` (pe-export itself among them) installed once and kept between runs.

    Keyed by pyproject.toml, the requirements and the base interpreter; on reuse only pe-export's own code
    is reinstalled. ``base``/``root``: another interpreter, another cache folder (one other users can read).
    """
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + "\n".join([*requirements, base]).encode())
    version = subprocess.run(
        [base, "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    venv = root / f"{name}-py{version}-{key.hexdigest()[:12]}"
    python = venv / "bin" / "python"
    with cache_lock("checkout"):
        return _cached_venv(venv, python, base, requirements)


def _cached_venv(venv: Path, python: Path, base: str, requirements: list[str]) -> Path:
    if not python.exists():
        created = run_outside_repo(base, "-m", "venv", venv)
        assert created.returncode == 0, created.stderr
        installed = run_outside_repo(python, "-m", "pip", "install", "-q", *requirements)
        if installed.returncode != 0:
            import shutil

            shutil.rmtree(venv, ignore_errors=True)  # a half-built venv must not be reused
        assert installed.returncode == 0, installed.stderr[-2000:]
    else:
        installed = run_outside_repo(python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", REPO)
        assert installed.returncode == 0, installed.stderr[-2000:]
    return venv


def pyproject() -> dict:
    """pyproject.toml, read with tomllib (Python 3.11+) or tomli (3.10, JetPack 6's Python; in the dev extra)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def int8_kernel_saturates() -> bool:
    """Whether this host's onnxruntime int8 MatMul saturates 16-bit pair sums (x86 AVX2 without VNNI): one row of
    uint8 255s times a column of int8 127s, whose exact product is 255·127·64 = 2,072,640. Decided by running it."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        initializer=[numpy_helper.from_array(np.full((64, 1), 127, np.int8), "b")],
    )
    session = ort.InferenceSession(onnx_model(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    return int(session.run(None, {"a": np.full((1, 64), 255, np.uint8)})[0][0, 0]) != 255 * 127 * 64


SATURATES = (
    "this host's onnxruntime int8 MatMul saturates (x86 AVX2 without VNNI: tests.helpers.int8_kernel_saturates): the "
    "error measured is its kernel's, not the quantization's"
)


def float_and_dynamic_range(model: Any) -> tuple[bytes, bytes]:
    """(float32 file, the converter's dynamic-range file) of a ``tf.Module`` whose ``__call__`` is a tf.function."""
    from pe_export.native import import_tensorflow

    tf = import_tensorflow()
    files = []
    for quantize in (False, True):
        converter = tf.lite.TFLiteConverter.from_concrete_functions([model.__call__.get_concrete_function()], model)
        if quantize:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        files.append(converter.convert())
    return files[0], files[1]


def outlier_feeds(seed: int, width: int, batches: int = 4, rows: int = 12) -> list[dict[str, np.ndarray]]:
    """Activations with one outlier channel (x[:, 3] × 60), as trained encoders' LayerNorm outputs have."""
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(batches):
        x = rng.normal(size=(rows, width)).astype(np.float32)
        x[:, 3] *= 60.0
        result.append({"x": x})
    return result


# Our set-up scripts' exit code for "this host lacks what I need" (docker/debian-archive.sh): the only skip.
HOST_LACKS = 77


def software_vulkan_env() -> dict[str, str]:
    """VK_ICD_FILENAMES and LD_LIBRARY_PATH of Mesa's lavapipe, unpacked once per setup.sh version
    (targets/software-vulkan/setup.sh); skips the calling test where this host lacks what it needs (the
    script's exit 77), fails it where the script itself fails."""
    setup = REPO / "targets" / "software-vulkan" / "setup.sh"
    folder = VENV_CACHE / f"software-vulkan-{hashlib.sha256(setup.read_bytes()).hexdigest()[:12]}"
    with cache_lock("software-vulkan"):
        if not (folder / "env.sh").exists():
            made = subprocess.run(["bash", str(setup), str(folder)], capture_output=True, text=True, check=False)
            last = (made.stderr.strip().splitlines() or ["?"])[-1]
            if made.returncode == HOST_LACKS:
                pytest.skip(f"no software Vulkan here: {last}")
            if made.returncode != 0:
                pytest.fail(f"targets/software-vulkan/setup.sh failed (exit {made.returncode}): {made.stderr[-1500:]}")
    env = {}
    for line in (folder / "env.sh").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = value.split("${")[0].rstrip(":")
    return env


def onnx_model(graph: Any, *opsets: tuple[str, int]) -> Any:
    """helper.make_model at the lowest IR version its opsets allow (default opset: ai.onnx 17): onnx's own
    default is the newest IR, which the last onnxruntime for Python 3.10 (1.23) refuses."""
    from onnx import helper

    imports = [helper.make_opsetid(domain, version) for domain, version in opsets or (("", 17),)]
    return helper.make_model(
        graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports, ignore_unknown=True)
    )


def matmul_model(weight: Any) -> Any:
    """One MatMul of an input x [n, K] by the constant ``weight`` [K, N], named "product"."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="product")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    return onnx_model(graph)


SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)


def shell_lines(page: Path) -> list[str]:
    """The page's fenced shell commands, continuation lines joined, comments dropped."""
    commands = []
    for block in SHELL_FENCE.findall(page.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands
