"""The runner interface and its registry."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Protocol

import numpy as np

from pe_export.errors import BadInputError, RuntimeUnavailableError
from pe_export.registry import Registry
from pe_export.specs import TensorSpec


class Runner(ABC):
    """Runs one model file in one runtime.

    ``activate`` loads the model, ``infer`` maps input names to arrays and returns output
    names to arrays, ``deactivate`` frees the runtime. Use it as a context manager.
    """

    name: ClassVar[str]
    file_suffixes: ClassVar[tuple[str, ...]]
    backend_module: ClassVar[str] = ""  # top-level module the runtime needs
    option_names: ClassVar[tuple[str, ...]] = ()  # keyword options beyond threads that this runner takes
    only_when_asked: ClassVar[bool] = False  # never picked as a file's default runtime

    def __init__(self, model_path: Path, *, threads: int | None = None, **options: Any) -> None:
        self.model_path = Path(model_path)
        self.threads = threads
        self.options = options

    @abstractmethod
    def activate(self) -> None: ...

    @abstractmethod
    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def input_specs(self) -> list[TensorSpec]: ...

    @abstractmethod
    def output_names(self) -> list[str]: ...

    @abstractmethod
    def deactivate(self) -> None:
        """Drop the runtime's session."""

    def describe(self) -> str:
        return self.name

    # Layer-wise parity (pe_export/parity/layers): a runner that can read a file's intermediate tensors without changing
    # what the file computes says so and implements ``tapped``.
    exposes_intermediates: ClassVar[bool] = False

    @classmethod
    def keeps_intermediates(cls, options: dict[str, Any]) -> bool:
        """Whether the runner with ``options`` can keep a file's intermediate tensors and still compute what it
        computes without them; where not, `parity --layers` runs files cut at a layer
        (pe_export/parity/layers/check.py)."""
        return cls.exposes_intermediates

    def tapped(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """After ``infer``: the file's intermediate tensors by name (``names``, or every float activation)."""
        raise BadInputError(
            f"runtime {self.name!r} cannot read a file's intermediate tensors; layer-wise parity runs on "
            f"{', '.join(n for n, c in RUNNERS.items() if c.exposes_intermediates)}"
        )

    @classmethod
    def arithmetic_precision(cls, options: dict[str, Any]) -> str | None:
        """The precision the runtime computes in when coarser than the file's (a GPU's float16), else None."""
        return None

    @classmethod
    def arithmetic_remedy(cls, options: dict[str, Any]) -> str | None:
        """What a run that fails at that coarser arithmetic can do instead, on this runtime (None: nothing)."""
        return None

    def __enter__(self) -> Runner:
        self.activate()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.deactivate()


RUNNERS: Registry[type[Runner]] = Registry("runtime")


def register_runner(name: str, suffixes: tuple[str, ...]) -> Callable[[type[Runner]], type[Runner]]:
    """Class decorator: make a runner available under ``name`` for files with ``suffixes``."""
    return RUNNERS.register(name, file_suffixes=suffixes)


def runner_names() -> list[str]:
    """Every runner, in preference order (the first installed one for a file is the default)."""
    return RUNNERS.names()


def runners_for_file(path: Path) -> list[str]:
    """Runner names that accept this file, in registration (preference) order."""
    suffix = Path(path).suffix.lower()
    return [name for name, cls in RUNNERS.items() if suffix in cls.file_suffixes]


def installed_runners(path: Path) -> list[str]:
    """Runners for this file whose backend module is installed (found, not imported), in preference order;
    runners that need hardware (``only_when_asked``) are left out: they run when named."""
    return [
        name
        for name in runners_for_file(path)
        if not RUNNERS.get(name).only_when_asked and importlib.util.find_spec(RUNNERS.get(name).backend_module)
    ]


def first_installed_runner(path: Path) -> str | None:
    return next(iter(installed_runners(path)), None)


NO_RUNTIME_FIX = "pip install 'pe-export[device]'"


def resolve_runtime(path: Path, asked: str | None = None) -> str:
    """The runtime to run ``path`` with: the one asked for, else the first installed; none is exit 3."""
    runtime = asked or first_installed_runner(path)
    if runtime is None:
        raise RuntimeUnavailableError(f"no runtime for {Path(path).suffix} files is installed; {NO_RUNTIME_FIX}")
    return runtime


def runner_options(runtime: str, *, threads: int | None, **options: Any) -> dict[str, Any]:
    """Keyword options for create_runner: threads, plus those of ``options`` this runtime takes."""
    accepted = RUNNERS.get(runtime).option_names
    return {"threads": threads, **{key: value for key, value in options.items() if key in accepted}}


class RuntimeSettings(Protocol):
    """What a command's options say about the runtime (ParityOptions, BenchOptions)."""

    @property
    def threads(self) -> int | None: ...
    @property
    def providers(self) -> tuple[str, ...]: ...
    @property
    def tf32(self) -> bool: ...
    @property
    def gpu_precision(self) -> str: ...
    @property
    def cpu_fallback(self) -> bool: ...
    @property
    def trt_fp16(self) -> bool: ...
    @property
    def trt_int8(self) -> bool: ...
    @property
    def trt_cache(self) -> str | None: ...


def create_runner(name: str, model_path: Path, **options: Any) -> Runner:
    cls = RUNNERS.get(name)
    suffix = Path(model_path).suffix.lower()
    if suffix not in cls.file_suffixes:
        raise BadInputError(
            f"runtime {name!r} runs {'/'.join(cls.file_suffixes)} files, not {Path(model_path).name!r}; "
            f"for this file use one of: {', '.join(runners_for_file(model_path)) or 'none'}"
        )
    return cls(model_path, **options)


def infer_rows(runner: Runner, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``runner.infer`` on ``feed``'s rows, in as many runs as a file of a fixed batch needs (``whole_batches``; the
    filled rows are dropped from the outputs): a bundle stored 4 rows a batch checks a batch-1 file, where the
    TFLite and onnxruntime CPU kernels would refuse the shape."""
    from pe_export.holdout import whole_batches

    batches = {spec.shape[0] for spec in runner.input_specs() if spec.shape and spec.shape[0] is not None}
    rows = {int(array.shape[0]) for array in feed.values() if np.ndim(array)}
    if len(batches) != 1 or len(rows) != 1 or batches == rows:
        return runner.infer(feed)
    (batch,), (count,) = batches, rows
    parts = [
        runner.infer({name: np.take(array, index, axis=0) for name, array in feed.items()})
        for index in whole_batches(count, batch)
    ]
    joined = {}
    for name, first in parts[0].items():
        if np.ndim(first) and first.shape[0] == batch:
            joined[name] = np.concatenate([part[name] for part in parts])[:count]
        else:  # no batch axis: one run's value stands for all
            joined[name] = first
    return joined
