"""``twistd logrouter``: command-line options and the service they build."""

from __future__ import annotations

import os
import sys

from logrouter.arrow_memory import prepare_arrow
from logrouter.twisted_without_openssl import import_twisted

import_twisted()  # before anything imports the reactor or endpoints: no pyOpenSSL without TLS
prepare_arrow()  # before anything imports pyarrow: Arrow reads its pool's name on its first allocation

from twisted.python import usage  # noqa: E402

from logrouter.config.load import DEFAULT_CONFIG, ConfigError, invalid_config_header, load_string, read_text  # noqa: E402
from logrouter.failures import EXIT_FAILURE  # noqa: E402


class Options(usage.Options):
    optParameters = [
        ["config", "c", DEFAULT_CONFIG, "path of the TOML config file"],
    ]


def makeService(options: Options):
    from logrouter.service import RouterService

    try:
        text = read_text(options["config"])  # with workers, the text they all start from
        config = load_string(text, options["config"])
    except ConfigError as e:
        print(invalid_config_header(options["config"], e.errors), file=sys.stderr)
        for error in e.errors:
            print(f"  {error}", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE)
    raise_open_files_limit()
    from logrouter.workers.plan import processes, workers

    if processes(config) > 1:
        from logrouter.workers.supervisor import SupervisorService

        return SupervisorService(config, config_path=os.path.abspath(options["config"]), config_text=text)
    if config.router.get("workers") == "auto":
        from twisted.logger import Logger

        why = workers(config)[1] or "one core"
        Logger(namespace="logrouter").info("workers = auto: one process ({why})", why=why)
    return RouterService(config, config_path=os.path.abspath(options["config"]))


def raise_open_files_limit() -> None:
    """The soft ``RLIMIT_NOFILE`` up to the hard one, for this process and the workers it
    starts (``logrouter.open_files``), logged."""
    from twisted.logger import Logger

    from logrouter.open_files import raise_to_hard

    limits = raise_to_hard()
    if limits is None:
        return
    log = Logger(namespace="logrouter")
    before, now = limits
    if now != before:
        log.info("open files limit raised from {before} to {now} (the hard limit)", before=before, now=now)
    else:
        log.debug("open files limit: {now}", now=now)
