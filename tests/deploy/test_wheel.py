"""The built wheel, installed as a user installs it: a fresh virtual environment with nothing of the
checkout, `unipad` started from a folder that holds its own server.py, models/ and pipeline/, a file
transcribed by `unipad-file`, and the client library imported beside the user's own `server` module.

The wheel is built from a copy of only what pyproject.toml names (so nothing of the checkout leaks in),
with pip's build isolation as `pip wheel .` runs it; its dependencies come from the package index (pip's
cache after the first run)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from bench.serverproc import free_port
from unipad_asr import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "fixtures" / "demo" / "multi.wav"  # three utterances the demo model knows
SHIPPED = ("pipeline", "server", "models", "export", "clients")  # bench stays in the checkout
READY_TIMEOUT = 60

# The user's own modules under our packages' names: importing any of them by mistake stops the process.
USER_MODULE = 'WHO = "user"\nif __import__("os").environ.get("UNIPAD_FORBID_USER"):\n    raise SystemExit("{}")\n'


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("unipad_asr", *SHIPPED):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "-w", str(out), str(source)], check=True, capture_output=True, text=True)
    (built,) = out.glob("unipad_asr-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel and its dependencies, and nothing of the checkout."""
    where = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True)
    # --no-compile: byte-compiling numpy's and onnxruntime's files at install is most of its CPU time here;
    # the server compiles what it imports when it starts
    subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-compile", str(wheel)], check=True, capture_output=True, text=True)
    return where


@pytest.fixture()
def user_folder(tmp_path: Path) -> Path:
    """An empty folder but for the user's own server.py, models/ and pipeline/ (names ours share)."""
    (tmp_path / "server.py").write_text(USER_MODULE.format("imported the user's server.py"))
    for package in ("models", "pipeline"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(USER_MODULE.format(f"imported the user's {package}/"))
    return tmp_path


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell in `venv`: no PYTHONPATH pointing into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"]), VIRTUAL_ENV=str(venv))
    return env


def wait_ready(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    server.kill()
    raise AssertionError(f"unipad did not get ready: {server.communicate()[1][-3000:]}")


def test_the_wheel_holds_one_package_and_what_the_server_reads(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"unipad_asr"}, top  # no `server`, `models`, ... of ours at the top of site-packages
    assert {f"unipad_asr/{p}/__init__.py" for p in SHIPPED} <= set(names)
    subpackages = {f"unipad_asr/{init.relative_to(ROOT).as_posix()}" for p in SHIPPED for init in (ROOT / p).rglob("__init__.py")}
    assert subpackages <= set(names), sorted(subpackages - set(names))  # pipeline/families/* with the rest
    for needed in ("models/demo/manifest.json", "models/demo/model.int8.onnx", "models/demo/tokens.txt",
                   "clients/static/index.html", "clients/static/worklet.js", "pipeline/data/silero_vad.onnx",
                   "pipeline/data/silero_vad.LICENSE"):
        assert f"unipad_asr/{needed}" in names, needed
    assert not any(name.startswith(("unipad_asr/bench/", "unipad_asr/tests/")) for name in names)


def test_installed_unipad_serves_from_a_folder_with_its_own_server_py(venv: Path, user_folder: Path) -> None:
    env = clean_env(venv) | {"UNIPAD_FORBID_USER": "1"}
    port = free_port()
    server = subprocess.Popen([str(venv / "bin" / "unipad"), "--port", str(port)], cwd=user_folder, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(port, server)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:  # the page ships too
            assert b"<html" in page.read().lower()
        done = subprocess.run([str(venv / "bin" / "unipad-file"), str(RECORDING), "--url",
                               f"ws://127.0.0.1:{port}", "--fast", "--format", "jsonl"],
                              cwd=user_folder, env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    texts = [json.loads(line)["text"] for line in done.stdout.splitlines()]
    expected = [u["text"] for u in json.loads(RECORDING.with_suffix(".json").read_text())["speech"]]
    assert texts == expected
    assert server.returncode == 0, err[-3000:]
    assert "/site-packages/unipad_asr/models/demo" in err  # the wheel's own demo model, not a checkout's


def test_the_library_leaves_the_users_own_modules_alone(venv: Path, user_folder: Path) -> None:
    script = """
import sys
import server, models                               # the user's, from the working directory
from unipad_asr.clients import connect              # ours, under our one name
from unipad_asr.server.protocol import Final
import pipeline                                     # still the user's, after ours loaded
assert server.WHO == models.WHO == pipeline.WHO == "user"
ours = sorted(name for name in sys.modules if name.split(".")[0] in {top})
assert ours == ["models", "pipeline", "server"], ours  # nothing of ours under the bare names
print(connect.__module__, Final.__module__)
""".replace("{top}", repr(set(PACKAGES)))
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=user_folder, env=clean_env(venv),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["unipad_asr.clients.client", "unipad_asr.server.protocol"]


def test_installed_commands_answer_help(venv: Path, user_folder: Path) -> None:
    env = clean_env(venv) | {"UNIPAD_FORBID_USER": "1"}
    for command in (["unipad-export"], ["unipad-mic"], ["python", "-m", "unipad_asr"]):
        done = subprocess.run([str(venv / "bin" / command[0]), *command[1:], "--help"], cwd=user_folder, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "usage:" in done.stdout, (command, done.stderr)
