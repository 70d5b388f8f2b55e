"""`zerokit launch`: plan (or take) a ds_config, check it fits, then run it under the deepspeed launcher.

    zerokit launch --model tiny-llama --plan --gpus-per-node 2 --steps 20
    zerokit launch --model DIR --data corpus/ --config ds_config.json --output-dir runs/x --save-every 50
    zerokit launch ... --dry-run            # print the exact command, env and config; run and write nothing

Order: validate everything (model, data, tokenizer, hardware, hostfile, config, fit) before the output
directory is created; then write ds_config.json, data/tokens.npy and launch.json; run the launcher
through zerokit.launch.runner (restarts from the latest complete checkpoint on a crash); finally
print and write the predicted-vs-measured report.

Only the standard library and zerokit's light modules are imported at module level (the top-level
CLI imports this file for --help).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from zerokit.cli import nonneg_int, positive_float, positive_int
from zerokit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, ZerokitError

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def add_launch_parser(subparsers, hardware_parent: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the `launch` subcommand to the top-level CLI's subparsers."""
    parents = [hardware_parent]
    try:
        from zerokit.cli import setup_parent

        parents.insert(0, setup_parent())
    except ImportError:  # pragma: no cover - the top-level CLI always has it
        pass
    p = subparsers.add_parser(
        "launch", parents=parents,
        help="check the setup fits, then train with the deepspeed launcher (restarts, checkpoints, report)",
        description="Train MODEL on DATA with DeepSpeed: plan or take a ds_config, refuse what does not fit, "
                    "run every rank under the deepspeed launcher, restart from the latest checkpoint after a "
                    "crash, and report predicted vs measured memory and speed.",
    )
    p.add_argument("--model", required=True,
                   help="HF id, local model directory (weights loaded if present), config-only directory, or "
                        "bundled config name (tiny-llama, ...) for random init")
    p.add_argument("--data", help=".txt/.jsonl file (\"text\" field) or a directory of them; default: the bundled "
                                  "tiny corpus")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", action="store_true", help="let the planner choose the setup and render the config")
    src.add_argument("--config", metavar="DS_CONFIG", help="use this ds_config.json (checked first)")
    p.add_argument("--output-dir", metavar="DIR", help="default runs/<model>-<time>")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int, help="optimizer steps (default: one epoch)")
    length.add_argument("--epochs", type=positive_float, help="passes over the data (default 1)")
    p.add_argument("--save-every", type=nonneg_int, metavar="K",
                   help="checkpoint every K steps (default: 10 checkpoints when --max-restarts > 0, else only the last)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its latest checkpoint")
    p.add_argument("--max-restarts", type=nonneg_int, default=0, metavar="R",
                   help="relaunch from the latest complete checkpoint up to R times if a rank dies")
    p.add_argument("--dry-run", action="store_true", help="print the command, environment and config; run nothing")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sample (default min(512, the model's maximum))")
    p.add_argument("--global-batch", type=positive_int, metavar="N", help="samples per optimizer step (--plan)")
    p.add_argument("--lr", type=positive_float, help="peak learning rate (--plan; default 2e-5 for pretrained "
                                                     "weights, 1e-3 for a random-init model)")
    p.add_argument("--warmup-steps", type=nonneg_int, default=None, help="LR warm-up steps (--plan; default 1/10 of the run)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--master-port", type=positive_int, help="rendezvous port (default: a free one)")
    p.add_argument("--no-report", action="store_true", help="skip the predicted-vs-measured report")
    multi = p.add_argument_group("multi-node")
    multi.add_argument("--launcher", choices=("pdsh", "openmpi", "mpich", "slurm"),
                       help="DeepSpeed's multi-node launcher (default pdsh when --hostfile names other hosts)")
    multi.add_argument("--master-addr", metavar="HOST", help="rendezvous address (default: DeepSpeed asks the first host)")
    multi.add_argument("--sbatch", metavar="FILE",
                       help="prepare the run directory and write a Slurm batch script for this job instead of running it "
                            "(submit with: sbatch FILE)")
    multi.add_argument("--time-limit", default="04:00:00", help="--sbatch: Slurm time limit (default 04:00:00)")
    multi.add_argument("--partition", help="--sbatch: Slurm partition")
    p.set_defaults(func=run_launch)
    return p


# ----------------------------------------------------------------------------------------------
# validation helpers (nothing is written)


def _cuda_devices() -> tuple[int, int | None]:
    """(count, memory MiB of the first) of local NVIDIA GPUs, without importing torch."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0, None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    mems = [int(x) for x in out.stdout.split() if x.strip().isdigit()] if out.returncode == 0 else []
    return len(mems), (mems[0] if mems else None)


def _is_local(host: str) -> bool:
    if host in LOCAL_HOSTS or host.startswith("127."):
        return True
    try:
        return host in (socket.gethostname(), socket.getfqdn())
    except OSError:
        return False


def check_hosts_reachable(hosts, timeout: int = 5, need_pdsh: bool = True) -> None:
    """ssh to every non-local host the way DeepSpeed's runner does; one-line error for the first failure."""
    remote = [h for h in hosts if not _is_local(h)]
    if not remote:
        return
    ssh = shutil.which("ssh")
    if not ssh:
        raise ZerokitError(f"host {remote[0]} needs ssh but no ssh client is installed: apt-get install openssh-client")
    for h in remote:
        try:
            r = subprocess.run([ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}",
                                "-o", "StrictHostKeyChecking=accept-new", h, "true"],
                               capture_output=True, text=True, timeout=timeout + 10)
            ok = r.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        if not ok:
            raise ZerokitError(f"host {h} from the hostfile is unreachable over ssh (passwordless ssh is needed for "
                               "multi-node launch): fix the host name or ssh keys, or drop it from the hostfile")
    if need_pdsh and not shutil.which("pdsh"):
        raise ZerokitError("multi-node launch uses DeepSpeed's pdsh launcher but pdsh is not installed: apt-get install pdsh")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deepspeed_bin() -> str:
    here = Path(sys.executable).parent / "deepspeed"
    if here.is_file():
        return str(here)
    found = shutil.which("deepspeed")
    if not found:
        raise ZerokitError("the deepspeed launcher is not installed: pip install 'zerokit[train]'")
    return found


def resolve_model(model: str) -> tuple[str, str, dict]:
    """(kind 'weights'|'config', source, config dict). Errors for a directory without config.json."""
    p = Path(model).expanduser()
    if p.exists() and not p.is_dir():
        raise ZerokitError(f"model {model!r} is a file: give a model directory (with config.json), an HF id or a bundled name")
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise ZerokitError(f"model directory {model!r} has no config.json: give a HuggingFace model directory")
        from zerokit.launch.train import has_weights
        from zerokit.model_spec import read_config_file

        config = read_config_file(cfg)

        return ("weights" if has_weights(p) else "config", str(p), config)
    from zerokit.launch.data import bundled_dir

    b = bundled_dir("models") / model
    if (b / "config.json").is_file():
        from zerokit.model_spec import read_config_file

        return ("config", str(b), read_config_file(b / "config.json"))
    if "/" in model and not model.startswith((".", "/", "~")):
        return ("weights", model, {})  # hub id: the config comes from the model spec loader
    raise ZerokitError(f"model {model!r} is not a directory, a bundled name or an HF id (org/name): check the spelling")


def steps_for(num_sequences: int, world: int, micro: int, accum: int, steps: int | None, epochs: float | None) -> int:
    """Optimizer steps, counted exactly as zerokit.launch.train streams the data (DistributedSampler pads
    every rank to ceil(n / world) samples; the last micro batch of an epoch may be short)."""
    if steps is not None:
        return steps
    per_rank = math.ceil(num_sequences / world)
    micro_per_epoch = math.ceil(per_rank / micro)
    return max(1, int(math.floor((epochs or 1.0) * micro_per_epoch / accum)))


def _cluster(args, gpu_default: str | None, gpn_default: int | None, mem_default: str | None):
    from zerokit.hardware import build_cluster

    gpn = args.gpus_per_node if args.gpus_per_node is not None else (None if args.hostfile else gpn_default)
    return build_cluster(gpu=args.gpu or gpu_default, gpu_memory=args.gpu_memory or (None if args.gpu else mem_default),
                         gpus_per_node=gpn, nodes=args.nodes, hostfile=args.hostfile, cpu_memory=args.cpu_memory,
                         nvme_path=args.nvme_path, nvme_size=args.nvme_size, hardware_profile=args.hardware_profile)


def _pins(args) -> dict:
    pins = {k: getattr(args, k, None) for k in ("zero_stage", "offload_optimizer", "offload_param", "precision",
                                                "micro_batch_size", "gradient_accumulation_steps")}
    return {k: v for k, v in pins.items() if v is not None}


# ----------------------------------------------------------------------------------------------


class Prepared:
    """Everything validated; what a run (or a dry run) needs."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def prepare(args) -> Prepared:
    """All validation and planning; writes nothing. Raises ZerokitError."""
    from zerokit.launch import data as zdata

    kind, model_src, model_cfg = resolve_model(args.model)

    # hardware: on a machine without CUDA the ranks are CPU processes (gloo)
    n_cuda, cuda_mib = _cuda_devices()
    gpu_default = None if n_cuda else "cpu"
    cluster = _cluster(args, gpu_default, n_cuda or 1, f"{cuda_mib}MiB" if cuda_mib else None)
    if cluster.accelerator.is_cpu and n_cuda:
        pass  # explicit --gpu cpu on a GPU machine: allowed
    hosts = dict(cluster.hosts) if cluster.hosts else {}
    multi_node = bool(hosts) and not (len(hosts) == 1 and _is_local(next(iter(hosts))))
    if cluster.nodes > 1 and not hosts and not (args.sbatch or args.launcher == "slurm"):
        raise ZerokitError(f"--nodes {cluster.nodes} needs --hostfile naming the nodes: give one")

    # model spec (exact parameter counts) for the fit check
    from zerokit.model_spec import load_model_spec

    spec = load_model_spec(model_src)
    max_pos = model_cfg.get("max_position_embeddings") or model_cfg.get("n_positions") or 2048
    seq_len = args.seq_len or min(512, int(max_pos))
    if seq_len > int(max_pos):
        raise ZerokitError(f"--seq-len {seq_len} exceeds the model's maximum of {max_pos} positions: lower it")

    # data: files, tokenizer, token blocks (the empty-data check needs the count)
    files = zdata.resolve_data_files(args.data)
    tokenizer = zdata.resolve_tokenizer(model_src)
    arr, total_tokens = zdata.tokenize_files(files, tokenizer, seq_len)
    vocab = model_cfg.get("vocab_size") or spec.vocab_size
    if vocab and int(arr.max()) >= int(vocab):
        raise ZerokitError(f"tokenizer {tokenizer} produces token id {int(arr.max())} but the model's vocabulary has "
                           f"{vocab} entries: use the model's own tokenizer")

    from zerokit.zero_setup import Workload

    samples = int(arr.shape[0])
    world = cluster.world_size
    pins = _pins(args)
    ac = getattr(args, "activation_checkpointing", None)
    if ac is not None:
        pins["activation_checkpointing"] = ac == "on"
    fraction = getattr(args, "memory_fraction", None)
    from zerokit.memory import DEFAULT_MEMORY_FRACTION

    fraction = fraction or DEFAULT_MEMORY_FRACTION

    if args.config:
        if pins.keys() - {"activation_checkpointing"}:
            raise ZerokitError("--stage/--offload-*/--precision/--micro-batch/--grad-accum choose a setup for --plan; "
                               "with --config the config decides: drop them or use --plan")
        from zerokit.check import check_config
        from zerokit.ds_check import load_config_file

        ds_config = load_config_file(args.config)
        workload = Workload(seq_len=seq_len, samples=samples, global_batch=None)
        result = check_config(ds_config, args.config, spec, cluster, workload,
                              activation_checkpointing=bool(pins.get("activation_checkpointing")),
                              memory_fraction=fraction)
        if not result.valid or (result.evaluation is not None and not result.evaluation.fits):
            from zerokit.report_text import format_check

            print(format_check(result), file=sys.stderr)
            if not result.valid:
                raise ZerokitError(f"{args.config} is not a valid DeepSpeed config for {world} ranks: see above")
            raise ZerokitError(f"the setup in {args.config} does not fit: see the breakdown above (or try --plan)",
                               exit_code=EXIT_DOES_NOT_FIT)
        evaluation = result.evaluation
        setup = evaluation.setup
        micro = int(ds_config.get("train_micro_batch_size_per_gpu") or setup.micro_batch_size)
        accum = int(ds_config.get("gradient_accumulation_steps") or setup.gradient_accumulation_steps)
        steps = steps_for(samples, world, micro, accum, args.steps, args.epochs)
    else:
        from zerokit.planner import make_plan
        from zerokit.render import render_ds_config

        workload = Workload(seq_len=seq_len, global_batch=args.global_batch, samples=samples,
                            epochs=args.epochs or 1.0)
        plan = make_plan(spec, cluster, workload, pins, memory_fraction=fraction)
        if not plan.fits or plan.best is None:
            from zerokit.report_text import format_plan

            print(format_plan(plan), file=sys.stderr)
            raise ZerokitError("no ZeRO setup fits this model on this hardware: see the breakdown above",
                               exit_code=EXIT_DOES_NOT_FIT)
        evaluation = plan.best
        setup = evaluation.setup
        micro, accum = setup.micro_batch_size, setup.gradient_accumulation_steps
        steps = steps_for(samples, world, micro, accum, args.steps, args.epochs)
        lr = args.lr or (2e-5 if kind == "weights" else 1e-3)
        warmup = args.warmup_steps if args.warmup_steps is not None else max(1, steps // 10)
        ds_config = render_ds_config(setup, cluster, spec, workload, lr=lr, warmup_steps=warmup, total_steps=steps)
    grad_ckpt = bool(setup.activation_checkpointing)

    save_every = args.save_every
    if save_every is None:
        save_every = max(1, steps // 10) if args.max_restarts else 0

    out = Path(args.output_dir) if args.output_dir else Path("runs") / (
        f"{Path(args.model.rstrip('/')).name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and not out.is_dir():
        raise ZerokitError(f"--output-dir {out} is a file: give a directory")
    ckpt = out / "checkpoints"
    if args.resume:
        from zerokit.launch.train import read_latest

        if not read_latest(ckpt):
            raise ZerokitError(f"--resume: {out} has no complete checkpoint (checkpoints/latest): drop --resume to start fresh")
        old_tokens = out / "data" / "tokens.npy"
        if old_tokens.is_file():
            prev = zdata.load_tokens(old_tokens)
            if prev.shape != arr.shape or not (prev == arr).all():
                raise ZerokitError(f"--resume: the data or --seq-len differ from the run in {out} (its data position "
                                   "would point elsewhere): resume with the same --data and --seq-len")
    elif ckpt.is_dir() and any(ckpt.iterdir()):
        raise ZerokitError(f"--output-dir {out} already holds checkpoints: pass --resume to continue it, or choose another directory")

    launcher = args.launcher or ("pdsh" if multi_node else "local")
    if args.sbatch:
        sb_dir = Path(args.sbatch).expanduser().resolve().parent
        if not sb_dir.is_dir() or not os.access(sb_dir, os.W_OK):
            raise ZerokitError(f"cannot write --sbatch {args.sbatch}: {sb_dir} is not a writable directory")
        launcher = "slurm"  # the script runs DeepSpeed's slurm launcher inside the allocation
    elif launcher == "slurm" and not args.master_addr:
        raise ZerokitError("--launcher slurm runs inside a Slurm allocation and needs --master-addr: "
                           "or use --sbatch FILE to get a batch script that finds it")
    if launcher != "local":
        multi_node = True
    if launcher in ("pdsh", "openmpi", "mpich"):
        if not hosts:
            raise ZerokitError(f"--launcher {launcher} needs --hostfile naming the nodes: give one")
        check_hosts_reachable(list(hosts), need_pdsh=launcher == "pdsh")
    deepspeed_bin = _deepspeed_bin()
    port = args.master_port or _free_port()

    # the launch command (pure: zerokit.launch.command)
    from zerokit.launch.command import LaunchSpec

    out_abs = out.resolve()
    cfg_path, tokens_path = out_abs / "ds_config.json", out_abs / "data" / "tokens.npy"
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(x for x in (pkg_root, os.environ.get("PYTHONPATH", "")) if x)}
    if cluster.accelerator.is_cpu:
        env["DS_ACCELERATOR"] = "cpu"
        if "OMP_NUM_THREADS" not in os.environ:
            # torch gives every rank all cores; N ranks on N x fewer cores each fight for them
            # (measured: a tiny ZeRO-0 step 5.8 s instead of 0.05 s with 2 ranks on 2 cores)
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cluster.gpus_per_node))
    for k in ("TORCH_EXTENSIONS_DIR", "HF_HOME", "HF_HUB_OFFLINE"):
        if os.environ.get(k) and multi_node:
            env[k] = os.environ[k]

    def script_args(resume: bool) -> list[str]:
        a = ["--model", model_src, "--tokens", str(tokens_path), "--tokenizer", tokenizer,
             "--ds-config", str(cfg_path), "--output-dir", str(out_abs), "--steps", str(steps),
             "--save-every", str(save_every), "--seed", str(args.seed)]
        if grad_ckpt:
            a.append("--gradient-checkpointing")
        if resume:
            a.append("--resume")
        return a

    def make_spec(resume: bool) -> "LaunchSpec":
        if launcher == "slurm":
            # the sbatch template replaces hostfile and master address with the allocation's
            return LaunchSpec(launcher="slurm", num_gpus=cluster.gpus_per_node, num_nodes=cluster.nodes,
                              hostfile=str(Path(args.hostfile).resolve() if args.hostfile else out_abs / "hostfile"),
                              master_addr=args.master_addr or "localhost", master_port=port,
                              script_args=script_args(resume), env=env, deepspeed_bin=deepspeed_bin)
        if multi_node:
            return LaunchSpec(launcher=launcher, num_gpus=cluster.gpus_per_node, num_nodes=cluster.nodes,
                              hostfile=str(Path(args.hostfile).resolve()), master_addr=args.master_addr,
                              master_port=port, script_args=script_args(resume), env=env,
                              deepspeed_bin=deepspeed_bin)
        return LaunchSpec(launcher="local", num_gpus=cluster.gpus_per_node, master_port=port,
                          script_args=script_args(resume), env=env, deepspeed_bin=deepspeed_bin)

    make_spec(args.resume)  # validate now

    from zerokit.launch.report import prediction_from_evaluation

    return Prepared(
        kind=kind, model_src=model_src, cluster=cluster, spec=spec, files=files, tokenizer=tokenizer, arr=arr,
        total_tokens=total_tokens, samples=samples, seq_len=seq_len, ds_config=ds_config, evaluation=evaluation,
        setup=setup, steps=steps, save_every=save_every, out=out, out_abs=out_abs, cfg_path=cfg_path,
        tokens_path=tokens_path, port=port, multi_node=multi_node, make_spec=make_spec, env=env,
        prediction=prediction_from_evaluation(evaluation, steps),
    )


def _print_command(prep: Prepared, resume: bool, stream) -> None:
    from zerokit.launch.command import build_launch_command

    argv, env = build_launch_command(prep.make_spec(resume))
    print(f"# {prep.setup.label} | {prep.cluster.world_size} ranks | {prep.steps} steps | seq {prep.seq_len} | "
          f"{prep.samples} sequences ({prep.total_tokens:,} tokens)", file=stream)
    print("# environment:", file=stream)
    for k, v in env.items():
        print(f"export {k}={shlex.quote(v)}", file=stream)
    print("# command:", file=stream)
    print(shlex.join(argv), file=stream)


def run_launch(args) -> int:
    prep = prepare(args)
    if args.dry_run:
        _print_command(prep, args.resume, sys.stdout)
        print(f"# ds_config ({prep.cfg_path}):")
        print(json.dumps(prep.ds_config, indent=2))
        print("# dry run: nothing was written or started")
        return EXIT_OK

    # from here on we write: the output directory, the config, the tokens, launch.json
    from zerokit.launch import data as zdata
    from zerokit.launch.command import build_launch_command
    from zerokit.launch.runner import run_with_restarts
    from zerokit.render import write_json_atomic

    out = prep.out_abs
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(prep.cfg_path, prep.ds_config)
    zdata.write_tokens(prep.arr, prep.total_tokens, prep.files, prep.tokenizer, prep.seq_len, prep.tokens_path.parent)
    if prep.multi_node and not args.sbatch:  # the sbatch script exports the same variables itself
        from zerokit.hostfile import write_deepspeed_env

        write_deepspeed_env(os.getcwd(), prep.env)
    if args.sbatch:
        from zerokit.fsutil import atomic_write_text
        from zerokit.launch.command import render_sbatch

        script = render_sbatch(prep.make_spec(args.resume), job_name=f"zerokit-{out.name}", nodes=prep.cluster.nodes,
                               gpus_per_node=prep.cluster.gpus_per_node, time_limit=args.time_limit,
                               partition=args.partition, output_dir=str(out))
        atomic_write_text(args.sbatch, script, mode=0o755)
        print(f"wrote {args.sbatch} for {prep.setup.label} on {prep.cluster.nodes} node(s); submit with: "
              f"sbatch {shlex.quote(args.sbatch)}")
        return EXIT_OK
    argv0, env0 = build_launch_command(prep.make_spec(args.resume))
    write_json_atomic(out / "launch.json", {
        "command": argv0, "env": env0, "steps": prep.steps, "save_every": prep.save_every, "seq_len": prep.seq_len,
        "model": prep.model_src, "tokenizer": prep.tokenizer, "data": [str(f) for f in prep.files],
        "setup": prep.setup.to_dict(), "prediction": prep.prediction, "max_restarts": args.max_restarts,
    })
    _print_command(prep, args.resume, sys.stderr)
    sys.stderr.flush()

    def make(resume: bool, attempt: int):
        return build_launch_command(prep.make_spec(resume))

    result = run_with_restarts(make, out, max_restarts=args.max_restarts, resume=args.resume,
                               shm_port=None if prep.multi_node else prep.port)
    run_info = result.to_dict()
    if not args.no_report:
        from zerokit.launch.report import build_report, format_report, read_metrics, summarize_metrics, write_report

        measured = summarize_metrics(read_metrics(out))
        report = build_report(prep.prediction, measured, run_info)
        write_report(out, report)
        print(format_report(report))
    if result.interrupted:
        print("interrupted: every rank was stopped", file=sys.stderr)
        return result.returncode
    if not result.ok:
        raise ZerokitError(f"training failed (launcher exit code {result.returncode}) after {result.restarts} restarts: "
                           f"see the rank output above; resume with --resume --output-dir {prep.out}",
                           exit_code=result.returncode if 0 < result.returncode < 128 else 1)
    print(f"done: {prep.steps} steps, {result.restarts} restarts ({result.redone_steps} steps redone); "
          f"weights in {prep.out / 'final'}")
    return EXIT_OK

