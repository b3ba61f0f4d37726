"""The console's fixtures: a gateway process with admin and read-only users, and a headless Chromium
driven through Selenium (Debian's chromium and chromium-driver, which scripts/bootstrap.sh installs;
nothing here downloads a browser). Screenshots go to ``artifacts/console/`` (KANAL_ARTIFACTS
overrides the folder), which CI keeps."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from kanal.embedded import GatewayProcess, TansuBroker

USERS = '[{"username": "ops", "password": "s3cret!", "admin": true}, {"username": "viewer", "password": "look-only"}]'
ADMIN = ("ops", "s3cret!")
VIEWER = ("viewer", "look-only")
ARTIFACTS = Path(os.environ.get("KANAL_ARTIFACTS", Path(__file__).parents[2] / "artifacts")) / "console"


class ConsoleNode:
    """A gateway process and its console's address."""

    def __init__(self, process: GatewayProcess) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{process.env['GATEWAY_HTTP_PORT']}"

    def session(self, user: tuple[str, str] = ADMIN) -> httpx.Client:
        """An HTTP client logged in through the login form (a browser's session cookie)."""
        client = httpx.Client(base_url=self.base, follow_redirects=False, timeout=10)
        token = csrf_of(client.get("/console/login").text)
        answer = client.post("/console/login", data={"csrf": token, "username": user[0], "password": user[1]})
        assert answer.status_code == 303, answer.text
        return client


def csrf_of(html: str) -> str:
    """The CSRF token of the first form of a page."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


GUIDE = Path(__file__).parents[2] / "docs" / "plugin-author-guide.md"
FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def guide_block(marker: str) -> str:
    """The plugin author guide's code block whose first line is ``marker``, without that line."""
    for block in FENCE.findall(GUIDE.read_text(encoding="utf-8")):
        first, _, body = block.partition("\n")
        if first.strip() == marker:
            return body
    raise AssertionError(f"no block {marker!r} in {GUIDE}")


def notes_plugin(root: Path) -> Path:
    """The guide's console example as an installed plugin: its module, its template, and a
    ``.dist-info`` with its ``kanal.plugins`` entry point (put on the gateway's PYTHONPATH)."""
    (root / "kanal_console_notes.py").write_text(guide_block("# example: console-notes"))
    template = root / "templates" / "notes" / "list.html"
    template.parent.mkdir(parents=True)
    template.write_text(guide_block("{# example-template: notes/list.html #}"))
    info = root / "kanal_console_notes-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-console-notes\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\nconsole-notes = kanal_console_notes\n")
    return root


@pytest.fixture(scope="module")
def console_node(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleNode]:
    """A gateway with admin and read-only users and the guide's notes page installed."""
    plugin = notes_plugin(tmp_path_factory.mktemp("console-notes"))
    # A cluster id of its own: the interceptors these tests store stay in its own state topic, not in
    # the one every later test gateway of the session (cluster id "gateway") would load.
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": f"console-{uuid.uuid4().hex[:8]}",
        "PYTHONPATH": str(plugin),
    }
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("console") / "gateway.log")
    process.start(timeout=30)
    try:
        yield ConsoleNode(process)
    finally:
        process.stop()


class Browser:
    """A headless Chromium on the console, with the waits the tests need (never fixed sleeps)."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver = driver
        self.base = base

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def find(self, css: str) -> Any:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def wait(self, condition: Any, timeout: float = 15, what: str = "") -> Any:
        """Waits for ``condition()``; an element a live region or a navigation replaced meanwhile
        only means "not yet"."""
        wait = WebDriverWait(self.driver, timeout, ignored_exceptions=(StaleElementReferenceException,))
        return wait.until(lambda _: condition(), message=what)

    def log_in(self, user: tuple[str, str] = ADMIN) -> None:
        self.open("/console/login")
        self.find("#username").send_keys(user[0])
        self.find("#password").send_keys(user[1])
        self.find("form.login button[type=submit]").click()
        self.wait(lambda: "/console/login" not in self.driver.current_url, what="the login leaves the login page")

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.driver.set_window_size(1280, 800)
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1280, max(800, min(int(height) + 40, 4000)))
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(1280, 900)
        return path

    def errors(self) -> list[str]:
        """JavaScript errors and failed loads the page reported to the browser's console."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(browser).exists() and Path(driver).exists()):
        pytest.fail("the console's browser tests need Debian's chromium and chromium-driver: scripts/bootstrap.sh test")
    return browser, driver


@pytest.fixture(scope="module")
def browser(console_node: ConsoleNode) -> Iterator[Browser]:
    binary, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    profile = tempfile.mkdtemp(prefix="kanal-chromium-")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield Browser(driver, console_node.base)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
