"""Make the README's dashboard screenshot (docs/img/run.png) again, from a real run on the CPU.

    python bench/dashboard_screenshot.py                  # docs/img/run.png
    python bench/dashboard_screenshot.py --limit 8 --out /tmp/run.png

It runs `operatorx run -t gemm_perf --device cpu --limit N` into a new SQLite file, serves it with
`operatorx serve` on 127.0.0.1 (a free port), opens the Run page of that run in headless Chromium
(Playwright, Debian's /usr/bin/chromium: `apt-get install chromium`) and saves the visible window.
The page must log no console error; the server is stopped and the database removed afterwards.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"operatorx serve did not answer {url}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "run.png")
    ap.add_argument("--limit", type=int, default=5, help="cases of gemm_perf to run (default 5)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="ox-shot-") as tmp:
        db = str(Path(tmp) / "shot.db")
        ox = [sys.executable, "-m", "operatorx"]
        subprocess.run([*ox, "run", "-t", "gemm_perf", "--device", "cpu", "--limit", str(args.limit), "--db", db,
                        "--results-dir", str(Path(tmp) / "results")], check=True)
        port = _free_port()
        server = subprocess.Popen([*ox, "serve", "--db", db, "--host", "127.0.0.1", "--port", str(port)])
        try:
            url = f"http://127.0.0.1:{port}/run/latest"
            _wait_for(url, server)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, headless=True, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                page.wait_for_selector("#rows-table tbody tr")
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=False)
                browser.close()
            if errors:
                raise SystemExit(f"the page logged errors: {errors}")
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
