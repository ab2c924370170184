"""A quiet, loopback-only local SparkSession for tests, examples and benchmarks."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from .. import platform

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.nativeloader.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeloader.level = error
logger.sparkenv.name = org.apache.spark.SparkEnv
logger.sparkenv.level = error
logger.resolvewrite.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream
logger.resolvewrite.level = error
logger.dagcancel.name = org.apache.spark.scheduler.DAGScheduler
logger.dagcancel.level = error
logger.microbatch.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution
logger.microbatch.level = error
"""


def quiet_conf_dir() -> str:
    """A SPARK_CONF_DIR holding a log4j2.properties that logs warnings and up only."""
    path = os.path.join(tempfile.gettempdir(), f"nanopy-spark-conf-{platform.user_tag()}-v6")
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "log4j2.properties")
    if not os.path.exists(target):
        tmp = f"{target}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(_LOG4J2)
        os.replace(tmp, target)
    return path


def is_loopback_master(master: str) -> bool:
    """``local[...]``, or a ``spark://`` master on this host's loopback address."""
    if master.startswith("local"):
        return True
    host = master.partition("://")[2].split(",")[0].rpartition(":")[0]
    return host in ("127.0.0.1", "localhost", "[::1]", "::1")


def local_session(master: str = "local[2]", app_name: str = "nanopy", **conf: str) -> Any:
    """Build (or get) a SparkSession configured as docs/spark.md recommends.

    Sets ``PYSPARK_PYTHON`` to this interpreter (so workers can import nanopy and
    pyarrow), a quiet log4j2 configuration unless ``SPARK_CONF_DIR`` is set, no UI
    and no console progress bars. For ``local[...]`` or a master on loopback
    (``spark://127.0.0.1:7077``) the driver also stays on 127.0.0.1
    (``SPARK_LOCAL_IP``, ``spark.driver.host``); for any other master the driver
    address is left to Spark (set ``spark.driver.host`` to a name the executors
    can reach). Keyword arguments are extra Spark settings (pass
    ``**{"spark.sql.shuffle.partitions": "4"}``).
    """
    loopback = is_loopback_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_CONF_DIR", quiet_conf_dir())
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData",
    }
    if loopback:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from . import register

    register(spark)
    return spark
