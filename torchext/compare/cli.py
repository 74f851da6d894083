"""``torchext-compare`` / ``python -m torchext.compare``: parse the arguments, run, map errors to exit codes."""

from __future__ import annotations

from .config import CompareError, build_parser, config_from_args
from .train import run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args)
    try:
        run(config)
    except CompareError as e:
        parser.error(str(e))
    except KeyboardInterrupt:
        return 130  # run() has said what it wrote; 128 + SIGINT, as a shell reports Ctrl-C
    return 0
