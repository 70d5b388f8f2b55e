"""Options declared once (zerokit.core.options): the parsers, the -c run file and the ranks' options all come from
the declarations; a second declaration of a flag, an option the CLI adds by hand, or a run-file key that is no option
fails here."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from zerokit.cli import main, parse
from zerokit.core.errors import ZerokitError
from zerokit.core.options import COMMANDS, OPTIONS, Option, flag, for_command, option

REPO = Path(__file__).resolve().parent.parent
RUN_COMMANDS = [c for c in COMMANDS if c not in ("zerokit", "serve")]  # serve takes no run file


def declaration_problems(options) -> list[str]:
    """Names declared twice, and per command: a flag, short flag or attribute two options share."""
    bad, seen = [], set()
    for o in options:
        if o.name in seen:
            bad.append(f"{o.name} declared twice")
        seen.add(o.name)
        unknown = set(o.commands) - set(COMMANDS)
        if unknown:
            bad.append(f"{o.name}: unknown commands {sorted(unknown)}")
    for cmd in COMMANDS:
        mine = [o for o in options if cmd in o.commands]
        for what, get in (("flag", lambda o: [o.flag, *("--" + a for a in o.aliases)] + ([o.short] if o.short else [])),
                          ("attribute", lambda o: [o.key])):
            names = [n for o in mine for n in get(o)]
            bad += [f"{cmd}: {what} {n} declared twice" for n in sorted({n for n in names if names.count(n) > 1})]
    return bad


def test_no_option_is_declared_twice():
    assert declaration_problems(OPTIONS) == []


def test_the_check_catches_a_second_declaration():
    seed = option("seed")
    assert any("seed declared twice" in p for p in declaration_problems(OPTIONS + (seed,)))
    # the same flag under another name's attribute, or a short flag taken twice on one command
    assert any("attribute seed declared twice" in p
               for p in declaration_problems(OPTIONS + (replace(seed, name="seed2", dest="seed"),)))
    assert any("-o declared twice" in p
               for p in declaration_problems(OPTIONS + (Option("out2", ("render",), short="-o"),)))


def cli_hand_made_options(sources: dict[str, str]) -> list[str]:
    """add_argument calls in zerokit/cli/ that name a flag themselves instead of taking it from OPTIONS."""
    bad = []
    for path, src in sources.items():
        for node in ast.walk(ast.parse(src)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                    and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("-")
                    and node.args[0].value != "--version"):  # argparse's own action
                bad.append(f"{path}:{node.lineno} {node.args[0].value}")
    return bad


def test_the_cli_declares_no_option_of_its_own():
    sources = {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "zerokit" / "cli").glob("*.py")}
    assert cli_hand_made_options(sources) == []
    sources["zerokit/cli/plan.py"] += "\np.add_argument('--seed', type=int)\n"
    assert cli_hand_made_options(sources) == ["zerokit/cli/plan.py:" + str(sources["zerokit/cli/plan.py"].count("\n")) +
                                              " --seed"]


def test_every_option_reaching_the_ranks_is_a_field_they_read():
    """rank=True: the option's value is carried in RankOptions (or, for what trains, in its Finetune)."""
    from zerokit.launching.rank_options import RankOptions
    from zerokit.spec.finetune import Finetune

    carried = {f.name for f in fields(RankOptions)} | {f.name for f in fields(Finetune)} | {"finetune"}
    missing = [o.name for o in OPTIONS if o.rank and o.key not in carried]
    assert missing == []


def test_flag_names_a_declared_option_and_refuses_a_typo():
    assert flag("gpus-per-node") == "--gpus-per-node"
    with pytest.raises(KeyError):
        flag("gpus-per-nod")


# ---------------------------------------------------------------------------------------------
# -c run.yaml, on every command

# a value each command takes, the typed value it must arrive as, and a flag that overrides it
RUN_FILE_CASES = {
    "plan": ("gpus_per_node: 4\nseq-len: 1024\nactivation-checkpointing: on\nfreeze: [embed_tokens]\n",
             {"gpus_per_node": 4, "seq_len": 1024, "activation_checkpointing": "on", "freeze": ["embed_tokens"]},
             ["--seq-len", "512"], {"seq_len": 512}),
    "render": ("output: x.json\nprofile: hf\nstage: 3\n", {"output": "x.json", "profile": "hf", "zero_stage": 3},
               ["--stage", "2"], {"zero_stage": 2}),
    "check": ("config: ds.json\nmodel: tiny-llama\nmicro-batch: 2\n",
              {"config": "ds.json", "model": "tiny-llama", "micro_batch_size": 2},
              ["other.json"], {"config": "other.json"}),
    "launch": ("model: tiny-llama\nplan: true\nsteps: 20\nlr: 1e-4\nmax_restarts: 2\n",
               {"model": "tiny-llama", "plan": True, "steps": 20, "lr": 1e-4, "max_restarts": 2},
               ["--epochs", "2"], {"epochs": 2.0, "steps": None}),
    "calibrate": ("quick: true\noutput: p.json\n", {"quick": True, "output": "p.json"},
                  ["--output", "q.json"], {"output": "q.json"}),
}


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_every_command_takes_a_run_file_and_flags_override_it(command, tmp_path):
    text, expected, override, after = RUN_FILE_CASES[command]
    f = tmp_path / "run.yaml"
    f.write_text(text)
    args = parse([command, "-c", str(f)])
    assert {k: getattr(args, k) for k in expected} == expected
    for o in for_command(command):  # the rest: the declared defaults
        if o.key not in expected:
            assert getattr(args, o.key) == (False if o.is_switch else o.default) or o.key == "config_file", o.name
    args = parse([command, *override, "--config-file", str(f)])
    assert {k: getattr(args, k) for k in after} == after


@pytest.mark.parametrize("text, value", [("on", "on"), ("off", "off"), ("0.5.10", "0.5.10"), ("0.6", "0.6"),
                                         ("'0.6.1'", "0.6.1")])
def test_a_run_file_gives_liger_kernels_on_off_or_a_release(text, value, tmp_path):
    """YAML 1.1 reads on/off as booleans and 0.6 as a number: each arrives as --liger-kernels would."""
    f = tmp_path / "run.yaml"
    f.write_text(f"liger-kernels: {text}\n")
    assert parse(["plan", "-c", str(f)]).liger_kernels == value


def test_one_run_file_serves_every_command(tmp_path):
    """A launch-only key is skipped by plan; a key that is no option anywhere is refused, with the closest name."""
    f = tmp_path / "run.yaml"
    f.write_text("model: tiny-llama\nsteps: 20\ngpus-per-node: 2\n")
    assert parse(["plan", "-c", str(f)]).gpus_per_node == 2
    f.write_text("model: tiny-llama\nstepz: 20\n")
    with pytest.raises(ZerokitError, match="unknown key 'stepz': did you mean 'steps'"):
        parse(["plan", "-c", str(f)])


@pytest.mark.parametrize("text, needle", [
    ("gpus-per-node: 0\n", "gpus-per-node: expected a positive integer"),
    ("stage: 5\n", "stage: expected one of 0, 1, 2, 3"),
    ("seq-len: [1, 2]\n", "seq-len: expected one value"),
    ("json: maybe\n", "json: expected true or false"),
    ("precision: bf32\n", "precision: expected one of bf16, fp16, fp32"),
    ("- a\n- b\n", "not a mapping"),
    ("gpus-per-node: [\n", "not valid YAML at line"),
    ("config-file: other.yaml\n", "cannot name another"),
    ("grad_acum: 2\n", "did you mean 'grad-accum'"),
])
def test_a_bad_run_file_is_one_line_exit_2_and_nothing_written(text, needle, tmp_path, capsys):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    out = tmp_path / "ds.json"
    assert main(["render", "--params", "1e9", "-o", str(out), "-c", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not out.exists()


def test_a_missing_run_file_is_one_line(tmp_path, capsys):
    assert main(["plan", "--params", "1e9", "-c", str(tmp_path / "nope.yaml")]) == 2
    assert "not found: check the -c path" in capsys.readouterr().err


def test_exclusive_options_from_a_file_and_the_command_line(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("steps: 20\nepochs: 2\n")
    with pytest.raises(ZerokitError, match="epochs and steps exclude each other: keep one"):
        parse(["launch", "-c", str(f)])


def test_a_run_file_plans_what_the_same_flags_plan(tmp_path, capsys):
    """The JSON plan from a run file equals the one from the same values as flags (JSON file too)."""
    flags = ["--params", "7e9", "--gpus-per-node", "8", "--seq-len", "4096", "--activation-checkpointing", "on",
             "--stage", "3", "--json"]
    assert main(["plan", *flags]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"params": "7e9", "gpus-per-node": 8, "seq_len": 4096, "activation-checkpointing": "on",
                             "stage": 3, "json": True}))
    assert main(["plan", "-c", str(f)]) == 0
    assert json.loads(capsys.readouterr().out) == by_flags


def test_launch_dry_run_from_a_run_file(tmp_path, capsys):
    f = tmp_path / "run.yaml"
    out = tmp_path / "run"
    f.write_text(f"model: tiny-llama\nplan: true\ngpu: cpu\ngpus-per-node: 2\nseq-len: 32\nsteps: 3\n"
                 f"output-dir: {out}\nmaster-port: 29911\n")
    assert main(["launch", "-c", str(f), "--dry-run", "--save-every", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    opts = json.loads(lines[lines.index(next(x for x in lines if x.startswith("# rank options"))) + 1])
    assert opts["model"].endswith("tiny-llama") and (opts["steps"], opts["save_every"], opts["output_dir"]) == (3, 1, str(out))
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# the ranks' options: a typed file, not a second command line


def test_rank_options_round_trip_and_refuse_wrong_types(tmp_path):
    from zerokit.launching.rank_options import RankOptions, options_file_from_argv
    from zerokit.spec.finetune import Finetune

    opts = RankOptions(model="tiny-llama", ds_config="c.json", output_dir="out", steps=5, seq_len=64, lr=1e-4,
                       finetune=Finetune(mode="lora", lora_r=4), merge=True, dist_backend="gloo")
    path = tmp_path / "rank_options.json"
    opts.save(path)
    back = RankOptions.load(path)
    assert replace(back, memory_steps=None) == opts and back.memory_steps is not None  # from the environment
    assert RankOptions.load(path, attempt=1).resume is True  # a restart resumes
    bad = {**opts.to_dict(), "steps": "5"}
    with pytest.raises(ZerokitError, match="steps must be"):
        RankOptions.from_dict(bad)
    with pytest.raises(ZerokitError, match="unknown key 'stepz'"):
        RankOptions.from_dict({**opts.to_dict(), "stepz": 5})
    with pytest.raises(ZerokitError, match="merge needs a LoRA"):
        RankOptions(model="m", ds_config="c", output_dir="o", merge=True)
    assert options_file_from_argv(["--local_rank=1", str(path)]) == str(path)
    with pytest.raises(ZerokitError, match="usage"):
        options_file_from_argv(["--local_rank=1"])


# ---------------------------------------------------------------------------------------------
# lower layers name an option through its declaration (issue 26): flag("merge"), never "--merge"

# literals that spell a declared option's flag but mean another program's: (file, the whole literal) -> why
NOT_ZEROKITS = {
    ("zerokit/launching/command.py", "--hostfile"): "the deepspeed launcher's own flag, in its argv",
    ("zerokit/launching/command.py", "--launcher"): "the deepspeed launcher's own flag, in its argv",
}


def option_flag_literals(sources: dict[str, str]) -> list[str]:
    """String constants (the constant parts of f-strings included, docstrings not) that spell `--NAME` for a declared
    option, as "path:line --NAME"."""
    names = sorted((o.name for o in OPTIONS), key=len, reverse=True)
    spelled = re.compile(r"--(?:" + "|".join(map(re.escape, names)) + r")(?![\w-])")
    bad = []
    for path, src in sources.items():
        tree = ast.parse(src)
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and (path, node.value) not in NOT_ZEROKITS):
                bad += [f"{path}:{node.lineno} {m.group(0)}" for m in spelled.finditer(node.value)]
    return bad


def test_lower_layers_name_options_through_the_declarations():
    sources = {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "zerokit").rglob("*.py"))
               if p.relative_to(REPO).parts[1] != "cli" and p.relative_to(REPO) != Path("zerokit/core/options.py")}
    assert "zerokit/launching/prepare.py" in sources and "zerokit/cli/launch.py" not in sources
    assert option_flag_literals(sources) == []
    # the check can fail: a message, an f-string's constant part, a bare flag; not a docstring, a comment, a flag
    # that is no option (--num_gpus) or only begins like one (--seeds, --seed_x)
    src = ('"""Pass --seed."""\n'
           'def f(n):\n'
           '    """--merge, documented."""\n'
           '    a = "--merge needs --finetune lora"  # --lr\n'
           '    b = f"{n} with --gpus-per-node {n}"\n'
           '    return a, b, "--seed", "--num_gpus", "--seeds", "--seed_x"\n')
    assert option_flag_literals({"zerokit/x.py": src}) == [
        "zerokit/x.py:4 --merge", "zerokit/x.py:4 --finetune", "zerokit/x.py:5 --gpus-per-node", "zerokit/x.py:6 --seed"]


def test_the_example_run_file_serves_every_command(tmp_path, capsys):
    """examples/run.yaml, as the README shows it: plan from it alone, and a dry-run launch from it."""
    example = str(REPO / "examples" / "run.yaml")
    for command in ("plan", "render", "check", "launch"):
        assert parse([command, "-c", example]).model == "tiny-llama"
    assert main(["plan", "-c", example, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
    out = tmp_path / "run"
    assert main(["launch", "-c", example, "--dry-run", "--output-dir", str(out)]) == 0
    assert "rank options" in capsys.readouterr().out and not out.exists()
