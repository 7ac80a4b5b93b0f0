"""The ``logrouter`` command: ``check-config FILE``, ``run`` (twistd in the foreground) and
``compact`` (see or run lake compaction by hand)."""

from __future__ import annotations

import argparse
import os
import sys

from logrouter.config.load import ConfigError, load_file
from logrouter.tap import DEFAULT_CONFIG


def check_config(path: str) -> int:
    try:
        config = load_file(path)
    except ConfigError as e:
        print(f"{path}: invalid config ({len(e.errors)} error{'s' if len(e.errors) != 1 else ''}):", file=sys.stderr)
        for error in e.errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{len(getattr(config, k))} {k}" for k in ("sources", "filters", "sinks"))
    print(f"{path}: ok ({counts})")
    return 0


def run(path: str) -> int:
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    args = [twistd, "--nodaemon", "--pidfile=", "logrouter", "--config", path]
    os.execv(twistd, args)
    return 1  # not reached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logrouter", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate a config file and exit 0 (ok) or 1 (errors)")
    check.add_argument("file")
    runner = commands.add_parser("run", help="run the router in the foreground (twistd -n logrouter)")
    runner.add_argument("--config", "-c", default=DEFAULT_CONFIG)
    compactor = commands.add_parser("compact", help="show (--dry-run) or run compaction of sealed lake partitions")
    from logrouter.compaction import tool

    tool.add_arguments(compactor)
    args = parser.parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "compact":
        return tool.compact(args)
    return run(args.config)


if __name__ == "__main__":
    sys.exit(main())
