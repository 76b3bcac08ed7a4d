"""Start a throwaway standalone ZooKeeper server on a loopback port.

For tests, and for users who want a local coordinator without running ZooKeeper
themselves. Everything the server writes (config, data, logs) lives in one temporary
directory, the server listens on one address (127.0.0.1 unless told otherwise), and it is stopped by the PID this
module started::

    with ZooKeeperServer() as server:
        coord = ZooKeeperCoordinator(server.hosts)

From a shell: ``python -m trainthrough.coord`` (see ``coord/__main__.py``).
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from trainthrough.errors import UserError

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In the server's process, before Java starts: the kernel ends it when the process
    that started it dies, however it dies (SIGKILL included), so a launcher killed from
    outside never leaves a server holding its port for the next run."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

_DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
# Debian's zookeeper.jar names its dependencies in its manifest, except a logging
# backend; without one slf4j discards every log line, so add the log4j 1.2 binding
# (both jars are dependencies of the Debian package).
_DEBIAN_LOGGING = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")
_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
_INSTALL_HINT = (
    "install it with `apt-get install -y --no-install-recommends zookeeper` (Debian/Ubuntu) "
    "or set ZOOKEEPER_HOME to an Apache ZooKeeper release; Java must be on PATH or in JAVA_HOME"
)
_LOG4J = """log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n
"""
# Apache release tarballs log through logback instead of log4j.
_LOGBACK = """<configuration><appender name="FILE" class="ch.qos.logback.core.FileAppender">
<file>{log}</file><encoder><pattern>%d %-5p [%t:%C{{1}}@%L] - %m%n</pattern></encoder>
</appender><root level="INFO"><appender-ref ref="FILE"/></root></configuration>
"""


def _find_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def find_zookeeper() -> str | None:
    """Locate a ZooKeeper server installation and Java.

    Looks at ``$ZOOKEEPER_HOME`` (an Apache release: ``lib/*.jar``) first, then the
    Debian package (``/usr/share/java/zookeeper.jar``).

    Returns:
        The Java classpath that runs the server, or ``None`` if ZooKeeper or Java is
        missing.
    """
    if _find_java() is None:
        return None
    home = os.environ.get("ZOOKEEPER_HOME")
    jars = sorted(glob.glob(os.path.join(home, "lib", "*.jar"))) if home else []
    if not jars and os.path.exists(_DEBIAN_JAR):
        jars = [_DEBIAN_JAR, *(j for j in _DEBIAN_LOGGING if os.path.exists(j))]
    return os.pathsep.join(jars) if jars else None


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _serving(address: str, port: int) -> bool:
    """True once the server answers the ``srvr`` four-letter word as a running server.

    (``ruok`` answers ``imok`` even before the server accepts sessions; ``srvr`` does not.)
    """
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            s.sendall(b"srvr")
            reply = b"".join(iter(lambda: s.recv(4096), b""))
    except OSError:
        return False
    return b"Zookeeper version" in reply


class ZooKeeperServer:
    """A standalone ZooKeeper server in a temporary directory; a context manager.

    Args:
        port: client port; a free one is chosen when ``None``.
        tick_time_ms: ZooKeeper's time unit; sessions may last 2 to 20 ticks, so the
            default 500 ms allows session timeouts of 1 to 10 s.
        startup_timeout: seconds to wait for the server to serve.
        address: the one address it listens on: loopback, unless a test spans hosts
            (network namespaces, tests/netns.py) and their replicas must reach it.

    Raises:
        UserError: ZooKeeper or Java is not installed, or the server did not start (the
            message quotes the end of its log).
    """

    def __init__(
        self, port: int | None = None, tick_time_ms: int = 500, startup_timeout: float = 30.0,
        address: str = "127.0.0.1",
    ) -> None:
        self._want_port, self._tick, self._startup_timeout = port, tick_time_ms, startup_timeout
        self.address = address
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self.port = 0

    @property
    def hosts(self) -> str:
        """Connection string for :class:`~trainthrough.coord.zookeeper.ZooKeeperCoordinator`."""
        return f"{self.address}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the server's Java process, while it runs."""
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        """The server's log file (inside the temporary directory, deleted on stop)."""
        assert self._dir is not None, "the server was not started"
        return self._dir / "zookeeper.log"

    def start(self) -> ZooKeeperServer:
        """Launch the server and wait until it serves; returns ``self``."""
        classpath, java = find_zookeeper(), _find_java()
        if classpath is None or java is None:
            raise UserError(f"no ZooKeeper server found: {_INSTALL_HINT}")
        self._dir = Path(tempfile.mkdtemp(prefix="trainthrough-zk-"))
        (self._dir / "log4j.properties").write_text(_LOG4J.format(log=self.log_path))
        (self._dir / "logback.xml").write_text(_LOGBACK.format(log=self.log_path))
        atexit.register(self.stop)  # never leave a server behind if the caller forgets
        # A port picked free can be taken before the JVM binds it: try a few.
        for _ in range(1 if self._want_port else 3):
            self.port = self._want_port or _free_port(self.address)
            cfg = self._dir / "zoo.cfg"
            cfg.write_text(
                f"tickTime={self._tick}\ndataDir={self._dir / 'data'}\n"
                f"clientPort={self.port}\nclientPortAddress={self.address}\n"
                "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n"
            )
            cmd = [
                java, "-Xmx256m", "-XX:+UseSerialGC",
                f"-Dlog4j.configuration=file:{self._dir / 'log4j.properties'}",
                f"-Dlogback.configurationFile={self._dir / 'logback.xml'}",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp", classpath, _MAIN, str(cfg),
            ]  # fmt: skip
            with open(self._dir / "stdout.log", "ab") as out:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, cwd=self._dir,
                                              preexec_fn=_die_with_parent)
            deadline = time.monotonic() + self._startup_timeout
            while time.monotonic() < deadline and self._proc.poll() is None:
                if _serving(self.address, self.port):
                    return self
                time.sleep(0.05)
            if self._proc.poll() is None or "Address already in use" not in self._log_tail():
                break
        tail = self._log_tail()
        self.stop()
        raise UserError(
            f"the ZooKeeper server did not start within {self._startup_timeout:g} s; "
            f"end of its log:\n{tail}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        text = ""
        for name in ("zookeeper.log", "stdout.log"):
            path = self._dir / name if self._dir else None
            if path and path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server started here (by its PID) and delete its directory. Idempotent."""
        atexit.unregister(self.stop)
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
