"""A Spark standalone cluster on loopback for the ``cluster`` test tier.

One master and two workers, started from the pyspark package itself
(``bin/spark-class``), bound to 127.0.0.1, with their own temporary work, log and
conf directories, and stopped by PID. Drivers run in subprocesses
(``spark_cluster_driver.py``) so a test can SIGKILL one mid-batch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "spark_cluster_driver.py")
JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout: float, what: str, interval: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # polling an external process (no event to wait on)


@dataclass
class Cluster:
    master_url: str
    ui_port: int
    workdir: str
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def state(self) -> dict:
        """The master's JSON status ({} while it is not up yet)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        try:
            with opener.open(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as r:
                return json.load(r)
        except (OSError, ValueError):
            return {}

    def up(self) -> bool:
        """True while every daemon runs; raises with its log when one has exited."""
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                name = "master.log" if i == 0 else f"worker{i - 1}.log"
                raise RuntimeError(f"the Spark {name[:-4]} exited ({proc.returncode}): {self.log(name)}")
        return True

    def alive_workers(self) -> int:
        return int(self.state().get("aliveworkers", 0))

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs[1:]]

    def executor_pids(self) -> list[int]:
        """JVMs the workers launched (CoarseGrainedExecutorBackend), children of our workers."""
        out = []
        for wpid in self.worker_pids():
            kids: list[str] = []
            try:  # children are listed per thread: the worker starts executors from its own threads
                for task in os.listdir(f"/proc/{wpid}/task"):
                    with open(f"/proc/{wpid}/task/{task}/children") as f:
                        kids += f.read().split()
            except OSError:
                continue
            for kid in kids:
                try:
                    with open(f"/proc/{kid}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if b"CoarseGrainedExecutorBackend" in cmd:
                    out.append(int(kid))
        return out

    def driver(self, *args: str, log_name: str) -> subprocess.Popen:
        """Start a driver subprocess (own process group, so its JVM dies with it)."""
        return _spawn([sys.executable, DRIVER, self.master_url, *args], self.env,
                      os.path.join(self.workdir, log_name), stdout=subprocess.PIPE, start_new_session=True)

    def log(self, name: str) -> str:
        try:
            with open(os.path.join(self.workdir, name), errors="replace") as f:
                return f.read()[-6000:]
        except OSError:
            return ""


def _spawn(cmd: list[str], env: dict[str, str], log_path: str, stdout: int = subprocess.DEVNULL,
           start_new_session: bool = False) -> subprocess.Popen:
    """Start ``cmd`` with stderr to ``log_path`` (the child keeps its own copy of the file)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=stdout, stderr=log, start_new_session=start_new_session)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a driver started by Cluster.driver: its python, JVM and helpers."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


@contextmanager
def standalone_cluster(workdir: str, workers: int = 2) -> Iterator[Cluster]:
    import pyspark

    from nanopy.spark._session import quiet_conf_dir

    home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(home, "bin", "spark-class")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise RuntimeError("Spark needs Java (17) on PATH or JAVA_HOME")
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": quiet_conf_dir(),
        "SPARK_LOG_DIR": os.path.join(workdir, "logs"),
        "SPARK_PID_DIR": workdir,
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_DAEMON_JAVA_OPTS": JVM_FLAGS,
        "SPARK_DAEMON_MEMORY": "256m",
        "PYTHONPATH": os.pathsep.join([HERE, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })
    port, ui = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", ui, workdir, env)
    try:
        cluster.procs.append(_spawn(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)], env, os.path.join(workdir, "master.log")))
        wait_for(lambda: cluster.up() and cluster.state(), 90, "the Spark master")
        for i in range(workers):
            wdir = os.path.join(workdir, f"worker{i}")
            os.makedirs(wdir, exist_ok=True)
            cluster.procs.append(_spawn(
                [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                 "--webui-port", str(free_port()), "--work-dir", wdir],
                env, os.path.join(workdir, f"worker{i}.log")))
        wait_for(lambda: cluster.up() and cluster.alive_workers() >= workers, 90, f"{workers} Spark workers")
        yield cluster
    finally:
        for proc in reversed(cluster.procs):
            _stop(proc)
