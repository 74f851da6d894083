"""``torchext-compare`` / ``python -m torchext.compare``: parse the arguments, run, map errors to exit codes."""

from __future__ import annotations

import faulthandler
import signal
import sys

from .config import CompareError, build_parser, config_from_args
from .train import run


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` (or `timeout --signal=USR1`) prints every thread's Python stack to stderr and the run goes
    on: where a run that seems stuck is (a kernel that does not return, a compile that does not end)."""
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        except (AttributeError, OSError, ValueError):  # a stderr with no file descriptor (captured by a test runner)
            pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _stacks_on_sigusr1()
    config = config_from_args(args)
    try:
        run(config)
    except CompareError as e:
        parser.error(str(e))
    except KeyboardInterrupt:
        return 130  # run() has said what it wrote; 128 + SIGINT, as a shell reports Ctrl-C
    return 0
