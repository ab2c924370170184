"""nanopy for Apache Spark (PySpark >= 4.0): a streaming source, a sink, a coordinator.

::

    import nanopy.spark
    nanopy.spark.register(spark)                      # once per SparkSession
    df = (spark.readStream.format("nanopy")
          .option("url", "tcp://127.0.0.1:5555").option("protocol", "pull").load())
    df.writeStream.format("nanopy").option("url", "tcp://127.0.0.1:5556").start()

    with nanopy.spark.Coordinator(items) as coord:    # hand work to Spark tasks
        results = coord.map(spark, work_fn)

Importing this module starts no thread, loop or socket, and does not import
pyspark; the data source classes load on first use. See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

from ._client import CoordinatorLost as CoordinatorLost
from ._client import CoordinatorRefused as CoordinatorRefused
from ._client import TaskClient as TaskClient
from ._coordinator import Coordinator as Coordinator
from ._tags import TAG_SIZE as TAG_SIZE
from ._tags import Deduplicator as Deduplicator
from ._tags import Tag as Tag
from ._tags import split_tag as split_tag

__all__ = [
    "TAG_SIZE",
    "Coordinator",
    "CoordinatorLost",
    "CoordinatorRefused",
    "Deduplicator",
    "NanopyDataSource",
    "Tag",
    "TaskClient",
    "local_session",
    "register",
    "split_tag",
]


def _need_pyspark() -> None:
    """Fail with the install command, not a bare ModuleNotFoundError, without PySpark."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "nanopy.spark needs PySpark 4 and pyarrow (and Java 17 to run Spark): "
            "pip install 'nanopy[spark]'"
        ) from exc


def register(spark: Any) -> None:
    """Register the ``"nanopy"`` data source (read, readStream, write, writeStream).

    Args:
        spark: a ``SparkSession``; register once per session.

    Raises:
        ImportError: PySpark is not installed (the ``spark`` extra).
    """
    _need_pyspark()
    from ._source import NanopyDataSource

    spark.dataSource.register(NanopyDataSource)


def local_session(master: str = "local[2]", app_name: str = "nanopy", **conf: str) -> Any:
    """A quiet local SparkSession with the settings nanopy needs (see docs/spark.md).

    Args:
        master: the Spark master URL.
        app_name: the application's name.
        **conf: more Spark settings (``spark.sql.shuffle.partitions="2"``, ...).

    Returns:
        A ``SparkSession`` with the nanopy data source registered.

    Raises:
        ImportError: PySpark is not installed (the ``spark`` extra).
    """
    _need_pyspark()
    from ._session import local_session as _local_session

    return _local_session(master, app_name, **conf)


def __getattr__(name: str) -> Any:
    if name == "NanopyDataSource":
        _need_pyspark()
        from ._source import NanopyDataSource

        return NanopyDataSource
    raise AttributeError(f"module 'nanopy.spark' has no attribute {name!r}")
