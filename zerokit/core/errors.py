"""User-facing errors: one line naming the problem and the fix, and an exit code."""

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1
EXIT_INVALID = 2


class ZerokitError(Exception):
    """Bad input or an impossible request. The CLI prints `error: <message>` and exits with `exit_code`.

    The message must be one line that says what is wrong and how to fix it.
    """

    exit_code = EXIT_INVALID

    def __init__(self, message: str, exit_code: int | None = None):
        # one line whatever the user typed: a path or filter echoed into the message keeps its line breaks visible
        # as \n, and other control characters as escapes, instead of breaking the line
        message = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(message))
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
