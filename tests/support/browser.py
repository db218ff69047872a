"""A real headless browser for the fit table's tests: Debian's Chromium driven through its
chromedriver with Selenium (the W3C WebDriver protocol).

Why Selenium and chromedriver rather than Playwright: Debian builds ``chromium`` and
``chromium-driver`` from one source package, so the driver always speaks to a browser of its own
version, and WebDriver is a W3C standard; Playwright drives Chromium over the DevTools protocol of
the browser build it bundles, which cannot be downloaded here, and is not promised to work with
another. ``scripts/_browser.sh`` (sourced by ``scripts/test``) installs both packages with
apt-get when they are missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

#: Flags known to work here: headless, no sandbox (root in a container), no GPU, and nothing
#: that reaches out to the network by itself (also used by the /schema page's test).
QUIET_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FLAGS = (*QUIET_FLAGS, "--lang=en-US", "--window-size=1280,1000")


def missing() -> str | None:
    """None when the browser and its driver are installed; else why they are not."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    return f"{' and '.join(absent)} not installed" if absent else None


def cannot_install() -> str | None:
    """Why ``scripts/_browser.sh`` cannot install the browser here (None: it can)."""
    if os.geteuid() != 0:
        return "not root, so scripts/_browser.sh cannot apt-get install chromium"
    if shutil.which("apt-get") is None:
        return "no apt-get, so scripts/_browser.sh cannot install chromium"
    return None


@contextmanager
def chromium(profile: Path) -> Iterator[WebDriver]:
    """A headless Chromium with an empty profile in ``profile``; quit on exit."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=DriverService(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()
