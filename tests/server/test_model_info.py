"""What the server says about its model: GET /v1/model, GET /v1/model/card and the startup log line."""
from __future__ import annotations

import json

from pathlib import Path

from pipeline.modeldir import MANIFEST_FORMAT, read_model_directory
from server.model_info import MODEL_CARD_PATH, MODEL_PATH, model_info, notice_line
from server_testkit import http_get

DEMO_MODEL = Path(__file__).resolve().parents[2] / "models" / "demo"


def plain_model_dir(tmp_path):
    """A model directory as an older export wrote it: a manifest without `notice`, no model card."""
    manifest = {"name": "sensevoice-small", "architecture": "sensevoice", "dimensions": {}, "files": {},
                "source": {"kind": "checkpoint"}, "format": MANIFEST_FORMAT}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    (tmp_path / "tokens.txt").write_text("<blank>\n", encoding="utf-8")
    return read_model_directory(tmp_path)


def test_a_model_without_notice_is_described_by_name_and_languages(tmp_path):
    model = plain_model_dir(tmp_path)
    assert model_info(model) == {"name": "sensevoice-small", "languages": ["zh", "en", "yue", "ja", "ko"],
                                 "notice": "", "card": None, "punctuation": None}
    assert notice_line(model) == "model sensevoice-small, languages zh, en, yue, ja, ko"


def test_the_demo_model_says_what_it_knows_and_where_its_card_is():
    model = read_model_directory(DEMO_MODEL)
    info = model_info(model)
    assert info["name"] == "demo-en-commands" and info["card"] == MODEL_CARD_PATH
    assert "English" in info["notice"] and "Serving the real SenseVoiceSmall" in info["notice"]
    line = notice_line(model)
    assert line.startswith("model demo-en-commands: ") and str(DEMO_MODEL / "README.md") in line


async def test_model_endpoints(serve_test_server, test_model_dir):
    model = read_model_directory(test_model_dir)
    async with serve_test_server() as url:
        status, headers, body = await http_get(url.http, MODEL_PATH)
        assert status == 200 and headers["content-type"] == "application/json"
        assert json.loads(body) == model_info(model)
        status, headers, body = await http_get(url.http, MODEL_CARD_PATH)
    if (test_model_dir / "README.md").is_file():
        assert status == 200 and headers["content-type"] == "text/plain; charset=utf-8"
        assert body == (test_model_dir / "README.md").read_bytes()
    else:
        assert status == 404 and b"no model card" in body
