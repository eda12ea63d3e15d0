"""Log output of the gateway process (and its uvicorn workers): plain text or one JSON object a line.

`--log-format json` uses python-json-logger's formatter: every record becomes an
object with time, level, logger and message, plus the fields passed as `extra`
(the access line of gateway/request_context.py carries request id, tenant,
route, status, tokens, timings and outcome). uvicorn's own loggers propagate to
the same root handler (it is started with `log_config=None`), and its access log
is off: "pageserve.access" is the access log, one line per request, in the same
format. Nothing here ever receives a prompt or a key.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, fmt: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        uv = logging.getLogger(name)
        uv.handlers[:] = []
        uv.propagate = True
    access = logging.getLogger("uvicorn.access")  # replaced by "pageserve.access" (one richer line per request)
    access.handlers[:] = []
    access.propagate = False


def _formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger"})
