"""nanopy's log lines in Spark's own format, in Spark's Python helper processes.

Spark's Python workers and the streaming source's runner write their stderr to
the driver's or executor's log. Python's fallback handler would print bare
messages there; this handler prints them as Spark's default log4j2 layout does
(``%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m``), with log4j's level names. It is added
only when the application configured no logging of its own.
"""

from __future__ import annotations

import logging
import sys

_LEVELS = {"WARNING": "WARN", "CRITICAL": "FATAL"}


class SparkFormatter(logging.Formatter):
    """``25/11/27 01:02:03 WARN nanopy.spark: message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(spark_level)s %(name)s: %(message)s", "%y/%m/%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.spark_level = _LEVELS.get(record.levelname, record.levelname)
        return super().format(record)


def use_spark_format() -> None:
    """Give the ``nanopy`` loggers a stderr handler in Spark's format, unless the
    process already has logging set up."""
    logger = logging.getLogger("nanopy")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SparkFormatter())
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
