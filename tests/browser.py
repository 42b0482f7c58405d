"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: no port, no websocket
library): open a page at a fixed size, wait until a script says it is drawn, read values from it, take a screenshot.
For the tests that check what a person sees in the MLflow UI."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Browser:
    """One headless Chromium with a fresh profile; `with Browser() as browser: page = browser.open(url)`."""

    def __init__(self, width: int = 1500, height: int = 900):
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="fairaudit-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def pipes() -> None:  # the child reads commands on fd 3 and writes answers on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]  # clear of 3 and 4
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--no-first-run", "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=pipes, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next, self._buffer = 0, b""

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *_) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 120) -> dict:
        """One DevTools command; its result (events on the way are skipped)."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self._buffer:
                self._buffer += os.read(self._from_chrome, 1 << 20)
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
        raise TimeoutError(f"{method}: no answer within {timeout} s")

    def open(self, url: str) -> "Page":
        """A new page at this browser's size, navigated to `url`."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        page.call("Page.navigate", {"url": url})
        return page


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def call(self, method: str, params: dict | None = None) -> dict:
        return self.browser.call(method, params, self.session)

    def value(self, expression: str):
        """A JavaScript expression's value in the page (JSON-able)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 240, every: float = 1.0):
        """Poll `expression` until it is truthy; its value (TimeoutError with the last value otherwise)."""
        deadline, found = time.time() + timeout, None
        while time.time() < deadline:
            found = self.value(expression)
            if found:
                return found
            time.sleep(every)
        raise TimeoutError(f"{expression[:80]}... stayed {found!r} for {timeout} s")

    def screenshot(self, path: str) -> bytes:
        """The page as drawn, saved as a PNG at `path`."""
        data = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
        with open(path, "wb") as file:
            file.write(data)
        return data
