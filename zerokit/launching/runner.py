"""Run the deepspeed launcher as a subprocess; on a crash relaunch it with --resume, up to R times.

    result = run_with_restarts(make_command, output_dir, max_restarts=2, shm_port=29500)

`make_command(resume, attempt) -> (argv, env)` gives the launcher command for one attempt (the first
attempt resumes only when the user asked; every relaunch resumes from checkpoints/latest). The
launcher runs in its own process group (session); Ctrl-C or SIGTERM here kills that whole group
(SIGTERM, then SIGKILL after a grace period) and the run ends with 130/143.

Ranks see ZEROKIT_ATTEMPT=<n> and ZEROKIT_RUN_ID (one id per run_with_restarts call); they log both
with every metrics record, so the attempts of this call are told apart from earlier invocations. After each attempt the /dev/shm/deepspeed_allreduce_buffer_* files of
THIS job are removed: DeepSpeed's CPU shm allreduce names them
deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>, so ours are the ones with our
master address and port that did not exist before we started.

Pure standard library; nothing heavy is imported.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from zerokit.launching.checkpoints import CKPT_SUBDIR, config_rejection, latest_step
from zerokit.report.run_dir import metrics_files

SHM_DIR = "/dev/shm"
SHM_PREFIX = "deepspeed_allreduce_buffer"
KILL_GRACE_S = 10.0


@dataclass
class Attempt:
    attempt: int
    resume: bool
    start_step: int  # the step the attempt resumed from (0: from scratch)
    reached_step: int  # the last step any rank logged in this attempt
    returncode: int
    wall_s: float


@dataclass
class RunResult:
    returncode: int
    restarts: int = 0
    redone_steps: int = 0
    wall_s: float = 0.0
    interrupted: bool = False
    attempts: list[Attempt] = field(default_factory=list)
    shm_removed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def shm_files(port: int | str, addr: str = "127.0.0.1") -> set[str]:
    """This job's DeepSpeed shm allreduce buffers (any rank) currently in /dev/shm."""
    pattern = os.path.join(SHM_DIR, f"{SHM_PREFIX}_{os.getuid()}_{glob.escape(str(addr))}_{port}_*")
    return {p for p in glob.glob(pattern) if p.rsplit("_", 1)[-1].isdigit()}


def remove_shm(port: int | str | None, before: set[str], addr: str = "127.0.0.1") -> list[str]:
    """Remove this job's shm buffers that were not there before the job started."""
    if port is None:
        return []
    removed = []
    for p in sorted(shm_files(port, addr) - before):
        try:
            os.unlink(p)
            removed.append(p)
        except OSError:
            pass
    return removed


def reached_step(output_dir: str | os.PathLike, attempt: int, run_id: str | None = None) -> int:
    """The highest step any rank logged in metrics/rank*.jsonl during `attempt` (of run `run_id`)."""
    best = 0
    for _, f in metrics_files(output_dir):
        try:
            with open(f) as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut short by a kill
                    if rec.get("event") != "step" or rec.get("attempt") != attempt:
                        continue
                    if run_id is None or rec.get("run_id") == run_id:
                        best = max(best, int(rec.get("step", 0)))
        except OSError:
            continue
    return best


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group of `proc` (its own session: pgid == pid), then SIGKILL what is left."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.time() + wait
        while time.time() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.1)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def run_with_restarts(
    make_command: Callable[[bool, int], tuple[list[str], dict[str, str]]],
    output_dir: str | os.PathLike,
    max_restarts: int = 0,
    resume: bool = False,
    shm_port: int | None = None,
    shm_addr: str = "127.0.0.1",
    cwd: str | None = None,
    log: Callable[[str], None] | None = None,
) -> RunResult:
    """Run attempts until one exits 0, Ctrl-C, or max_restarts relaunches were used."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    ckpt_dir = Path(output_dir) / CKPT_SUBDIR
    shm_before = shm_files(shm_port, shm_addr) if shm_port is not None else set()
    result = RunResult(returncode=1)
    t_all = time.time()
    attempt = 0
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    while True:
        do_resume = resume or attempt > 0
        start = latest_step(ckpt_dir) if do_resume else 0
        argv, env_add = make_command(do_resume, attempt)
        env = dict(os.environ)
        env.update(env_add)
        env["ZEROKIT_ATTEMPT"] = str(attempt)
        env["ZEROKIT_RUN_ID"] = run_id
        t0 = time.time()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True)
        interrupted = None
        old = {}

        def on_signal(signum, _frame):
            nonlocal interrupted
            interrupted = signum
            raise KeyboardInterrupt

        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                old[s] = signal.signal(s, on_signal)
            except ValueError:  # not the main thread
                pass
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            interrupted = interrupted or signal.SIGINT
            log("interrupted: stopping every rank")
            _kill_group(proc)
            rc = 128 + int(interrupted)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        if not interrupted:
            _kill_group(proc, grace=2.0)  # no rank of this job may outlive its launcher
        reached = reached_step(output_dir, attempt, run_id)
        result.attempts.append(Attempt(attempt, do_resume, start, reached, rc, time.time() - t0))
        result.shm_removed += remove_shm(shm_port, shm_before, shm_addr)
        if interrupted:
            result.returncode, result.interrupted = rc, True
            break
        if rc == 0:
            result.returncode = 0
            break
        if attempt >= max_restarts or config_rejection(output_dir):  # a restart cannot fix the config
            result.returncode = rc
            break
        resume_at = latest_step(ckpt_dir)
        redo = max(0, reached - resume_at)
        result.redone_steps += redo
        result.restarts += 1
        attempt += 1
        log(f"launcher exited with {rc} (a rank died) after step {reached}; restart {attempt}/{max_restarts} "
            f"from checkpoint step {resume_at} ({redo} steps to redo)")
    result.wall_s = time.time() - t_all
    return result
