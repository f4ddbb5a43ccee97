"""Run the router under uvicorn, with text or JSON (one object per line) logs."""

from __future__ import annotations

import json
import logging
import sys

import uvicorn

from disagg_router.app import create_app
from disagg_router.config import RouterConfig
from disagg_router.header_deadline import header_deadline

KEEP_ALIVE_S = 75


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and exception text)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(log_format: str) -> None:
    """Send INFO and above to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def run(config: RouterConfig) -> int:
    """Serve until interrupted; return the exit status."""
    configure_logging(config.log_format)
    app = create_app(config)
    uvicorn.run(
        app,
        http=header_deadline(config.header_timeout_s, app.metrics.header_timeouts.inc),
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,
        # Longer than clients' and load balancers' idle timeouts (httpx 5 s, AWS ALB 60 s): a
        # client must never send on a connection the router is closing at that moment.
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=config.shutdown_timeout_s,
    )
    return 0
