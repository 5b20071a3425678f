"""Hotwords from the client library and the file client, on the demo model's save/send blend
(tests/fixtures/make_hotword_fixture.py), whose first word only the hotword decides."""
from __future__ import annotations

import numpy as np
import pytest
from client_testkit import ROOT, assert_one_line_error, run_script

from clients.client import connect
from pipeline.audio import SAMPLE_RATE, load_audio
from pipeline.errors import ProtocolError
from fixtures.make_hotword_fixture import BLEND_BOOST

DEMO_MODEL = ROOT / "models" / "demo"
BLEND = ROOT / "tests" / "fixtures" / "demo" / "save_send_blend.wav"
pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "manifest.json").is_file(), reason="needs the demo model")


async def test_library_and_file_client_send_hotwords(serve_test_server):
    silence = np.zeros(SAMPLE_RATE // 2, np.float32)
    audio = np.concatenate([silence, load_audio(BLEND), silence])
    async with serve_test_server(DEMO_MODEL, partial_interval=0.0) as url:
        for word in ("save", "send"):
            hotwords, expected = [{"text": word, "boost": BLEND_BOOST}], f"{word} message"
            async with connect(url, hotwords=hotwords) as stream:
                await stream.send(audio)
                await stream.stop()
            assert [f.text for f in stream.finals] == [expected]
        run = await run_script("clients/file.py", str(BLEND), "--url", url, "--fast",
                               "--hotword", f"save:{BLEND_BOOST:g}")
        assert run.returncode == 0 and run.stdout.strip().endswith("save message"), run
        run = await run_script("clients/file.py", str(BLEND), "--url", url, "--fast", "--hotword", "zebra")
        assert_one_line_error(run, "bad_start", "zebra")  # the server spells hotwords with its model
    run = await run_script("clients/file.py", str(BLEND), "--hotword", "save:99")
    assert run.returncode == 2 and "boost" in run.stderr  # refused before connecting
    run = await run_script("clients/file.py", str(BLEND), "--hotword", "note: " + "long " * 14)
    assert run.returncode == 2 and "characters long" in run.stderr and "Traceback" not in run.stderr
    with pytest.raises(ProtocolError):
        connect(url, hotwords=[{"text": "save", "boost": "high"}])
