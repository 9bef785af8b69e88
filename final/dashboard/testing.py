"""The dashboard's browser tests' tools: a headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium), what the page shows, and its console's errors."""
import contextlib
import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
PAGE_STATE = """
const $ = id => document.getElementById(id);
return {rows: document.querySelectorAll('#rows tr').length, grid: $('pool').toDataURL(),
        preemption: $('last-preemption').textContent, preemptions: $('stat-preemptions').textContent,
        flash: $('last-preemption').className === 'flash',
        updates: parseFloat($('stat-updates').textContent) || 0, status: $('status').textContent,
        rendered: Number(document.body.dataset.rendered) || 0};
"""


@contextlib.contextmanager
def chromium():
    """A headless Chromium driven by selenium; the test is skipped where none is installed."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium + chromedriver (Debian: apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    os.environ.setdefault("SE_AVOID_STATS", "true")  # Selenium Manager stays offline
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1150"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
