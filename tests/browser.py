"""A headless Chromium driven over the DevTools protocol, for tests of the report page.

Chromium is started with ``--remote-debugging-pipe``: it reads commands from fd 3 and writes
replies and events to fd 4, each a JSON message ended by a NUL byte (what Puppeteer uses), so
nothing beyond the standard library is needed. :func:`find` says where a browser is or why
there is none (``make browser`` installs Debian's chromium; ``QBENCH_BROWSER`` names another).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find() -> tuple[str | None, str]:
    """(the browser's path, "") or (None, why there is none)."""
    named = os.environ.get("QBENCH_BROWSER")
    if named:
        return (named, "") if Path(named).is_file() else (None, f"QBENCH_BROWSER={named} missing")
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path, ""
    return None, "no Chromium or Chrome installed (`make browser` installs Debian's chromium)"


class Browser:
    """One headless browser and one page; ``events`` holds every event seen so far."""

    def __init__(self, binary: str, width: int = 1200, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="qbench-chromium-")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()

        def fds() -> None:  # in the child: commands on fd 3, replies on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
            for fd, wanted in zip(high, (3, 4), strict=True):  # dup2 clears close-on-exec
                os.dup2(fd, wanted)

        argv = [binary, "--headless=new", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-dev-shm-usage",
                f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
                "about:blank"]  # fmt: skip
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
        self.proc = subprocess.Popen(argv, preexec_fn=fds, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        target = next(t for t in self.call("Target.getTargets")["targetInfos"]
                      if t["type"] == "page")  # fmt: skip
        attached = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width,
                  height=height, deviceScaleFactor=1, mobile=False)  # fmt: skip

    def call(self, method: str, session: bool = False, timeout: float = 60.0,
             **params: Any) -> dict[str, Any]:  # fmt: skip
        """Send one command and wait for its reply (events meanwhile go to ``events``)."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("the browser did not answer")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"the browser exited: {err[-500:]}")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return dict(json.loads(raw))

    def open(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait for the load event; ``events`` then holds this page's only."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._message(deadline))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)  # fmt: skip
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and failed loads seen so far."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning"):
                out.append(f"console {params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                out.append(f"log {params['entry']['level']}: {params['entry'].get('text')}")
        return out

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            )
        data = self.call("Page.captureScreenshot", session=True, **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def pdf(self) -> bytes:
        """The page as printed (print CSS applied)."""
        data = self.call("Page.printToPDF", session=True, printBackground=False)["data"]
        return base64.b64decode(data)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)
