"""`zerokit serve`: a real server on a free port (the standard library's, as `zerokit serve` starts it), hostile
requests over real sockets, 50 concurrent plans, and the page in Debian's Chromium driven by Playwright: its numbers
against `zerokit plan --json`, its download against `zerokit render`, a shared URL reopened."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from zerokit.serve import make_server
from zerokit.serve.app import MAX_BODY_BYTES

CHROMIUM = "/usr/bin/chromium"
FORM = {"model": "tiny-llama", "gpu": "cpu", "gpus_per_node": "2", "seq_len": "64", "global_batch": "8",
        "samples": "256"}
ARGV = ["tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2", "--seq-len", "64", "--global-batch", "8",
        "--samples", "256"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    src = Path(__file__).resolve().parent.parent / "zerokit" / "data" / "models" / "tiny-llama" / "config.json"
    (models / "mine").mkdir()
    (models / "mine" / "config.json").write_text(src.read_text())
    srv = make_server("127.0.0.1", 0, str(models))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def request(port, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, out


def run_cli(argv):
    """(exit code, stdout, stderr) of the command line, in this process."""
    import contextlib
    import io

    from zerokit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def cli_plan_json(argv):
    rc, out, _err = run_cli(["plan", *argv, "--json"])
    assert rc == 0
    return json.loads(out)


def test_a_plan_over_http_is_plan_json(server, tmp_path):
    status, out = request(server, "POST", "/api/plan", {"options": FORM})
    assert status == 200
    page = json.loads(out)
    assert page["plan"] == cli_plan_json(ARGV)
    assert page["setups"][0]["label"] == page["plan"]["choice"]["label"]
    assert sum(page["setups"][0]["terms"].values()) == page["setups"][0]["per_gpu_bytes"]
    assert page["downloads"]["ds_config_deepspeed.json"] == page["plan"]["ds_config"]
    assert page["downloads"]["ds_config_hf.json"]["train_micro_batch_size_per_gpu"] == "auto"
    # the run file and the command, read back by zerokit's own run-file reader and parser
    import shlex

    from zerokit.cli import parse

    run = tmp_path / "run.yaml"
    run.write_text(page["downloads"]["run.yaml"])
    by_file = parse(["launch", "-c", str(run)])
    argv = shlex.split(page["downloads"]["launch_command"])
    assert argv[:2] == ["zerokit", "launch"]
    by_flags = parse(argv[1:])
    for args in (by_file, by_flags):
        assert (args.model, args.gpu, args.gpus_per_node, args.seq_len, args.global_batch, args.plan) == (
            "tiny-llama", "cpu", 2, 64, 8, True)
        from zerokit.api import launch_request
        from zerokit.cli.common import to_request

        assert launch_request(to_request(args, echo=False)).model == "tiny-llama"  # launch's own checks take it


def test_a_model_under_models_dir_and_an_uploaded_config(server):
    cfg = json.loads((Path(__file__).resolve().parent.parent / "zerokit/data/models/tiny-llama/config.json").read_text())
    by_dir = json.loads(request(server, "POST", "/api/plan", {"options": {**FORM, "model": "mine"}})[1])
    upload = {k: v for k, v in FORM.items() if k != "model"}
    uploaded = json.loads(request(server, "POST", "/api/plan", {"options": upload, "model_config": cfg})[1])
    assert by_dir["plan"]["model"]["params"] == uploaded["plan"]["model"]["params"] == 1262720
    assert by_dir["plan"]["time"] == uploaded["plan"]["time"]


HOSTILE = [
    ("GET", "/../../etc/passwd", None, {}, 404),
    ("GET", "/static/../api.py", None, {}, 404),
    ("DELETE", "/api/plan", None, {}, 405),
    ("PUT", "/", b"x", {}, 405),
    ("GET", "/api/plan", None, {}, 405),
    ("POST", "/api/plan", b"{not json", {}, 400),
    ("POST", "/api/plan", b"\xff\xfe", {}, 400),
    ("POST", "/api/plan", b"[" * 5000 + b"]" * 5000, {}, 400),
    ("POST", "/api/plan", b"[1, 2]", {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "hostfile": "/etc/passwd"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "config_file": "/etc/passwd"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "hardware_profile": "/etc/passwd"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "/etc"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "../../../etc"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "gpus_per_node": "-1"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "nodes": "1e9"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "seq_len": "1e99"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "gpu": "<script>alert(1)</script>"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "stage": "7"}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama", "no_such": 1}}, {}, 400),
    ("POST", "/api/plan", {"options": {"model": {"a": 1}}}, {}, 400),
    ("POST", "/api/plan", {"options": "tiny-llama"}, {}, 400),
    ("POST", "/api/plan", {"options": {}, "model_config": [1, 2]}, {}, 400),
    ("POST", "/api/plan", {"options": {}, "model_config": {"model_type": "nonsense"}}, {}, 400),
    ("POST", "/api/plan", {"options": {}, "model_config": {"x": "y" * 300_000}}, {}, 413),
    ("POST", "/api/plan", {"options": {"model": "tiny-llama"}, "extra": 1}, {}, 400),
    ("POST", "/api/check", {"config": "not a dict"}, {}, 400),
    ("POST", "/api/check", {"config": {"zero_optimization": {"stage": 9}}, "options": {"gpu": "cpu"}}, {}, 200),
    ("POST", "/api/plan", b"", {"Content-Length": "abc"}, 411),
    ("POST", "/api/plan", b"", {"Content-Length": str(MAX_BODY_BYTES + 1)}, 413),
]


@pytest.mark.parametrize("method, path, body, headers, status", HOSTILE,
                         ids=[f"{i}-{h[0]}-{h[4]}" for i, h in enumerate(HOSTILE)])
def test_hostile_requests_get_a_4xx_line_and_the_server_keeps_serving(server, tmp_path, method, path, body, headers,
                                                                      status):
    before = set(Path("/tmp").glob("zerokit-serve-*"))
    got, out = request(server, method, path, body, headers)
    assert got == status, out
    data = json.loads(out)
    if status >= 400:
        assert isinstance(data["error"], str) and "\n" not in data["error"] and "Traceback" not in data["error"]
        assert "<script>" not in data["error"] or data["error"].count("<script>") <= 1  # JSON, never HTML
    else:
        assert data["valid"] is False and data["problem"]  # an invalid config is an answer, not an error
    assert set(Path("/tmp").glob("zerokit-serve-*")) <= before  # uploads live only while answered
    assert request(server, "GET", "/api/catalog")[0] == 200  # still serving


def test_a_silent_client_and_a_short_body_do_not_hold_the_server(server):
    s = socket.create_connection(("127.0.0.1", server))
    s.sendall(b"POST /api/plan HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"opt")  # then nothing
    garbage = socket.create_connection(("127.0.0.1", server))
    garbage.sendall(b"\x00\x01 NOT HTTP\r\n\r\n")
    assert b'"error"' in garbage.recv(200)  # not HTTP/1.x: answered as HTTP/0.9 would be, the one line alone
    garbage.close()
    assert request(server, "POST", "/api/plan", {"options": FORM})[0] == 200  # answered while the other waits
    s.close()


def test_fifty_concurrent_plans_each_get_their_own_answer(server):
    sizes = [1, 2, 4, 8, 16]

    def one(i):
        gb = sizes[i % len(sizes)] * 2
        status, out = request(server, "POST", "/api/plan", {"options": {**FORM, "global_batch": str(gb)}})
        return gb, status, json.loads(out)

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(50)))
    expected = {gb: cli_plan_json([*ARGV[:-4], "--global-batch", str(gb), "--samples", "256"])
                for gb in {r[0] for r in results}}
    for gb, status, data in results:
        assert status == 200
        assert data["plan"] == expected[gb]


def test_every_field_of_the_page_is_a_declared_plan_option_with_its_choices():
    """The form's fields are plan options the server takes (PAGE_OPTIONS), and each select offers exactly the
    choices core/options.py declares for it (DeepSpeed's speed features included: hpZ, qwZ, qgZ, the offload engine,
    compile, tiling), so a choice added there cannot be missing here."""
    from html.parser import HTMLParser

    from zerokit.core.options import declared
    from zerokit.serve.app import PAGE_OPTIONS, STATIC

    class Form(HTMLParser):
        def __init__(self):
            super().__init__()
            self.fields, self.choices, self.select = [], {}, None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag in ("input", "select") and a.get("name"):
                self.fields.append(a["name"])
                if tag == "select":
                    self.select = a["name"]
                    self.choices[self.select] = []
            elif tag == "option" and self.select:
                self.choices[self.select].append([a.get("value"), ""])

        def handle_data(self, data):
            if self.select and self.choices[self.select]:
                self.choices[self.select][-1][1] += data.strip()

        def handle_endtag(self, tag):
            if tag == "select":
                self.select = None

    form = Form()
    form.feed((STATIC / "index.html").read_text())
    assert {"hpz", "zero_quantized_weights", "zero_quantized_gradients", "offload_engine", "compile", "tiled_loss",
            "tiled_mlp", "attention", "seq_parallel_comm_dtype"} <= set(form.fields)
    for name in form.fields:
        assert name in PAGE_OPTIONS, name
        option = declared(name)
        if name in form.choices and option.choices:
            # an option's value, else its text (the finetune select's empty value reads "full", the default)
            offered = [value or text for value, text in form.choices[name] if value or text]
            assert offered == [str(c) for c in option.choices], name


def test_a_plan_with_speed_feature_pins_over_http_is_plan_json(server):
    """qwZ, qgZ and hpZ pinned from the page plan what the same flags plan on the command line."""
    argv = ["llama-3-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--nodes", "2", "--seq-len", "4096",
            "--zero-quantized-weights", "on", "--zero-quantized-gradients", "on", "--hpz", "8"]
    options = {"model": "llama-3-8b", "gpu": "h100-80gb", "gpus_per_node": 8, "nodes": 2, "seq_len": 4096,
               "zero_quantized_weights": "on", "zero_quantized_gradients": "on", "hpz": 8}
    status, body = request(server, "POST", "/api/plan", {"options": options})
    cli = cli_plan_json(argv)
    assert status == 200, body
    plan = json.loads(body)["plan"]
    assert plan["choice"]["quantized_weights"] and plan["choice"]["quantized_gradients"]
    assert plan["choice"]["hpz_partition_size"] == 8
    assert plan == cli


# ---------------------------------------------------------------------------------------------
# the page in a real browser


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make test` installs it (scripts/setup_browser.sh)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def fill(page, values):
    for name, value in values.items():
        loc = page.locator(f"[name={name}]")
        if loc.evaluate("e => e.tagName") == "SELECT":
            loc.select_option(value)
        else:
            loc.fill(value)


def test_the_page_answers_as_the_user_edits_and_matches_the_cli(server, browser, tmp_path):
    page = browser.new_page(accept_downloads=True, bypass_csp=True)  # the CSP forbids eval: Playwright waits by eval
    page.goto(f"http://127.0.0.1:{server}/")
    fill(page, FORM)
    page.wait_for_function("document.body.dataset.state === 'answered' && "
                           "document.querySelector('#summary').dataset.label")
    page.wait_for_timeout(400)  # the last edit's answer, not an earlier one
    page.wait_for_function("document.body.dataset.state === 'answered'")
    cli = cli_plan_json(ARGV)
    summary = page.locator("#summary")
    assert summary.get_attribute("data-label") == cli["choice"]["label"]
    assert float(summary.get_attribute("data-step-seconds")) == pytest.approx(cli["time"]["step_seconds"], rel=1e-9)
    assert page.locator("#verdict").get_attribute("data-fits") == "true"
    assert page.locator("#bars svg rect").count() >= 3  # stacked terms, drawn without a CDN
    assert page.locator("#setups tbody tr").count() == min(1 + len(cli["rejected"]), 8)
    # the download is what `zerokit render` writes
    with page.expect_download() as dl:
        page.locator("button[data-file='ds_config_deepspeed.json']").click()
    saved = tmp_path / "page.json"
    dl.value.save_as(saved)
    rendered = tmp_path / "cli.json"
    assert run_cli(["render", *ARGV, "-o", str(rendered)])[0] == 0
    assert json.loads(saved.read_text()) == json.loads(rendered.read_text())
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    # a shared URL opens the same view
    url = page.locator("#share").get_attribute("href")
    assert "gpus_per_node=2" in url
    other = browser.new_page(bypass_csp=True)
    other.goto(url)
    other.wait_for_function("document.body.dataset.state === 'answered'")
    assert other.locator("#summary").get_attribute("data-label") == cli["choice"]["label"]
    assert other.locator("#text").text_content() == page.locator("#text").text_content()
    # a bad value: the one line, in the page
    fill(other, {"gpus_per_node": "0"})
    other.wait_for_function("document.body.dataset.state === 'error'")
    assert "gpus_per_node" in other.locator("#error").text_content()
    page.close()
    other.close()


def test_the_page_says_at_the_edge_where_the_cli_does(server, browser):
    """A length the memory model fits but the published long runs' factor does not (planning/search.py verdict):
    the page's verdict line says AT THE EDGE, as `zerokit plan` does."""
    argv = ["llama-3.1-8b", "--gpu", "h100-80gb", "--gpus-per-node", "8", "--seq-len", "5000000",
            "--activation-checkpointing", "offload", "--sequence-parallel", "8", "--stage", "3", "--offload-optimizer",
            "cpu", "--liger-kernels", "on"]
    cli = cli_plan_json(argv)
    assert cli["verdict"] == "at the edge" and cli["fits"] and cli["model"]["liger_kernels"]
    query = ("model=llama-3.1-8b&gpu=h100-80gb&gpus_per_node=8&seq_len=5000000&activation_checkpointing=offload&"
             "sequence_parallel=8&stage=3&offload_optimizer=cpu&liger_kernels=on")
    page = browser.new_page(bypass_csp=True)
    page.goto(f"http://127.0.0.1:{server}/?{query}")
    page.wait_for_function("document.body.dataset.state === 'answered'")
    verdict = page.locator("#verdict")
    assert verdict.get_attribute("data-verdict") == "at the edge" and verdict.text_content().startswith("AT THE EDGE")
    assert page.locator("#summary").get_attribute("data-label") == cli["choice"]["label"]
    page.close()


def test_the_check_tab_judges_an_uploaded_config_as_check_does(server, browser, tmp_path):
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                               "zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}))
    page = browser.new_page(bypass_csp=True)
    page.goto(f"http://127.0.0.1:{server}/?tab=check&model=tiny-llama&gpu=cpu&gpus_per_node=2&seq_len=64")
    page.locator("#config-file").set_input_files(str(cfg))
    page.wait_for_function("document.body.dataset.state === 'checked'")
    assert page.locator("#check-verdict").get_attribute("data-valid") == "true"
    rc, out, _ = run_cli(["check", str(cfg), "--model", "tiny-llama", "--gpu", "cpu", "--gpus-per-node", "2",
                          "--seq-len", "64"])
    shown = page.locator("#check-text").text_content().strip().splitlines()
    assert shown[0] == "check ds_config.json (world size 2)" and out.strip().splitlines()[1:] == shown[1:]
    page.close()
