"""The browser page in Debian's Chromium (Playwright, never a downloaded browser), hearing a WAV file as
its microphone, against a real server. Screenshots go to tests/artifacts/ (git-ignored)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
from client_testkit import ARTIFACTS, ROOT, knows_words, normalise

from pipeline.audio import SAMPLE_RATE
from pipeline.modeldir import read_model_directory

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt install chromium)")
TRAILING_SILENCE = 4.0  # seconds: Chromium loops the file; the last segment must end before the loop
WAIT_MS = 60_000  # generous: this machine is shared with a training run
INSECURE_HOST = "unipad.test"  # http:// on a name other than localhost: what a LAN address looks like to the page


def chromium_args(fake_microphone: Path) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={fake_microphone}",
            f"--host-resolver-rules=MAP {INSECURE_HOST} 127.0.0.1"]  # a name that is not a secure context


def fake_microphone(tmp_path: Path, audio: np.ndarray) -> Path:
    """A 48 kHz WAV (what a sound card gives) of `audio` (float32 at SAMPLE_RATE) plus trailing silence."""
    import soxr

    padded = np.concatenate([audio, np.zeros(int(TRAILING_SILENCE * SAMPLE_RATE), np.float32)])
    path = tmp_path / "microphone.wav"
    soundfile.write(path, soxr.resample(padded, SAMPLE_RATE, 48000), 48000, subtype="PCM_16")
    return path


@pytest.fixture
async def browser(tmp_path, speech):
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                   args=chromium_args(fake_microphone(tmp_path, speech.audio)))
        try:
            yield browser
        finally:
            await browser.close()


async def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if not (ARTIFACTS / ".gitignore").exists():  # test output, never committed
        (ARTIFACTS / ".gitignore").write_text("*\n")
    path = ARTIFACTS / name
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


async def stats(page) -> dict:
    return await page.evaluate("() => ({...window.unipad.stats})")


async def check_model_notice(page, model_dir: Path) -> str:
    """The page names the served model before anyone speaks: the manifest's notice (a demo model says what
    it knows), else its languages; the model card link opens the directory's README.md."""
    manifest = read_model_directory(model_dir).manifest
    box = page.locator("#model")
    await box.wait_for(state="visible", timeout=WAIT_MS)
    shown = await box.inner_text()
    assert shown.startswith(f"Model {manifest.name}"), shown
    assert manifest.notice in shown if manifest.notice else "languages: " in shown, shown
    links = box.get_by_role("link", name="model card")
    if (model_dir / "README.md").is_file():
        href = await links.get_attribute("href")
        card = await page.evaluate("async (href) => (await fetch(href)).text()", href)
        assert card == (model_dir / "README.md").read_text(encoding="utf-8")
    else:
        assert await links.count() == 0
    return shown


async def test_page_transcribes_the_microphone(serve_test_server, browser, speech, test_model_dir):
    async with serve_test_server(partial_interval=0.3) as url:
        page = await browser.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        page.on("console", lambda m: page_errors.append(m.text) if m.type == "error" else None)  # e.g. a 404
        await page.goto(url.http + "/")
        assert await page.title() == "Unipad ASR"
        notice = await check_model_notice(page, test_model_dir)
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_selector('#state[data-state="listening"]', timeout=WAIT_MS)
        assert "Session" in await page.inner_text("#session")
        n = len(speech.utterances)
        await page.wait_for_function("window.unipad.stats.finals >= 1", timeout=WAIT_MS)
        await screenshot(page, "browser_listening.png")  # live: level meter, a final, maybe a partial
        await page.wait_for_function(f"window.unipad.stats.finals >= {n}", timeout=WAIT_MS)
        await page.get_by_role("button", name="Stop").click()
        await page.wait_for_selector('#state[data-state="idle"]', timeout=WAIT_MS)
        shot = await screenshot(page, "browser_transcript.png")
        counts = await stats(page)
        finals = await page.locator("#finals li .text").all_inner_texts()
        times = await page.locator("#finals li .time").all_inner_texts()
        errors = await page.locator("#errors").inner_text()
    assert page_errors == [] and errors == "" and counts["errors"] == 0, (page_errors, errors)
    assert counts["done"] == 1 and counts["partials"] >= 1 and counts["maxLevel"] > 0, counts
    assert counts["finals"] >= n and len(finals) <= counts["finals"]  # empty finals are not listed
    assert all(t.count(":") == 2 for t in times), times  # "0:00.6–0:02.2"
    assert shot.stat().st_size > 0
    if knows_words(test_model_dir):  # the shipped demo model warns that it knows only a few English words
        assert "demo model" in notice and "SenseVoiceSmall" in notice, notice
    if knows_words(test_model_dir):
        assert [normalise(t) for t in finals[:n]] == [normalise(u["text"]) for u in speech.utterances]


async def test_page_shows_server_errors(serve_test_server, browser):
    async with serve_test_server(token="sesame") as url:
        page = await browser.new_page()
        await page.goto(url.http + "/")
        # No token: the handshake is accepted, `start` is refused with an `error` and close 1008.
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_selector('#state[data-state="error"]', timeout=WAIT_MS)
        shown = await page.locator("#errors .error").all_inner_texts()
        assert any("unauthorized" in e for e in shown), shown
        assert any("1008" in e for e in shown), shown
        await screenshot(page, "browser_error.png")
        # A wrong token: refused at the handshake (HTTP 401), which a browser sees as close 1006.
        await page.get_by_label("Token").fill("not-the-token")
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_selector('#state[data-state="error"]', timeout=WAIT_MS)
        shown = await page.locator("#errors .error").all_inner_texts()
        assert len(shown) == 1 and "Could not connect" in shown[0] and "not-the-token" not in shown[0], shown
        # The right one works.
        await page.get_by_label("Token").fill("sesame")
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_selector('#state[data-state="listening"]', timeout=WAIT_MS)
        await page.get_by_role("button", name="Stop").click()
        await page.wait_for_selector('#state[data-state="idle"]', timeout=WAIT_MS)
        assert await page.locator("#errors .error").count() == 0


async def error_after_start(page) -> str:
    await page.get_by_role("button", name="Start").click()
    await page.wait_for_selector('#state[data-state="error"]', timeout=WAIT_MS)
    return await page.locator("#errors").inner_text()


async def test_page_blames_a_stopped_server_not_the_microphone(serve_test_server, browser):
    async with serve_test_server() as url:
        page = await browser.new_page()
        await page.goto(url.http + "/")
    # The page's audio code comes from the server on Start: this used to read "Microphone unavailable".
    shown = await error_after_start(page)
    assert shown.startswith("Server unreachable: ") and "is the server running?" in shown, shown
    assert await page.inner_text("#state") == "Server unreachable"


async def test_page_explains_why_plain_http_has_no_microphone(serve_test_server, browser):
    async with serve_test_server() as url:
        page = await browser.new_page()
        await page.goto(f"http://{INSECURE_HOST}:{url.port}/")
        # navigator.mediaDevices is missing outside secure contexts: this used to be a TypeError's words.
        shown = await error_after_start(page)
    assert "only to https:// pages and http://localhost" in shown and "--certfile" in shown, shown
    assert "TypeError" not in shown


async def test_stream_url_follows_the_page(serve_test_server, browser):
    async with serve_test_server() as url:
        page = await browser.new_page()
        await page.goto(url.http + "/")
        assert await page.evaluate("window.unipad.streamUrl('')") == url
        assert await page.evaluate("window.unipad.streamUrl('a b')") == url + "?token=a+b"
        await page.goto(url.http + "/?server=wss://asr.example.org/v1/stream")
        assert await page.evaluate("window.unipad.streamUrl('')") == "wss://asr.example.org/v1/stream"


async def test_resampler_is_band_limited(browser):
    """worklet.js's resampler: a 1 kHz tone passes at unit gain, tones above 8 kHz do not alias in."""
    page = await browser.new_page()
    await page.set_content("<!doctype html><title>resampler</title>")
    await page.add_script_tag(content=(ROOT / "clients" / "static" / "worklet.js").read_text())
    measured = await page.evaluate("""() => {
      const rms = (rate, freq) => {
        const resampler = new UnipadResampler(rate, 16000);
        const input = new Float32Array(rate);  // 1 s of a 0.5-amplitude tone, fed in 128-sample blocks
        for (let i = 0; i < input.length; i++) input[i] = 0.5 * Math.sin(2 * Math.PI * freq * i / rate);
        const out = [];
        for (let i = 0; i < input.length; i += 128) out.push(...resampler.process(input.subarray(i, i + 128)));
        const mid = out.slice(2000, 14000);
        return [out.length, Math.sqrt(mid.reduce((a, b) => a + b * b, 0) / mid.length)];
      };
      return {pass48: rms(48000, 1000), stop48: rms(48000, 12000), pass44: rms(44100, 1000),
              stop44: rms(44100, 9000), pass16: rms(16000, 1000)};
    }""")
    for key in ("pass48", "pass44", "pass16"):
        length, level = measured[key]
        assert abs(length - SAMPLE_RATE) < 64 and abs(level - 0.5 / np.sqrt(2)) < 0.005, (key, measured[key])
    for key in ("stop48", "stop44"):
        assert measured[key][1] < 0.5 / np.sqrt(2) * 1e-3, (key, measured[key])  # below -60 dB


async def test_page_offers_only_the_models_languages(serve_test_server, browser, paraformer_model_dir):
    """A Paraformer knows Mandarin and English: the page offers no language the server would refuse, and a
    stream from it runs (the microphone's speech through the Paraformer path, its text noise)."""
    async with serve_test_server(paraformer_model_dir, partial_interval=0.0) as url:
        page = await browser.new_page()
        await page.goto(url.http + "/")
        await check_model_notice(page, paraformer_model_dir)
        offered = await page.eval_on_selector_all("#language option", "os => os.filter(o => !o.disabled).map(o => o.value)")
        assert offered == ["auto", "en", "zh"], offered
        await page.select_option("#language", "zh")
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_function("window.unipad.stats.finals >= 1", timeout=WAIT_MS)
        await page.get_by_role("button", name="Stop").click()
        await page.wait_for_selector('#state[data-state="idle"]', timeout=WAIT_MS)
        assert await page.locator("#errors .error").count() == 0
