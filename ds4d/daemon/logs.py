"""Logging: stderr by default (journald adds timestamps and levels of its own there),
`--log-file` to append to a file instead; the level can change while running."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ds4d.daemon.config import Config

ROOT = "ds4d"
_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
_DATEFMT = "%m%d %H:%M:%S"
_JOURNAL_FORMAT = "%(levelname).1s %(name)s: %(message)s"


def setup_logging(config: Config) -> logging.Logger:
    """Configure the `ds4d` logger tree from `config` (log_file, log_level); idempotent."""
    logger = logging.getLogger(ROOT)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    if config.log_file:
        path = Path(config.log_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Logs may quote prompts: create the file private.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        handler: logging.Handler = logging.StreamHandler(os.fdopen(fd, "a", buffering=1))
        handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
    else:
        handler = logging.StreamHandler(sys.stderr)
        # Under systemd stderr goes to the journal, which stamps the time itself.
        handler.setFormatter(
            logging.Formatter(_JOURNAL_FORMAT if stderr_is_journal() else _FORMAT, _DATEFMT)
        )
    logger.addHandler(handler)
    logger.propagate = False
    set_level(config.log_level)
    return logger


def stderr_is_journal() -> bool:
    """systemd's documented check: JOURNAL_STREAM names stderr's device and inode."""
    try:
        dev, ino = (int(x) for x in os.environ.get("JOURNAL_STREAM", "").split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def set_level(level: str) -> None:
    logging.getLogger(ROOT).setLevel(level.upper())


def apply_config_change(config: Config, changed: list[str]) -> None:
    """LiveConfig subscriber: follow `log_level` edits."""
    if "log_level" in changed:
        set_level(config.log_level)
        logging.getLogger(ROOT).info("log level is now %s", config.log_level)
