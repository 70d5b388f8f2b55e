"""docs/serve.png: the page, as a user sees it, in Debian's Chromium (python bench/serve_screenshot.py)."""

from __future__ import annotations

import threading

from playwright.sync_api import sync_playwright

from zerokit.serve import make_server

QUERY = ("model=llama-3-8b&gpu=h100-80gb&gpus_per_node=8&seq_len=8192&global_batch=64&samples=100000"
         "&compare_gpus=a100-80gb,h100-80gb,h200")


def main(out: str = "docs/serve.png") -> None:
    srv = make_server("127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = b.new_page(viewport={"width": 1200, "height": 900}, bypass_csp=True)
        page.goto(f"http://127.0.0.1:{srv.server_address[1]}/?{QUERY}")
        page.wait_for_function("document.body.dataset.state === 'answered'", timeout=60000)
        page.screenshot(path=out, full_page=True)
        b.close()
    srv.shutdown()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
