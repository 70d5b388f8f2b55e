"""`zerokit launch` through the real CLI (`python -m zerokit launch ...` in a subprocess).

Bad inputs: exit code, one-line `error:` on stderr, no traceback, no output directory left behind.
--dry-run: prints the exact command and config, starts and writes nothing. One real end-to-end run
(2 CPU ranks, tiny-llama, --plan) checks the files a run leaves and the predicted-vs-measured report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")


def zk(*args, cwd=None, timeout=600, env_extra=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH", "")) if x)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "zerokit", "launch", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or str(REPO), env=env, timeout=timeout)


def assert_one_line_error(p: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), p.stderr
    for n in needles:
        assert n in last, last
    return last


BASE = ["--model", "tiny-llama", "--gpus-per-node", "2", "--seq-len", "32", "--steps", "2", "--gpu", "cpu"]


def test_missing_data_file(tmp_path):
    out = tmp_path / "run"
    p = zk(*BASE, "--plan", "--data", tmp_path / "nope.txt", "--output-dir", out)
    assert_one_line_error(p, 2, "nope.txt", "does not exist")
    assert not out.exists()


def test_empty_data(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")
    out = tmp_path / "run"
    p = zk(*BASE, "--plan", "--data", tmp_path / "tiny.txt", "--output-dir", out)
    assert_one_line_error(p, 2, "fewer than one sequence of 32")
    assert not out.exists()


def test_malformed_jsonl(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "fine"}\n{not json}\n')
    p = zk(*BASE, "--plan", "--data", tmp_path / "d.jsonl", "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "d.jsonl:2")
    assert not (tmp_path / "run").exists()


def test_model_directory_without_config(tmp_path):
    (tmp_path / "model").mkdir()
    p = zk("--model", tmp_path / "model", "--gpus-per-node", "2", "--steps", "2", "--plan", "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "no config.json")
    assert not (tmp_path / "run").exists()


def test_config_that_does_not_fit(tmp_path):
    cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": 0}}
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    out = tmp_path / "run"
    p = zk(*BASE, "--config", tmp_path / "ds.json", "--gpu-memory", "1MB", "--output-dir", out)
    assert_one_line_error(p, 1, "does not fit")
    assert "DOES NOT FIT" in p.stderr  # the breakdown is printed before the error line
    assert not out.exists()


# lint passes it (a known key), DeepSpeed's DeepSpeedZeroConfig refuses the value, zerokit reads no setup from it
REFUSED_BY_DEEPSPEED = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
                        "zero_optimization": {"stage": 2, "overlap_comm": "often"}}


def test_config_deepspeed_refuses_is_refused_before_anything_starts_where_it_must(tmp_path):
    """A dry run, and a run into an existing --output-dir, put the config to DeepSpeed in the parent."""
    (tmp_path / "ds.json").write_text(json.dumps(REFUSED_BY_DEEPSPEED))
    p = zk(*BASE, "--config", tmp_path / "ds.json", "--output-dir", tmp_path / "run", "--dry-run")
    assert_one_line_error(p, 2, "not a valid DeepSpeed config", "overlap_comm")
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "mine.txt").write_text("keep")
    p = zk(*BASE, "--config", tmp_path / "ds.json", "--output-dir", tmp_path / "existing")
    assert_one_line_error(p, 2, "not a valid DeepSpeed config")
    assert sorted(f.name for f in (tmp_path / "existing").iterdir()) == ["mine.txt"]


def test_deepspeed_check_in_ranks_only_for_a_fresh_local_run(tmp_path):
    from zerokit.launching.prepare import LaunchRequest, deepspeed_check_in_ranks

    req = LaunchRequest(model="tiny-llama", config="ds.json", output_dir=str(tmp_path / "new"))
    assert deepspeed_check_in_ranks(req, multi_node=False)
    assert not deepspeed_check_in_ranks(req, multi_node=True)
    for change in (dict(config=None), dict(dry_run=True), dict(sbatch="job.sbatch"), dict(resume=True),
                   dict(launcher="pdsh"), dict(output_dir=str(tmp_path))):
        assert not deepspeed_check_in_ranks(LaunchRequest(**{**req.__dict__, **change}), multi_node=False), change


def test_first_launch_of_a_config_imports_no_deepspeed_in_the_parent(tmp_path):
    """prepare_launch of a fresh local run with --config: lint reads DeepSpeed's key sets as data, the tokens come
    from the tokenizers library, and DeepSpeed's config classes are left to the ranks (--check-config)."""
    (tmp_path / "ds.json").write_text(json.dumps({**REFUSED_BY_DEEPSPEED, "zero_optimization": {"stage": 2}}))
    code = ("import json, sys\n"
            "from zerokit.launching.prepare import LaunchRequest, prepare_launch\n"
            "from zerokit.spec.hardware import HardwareOptions\n"
            f"req = LaunchRequest(model='tiny-llama', config={str(tmp_path / 'ds.json')!r}, seq_len=32, steps=2,\n"
            f"    output_dir={str(tmp_path / 'run')!r}, hardware=HardwareOptions(gpu='cpu', gpus_per_node=2))\n"
            "plan = prepare_launch(req)\n"
            "print(json.dumps({'options': plan.rank_options(False).to_dict(), 'checked': plan.deepspeed_checked,\n"
            "    'heavy': [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]}))\n")
    env = dict(os.environ, ZEROKIT_CACHE_DIR=str(tmp_path / "empty-cache"),
               PYTHONPATH=os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["checked"] is False and out["options"]["check_config"] is True, out


@pytest.mark.slow
def test_config_deepspeed_refuses_in_the_ranks_ends_in_one_line(tmp_path):
    """The first launch of a config leaves DeepSpeed's config classes to the ranks: the refusal still ends in one
    error line, exit 2, no traceback, no restart, and no run directory left."""
    (tmp_path / "ds.json").write_text(json.dumps(REFUSED_BY_DEEPSPEED))
    out = tmp_path / "run"
    p = zk(*BASE, "--config", tmp_path / "ds.json", "--output-dir", out, "--max-restarts", "2",
           env_extra={"ZEROKIT_CACHE_DIR": str(tmp_path / "cache")})  # no cached verdict: the first launch
    last = assert_one_line_error(p, 2, "not a valid DeepSpeed config for 2 ranks", "overlap_comm", "often")
    assert '"check_config": true' in p.stderr  # the ranks' options (printed before the launch)
    assert "restart" not in p.stderr and not out.exists(), last


def test_malformed_hostfile(tmp_path):
    (tmp_path / "hosts").write_text("worker-0 slots=two\n")
    p = zk("--model", "tiny-llama", "--plan", "--steps", "2", "--gpu", "cpu", "--hostfile", tmp_path / "hosts",
           "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "hosts")
    assert not (tmp_path / "run").exists()


def test_unreachable_host(tmp_path):
    (tmp_path / "hosts").write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    p = zk("--model", "tiny-llama", "--plan", "--steps", "2", "--seq-len", "32", "--gpu", "cpu",
           "--hostfile", tmp_path / "hosts", "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "no-such-host.invalid")
    assert not (tmp_path / "run").exists()


def test_no_save_with_what_needs_a_checkpoint(tmp_path):
    for extra, needle in ((["--max-restarts", "1"], "--no-save writes no checkpoint or weights, and --max-restarts"),
                          (["--save-every", "2"], "--save-every needs them"),
                          (["--resume"], "--resume needs them")):
        p = zk(*BASE, "--plan", "--no-save", *extra, "--output-dir", tmp_path / "run")
        assert_one_line_error(p, 2, needle)
        assert not (tmp_path / "run").exists()


def test_resume_without_checkpoint(tmp_path):
    p = zk(*BASE, "--plan", "--resume", "--output-dir", tmp_path / "run")
    assert_one_line_error(p, 2, "--resume")
    assert not (tmp_path / "run").exists()


def test_dry_run_prints_command_and_runs_nothing(tmp_path):
    out = tmp_path / "run"
    p = zk(*BASE, "--plan", "--micro-batch", "2", "--save-every", "1", "--master-port", "29999", "--dry-run",
           "--output-dir", out)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    cmd = next(x for x in lines if "--module zerokit.launching.train" in x)
    assert "--num_gpus 2" in cmd and "--master_port 29999" in cmd and cmd.endswith(str(out / "rank_options.json"))
    # what the ranks will read from that file (launching/rank_options.RankOptions)
    opts = json.loads(lines[lines.index(next(x for x in lines if x.startswith("# rank options"))) + 1])
    assert opts["steps"] == 2 and opts["save_every"] == 1 and opts["output_dir"] == str(out)
    assert any(x.startswith("export PYTHONPATH=") for x in lines)
    after = p.stdout[p.stdout.index("# ds_config"):]
    cfg = json.loads(after[after.index("{"): after.rindex("}") + 1])
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert not out.exists()
    assert not any(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29999_*"))


@pytest.mark.slow
def test_launch_end_to_end_with_report(tmp_path):
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    p = zk(*BASE[:-4], "--steps", "6", "--gpu", "cpu", "--plan", "--stage", "2", "--precision", "fp32",
           "--micro-batch", "2", "--grad-accum", "2", "--save-every", "3", "--output-dir", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for f in ("ds_config.json", "launch.json", "data/tokens.npy", "data/tokens.json", "report.txt", "report.json",
              "metrics/rank0.jsonl", "metrics/rank1.jsonl", "checkpoints/latest", "final/config.json"):
        assert (out / f).exists(), f
    assert (out / "checkpoints" / "latest").read_text() == "step6"
    rep = json.loads((out / "report.json").read_text())
    names = {r["name"]: r for r in rep["rows"]}
    mem = names["peak memory per rank (max over ranks)"]
    assert mem["predicted"] > 0 and mem["measured"] > 0
    assert names["step time (median, steady state)"]["measured"] > 0
    assert rep["steps"] == 6 and rep["restarts"] == 0 and len(rep["per_rank"]) == 2
    assert "predicted" in p.stdout and "measured" in p.stdout
    # the same output dir again without --resume: refused, nothing touched
    before = sorted(str(x) for x in out.rglob("*"))
    p2 = zk(*BASE, "--plan", "--output-dir", out)
    assert_one_line_error(p2, 2, "--resume")
    assert sorted(str(x) for x in out.rglob("*")) == before
    # --resume with other data (here: another sequence length): refused, nothing touched
    p3 = zk(*BASE[:4], "--seq-len", "16", "--steps", "8", "--gpu", "cpu", "--plan", "--resume", "--output-dir", out)
    assert_one_line_error(p3, 2, "--resume: the data or --seq-len differ")
    assert sorted(str(x) for x in out.rglob("*")) == before


# ----------------------------------------------------------------------------------------------
# data and step arithmetic (in-process, fast)


def test_bundled_tokenizer_and_corpus():
    from zerokit.core import resources
    from zerokit.launching import data as zdata

    tok = zdata.load_tokenizer(str(resources.bundled_tokenizer()))
    assert len(tok) == 2048 and tok.eos_token_id == 2 and tok.pad_token_id == 0 and tok.bos_token_id == 1
    size = resources.bundled_corpus().stat().st_size
    assert 50_000 < size < 400_000
    arr, total = zdata.tokenize_files([resources.bundled_corpus()], str(resources.bundled_tokenizer()), 64)
    assert arr.shape == (total // 64, 64) and int(arr.max()) < 2048


def _pack_both_ways(files, tok_dir, seq_len=16):
    """(plain tokenizers result or None, transformers result) of tokenize_and_pack."""
    from zerokit.launching import data as zdata

    plain = zdata.PlainFastTokenizer.from_tokenizer_dir(tok_dir)
    full = zdata.tokenize_and_pack(files, zdata.load_tokenizer(str(tok_dir)), seq_len)
    return (zdata.tokenize_and_pack(files, plain, seq_len) if plain is not None else None), full


def test_plain_tokenizer_gives_transformers_ids(tmp_path):
    """Oracle: AutoTokenizer's ids. The bundled tokenizer (tokenizer_class PreTrainedTokenizerFast) is read by the
    tokenizers library alone, and packs the bundled corpus, special-token strings and odd unicode to the same ids."""
    import shutil

    from zerokit.core import resources

    odd = tmp_path / "odd.txt"
    odd.write_text("Ada <|endoftext|> met <|pad|>Bram.\n\n  tabs\tand ünïcödé, 数字 123 emoji 🦉\n" * 30)
    files = [resources.bundled_corpus(), odd]
    (plain_arr, plain_total), (arr, total) = _pack_both_ways(files, resources.bundled_tokenizer())
    assert plain_total == total and plain_arr.shape == arr.shape and (plain_arr == arr).all()

    # where transformers would change the tokenizer, the plain path steps aside: each case is a copy with one change
    def variant(name, edit_config=None, edit_json=None):
        d = tmp_path / name
        shutil.copytree(resources.bundled_tokenizer(), d)
        for fname, edit in (("tokenizer_config.json", edit_config), ("tokenizer.json", edit_json)):
            if edit:
                data = json.loads((d / fname).read_text())
                edit(data)
                (d / fname).write_text(json.dumps(data))
        return d

    # a vocabulary past 100k (Llama 3, Qwen, Gemma sizes: where TokenizersBackend looks at _patch_mistral_regex)
    big = variant("big-vocab", edit_json=lambda j: j["model"]["vocab"].update(
        {f"<unused{i}>": 2048 + i for i in range(120_000)}))
    (plain_arr, plain_total), (arr, total) = _pack_both_ways([odd], big)
    assert plain_total == total and (plain_arr == arr).all()

    # a special token the file lacks: transformers adds it (one id for "<|mask|>"), the plain file would split it
    masked = variant("mask", edit_config=lambda c: c.update(mask_token="<|mask|>"))
    (tmp_path / "m.txt").write_text("a <|mask|> b " * 50)
    plain, (arr, _) = _pack_both_ways([tmp_path / "m.txt"], masked)
    assert plain is None
    from zerokit.launching import data as zdata

    assert (zdata.tokenize_files([tmp_path / "m.txt"], str(masked), 16)[0] == arr).all()
    from tokenizers import Tokenizer

    assert len(Tokenizer.from_file(str(masked / "tokenizer.json")).encode("<|mask|>", add_special_tokens=False).ids) > 1
    for d in (variant("class", edit_config=lambda c: c.update(tokenizer_class="LlamaTokenizer")),
              variant("split", edit_config=lambda c: c.update(split_special_tokens=True)),
              variant("mistral-regex", edit_config=lambda c: c.update(fix_mistral_regex=True)),
              variant("rstrip-differs", edit_config=lambda c: c.update(added_tokens_decoder={"2": {
                  "content": "<|endoftext|>", "lstrip": False, "rstrip": True, "normalized": False,
                  "single_word": False, "special": True}})),
              variant("trunc", edit_json=lambda j: j.update(truncation={"max_length": 8, "strategy": "LongestFirst",
                                                                        "direction": "Right", "stride": 0}))):
        assert zdata.PlainFastTokenizer.from_tokenizer_dir(d) is None, d.name


def test_tokenizing_the_bundled_data_imports_no_transformers(tmp_path):
    code = ("import json, sys\n"
            "from zerokit.core import resources\n"
            "from zerokit.launching.data import tokenize_files\n"
            "arr, total = tokenize_files([resources.bundled_corpus()], str(resources.bundled_tokenizer()), 64)\n"
            "print(json.dumps({'n': int(arr.shape[0]), 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))\n")
    env = dict(os.environ, ZEROKIT_CACHE_DIR=str(tmp_path / "empty-cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] > 0 and out["heavy"] == [], out


def test_data_directory_txt_and_jsonl(tmp_path):
    from zerokit.core.errors import ZerokitError
    from zerokit.core import resources
    from zerokit.launching import data as zdata

    (tmp_path / "a.txt").write_text("The river flows north.\nIt is cold.\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text('{"text": "Ada found a lantern."}\n\n{"text": "Bram counted owls."}\n')
    (tmp_path / "ignored.xml").write_text("x")  # not a data file (.csv is one: tests/test_data_formats.py)
    files = zdata.resolve_data_files(str(tmp_path))
    assert [f.name for f in files] == ["a.txt", "b.jsonl"]
    docs = list(zdata.read_documents(files))
    assert docs == ["The river flows north.\nIt is cold.\n", "Ada found a lantern.", "Bram counted owls."]
    tok = zdata.load_tokenizer(str(resources.bundled_tokenizer()))
    arr, total = zdata.tokenize_and_pack(files, tok, 4)
    # documents are joined with EOS, the tail shorter than one block is dropped
    assert arr.shape[1] == 4 and arr.shape[0] == total // 4
    assert (arr == tok.eos_token_id).sum() >= 2
    (tmp_path / "c.jsonl").write_text('{"txt": "wrong field"}\n')
    with pytest.raises(ZerokitError, match='c.jsonl:1: expected an object with a "text"'):
        list(zdata.read_documents([tmp_path / "c.jsonl"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ZerokitError, match=r"holds no \.txt/\.jsonl"):
        zdata.resolve_data_files(str(tmp_path / "empty"))


def test_tokens_cache_round_trip(tmp_path):
    from zerokit.core import resources
    from zerokit.launching import data as zdata

    f = tmp_path / "d.txt"
    f.write_text("Ada found a lantern near Amberly. " * 40)
    tok = str(resources.bundled_tokenizer())
    arr, total = zdata.tokenize_files([f], tok, 16)
    prep = zdata.write_tokens(arr, total, [f], tok, 16, tmp_path / "data")
    assert zdata.cached_tokens([f], tok, 16, tmp_path / "data") == prep
    assert zdata.cached_tokens([f], tok, 32, tmp_path / "data") is None  # other seq_len: not this cache
    back = zdata.load_tokens(prep.tokens_path)
    assert back.shape == arr.shape and (back == arr).all()


def test_steps_for_counts_like_the_trainer():
    from zerokit.spec.setup import optimizer_steps as steps_for

    assert steps_for(100, 2, 4, 2, 7, None) == 7  # --steps wins
    # 100 sequences / 2 ranks = 50 per rank; micro 4 -> 13 micro batches per epoch; accumulation 2 -> 6 steps
    assert steps_for(100, 2, 4, 2, None, None) == 6
    assert steps_for(100, 2, 4, 2, None, 2.0) == 13
    assert steps_for(3, 2, 4, 8, None, 0.1) == 1  # at least one step


def test_sbatch_writes_a_slurm_script_and_prepares_the_run(tmp_path):
    out = tmp_path / "run"
    script = tmp_path / "job.sbatch"
    p = zk("--model", "tiny-llama", "--gpus-per-node", "2", "--nodes", "2", "--seq-len", "32", "--steps", "2",
           "--gpu", "cpu", "--plan", "--output-dir", out, "--sbatch", script, "--time-limit", "01:00:00", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / ".deepspeed_env").exists()  # the script exports the environment itself
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "#SBATCH --nodes=2" in text and "#SBATCH --time=01:00:00" in text
    assert "--launcher slurm" in text.replace("\\\n", " ") or "slurm" in text
    assert (out / "ds_config.json").is_file() and (out / "data" / "tokens.npy").is_file()


def test_openmpi_launcher_command_parses_with_deepspeed(tmp_path):
    p = zk(*BASE, "--plan", "--hostfile", REPO / "hostfiles" / "localhost-2", "--launcher", "openmpi",
           "--master-addr", "127.0.0.1", "--output-dir", tmp_path / "run", "--dry-run")
    assert p.returncode == 0, p.stderr
    cmd = [line for line in p.stdout.splitlines() if line and not line.startswith(("#", "export", " ", "{", "}"))][0]
    import shlex

    from deepspeed.launcher.runner import parse_args

    argv = shlex.split(cmd)
    parsed = parse_args(argv[1:])
    assert parsed.launcher == "openmpi" and parsed.master_addr == "127.0.0.1"
    assert not (tmp_path / "run").exists()


def test_slurm_launcher_without_allocation_is_a_clear_error(tmp_path):
    assert_one_line_error(zk(*BASE, "--plan", "--launcher", "slurm", "--output-dir", tmp_path / "run"), 2, "--sbatch")
    assert not (tmp_path / "run").exists()


def test_sbatch_under_a_file_writes_nothing(tmp_path):
    """A missing folder is created (mkdir -p, tests/test_bad_input.py); one under a file cannot be."""
    out = tmp_path / "run"
    (tmp_path / "f").write_text("x")
    assert_one_line_error(zk(*BASE, "--plan", "--output-dir", out, "--sbatch", tmp_path / "f" / "job.sh"), 2, "--sbatch")
    assert not out.exists()
