"""Every file pe-export writes or reads is safe to hand to another user, another process and a failed run:
default output names, paths checked before the work, nothing left by a failed export, the umask's
permissions, refusals of what is not a model — all through the real commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pe_export.errors import ExitCode
from tests.helpers import assert_one_line_error, run_cli

MODEL = "encoder_dynamic"


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_default_output_is_the_model_folder_name_here(
    capfd, saved_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The design card's own command, `pe-export tflite saved_model/ --compress 64`, works as written."""
    model = tmp_path / "saved_model"
    shutil.copytree(saved_model(MODEL), model)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = run_cli(capfd, "tflite", f"{model}/", "--compress", "64")
    assert result.exit_code == 0, result.stderr
    assert listing(work) == ["saved_model.tflite"] and "OK: wrote saved_model.tflite" in result.stdout
    again = run_cli(capfd, "tflite", model, "--compress", "64")
    assert_one_line_error(again, ExitCode.BAD_INPUT, "saved_model.tflite already exists", "--overwrite")
    listed = run_cli(capfd, "onnx", model, "--list-tables")  # writes nothing, needs no -o
    assert listed.exit_code == 0 and "position tables in" in listed.stdout
    assert listing(work) == ["saved_model.tflite"]


def test_a_failed_export_leaves_nothing_unless_kept_by_name(capfd, saved_model, tmp_path: Path) -> None:
    lossy = ["--compress", "2", "--compress-method", "interp"]  # the seed's recipe: parity fails (exit 1)
    result = run_cli(capfd, "tflite", saved_model(MODEL), "-o", tmp_path / "m.tflite", *lossy)
    assert_one_line_error(
        result, ExitCode.PARITY_FAILED, "m.tflite was not written", "--keep-failed keeps", "m.FAILED.tflite"
    )
    assert listing(tmp_path) == []
    report = tmp_path.parent / f"{tmp_path.name}.json"  # --json: written for a refused export too, saying so
    kept = run_cli(
        capfd, "tflite", saved_model(MODEL), "-o", tmp_path / "m.tflite", *lossy, "--keep-failed", "--json", report
    )
    assert_one_line_error(kept, ExitCode.PARITY_FAILED, "the failing file is kept as", "m.FAILED.tflite")
    assert listing(tmp_path) == ["m.FAILED.tflite"]
    said = json.loads(report.read_text())
    assert (said["written"], said["exit_code"], said["parity"]["passed"]) == (False, ExitCode.PARITY_FAILED, False)
    assert said["kept_failed"] == str(tmp_path / "m.FAILED.tflite") and said["tables"][0]["method"] == "interp"


def test_outputs_have_the_permissions_the_umask_gives(capfd, saved_model, tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        model = saved_model(MODEL)
        assert run_cli(capfd, "onnx", model, "-o", tmp_path / "m.onnx").exit_code == 0
        assert run_cli(capfd, "golden", model, "-o", tmp_path / "golden", "--samples", "4").exit_code == 0
        checked = run_cli(
            capfd,
            "parity",
            tmp_path / "m.onnx",
            tmp_path / "golden",
            "--json",
            tmp_path / "r.json",
            "--plot",
            tmp_path / "p.png",
        )
        assert checked.exit_code == 0, checked.stderr
    finally:
        os.umask(previous)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    print(modes)
    folders = {name for name in modes if (tmp_path / name).is_dir()}
    assert folders == {"golden", "golden/batches"} and all(modes[name] == 0o755 for name in folders)
    assert all(mode == 0o644 for name, mode in modes.items() if name not in folders)


SYSTEM_PYTHON = "/usr/bin/python3"  # outside /root, so another user can run a venv made from it


@pytest.mark.slow  # builds a fresh venv of the system Python once
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="switching to another uid needs root")
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason=f"no {SYSTEM_PYTHON} to build a venv another user can run")
def test_a_bundle_made_by_one_user_passes_parity_run_by_another(capfd, saved_model, tmp_path: Path) -> None:
    """What the device images do (they run as uid 1000): `pe-export parity` as another user, from a TF-free
    device venv, on a bundle and a model made by this one under the usual umask."""
    import pwd

    from tests.helpers import cached_venv

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine")
    shared_root = Path("/tmp/pe-export-shared")
    shared_root.mkdir(mode=0o755, exist_ok=True)
    os.chmod(shared_root, 0o755)
    venv = cached_venv(
        "device-venv-any-user", [f"{Path(__file__).resolve().parents[1]}[device]"], base=SYSTEM_PYTHON, root=shared_root
    )
    work = shared_root / f"work-{os.getpid()}"
    work.mkdir(mode=0o755)
    try:
        os.chmod(work, 0o755)
        previous = os.umask(0o022)
        try:
            made = run_cli(capfd, "golden", saved_model(MODEL), "-o", work / "golden", "--samples", "4")
            assert made.exit_code == 0
            assert run_cli(capfd, "tflite", saved_model(MODEL), "-o", work / "m.tflite").exit_code == 0
        finally:
            os.umask(previous)

        def as_nobody() -> None:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)

        checked = subprocess.run(
            [str(venv / "bin" / "pe-export"), "parity", str(work / "m.tflite"), str(work / "golden")],
            preexec_fn=as_nobody,
            capture_output=True,
            text=True,
            check=False,
            cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
        )
        print(checked.stdout[-400:], checked.stderr[-400:])
        assert checked.returncode == 0 and "PASS" in checked.stdout, checked.stderr[-1000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def model_and_bundle(saved_model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One exported file and golden bundle for every refusal case (each case copies them: ten exports took a minute)."""
    from pe_export.cli import main

    made = tmp_path_factory.mktemp("refusals")
    model, bundle = made / "m.onnx", made / "golden"
    for args in (
        ["onnx", saved_model(MODEL), "-o", model],
        ["golden", saved_model(MODEL), "-o", bundle, "--samples", "4"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([str(a) for a in args])
        assert not exit_info.value.code, args
    return model, bundle


@pytest.mark.parametrize(
    ("make_args", "fragments"),
    [
        (lambda d, m, b: ["parity", m, b, "--json", d / "exists.json"], ["exists.json already exists", "--overwrite"]),
        (lambda d, m, b: ["parity", m, b, "--json", m], ["--json", "expected a file name ending in .json"]),
        (lambda d, m, b: ["parity", m, b, "--json", d / "nofolder" / "r.json"], ["folder", "does not exist"]),
        (lambda d, m, b: ["parity", m, b, "--json", d / "exists.json" / "r.json"], ["does not exist"]),
        (lambda d, m, b: ["parity", m, b, "--plot", d / "p.txt"], ["--plot", "ending in .png"]),
        (lambda d, m, b: ["parity", m, b, "--plot", d / "exists.png"], ["exists.png already exists"]),
        (lambda d, m, b: ["bench", m, "--json", d / "exists.json"], ["exists.json already exists", "--overwrite"]),
        (lambda d, m, b: ["bench", m, "--json", d], ["--json", "ending in .json"]),
        (lambda d, m, b: ["demo", "--out", d], ["already holds golden, report.json", "--overwrite"]),
        (lambda d, m, b: ["demo", "--out", d / "exists.json"], ["is a file"]),
    ],
)
def test_output_paths_are_refused_before_the_work(
    capfd, model_and_bundle: tuple[Path, Path], tmp_path: Path, make_args, fragments
) -> None:
    """Each refusal is exit 2, one line, before anything runs (no report printed), nothing replaced."""
    model, bundle = tmp_path / "m.onnx", tmp_path / "golden"
    shutil.copy(model_and_bundle[0], model)
    shutil.copytree(model_and_bundle[1], bundle)
    for name in ("exists.json", "exists.png", "report.json"):
        (tmp_path / name).write_text("the user's own")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = run_cli(capfd, *make_args(tmp_path, model, bundle))
    assert_one_line_error(result, ExitCode.BAD_INPUT, *fragments)
    assert result.stdout == ""  # refused before any check, benchmark or export ran
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_overwrite_replaces_json_and_plot(capfd, saved_model, tmp_path: Path) -> None:
    model, bundle = tmp_path / "m.onnx", tmp_path / "golden"
    assert run_cli(capfd, "onnx", saved_model(MODEL), "-o", model).exit_code == 0
    assert run_cli(capfd, "golden", saved_model(MODEL), "-o", bundle, "--samples", "4").exit_code == 0
    (tmp_path / "r.json").write_text("old")
    (tmp_path / "p.png").write_text("old")
    result = run_cli(
        capfd, "parity", model, bundle, "--json", tmp_path / "r.json", "--plot", tmp_path / "p.png", "--overwrite"
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is True
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_refused_before_the_check(
    capfd, saved_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, bundle = tmp_path / "m.onnx", tmp_path / "golden"
    assert run_cli(capfd, "onnx", saved_model(MODEL), "-o", model).exit_code == 0
    assert run_cli(capfd, "golden", saved_model(MODEL), "-o", bundle, "--samples", "4").exit_code == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it now fails, as where it is absent
    result = run_cli(capfd, "parity", model, bundle, "--plot", tmp_path / "p.png")
    assert_one_line_error(result, ExitCode.BAD_INPUT, "matplotlib is not installed", "pe-export[plot]")
    assert result.stdout == "" and not (tmp_path / "p.png").exists()


def test_user_data_and_lengths_are_bad_input_not_bugs(capfd, saved_model, tmp_path: Path) -> None:
    import numpy as np

    model = saved_model(MODEL)
    np.savez(tmp_path / "oov.npz", token_ids=np.array([[1, 2, 3, 99_999]], np.int32))
    oov = run_cli(capfd, "golden", model, "-o", tmp_path / "g1", "--inputs", tmp_path / "oov.npz")
    assert_one_line_error(oov, ExitCode.BAD_INPUT, "'token_ids' holds ids 1…99999", "expected ids from 0 to")
    rows = int(re.search(r"(\d+)x\d+ +\S+ +kept", run_cli(capfd, "tflite", model, "--list-tables").stdout)[1])
    long = run_cli(capfd, "golden", model, "-o", tmp_path / "g2", "--seq-len", str(rows + 36))
    assert_one_line_error(
        long,
        ExitCode.BAD_INPUT,
        f"longer than the model takes: {rows} tokens (its position table has {rows} rows)",
        f"--seq-len {rows} or less",
    )
    fixed = run_cli(capfd, "tflite", model, "-o", tmp_path / "m.tflite", "--seq-len", str(rows + 36))
    hint = f"--dynamic-seq --max-len {rows + 36}"
    assert_one_line_error(fixed, ExitCode.BAD_INPUT, f"position table has {rows} rows", hint)
    followed = run_cli(capfd, "tflite", model, "-o", tmp_path / "m.tflite", *hint.split())  # the advice works
    assert followed.exit_code == 0, followed.stderr
    assert listing(tmp_path) == ["m.tflite", "oov.npz"]


def test_what_is_not_a_model_or_not_in_the_bundle_is_refused(capfd, saved_model, tmp_path: Path) -> None:
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert_one_line_error(run_cli(capfd, "inspect", tmp_path / "empty.onnx"), ExitCode.BAD_INPUT, "is empty (0 bytes)")
    (tmp_path / "text.onnx").write_bytes(b"\x08\x07")  # parses as a protobuf: ir_version 7, nothing else
    assert_one_line_error(
        run_cli(capfd, "inspect", tmp_path / "text.onnx"),
        ExitCode.BAD_INPUT,
        "is not an ONNX model (no graph outputs or opset)",
    )
    model, bundle = tmp_path / "m.onnx", tmp_path / "golden"
    assert run_cli(capfd, "onnx", saved_model(MODEL), "-o", model).exit_code == 0
    assert run_cli(capfd, "golden", saved_model(MODEL), "-o", bundle, "--samples", "4").exit_code == 0
    batch = next((bundle / "batches").glob("*.npz"))
    outside = tmp_path / "outside.npz"
    shutil.move(batch, outside)
    batch.symlink_to(outside)  # same bytes, same checksum: only the link gives it away
    refused = run_cli(capfd, "parity", model, bundle, "--no-isolate")
    assert_one_line_error(refused, ExitCode.BAD_INPUT, "is a link to a file outside the bundle")


def test_a_damaged_op_code_is_called_damage_not_an_old_runtime(capfd, saved_model, tmp_path: Path) -> None:
    from tensorflow.lite.tools import flatbuffer_utils

    assert run_cli(capfd, "tflite", saved_model(MODEL), "-o", tmp_path / "m.tflite").exit_code == 0
    model = flatbuffer_utils.read_model(str(tmp_path / "m.tflite"))
    model.operatorCodes[0].builtinCode, model.operatorCodes[0].deprecatedBuiltinCode = 250, 127  # no such op
    (tmp_path / "bad.tflite").write_bytes(bytes(flatbuffer_utils.convert_object_to_bytearray(model)))
    assert run_cli(capfd, "golden", saved_model(MODEL), "-o", tmp_path / "golden", "--samples", "4").exit_code == 0
    result = run_cli(capfd, "parity", tmp_path / "bad.tflite", tmp_path / "golden", "--runtime", "litert")
    assert_one_line_error(result, ExitCode.BAD_INPUT, "bad.tflite looks damaged", "builtin_code out of range")


def test_a_keras_file_exports_and_checks_like_its_savedmodel(
    capfd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keras.Model.save writes .keras by default: export it, make a bundle from it in another command, check."""
    if sys.version_info < (3, 11):
        pytest.skip("keras-hub 0.32 needs Python 3.11+: a keras-hub backbone is the model with registered layers")
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DistilBertBackbone(
        vocabulary_size=100, max_sequence_length=64, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64
    )
    backbone.save(tmp_path / "distil.keras")
    monkeypatch.chdir(tmp_path)
    exported = run_cli(capfd, "tflite", "distil.keras")
    assert exported.exit_code == 0, exported.stderr
    assert "OK: wrote distil.tflite" in exported.stdout and "distil.keras →" in exported.stdout
    assert run_cli(capfd, "golden", "distil.keras", "-o", "golden", "--samples", "4").exit_code == 0
    checked = run_cli(capfd, "parity", "distil.tflite", "golden")  # the same model by digest, across commands
    assert checked.exit_code == 0 and "PASS" in checked.stdout, checked.stderr
    assert listing(tmp_path) == ["distil.keras", "distil.tflite", "golden"]  # no temporary SavedModel left here


def test_a_keras_file_with_unregistered_layers_is_one_line(capfd, tmp_path: Path) -> None:
    from tests.fixtures.models import build_encoder

    build_encoder(None).save(tmp_path / "custom.keras")  # the test encoder's own layer classes are not registered
    result = run_cli(capfd, "onnx", tmp_path / "custom.keras", "-o", tmp_path / "m.onnx")
    assert_one_line_error(
        result,
        ExitCode.BAD_INPUT,
        "custom.keras: Keras cannot load it",
        "register_keras_serializable",
        "model.export(folder)",
    )
    assert listing(tmp_path) == ["custom.keras"]


def test_an_export_interrupted_during_verification_leaves_nothing(
    capfd, saved_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while the written file is being verified (KeyboardInterrupt wherever Python is)."""
    import pe_export.api

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pe_export.api, "verify_export", interrupted)
    result = run_cli(capfd, "tflite", saved_model(MODEL), "-o", tmp_path / "m.tflite")
    assert result.exit_code == 130 and "nothing partial was left behind" in result.stderr
    assert listing(tmp_path) == []  # neither the unverified file nor its staged copy
