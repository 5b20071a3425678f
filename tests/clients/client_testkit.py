"""Shared bits of the client tests: paths, the demo-model switch, transcript normalisation, audio files."""
from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "models" / "demo"
ARTIFACTS = ROOT / "tests" / "artifacts"  # git-ignored: screenshots of the browser tests


def knows_words(model_dir: Path) -> bool:
    """True when the served model is the trained demo model: then transcripts are checked word for word;
    otherwise (the tiny random graph) only the structure of the results is."""
    return Path(model_dir).resolve() == DEMO_MODEL.resolve() and (DEMO_MODEL / "manifest.json").is_file()


def normalise(text: str) -> str:
    """Lower case, words only: 'Please open the window now.' -> 'please open the window now'."""
    return " ".join(re.sub(r"[^\w']+", " ", text.lower()).split())


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


async def run_script(*args: str, timeout: float = 120) -> Run:
    """Run `python ARGS...` in the repository root (without blocking the server in this event loop)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return Run(proc.returncode, out.decode(), err.decode())


def assert_one_line_error(run: Run, *fragments: str) -> None:
    """A failed client run: exit 1, exactly one line on stderr that says why, no traceback."""
    assert run.returncode == 1, run
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), (fragment, lines[0])
