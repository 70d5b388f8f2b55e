"""Helpers the tests share."""


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of zerokit's CLI run in-process; a SystemExit (argparse's usage errors) is its code."""
    from zerokit.cli import main

    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err
