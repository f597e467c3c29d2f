"""Open a page in headless Chromium as a person would, with the network closed, and report what it showed.

Speaks the DevTools protocol over ``--remote-debugging-pipe`` (the standard library only: JSON messages ending in a
NUL byte on file descriptors 3 and 4 of the browser). ``open_page`` returns the page's text, the text of its first
screenful, every request the page made, its console errors, the load time and a PNG screenshot of the viewport.

Chromium is Debian's ``chromium`` package (``make browser`` installs it; ``.ci/run`` does under CI). As root it needs
``--no-sandbox``; a fresh ``--user-data-dir`` per page keeps runs apart; the flags below keep it off the network.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
    "--disable-default-apps", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>", "--remote-debugging-pipe", "--hide-scrollbars", "--mute-audio",
)  # fmt: skip
# The text inside the viewport: every text node whose box lies (partly) within the window.
VISIBLE_TEXT = """(() => {const out = []; const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
let n; while ((n = w.nextNode())) { const r = document.createRange(); r.selectNodeContents(n);
const b = r.getBoundingClientRect(); if (b.width > 0 && b.height > 0 && b.bottom > 0 && b.top < innerHeight
&& b.right > 0 && b.left < innerWidth) out.push(n.textContent.trim()); } return out.filter(Boolean).join('\\n');})()"""


def chromium() -> str | None:
    """The Chromium binary: ``$MSRL_CHROMIUM`` if set (a path or a name on PATH), else the first on PATH; None if
    there is none."""
    chosen = os.environ.get("MSRL_CHROMIUM")
    return shutil.which(chosen) if chosen else next((p for p in map(shutil.which, CANDIDATES) if p), None)


@dataclass
class PageView:
    url: str
    text: str  # the whole page's innerText
    first_screen: str  # the text within the first viewport
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the page's own included
    console_errors: list[str] = field(default_factory=list)
    load_ms: float = 0.0  # navigation start to the end of the load event, as the page measured it
    screenshot: bytes = b""  # the first screenful (the viewport)
    full_screenshot: bytes = b""  # the whole page, when asked for


class DevTools:
    """One Chromium process driven over its DevTools pipe."""

    def __init__(self, binary: str, width: int, height: int, timeout: float) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="msrl-chromium-")
        cmd_r, self.cmd_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        # Chromium reads the protocol on fd 3 and answers on fd 4: the shell moves the pipe's ends there, from
        # numbers above 10 so that neither end already sits on 3 or 4.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, resp_w)]
        for fd in (cmd_r, resp_w):
            os.close(fd)
        args = [binary, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"]
        script = f'exec "$@" 3<&{high[0]} 4>&{high[1]} {high[0]}<&- {high[1]}>&-'
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "bash", *args],
            pass_fds=high,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in high:
            os.close(fd)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.cmd_w, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        for k, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(k)
        while True:
            event = self._read()
            if event.get("method") == method:
                return event
            self.events.append(event)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.resp_r], [], [], left)[0]:
                raise TimeoutError(f"Chromium did not answer within {self.timeout:g} s")
            chunk = os.read(self.resp_r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe (it exited)")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.cmd_w, self.resp_r):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


def open_page(
    path: Path, width: int = 1280, height: int = 800, timeout: float = 60.0, full_page: bool = False
) -> PageView:
    """Load ``path`` from a file URL in a fresh headless Chromium with the network closed; return what it showed
    (``full_page``: a screenshot of the whole page as well)."""
    binary = chromium()
    if binary is None:
        raise FileNotFoundError("no Chromium on PATH (Debian: apt-get install chromium)")
    url = Path(path).resolve().as_uri()
    whole = ""
    tools = DevTools(binary, width, height, timeout)
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.send(f"{domain}.enable", session=session)
        tools.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                        "uploadThroughput": -1}, session)  # fmt: skip
        tools.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                          "mobile": False}, session)  # fmt: skip
        tools.send("Page.navigate", {"url": url}, session)
        tools.wait_for("Page.loadEventFired")

        def evaluate(expression: str) -> Any:
            reply = tools.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
            return reply.get("result", {}).get("value")

        load = evaluate("(() => {const n = performance.getEntriesByType('navigation')[0]; return n ? n.loadEventEnd "
                        ": performance.timing.loadEventEnd - performance.timing.navigationStart;})()")  # fmt: skip
        text, first = evaluate("document.body.innerText"), evaluate(VISIBLE_TEXT)
        shot = tools.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
        if full_page:  # the whole page too, for a person to look at
            size = tools.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": width, "height": min(float(size["height"]), 16000.0), "scale": 1}
            whole = tools.send("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                               session)["data"]  # fmt: skip
        evaluate("0")  # a last round trip, so late console messages have arrived
    finally:
        events = list(tools.events)
        tools.close()
    requests, errors = [], []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Network.requestWillBeSent":
            requests.append(p["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            errors.append(p["exceptionDetails"].get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            errors.append(p["entry"].get("text", ""))
    return PageView(
        url,
        text or "",
        first or "",
        requests,
        errors,
        float(load or 0.0),
        base64.b64decode(shot),
        base64.b64decode(whole) if full_page else b"",
    )
