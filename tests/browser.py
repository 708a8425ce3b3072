"""Headless Chromium for tests, with the stdlib only.

The HTML report must be checked the way a person sees it: does the page load
without console errors or JS exceptions, how long does it take, and does it
paint something that is not blank. This drives Debian's ``chromium`` over the
DevTools protocol on ``--remote-debugging-pipe`` (file descriptors 3 and 4,
NUL-separated JSON), so no websocket client, driver or Pillow is needed.
Every call is bounded by a deadline; the browser runs in its own session and
its whole process group is killed when it overruns or when we are done.

Also a small CLI: ``python tests/browser.py page.html [--width W]
[--screenshot out.png]`` prints load timings and any errors.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import math
import os
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "run scripts/ensure_chromium.sh (it installs Debian's chromium)"
FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container: the sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-color-profile=srgb",  # screenshot colours equal the CSS colours
    "--remote-debugging-pipe",
)


class BrowserError(RuntimeError):
    """The browser could not be started, answered an error, or overran its time."""


class BrowserTimeout(BrowserError):
    """The browser did not answer in time; its process group has been killed."""


class BrowserMissing(BrowserError):
    """No Chromium on this machine."""


def find_browser() -> str:
    """Path of a Chromium-family browser ($ADAPTERPROBE_CHROMIUM wins)."""
    explicit = os.environ.get("ADAPTERPROBE_CHROMIUM")
    if explicit:
        if shutil.which(explicit):
            return str(shutil.which(explicit))
        raise BrowserMissing(f"ADAPTERPROBE_CHROMIUM={explicit!r} is not executable")
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserMissing(f"no {', '.join(NAMES)} on PATH: {INSTALL_HINT}")


@dataclass
class PageResult:
    """What a page did while loading: messages, errors, timings, pixels."""

    url: str
    console: list[tuple[str, str]] = field(default_factory=list)  # (type, text)
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)  # browser-side: CSP, failed loads
    dialogs: list[str] = field(default_factory=list)  # alert/confirm/prompt opened
    load_ms: float = 0.0  # wall clock from navigate to the load event
    timing: dict[str, float] = field(default_factory=dict)  # the page's own Navigation Timing
    values: dict[str, Any] = field(default_factory=dict)  # results of `evaluate`
    screenshot: bytes | None = None  # PNG

    @property
    def errors(self) -> list[str]:
        """Everything a person would call an error on the console."""
        out = [
            f"console.{kind}: {text}" for kind, text in self.console if kind in ("error", "assert")
        ]
        out += [f"exception: {text}" for text in self.exceptions]
        out += [f"browser: {text}" for text in self.log_errors]
        out += [f"dialog: {text}" for text in self.dialogs]
        return out


def _high_fd(fd: int) -> int:
    """A close-on-exec copy of fd numbered 10 or more, so dup2 onto 3/4 cannot clash."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


def _remote_text(obj: dict[str, Any]) -> str:
    if "value" in obj:
        return str(obj["value"])
    return str(obj.get("description") or obj.get("unserializableValue") or obj.get("type"))


class Browser:
    """One headless Chromium process; each `load` opens and closes a fresh tab."""

    def __init__(self, path: str | None = None, start_timeout: float = 60.0):
        self.path = path or find_browser()
        self.profile = tempfile.mkdtemp(prefix="adapterprobe-chromium-")
        self.log = open(os.path.join(self.profile, "stderr.log"), "w+b")  # noqa: SIM115
        cmd_r, cmd_w = os.pipe()  # we write commands, the browser reads fd 3
        res_r, res_w = os.pipe()  # the browser writes fd 4, we read
        cmd_r, res_w = _high_fd(cmd_r), _high_fd(res_w)
        self._out, self._in = cmd_w, res_r
        devnull = os.open(os.devnull, os.O_RDONLY)
        argv = [self.path, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        try:
            self.pid = os.posix_spawn(
                self.path,
                argv,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0),
                    (os.POSIX_SPAWN_DUP2, self.log.fileno(), 1),
                    (os.POSIX_SPAWN_DUP2, self.log.fileno(), 2),
                    (os.POSIX_SPAWN_DUP2, cmd_r, 3),
                    (os.POSIX_SPAWN_DUP2, res_w, 4),
                ],
                setsid=True,  # its own process group, killed as a whole
            )
        finally:
            for fd in (devnull, cmd_r, res_w):
                os.close(fd)
        self._buf = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._closed = False
        try:
            self.version = self.call("Browser.getVersion", timeout=start_timeout)["product"]
        except BaseException:
            self.close()
            raise

    # -- protocol -----------------------------------------------------------

    def _read(self, deadline: float, waiting_for: str = "") -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserTimeout(
                    f"timed out waiting for {waiting_for or 'the browser'}{self._stderr_tail()}"
                )
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise BrowserError(f"the browser closed the pipe{self._stderr_tail()}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data) :]
        return self._next_id

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """Send a command and wait for its answer; events seen meanwhile are kept."""
        deadline = min(math.inf if deadline is None else deadline, time.monotonic() + timeout)
        msg_id = self.send(method, params, session)
        while True:
            msg = self._read(deadline, method)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._events.append(msg)

    def _wait_event(self, method: str, session: str, deadline: float) -> dict[str, Any]:
        for i, msg in enumerate(self._events):
            if msg["method"] == method and msg.get("sessionId") == session:
                return self._events.pop(i)
        while True:
            msg = self._read(deadline, method)
            if msg.get("method") == method and msg.get("sessionId") == session:
                return msg
            if "method" in msg:
                self._events.append(msg)

    def _stderr_tail(self) -> str:
        try:
            self.log.seek(0)
            tail = self.log.read()[-1500:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f"\n--- browser stderr (tail) ---\n{tail}" if tail else ""

    # -- pages --------------------------------------------------------------

    def load(self, page: str | os.PathLike[str], **kw: Any) -> PageResult:
        """Open `page` in a new tab and report on it (see `_load` for the options).

        A page or browser that overruns its time is not left running: the
        whole browser process group is killed and BrowserTimeout raised.
        """
        if self._closed:
            raise BrowserError("this browser has been closed")
        try:
            return self._load(page, **kw)
        except BrowserTimeout:
            self.close()
            raise

    def _load(
        self,
        page: str | os.PathLike[str],
        *,
        width: int = 1280,
        height: int = 900,
        screenshot: bool = True,
        full_page: bool = False,
        max_height: int = 6000,
        scroll_to: str | None = None,
        javascript: bool = True,
        evaluate: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> PageResult:
        """Open `page` (a file path or URL) in a new tab at width x height CSS px.

        Collects console messages, uncaught exceptions, browser log errors and
        dialogs from before the first byte until the end; then evaluates each
        JS expression in `evaluate` (promises are awaited, results must be
        JSON) and takes a PNG screenshot: the viewport, the whole page up to
        `max_height` px, or one viewport's height from the top of the element
        matching the CSS selector `scroll_to`. Raises BrowserError past `timeout`
        seconds.
        """
        deadline = time.monotonic() + timeout
        url = str(page)
        if "://" not in url and not url.startswith(("about:", "data:")):
            url = Path(page).resolve().as_uri()
        result = PageResult(url)
        target = self.call("Target.createTarget", {"url": "about:blank"}, deadline=deadline)
        target_id = target["targetId"]
        attached = self.call(
            "Target.attachToTarget", {"targetId": target_id, "flatten": True}, deadline=deadline
        )
        sid = attached["sessionId"]
        try:
            for method in ("Page.enable", "Runtime.enable", "Log.enable"):
                self.call(method, session=sid, deadline=deadline)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=sid,
                deadline=deadline,
            )
            if not javascript:  # the page's own scripts; `evaluate` still works
                self.call(
                    "Emulation.setScriptExecutionDisabled",
                    {"value": True},
                    session=sid,
                    deadline=deadline,
                )
            self._events = [e for e in self._events if e.get("sessionId") != sid]
            start = time.monotonic()
            nav = self.call("Page.navigate", {"url": url}, session=sid, deadline=deadline)
            if nav.get("errorText"):
                raise BrowserError(f"could not open {url}: {nav['errorText']}")
            self._wait_event("Page.loadEventFired", sid, deadline)
            result.load_ms = (time.monotonic() - start) * 1000
            if javascript:  # two animation frames: the page has painted what it will
                self._eval(sid, _PAINTED_JS, deadline)
            timing = self._eval(sid, _TIMING_JS, deadline)
            result.timing = {k: float(v) for k, v in (timing or {}).items()}
            for name, expression in (evaluate or {}).items():
                result.values[name] = self._eval(sid, expression, deadline)
            if screenshot:
                params: dict[str, Any] = {"format": "png"}
                if scroll_to:
                    top = self._eval(sid, _TOP_JS % json.dumps(scroll_to), deadline)
                    params["clip"] = {
                        "x": 0,
                        "y": top,
                        "width": width,
                        "height": height,
                        "scale": 1,
                    }
                    params["captureBeyondViewport"] = True
                elif full_page:
                    metrics = self.call("Page.getLayoutMetrics", session=sid, deadline=deadline)
                    size = metrics.get("cssContentSize") or metrics["contentSize"]
                    params["clip"] = {
                        "x": 0,
                        "y": 0,
                        "width": width,
                        "height": min(max_height, max(height, int(size["height"]))),
                        "scale": 1,
                    }
                    params["captureBeyondViewport"] = True
                shot = self.call("Page.captureScreenshot", params, session=sid, deadline=deadline)
                result.screenshot = base64.b64decode(shot["data"])
            self._collect(sid, result, deadline)
        finally:
            with contextlib.suppress(BrowserError):
                self.call("Target.closeTarget", {"targetId": target_id}, timeout=5)
        return result

    def _eval(self, sid: str, expression: str, deadline: float) -> Any:
        answer = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=sid,
            deadline=deadline,
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"evaluating {expression!r}: {answer['exceptionDetails']}")
        return answer.get("result", {}).get("value")

    def _collect(self, sid: str, result: PageResult, deadline: float) -> None:
        # A round trip flushes events the page emitted before this point.
        self.call("Runtime.evaluate", {"expression": "0"}, session=sid, deadline=deadline)
        keep = []
        for msg in self._events:
            if msg.get("sessionId") != sid:
                keep.append(msg)
                continue
            method, params = msg["method"], msg.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(_remote_text(a) for a in params.get("args", []))
                result.console.append((params.get("type", "log"), text))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                exc = details.get("exception") or {}
                result.exceptions.append(str(exc.get("description") or details.get("text")))
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                if entry.get("level") == "error":
                    result.log_errors.append(f"{entry.get('source')}: {entry.get('text')}")
            elif method == "Page.javascriptDialogOpening":
                result.dialogs.append(f"{params.get('type')}: {params.get('message')}")
        self._events = keep

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Ask the browser to quit, then kill its process group whatever happens."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, BrowserError, ValueError):
            self.call("Browser.close", timeout=5)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        end = time.monotonic() + 5  # helpers of the group die a moment after the leader
        while time.monotonic() < end:
            try:
                os.killpg(self.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        for fd in (self._out, self._in):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PAINTED_JS = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"

_TOP_JS = "(e => e.getBoundingClientRect().top + window.scrollY)(document.querySelector(%s))"

_TIMING_JS = """(() => {
  const n = performance.getEntriesByType("navigation")[0];
  const out = {};
  if (n) for (const k of ["responseEnd", "domInteractive", "domContentLoadedEventEnd",
                          "loadEventEnd", "transferSize", "decodedBodySize"]) out[k] = n[k];
  for (const p of performance.getEntriesByType("paint")) out[p.name] = p.startTime;
  return out;
})()"""


def load_page(page: str | os.PathLike[str], **kw: Any) -> PageResult:
    """Start a browser, load one page (see `Browser.load`), stop the browser."""
    with Browser() as browser:
        return browser.load(page, **kw)


# ---------------------------------------------------------------------------
# PNG decoding (stdlib): enough to look at the pixels of a screenshot.


def _add_bytes(a: int, b: int, n: int) -> int:
    """Bytewise (a + b) mod 256 of two n-byte big-endian integers, no carries across."""
    low = int.from_bytes(b"\x7f" * n, "big")
    high = int.from_bytes(b"\x80" * n, "big")
    return ((a & low) + (b & low)) ^ ((a ^ b) & high)


def _unfilter(kind: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    n = len(line)
    if kind == 0:
        return line
    if kind == 2:  # Up
        total = _add_bytes(int.from_bytes(line, "big"), int.from_bytes(prev, "big"), n)
        return total.to_bytes(n, "big")
    if kind == 1:  # Sub: a running sum per channel, done as a log-step prefix sum
        value, shift = int.from_bytes(line, "big"), bpp
        while shift < n:
            value = _add_bytes(value, value >> (8 * shift), n)
            shift *= 2
        return value.to_bytes(n, "big")
    out = bytearray(line)
    for i in range(n):
        a = out[i - bpp] if i >= bpp else 0
        b = prev[i]
        if kind == 3:  # Average
            out[i] = (out[i] + ((a + b) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            out[i] = (out[i] + pred) & 0xFF
        else:
            raise ValueError(f"bad PNG filter type {kind}")
    return bytes(out)


@dataclass
class Image:
    width: int
    height: int
    channels: int  # 3 (RGB) or 4 (RGBA)
    rows: list[bytes]

    def colours(self, step: int = 1) -> Counter[tuple[int, int, int]]:
        """How many pixels have each RGB colour (every `step`-th row and column)."""
        counts: Counter[tuple[int, int, int]] = Counter()
        ch = self.channels
        for row in self.rows[::step]:
            counts.update(
                zip(row[0 :: ch * step], row[1 :: ch * step], row[2 :: ch * step], strict=True)
            )
        return counts


def decode_png(data: bytes) -> Image:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG (what Chromium writes)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    channels = {2: 3, 6: 4}.get(colour)
    if depth != 8 or channels is None or interlace:
        raise ValueError(
            f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}"
        )
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = raw[start + 1 : start + 1 + stride]
        prev = _unfilter(raw[start], line, prev, channels)
        rows.append(prev)
    return Image(width, height, channels, rows)


def hex_rgb(colour: str) -> tuple[int, int, int]:
    colour = colour.lstrip("#")
    return (int(colour[0:2], 16), int(colour[2:4], 16), int(colour[4:6], 16))


def near(counts: Counter[tuple[int, int, int]], rgb: tuple[int, int, int], tol: int = 3) -> int:
    """Pixels within `tol` per channel of `rgb`."""
    return sum(
        n for c, n in counts.items() if all(abs(x - y) <= tol for x, y in zip(c, rgb, strict=True))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--screenshot", help="write a PNG here")
    parser.add_argument("--full-page", action="store_true")
    parser.add_argument("--scroll-to", help="screenshot from the element this CSS selector finds")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    size = os.path.getsize(args.page) if os.path.exists(args.page) else 0
    with Browser() as browser:
        res = browser.load(
            args.page,
            width=args.width,
            height=args.height,
            screenshot=bool(args.screenshot),
            full_page=args.full_page,
            scroll_to=args.scroll_to,
            timeout=args.timeout,
        )
        print(f"browser: {browser.version}")
    if args.screenshot and res.screenshot:
        Path(args.screenshot).write_bytes(res.screenshot)
    print(f"size: {size / 1e6:.2f} MB")
    print(f"load (navigate -> load event, wall): {res.load_ms:.0f} ms")
    for key, value in res.timing.items():
        print(f"  {key}: {value:.0f}")
    for err in res.errors:
        print(f"ERROR {err}")
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())
