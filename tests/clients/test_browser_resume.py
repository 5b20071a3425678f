"""The browser page resumes its stream when the connection is lost (clients/static/resume.js): Debian's
Chromium hears a WAV file as its microphone; the server aborts the page's TCP connection after the first
final; the page reconnects with a `resume` and every utterance still gets exactly one final."""
from __future__ import annotations

from client_testkit import knows_words, normalise
from test_browser_page import CHROMIUM, WAIT_MS, browser, pytestmark, stats  # noqa: F401 - fixture, skip mark


async def stop_and_read(page) -> tuple[dict, list[int], list[str], str]:
    """Stop the page's stream, wait for idle; its counts, the finals' segment numbers and texts, its errors."""
    await page.get_by_role("button", name="Stop").click()
    await page.wait_for_selector('#state[data-state="idle"]', timeout=WAIT_MS)
    segments = await page.locator("#finals li").evaluate_all("items => items.map(i => Number(i.dataset.segment))")
    finals = await page.locator("#finals li .text").all_inner_texts()
    return await stats(page), segments, finals, await page.locator("#errors").inner_text()


async def test_page_resumes_a_lost_connection(serve_test_server, browser, speech, test_model_dir):  # noqa: F811
    async with serve_test_server(partial_interval=0.3) as url:
        page = await browser.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        await page.goto(url.http + "/")
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_function("window.unipad.stats.finals >= 1", timeout=WAIT_MS)
        for connection in list(url.server.connections):  # as if the server had died
            connection.ws.transport.abort()
        n = len(speech.utterances)
        await page.wait_for_function(f"window.unipad.stats.finals >= {n}", timeout=WAIT_MS)
        counts, segments, finals, errors = await stop_and_read(page)
        resumed = url.server.metrics.sessions_resumed._value.get()
    assert page_errors == [] and errors == "", (page_errors, errors)
    assert counts["resumes"] == 1 and resumed == 1 and counts["done"] == 1, counts
    assert segments[:n] == list(range(n)), segments  # each utterance once, numbering continued
    if knows_words(test_model_dir):
        assert [normalise(t) for t in finals[:n]] == [normalise(u["text"]) for u in speech.utterances]


async def test_page_waits_out_a_long_outage_while_its_audio_is_kept(serve_test_server, browser, speech,
                                                                   test_model_dir):  # noqa: F811
    """The only server drains and is gone for 5 s, far longer than 8 attempts at the backoff set here last;
    it comes back on the same port and the page's stream goes on: no error, every utterance once."""
    async with serve_test_server(partial_interval=0.3) as url:
        page = await browser.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        await page.goto(url.http + "/")
        await page.evaluate("Object.assign(window.unipad.resumeOptions, {backoffMs: 50, maxBackoffMs: 200})")
        await page.get_by_role("button", name="Start").click()
        await page.wait_for_function("window.unipad.stats.finals >= 1", timeout=WAIT_MS)
    # drained and exited: every attempt now is refused (8 of them would be over in about 1 s)
    await page.wait_for_timeout(5000)
    async with serve_test_server(partial_interval=0.3, port=url.port) as url:
        n = len(speech.utterances)
        await page.wait_for_function(f"window.unipad.stats.finals >= {n}", timeout=WAIT_MS)
        counts, segments, finals, errors = await stop_and_read(page)
    assert page_errors == [] and errors == "", (page_errors, errors)
    assert counts["resumes"] > 8 and counts["done"] == 1, counts
    assert segments[:n] == list(range(n)) and len(set(segments)) == len(segments), segments
    if knows_words(test_model_dir):
        assert [normalise(t) for t in finals[:n]] == [normalise(u["text"]) for u in speech.utterances]
