"""Quiet by default: what the libraries zerokit imports say on their own (DeepSpeed's accelerator warning on
import, its INFO lines, Python warnings from torch, transformers and the hub client) stays out of zerokit's output
unless the user asked for it with `zerokit -v` or `--debug` (the CLI sets ZEROKIT_VERBOSE=1, which the ranks
inherit). Errors go to stderr and results to stdout either way."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings

VERBOSE_ENV = "ZEROKIT_VERBOSE"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


@contextlib.contextmanager
def library_output():
    """Around an import or call of a chatty library: its prints and warnings go to a discarded buffer (verbose:
    to stderr, so stdout stays clean for --json). A logging handler the library creates inside the block keeps
    that stream: DeepSpeed's logger then stays quiet in this process for good, as intended."""
    sink = sys.stderr if verbose() else io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        if verbose():
            yield
            return
        warnings.simplefilter("ignore")
        # a logger configured before the block (the hub client's, imported by transformers) still holds the real
        # stderr: logging's own switch silences WARNING and below whatever stream a handler holds
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)
