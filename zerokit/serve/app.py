"""The web page's answers: a request (method, path, body) in, (status, content type, bytes) out, with no socket in
sight, so the tests call it directly as well as over HTTP (zerokit/serve/__init__.py holds the server).

Every answer comes from zerokit.api, as `zerokit plan --json` and `zerokit check --json` give it. What a request may
ask is bounded before any planning: the body's size, its JSON's depth, the options the page takes (typed and bounded
by the command line's declarations, core/options.py typed_values), and a model named by path only inside the
server's --models-dir. A bad request is a 4xx with the one line the command line would print; nothing is written but
an uploaded config.json, in a temporary folder removed after the answer.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.options import declared, flag

MAX_BODY_BYTES = 1 << 20  # a request: the form's options and, at most, one uploaded config.json or ds_config
MAX_UPLOAD_BYTES = 256 << 10  # an uploaded config.json or ds_config, as JSON text (the largest HF config is ~30 KiB)
MAX_JSON_DEPTH = 32  # a ds_config nests 4 deep, an HF config 3: past this is no config
MAX_SETUP_ROWS = 8  # the stacked bars: the chosen setup and the closest others

# The options the page sends: the plan's own, never one that reads or writes a file on the server (hostfile,
# hardware-profile other than none, nvme-path, config-file, output, plot) or runs the model (trace).
PAGE_OPTIONS = frozenset({
    "model", "params", "hidden_size", "num_layers", "vocab_size", "num_attention_heads", "num_kv_heads", "gpu", "gpu_memory", "gpus_per_node", "nodes",
    "cpu_memory", "intra_node_bandwidth", "inter_node_bandwidth", "nvme_size", "dist_backend", "seq_len", "doc_len",
    "global_batch", "samples", "epochs", "attention", "liger_kernels", "checkpoint_reentrant", "training_loop",
    "stage", "zero_stage", "offload_optimizer", "offload_param", "precision", "micro_batch", "micro_batch_size",
    "grad_accum", "gradient_accumulation_steps", "activation_checkpointing", "tensor_parallel", "sequence_parallel",
    "seq_parallel_comm_dtype", "hpz", "hpz_partition_size", "pipeline_parallel", "zero_quantized_weights", "zero_quantized_gradients", "offload_engine", "compile",
    "tiled_loss", "tiled_mlp", "memory_fraction", "finetune", "lora_r", "lora_alpha", "lora_dropout", "lora_targets",
    "bnb_4bit_quant_storage", "bnb_4bit_use_double_quant", "freeze", "deadline", "compare_gpus", "client_optimizer",
    "profile",
})
STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
                "/static/app.css": ("app.css", "text/css; charset=utf-8")}


class BadRequest(Exception):
    """A request the page cannot answer: its HTTP status and the one line that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def answer(method: str, path: str, body: bytes = b"", models_dir: str | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) for one request; never raises."""
    try:
        return _route(method, path.split("?", 1)[0], body, models_dir)
    except BadRequest as e:
        return _json(e.status, {"error": str(e)})
    except ZerokitError as e:
        return _json(400, {"error": str(e)})
    except RecursionError:
        return _json(400, {"error": f"the JSON nests too deep: at most {MAX_JSON_DEPTH} levels"})
    except Exception as e:  # an input the library did not foresee: still one line, never a traceback
        line = " ".join(str(e).split())[:300]
        return _json(422, {"error": f"could not answer: {type(e).__name__}: {line}"})


def _route(method: str, path: str, body: bytes, models_dir: str | None):
    if path in STATIC_FILES:
        if method not in ("GET", "HEAD"):
            raise BadRequest(405, f"{method} {path}: the page takes GET")
        name, ctype = STATIC_FILES[path]
        return 200, ctype, (STATIC / name).read_bytes()
    routes = {"/api/catalog": ("GET", lambda: catalog()), "/api/plan": ("POST", lambda: plan(_body(body), models_dir)),
              "/api/check": ("POST", lambda: check(_body(body), models_dir))}
    if path not in routes:
        raise BadRequest(404, f"no page at {path[:100]}: the page is /, its answers /api/plan and /api/check")
    want, fn = routes[path]
    if method != want:
        raise BadRequest(405, f"{method} {path}: use {want}")
    return _json(200, fn())


def _json(status: int, obj) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(obj, allow_nan=False, default=str).encode()


def _body(body: bytes) -> dict:
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(413, f"the request is {len(body):,} bytes: at most {MAX_BODY_BYTES:,}")
    try:
        data = json.loads(body.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest(400, f"the request is not JSON ({str(e)[:80]}): send an object of option names to values") from None
    _check_depth(data)
    if not isinstance(data, dict):
        raise BadRequest(400, f"the request holds a {type(data).__name__}, not an object: send "
                              '{"options": {"model": "tiny-llama", ...}}')
    unknown = set(data) - {"options", "model_config", "config", "config_name"}
    if unknown:
        raise BadRequest(400, f"unknown field {sorted(unknown)[0]!r}: the request takes options, model_config, config, "
                              "config_name")
    return data


def _check_depth(obj) -> None:
    stack = [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(400, f"the JSON nests too deep: at most {MAX_JSON_DEPTH} levels")
        if isinstance(o, dict):
            stack += [(v, depth + 1) for v in o.values()]
        elif isinstance(o, list):
            stack += [(v, depth + 1) for v in o]


def catalog() -> dict:
    """What the form offers: the GPU catalog and the bundled models."""
    from zerokit.spec.hardware import catalog as gpus
    from zerokit.spec.resolve import bundled_models

    return {"gpus": sorted(gpus()), "models": bundled_models()}


def _options(data: dict) -> dict:
    opts = data.get("options") or {}
    if not isinstance(opts, dict):
        raise BadRequest(400, "options must be an object of option names to values")
    out = {}
    for key, value in opts.items():
        name = str(key).replace("-", "_")
        if name not in PAGE_OPTIONS:
            raise BadRequest(400, f"option {str(key)[:60]!r} is not taken from the page (it reads or writes files on "
                                  "the server, or is no option): use the command line")
        if value is None or value == "" or value == []:
            continue  # an empty field: the default
        out[name] = value
    return out


class _Model:
    """The model the request names, as a string the API takes: an uploaded config.json (written into a temporary
    folder, removed on exit), a directory under --models-dir, or a bundled name / hub id; never another path."""

    def __init__(self, data: dict, opts: dict, models_dir: str | None):
        self.tmp = None
        self.data, self.opts, self.models_dir = data, opts, models_dir

    def __enter__(self) -> dict:
        cfg = self.data.get("model_config")
        model = self.opts.get("model")
        if cfg is not None:
            if not isinstance(cfg, dict):
                raise BadRequest(400, "model_config must be the object a config.json holds")
            text = json.dumps(cfg)
            if len(text) > MAX_UPLOAD_BYTES:
                raise BadRequest(413, f"the config.json is {len(text):,} bytes: at most {MAX_UPLOAD_BYTES:,}")
            self.tmp = tempfile.TemporaryDirectory(prefix="zerokit-serve-")
            Path(self.tmp.name, "config.json").write_text(text, encoding="utf-8")
            return {**self.opts, "model": self.tmp.name}
        if isinstance(model, str) and model:
            return {**self.opts, "model": self._named(model)}
        return self.opts

    def _named(self, model: str) -> str:
        looks_like_path = model.startswith(("/", ".", "~", "\\")) or Path(model).exists()
        if self.models_dir:
            root = Path(self.models_dir).resolve()
            candidate = (root / model).resolve()
            if candidate.is_relative_to(root) and (candidate / "config.json").is_file():
                return str(candidate)
        if looks_like_path:
            raise BadRequest(400, f"model {model[:80]!r} is a path on the server: name a bundled model or a hub id, "
                                  f"upload its config.json, or start the server with {flag('models-dir')}"
                                  + (" (it is not a model directory under it)" if self.models_dir else ""))
        return model

    def __exit__(self, *exc):
        if self.tmp is not None:
            self.tmp.cleanup()


def plan(data: dict, models_dir: str | None = None) -> dict:
    """A plan for the form: `plan --json`'s object, the text table, the setups' memory per term for the bars, the
    GPU comparison and every download (both ds_config profiles, accelerate's yaml, a run file, the launch
    command)."""
    from zerokit import api

    opts = _options(data)
    with _Model(data, opts, models_dir) as given:
        compare = given.pop("compare_gpus", None)
        req = api.request("plan", given, where="the page")
        p = api.plan_request(req)
        out = {"plan": p.to_dict(), "text": p.text(), "setups": setup_bars(p), "said": req.said,
               "downloads": downloads(p, opts) if p.best is not None and p.fits else {}}
        if compare:
            creq = api.request("plan", {**given, "compare_gpus": compare}, where="the page")
            out["compare"] = api.compare_request(creq).to_dict()
    return out


def setup_bars(p) -> list[dict]:
    """The chosen setup and the closest others: label, why, per-GPU memory per term (the stacked bar), step time."""
    from zerokit.report.plan_text import TERM_LABELS

    rows = []
    for ev, why in [(p.best, "chosen" if p.fits else "least memory")] + list(p.close_evaluations()):
        if ev is None:
            continue
        terms = {TERM_LABELS.get(k, k): v for k, v in ev.memory.per_gpu.items() if v}
        rows.append({"label": ev.setup.label, "reason": why, "per_gpu_bytes": ev.memory.per_gpu_total,
                     "terms": terms, "step_seconds": ev.time.step_seconds, "fits": ev.fits})
        if len(rows) >= MAX_SETUP_ROWS:
            break
    return rows


def downloads(p, opts: dict) -> dict:
    """What the page offers to save: the ds_config in both profiles, accelerate's yaml, a run file and the command."""
    from zerokit import api

    # the options `zerokit launch` takes, less those it takes only for a user's own script (the command is --plan)
    launch_opts = {k: v for k, v in opts.items()
                   if "launch" in declared(k).commands and declared(k).key not in api.SCRIPT_ONLY_OPTIONS}
    if "model" not in launch_opts:
        launch_opts["model"] = "MODEL_DIR"
    if p.deadline is not None:  # planned for the GPUs the deadline needs
        launch_opts.update(gpus_per_node=p.cluster.gpus_per_node, nodes=p.cluster.nodes)
    run_yaml = "".join(f"{declared(k).name}: {json.dumps(v)}\n" for k, v in launch_opts.items())
    flags = " ".join(f"{declared(k).flag} {_shell(v)}" for k, v in launch_opts.items() if k != "model")
    return {"ds_config_deepspeed.json": p.ds_config_for("deepspeed"), "ds_config_hf.json": p.ds_config_for("hf"),
            api.ACCELERATE_YAML: api.accelerate_config_text(p), "run.yaml": run_yaml + "plan: true\n",
            "launch_command": f"zerokit launch {flag('model')} {_shell(launch_opts['model'])} {flags} {flag('plan')}"
                              .replace("  ", " ")}


def _shell(value) -> str:
    import shlex

    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return shlex.quote(str(value))


def check(data: dict, models_dir: str | None = None) -> dict:
    """A ds_config checked as `zerokit check --json` checks it ("auto" values answered)."""
    from zerokit import api

    config = data.get("config")
    if not isinstance(config, dict):
        raise BadRequest(400, "config must be the object a ds_config.json holds: upload one")
    if len(json.dumps(config)) > MAX_UPLOAD_BYTES:
        raise BadRequest(413, f"the ds_config is over {MAX_UPLOAD_BYTES:,} bytes")
    # the options `zerokit check` takes; the batch is the config's own (train_batch_size), and check judges one step,
    # not a training length
    opts = {k: v for k, v in _options(data).items()
            if "check" in declared(k).commands and declared(k).key not in ("global_batch", "samples", "epochs")}
    with _Model(data, opts, models_dir) as given:
        req = api.request("check", given, where="the page")
        req.config = Path(str(data.get("config_name") or "ds_config.json")).name[:100]  # a label: never opened
        result = api.check_request(req, config=config)
        return {"check": result.to_dict(), "text": result.text(), "valid": result.valid, "fits": result.fits,
                "problem": None if result.valid else result.problem(), "said": req.said}
