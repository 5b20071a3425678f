"""README's first commands as a new user on a plain Debian/Ubuntu runs them: only `python3` (no `python`
command; its system site-packages refuse pip, "externally-managed-environment"), so a virtual
environment first, then `pip install -e . && unipad`, and `bash .ci/run`.

`.ci/run` makes `.venv` with `python3` and installs the project there with `pip install -e`; run inside
it, the last test starts README's server command from that environment, on a PATH holding no other
Python than the system's `python3`, outside the checkout, and waits for /readyz.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.serverproc import free_port

ROOT = Path(__file__).resolve().parents[1]
PLAIN_PATH = ("/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")  # a Debian root's PATH
READY_TIMEOUT = 120


def first_commands() -> list[str]:
    """The commands of README's first code block, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def test_readme_opens_with_a_venv_then_two_commands() -> None:
    venv, install_and_serve, run_tests = first_commands()
    assert re.fullmatch(r"python3 -m venv (\S+) && \. \1/bin/activate", venv), venv  # python3: on every Debian
    assert install_and_serve == "pip install -e . && unipad"  # the installed command, from any folder
    assert run_tests == "bash .ci/run"


def test_ci_run_makes_its_own_venv_with_python3() -> None:
    """`.ci/run` used `python -m pip` on the system Python: "python: command not found" on a plain Debian,
    and "externally-managed-environment" where `python` exists. Every Python it runs is the venv's."""
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    code = [line.split("#", 1)[0] for line in script.splitlines()]
    assert any(re.search(r"\bpython3 -m venv\b", line) for line in code)
    bare = [line.strip() for line in code if re.search(r"(^|[;&|(]|\bexec)\s*(python|pip)\s", line)]  # as a command
    assert bare == [], bare  # only "$python" (the venv's) and python3 (to make the venv)
    assert "/.venv/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


def readiness(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except OSError:
        return 0, {}


def test_readme_server_command_from_a_venv_made_with_python3(tmp_path: Path) -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("not in a virtual environment: `bash .ci/run` runs this in the .venv it makes with python3")
    serve = first_commands()[1].split("&&")[1].strip()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), *PLAIN_PATH]), VIRTUAL_ENV=sys.prefix)
    # Outside the checkout, so what serves is what `pip install -e .` installed, not the working directory:
    # this checkout's files under the one installed name (unipad_asr/__init__.py), and no bare `server`.
    where = subprocess.run(["python", "-c", "import unipad_asr.server as s, importlib.util as u; "
                            "print(s.__file__, u.find_spec('server'))"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert where == [str(ROOT / "server" / "__init__.py"), "None"], where  # the editable install of this checkout
    server = subprocess.Popen(["bash", "-c", f"exec {serve} --port {port}"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        status, body = 0, {}
        while time.monotonic() < deadline and server.poll() is None:
            status, body = readiness(f"http://127.0.0.1:{port}/readyz")
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200 and body.get("status") == "ready", (status, body, server.poll())
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            _, err = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            _, err = server.communicate()
    assert server.returncode == 0, err[-3000:]
    assert f"browser page: http://127.0.0.1:{port}/" in err
