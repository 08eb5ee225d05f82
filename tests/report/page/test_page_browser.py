"""The report page in a real browser: headless Chromium (``make browser``) loads index.html,
every figure shows, the console stays clean, nothing is fetched but the file itself, the
contents' links land on their sections, and the page prints. A screenshot is saved (to
``QBENCH_SCREENSHOTS`` when set, else the test's temporary folder). Skips, saying why, where no
browser is installed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qbench.report import tables as report
from tests import browser
from tests.report import test_report_study

BINARY, WHY = browser.find()
pytestmark = pytest.mark.skipif(BINARY is None, reason=WHY)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("study")
    test_report_study.build(root)
    written = report.write_report(root, fmt=None)
    assert written.page is not None
    return written.page


@pytest.fixture(scope="module")
def chromium() -> browser.Browser:
    assert BINARY is not None
    b = browser.Browser(BINARY, width=1200, height=900)
    yield b  # type: ignore[misc]
    b.close()


def test_page_loads_whole_in_a_browser(page: Path, chromium: browser.Browser) -> None:
    chromium.call("Network.enable", session=True)
    chromium.open(page.resolve().as_uri())
    images = chromium.evaluate(
        "Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
    )
    assert len(images) >= 5 and all(ok for _, ok in images), images
    assert chromium.problems() == []
    requests = [e["params"]["request"]["url"] for e in chromium.events
                if e.get("method") == "Network.requestWillBeSent"]  # fmt: skip
    fetched = [u for u in requests if not u.startswith("data:")]
    assert fetched == [page.resolve().as_uri()]  # offline: the figures are in the file
    assert len(requests) - len(fetched) == len(images)
    broken = chromium.evaluate(
        "Array.from(document.querySelectorAll('nav.toc a'))"
        ".filter(a => !document.getElementById(a.hash.slice(1))).map(a => a.hash)"
    )
    assert broken == []
    wide = chromium.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert wide, "the page scrolls sideways: a table or figure is wider than the window"


def test_page_screenshot_and_print(page: Path, chromium: browser.Browser, tmp_path: Path) -> None:
    chromium.open(page.resolve().as_uri())
    out = Path(os.environ.get("QBENCH_SCREENSHOTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    shot = chromium.screenshot(out / "report-page.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    printed = chromium.pdf()
    assert printed[:5] == b"%PDF-" and len(printed) > 50_000  # figures and tables printed
    assert chromium.problems() == []
