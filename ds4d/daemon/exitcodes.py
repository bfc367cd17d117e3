"""Exit statuses of `ds4d serve`, distinct so a service manager can tell them apart.

The values follow BSD sysexits(3). The units list the three "retrying cannot help" codes
in RestartPreventExitStatus=, so systemd does not restart-loop on a broken config, a
missing model or a port some other process holds.
"""

OK = 0
USAGE = 2  # bad command line (argparse)
MODEL_LOAD_FAILED = 66  # EX_NOINPUT: the GGUF is missing, unreadable or unsupported
ADDRESS_IN_USE = 69  # EX_UNAVAILABLE: HTTP port or admin socket already taken
SOFTWARE = 70  # EX_SOFTWARE: an unexpected internal error
CONFIG_ERROR = 78  # EX_CONFIG: invalid config file, environment or flag value
INTERRUPTED = 130  # a second SIGINT while draining: exit at once, no saves
# (a second SIGTERM takes the default action: killed)

# Space-separated, as RestartPreventExitStatus= wants it.
NO_RESTART = f"{CONFIG_ERROR} {MODEL_LOAD_FAILED} {ADDRESS_IN_USE}"


class CliError(Exception):
    """An expected failure of a `ds4d` command: printed as one line, exit status `code`.
    It lives here, beside the codes, so the daemon's modules raise it without importing
    the command-line front end above them."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
