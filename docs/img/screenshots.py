"""Make the screenshots of a real PyTorch run that the guide shows (docs/img/*-pytorch*.png).

The run is made here: a small MLP trained for four Adam steps with PyTorch on the CPU, recorded
by ``gpuviz.torch.record`` (PyTorch's profiler, ``profile_memory=True``); its heap holds about
150 segments at the peak, so every view opens the map as the overview. Then, in Chromium
(Playwright): the HTML report, the notebook dashboard (``%gpuviz show``) in JupyterLab with a
group drilled into, and the JupyterLab extension's view of the saved log.

    python docs/img/screenshots.py            # needs torch, jupyterlab, playwright, chromium
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
RECORD = """
import torch
import gpuviz.torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                            torch.nn.ReLU(), torch.nn.Linear(2048, 10))
with gpuviz.torch.record(cuda=False) as rec:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(4):
        x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
rec.log.save("mlp.arrow")
"""


def _lab(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "gpuviz-docs"
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1", "--allow-root",
         f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", f"--LabApp.workspaces_dir={root}/.ws"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(180):
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                json.load(r)
            return server, f"{base}/lab/tree/{{}}?reset&token={token}"
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("jupyter lab did not start")


def _click_row(page, plot: str, row: int) -> None:  # type: ignore[no-untyped-def]
    """A real click on overview row ``row`` (its longest bar)."""
    x, y = page.evaluate(
        """([plot, row]) => {
          const gd = document.querySelector(plot), box = gd.getBoundingClientRect();
          const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
          const t = gd._fullData.reduce((a, b) => (b.x[row] > a.x[row] ? b : a));
          return [box.left + xa._offset + xa.l2p(t.base[row] + t.x[row] / 2), box.top + ya._offset + ya.l2p(row)];
        }""",
        [plot, row],
    )
    page.mouse.move(x, y)
    page.wait_for_selector(f"{plot} .hoverlayer .hovertext")
    page.mouse.click(x, y)


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        subprocess.run([sys.executable, "-c", RECORD], cwd=root, check=True)
        subprocess.run([sys.executable, "-m", "gpuviz", "report", "mlp.arrow", "-o", "mlp.html"], cwd=root, check=True)
        book = new_notebook(cells=[new_code_cell("%load_ext gpuviz\n%gpuviz show mlp.arrow")])
        book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(book, root / "mlp.ipynb")
        server, url = _lab(root)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                page.goto((root / "mlp.html").as_uri(), wait_until="load")
                page.wait_for_selector("#map0 .main-svg")
                page.screenshot(
                    path=str(HERE / "report-pytorch.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 300}
                )
                page.eval_on_selector(
                    "#map0-slider", "s => s.closest('.scrubber').previousElementSibling.scrollIntoView()"
                )
                page.set_viewport_size({"width": 1280, "height": 640})
                page.screenshot(path=str(HERE / "report-pytorch-map.png"))

                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                page.goto(url.format("mlp.ipynb"))
                page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=120_000)
                page.click(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")  # the file browser folded away
                page.locator(".jp-Cell").first.click()
                page.keyboard.press("Shift+Enter")
                plot = ".gpuviz-dashboard .gpuviz-map"
                page.wait_for_function(f"document.querySelector('{plot}')?.layout?.meta?.view === 'overview'",
                                       timeout=180_000)  # fmt: skip
                page.keyboard.press("Escape")
                page.eval_on_selector(".gpuviz-dashboard", "d => d.scrollIntoView()")
                page.wait_for_timeout(500)  # (plotly's resize after the scroll)
                page.screenshot(
                    path=str(HERE / "dashboard-pytorch.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 620}
                )
                used = page.eval_on_selector(plot, "gd => gd.data[0].x")
                _click_row(page, plot, used.index(max(used)))  # the group holding the most bytes in use
                page.wait_for_function(f"document.querySelector('{plot}').layout.meta.view === 'group'")
                page.eval_on_selector(".gpuviz-dashboard .gpuviz-nav", "d => d.scrollIntoView()")
                page.wait_for_timeout(500)
                x, y = page.evaluate(
                    """(plot) => {
                      const gd = document.querySelector(plot), box = gd.getBoundingClientRect();
                      const t = gd._fullData.find((d) => d.name === 'used'), xa = gd._fullLayout.xaxis;
                      const ya = gd._fullLayout.yaxis, i = t.x.indexOf(Math.max(...t.x));
                      return [box.left + xa._offset + xa.l2p(t.base[i] + t.x[i] / 2),
                              box.top + ya._offset + ya.l2p(ya.d2c(t.y[i]))];
                    }""",
                    plot,
                )
                page.mouse.move(x, y)  # hovering a block names its allocation and call site
                page.wait_for_selector(f"{plot} .hoverlayer .hovertext")
                page.screenshot(
                    path=str(HERE / "dashboard-pytorch-group.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 560}
                )

                page = browser.new_page(viewport={"width": 1280, "height": 640})
                page.goto(url.format("mlp.arrow"))
                page.click(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
                figure = ".jp-gpuviz-figure[data-name='map:CPU:0']"
                page.wait_for_selector(f"{figure}[data-view='overview']", timeout=120_000)
                page.eval_on_selector(".jp-gpuviz-result h3 >> nth=1", "h => h.scrollIntoView()")
                page.wait_for_timeout(500)
                page.screenshot(path=str(HERE / "labextension-pytorch.png"))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is missing")
    main()
