"""The ``logrouter`` command: ``check-config FILE``, ``run`` (twistd in the foreground),
``reload``, ``top`` (a live view of a running router), ``compact`` (see or run lake
compaction by hand), ``lake`` (``ddl`` of a parquet lake; ``show``, ``engines`` and
``import`` of an Iceberg table) and ``plugin-cache`` (refresh Twisted's plugin cache as
the owner of an install)."""

from __future__ import annotations

import argparse
import os
import sys

from logrouter.config.endpoints import accept_any_systemd_sockets
from logrouter.config.load import DEFAULT_CONFIG, ConfigError, invalid_config_header, load_file


def check_config(path: str) -> int:
    accept_any_systemd_sockets()
    try:
        config = load_file(path)
    except ConfigError as e:
        print(invalid_config_header(path, e.errors), file=sys.stderr)
        for error in e.errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    from logrouter.config.load import warnings

    for warning in warnings(config):
        print(f"logrouter: {path}: warning: {warning}", file=sys.stderr)
    counts = ", ".join(f"{len(getattr(config, k))} {k}" for k in ("sources", "filters", "sinks"))
    print(f"{path}: ok ({counts})")
    return 0


def plugin_cache() -> int:
    """Bring every ``twisted/plugins/dropin.cache`` up to date; 1 if one cannot be written.

    twistd (and Twisted's endpoint parser for ``systemd:``/``tcp6:``) rewrites a stale
    cache next to the plugin files on every start. In a system install that directory
    belongs to root and the service user cannot write it, so each start would log
    "Unable to write to plugin cache". Run this as the owner of the install after
    installing or upgrading (the systemd unit runs it as root before each start).
    """
    from twisted.logger import formatEvent, globalLogPublisher
    from twisted.plugin import IPlugin, getPlugins
    from twisted.python.modules import getModule

    problems: list[str] = []

    def observe(event: dict) -> None:
        text = formatEvent(event)
        if "log_failure" in event:
            text += "\n" + event["log_failure"].getTraceback()
        if "plugin cache" in text or "log_failure" in event:
            problems.append(text)

    globalLogPublisher.addObserver(observe)
    try:
        list(getPlugins(IPlugin))  # rewrites each stale cache, loading its plugins
    finally:
        globalLogPublisher.removeObserver(observe)
    directories = sorted({m.filePath.parent().path for m in getModule("twisted.plugins").iterModules()})
    for problem in problems:
        print(f"logrouter plugin-cache: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"plugin caches up to date: {', '.join(directories)}")
    return 0


def run(path: str) -> int:
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    args = [twistd, "--nodaemon", "--pidfile=", "logrouter", "--config", path]
    os.execv(twistd, args)
    return 1  # not reached


def reload(path: str, url: str | None = None) -> int:
    """Ask the running router to reload ``path`` (``POST /reload`` on its ``metrics_listen``,
    or at ``url``, e.g. ``http://127.0.0.1:9880`` when the config listens on port 0), with
    the reload token the config names (``reload_token`` or ``reload_token_file``)."""
    import urllib.error
    import urllib.request

    from logrouter.config.http_options import endpoint_url, reload_token

    accept_any_systemd_sockets()  # the router holds the passed sockets, not this command
    try:
        config = load_file(path)
    except ConfigError as e:
        print(f"{path}: invalid config, not sent (the running router keeps its config):", file=sys.stderr)
        for error in e.errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    token, why_not = reload_token(config.router)
    if token is None:
        print(f"{path}: {why_not}", file=sys.stderr)
        return 1
    if url is None:
        url = endpoint_url(config.router["metrics_listen"])
        if url is None:
            print(
                f"{path}: [router] metrics_listen is not a TCP endpoint with a fixed port; pass --url or send SIGHUP "
                "to the router instead",
                file=sys.stderr,
            )
            return 1
    request = urllib.request.Request(url.rstrip("/") + "/reload", method="POST", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            print(response.read().decode("utf-8", "replace").rstrip())
            return 0
    except urllib.error.HTTPError as e:
        print(e.read().decode("utf-8", "replace").rstrip(), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"cannot reach the router at {url}: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logrouter", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate a config file and exit 0 (ok) or 1 (errors)")
    check.add_argument("file")
    runner = commands.add_parser("run", help="run the router in the foreground (twistd -n logrouter)")
    runner.add_argument("--config", "-c", default=DEFAULT_CONFIG)
    commands.add_parser("plugin-cache", help="refresh Twisted's plugin cache (run as the owner of the install)")
    reloader = commands.add_parser("reload", help="make the running router re-read its config (POST /reload; or send SIGHUP)")
    reloader.add_argument("--config", "-c", default=DEFAULT_CONFIG)
    reloader.add_argument("--url", help="the router's metrics endpoint, e.g. http://127.0.0.1:9880 (default: from the config)")
    compactor = commands.add_parser("compact", help="show (--dry-run) or run compaction of sealed lake partitions")
    from logrouter.compaction import tool

    tool.add_arguments(compactor)
    from logrouter.top import command as top

    top.add_arguments(commands.add_parser("top", help="a live view of a running router (its /metrics), refreshed every second"))
    from logrouter import iceberg_cli
    from logrouter.lake import ddl

    iceberg_cli.add_parsers(ddl.add_parser(commands))
    args = parser.parse_args(argv)
    if args.command == "lake":
        return iceberg_cli.run(args) if args.lake_command in iceberg_cli.COMMANDS else ddl.run(args)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "plugin-cache":
        return plugin_cache()
    if args.command == "reload":
        return reload(args.config, args.url)
    if args.command == "compact":
        return tool.compact(args)
    if args.command == "top":
        return top.run(args)
    return run(args.config)


if __name__ == "__main__":
    sys.exit(main())
