"""The browser page's Hotwords field, in Debian's Chromium hearing the demo model's save/send blend
(tests/fixtures/make_hotword_fixture.py) as its microphone: the hotword typed decides the word."""
from __future__ import annotations

import pytest
from client_testkit import ROOT
from test_browser_page import CHROMIUM, WAIT_MS, chromium_args, fake_microphone

from pipeline.audio import load_audio
from fixtures.make_hotword_fixture import BLEND_BOOST

DEMO_MODEL = ROOT / "models" / "demo"
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt install chromium)"),
              pytest.mark.skipif(not (DEMO_MODEL / "manifest.json").is_file(), reason="needs the demo model")]


@pytest.fixture
async def blend_browser(tmp_path):
    from playwright.async_api import async_playwright

    audio = load_audio(ROOT / "tests" / "fixtures" / "demo" / "save_send_blend.wav")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                   args=chromium_args(fake_microphone(tmp_path, audio)))
        try:
            yield browser
        finally:
            await browser.close()


async def first_final(page, hotwords: str) -> str:
    await page.get_by_label("Hotwords").fill(hotwords)
    await page.get_by_role("button", name="Start").click()
    await page.wait_for_function("window.unipad.stats.finals >= 1", timeout=WAIT_MS)
    await page.get_by_role("button", name="Stop").click()
    await page.wait_for_selector('#state[data-state="idle"]', timeout=WAIT_MS)
    # The first: the fake microphone loops the file, so a slow Stop can finalise a fragment of the next
    # loop after it (a loaded machine's "oh").
    return (await page.locator("#finals li .text").all_inner_texts())[0]


async def test_page_sends_hotwords(serve_test_server, blend_browser):
    async with serve_test_server(DEMO_MODEL, partial_interval=0.0) as url:
        for hotwords, expected in ((f"save:{BLEND_BOOST:g}", "save message"),
                                   (f"send:{BLEND_BOOST:g}, turn on", "send message")):
            page = await blend_browser.new_page()
            await page.goto(url.http + "/")
            assert await first_final(page, hotwords) == expected
            await page.close()
        page = await blend_browser.new_page()
        await page.goto(url.http + "/")
        await page.get_by_label("Hotwords").fill("zebra")
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_selector('#state[data-state="error"]', timeout=WAIT_MS)
        shown = await page.locator("#errors .error").all_inner_texts()
        assert any("bad_start" in e and "zebra" in e for e in shown), shown
