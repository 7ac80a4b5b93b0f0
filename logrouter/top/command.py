"""The ``logrouter top`` command: fetch the router's ``/metrics`` every second and draw it.

Where the page is: ``--url`` (``http://127.0.0.1:PORT``), else the ``[router]
metrics_listen`` of ``--config`` (default ``etc/logrouter.toml``), as ``logrouter reload``
finds it. On a terminal the view is redrawn in place (``rich``'s live display on the
alternate screen, like ``top``) until Ctrl-C; ``--once`` prints one view (two fetches
``--interval`` apart, so it has rates) and exits, for pipes and scripts. A fetch that
fails is shown over the last numbers and tried again at the next tick; ``--once`` exits
1 when the router cannot be reached.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from logrouter.top.snapshot import Snapshot, read_page
from logrouter.top.view import render


def add_arguments(parser: Any) -> None:
    parser.add_argument("--config", "-c", default=None, help="config file whose [router] metrics_listen to read (default: etc/logrouter.toml)")
    parser.add_argument("--url", help="the router's metrics endpoint, e.g. http://127.0.0.1:9880 (default: from the config)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between fetches (default 1)")
    parser.add_argument("--once", action="store_true", help="print one view (two fetches --interval apart) and exit")


def base_url(config_path: str) -> tuple[str | None, str]:
    """``(url, "")`` of the config's metrics endpoint, or ``(None, why not)``."""
    from logrouter.config.endpoints import accept_any_systemd_sockets
    from logrouter.config.http_options import endpoint_url
    from logrouter.config.load import ConfigError, load_file

    accept_any_systemd_sockets()  # the router holds the passed sockets, not this command
    try:
        config = load_file(config_path)
    except ConfigError as e:
        return None, f"{config_path}: invalid config: {'; '.join(e.errors)}"
    url = endpoint_url(config.router["metrics_listen"])
    if url is None:
        return None, f"{config_path}: [router] metrics_listen is not a TCP endpoint with a fixed port; pass --url"
    return url, ""


def fetch(url: str, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic) -> Snapshot:
    """One snapshot of ``url``/metrics; ``OSError`` (``URLError`` is one) when it cannot be read."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as response:
        text = response.read().decode("utf-8", "replace")
    return read_page(text, clock(), time.time())


def run(args: Any, out: Any = None) -> int:
    from rich.console import Console

    from logrouter.config.load import DEFAULT_CONFIG

    console = Console(file=out) if out is not None else Console()
    if not console.is_terminal:
        console = Console(file=out, width=200)  # a pipe or a file: no terminal's width to fit
    url = args.url
    if url is None:
        url, why_not = base_url(args.config or DEFAULT_CONFIG)
        if url is None:
            print(why_not, file=sys.stderr)
            return 1
    interval = max(float(args.interval), 0.1)
    if args.once:
        return _once(console, url, interval)
    return _live(console, url, interval)


def _once(console: Any, url: str, interval: float) -> int:
    try:
        first = fetch(url)
        time.sleep(interval)  # a rate needs two readings
        second = fetch(url)
    except OSError as e:
        print(f"cannot read {url}/metrics: {e}", file=sys.stderr)
        return 1
    console.print(render(first, second, url))
    return 0


def _live(console: Any, url: str, interval: float) -> int:
    from rich.live import Live

    previous: Snapshot | None = None
    current: Snapshot | None = None
    try:
        with Live(render(None, None, url, "connecting …"), console=console, screen=True, auto_refresh=False) as live:
            next_tick = time.monotonic()
            while True:
                error = None
                try:
                    snapshot = fetch(url, timeout=max(interval, 1.0))
                    previous, current = current, snapshot
                except OSError as e:
                    error = f"cannot read {url}/metrics: {getattr(e, 'reason', None) or e} (trying again)"
                live.update(render(previous, current, url, error), refresh=True)
                next_tick += interval
                time.sleep(max(next_tick - time.monotonic(), 0))
    except KeyboardInterrupt:
        return 0
