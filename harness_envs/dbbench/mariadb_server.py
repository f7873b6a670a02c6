"""A local MariaDB server for the DBBench backend: a socket-only `mariadbd` on a temporary data
directory (RAM-backed when there is room), owned by this process, shared by its episodes
(`local_server()`) and shut down at exit. Servers left behind by processes that died without their
exit hook are stopped and their directories removed when the next one starts.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse

INSTALL_HINT = (
    "install the MariaDB server binaries (Debian/Ubuntu: `apt-get install -y mariadb-server-core "
    "mariadb-client-core`, or run .ci/install_mariadb.sh), or pass url= to use an existing server"
)


def _find_binary(*names: str) -> str | None:
    for name in names:
        for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
            if candidate and os.access(candidate, os.X_OK):
                return candidate
    return None


def _default_root_dir() -> str | None:
    """A RAM-backed directory when there is one: per-episode DDL is several times faster there."""
    shm = "/dev/shm"
    try:
        if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1 << 30:
            return shm
    except OSError:
        pass
    return None


_TMP_PREFIX = "hsjax-mariadb-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def remove_stale_servers(root_dir: str) -> None:
    """Clean up after processes that died without their atexit hook (SIGKILL, OOM): stop the
    servers whose owning process is gone and delete their data directories."""
    for entry in os.scandir(root_dir):
        if not entry.name.startswith(_TMP_PREFIX) or not entry.is_dir():
            continue
        owner = _read_pid(os.path.join(entry.path, "owner.pid"))
        if owner is None or _alive(owner):
            continue  # still starting, or still in use
        server = _read_pid(os.path.join(entry.path, "mariadbd.pid"))
        if server is not None and _alive(server):
            os.kill(server, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _alive(server) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(server):
                continue
        shutil.rmtree(entry.path, ignore_errors=True)


class LocalServer:
    """A socket-only mariadbd on a temporary data directory, owned by this process."""

    def __init__(self, startup_timeout_s: float = 60.0, root_dir: str | None = None):
        mariadbd = _find_binary("mariadbd", "mysqld")
        install_db = _find_binary("mariadb-install-db", "mysql_install_db")
        if mariadbd is None or install_db is None:
            raise RuntimeError(f"MariaDB backend: no mariadbd / mariadb-install-db binary found; {INSTALL_HINT}")
        root_dir = root_dir or _default_root_dir() or tempfile.gettempdir()
        remove_stale_servers(root_dir)
        self.tmpdir = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=root_dir)
        with open(os.path.join(self.tmpdir, "owner.pid"), "w") as f:
            f.write(str(os.getpid()))
        self.socket = os.path.join(self.tmpdir, "mysqld.sock")
        datadir = os.path.join(self.tmpdir, "data")
        self._log = os.path.join(self.tmpdir, "mariadbd.err")
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        no_files = os.path.join(self.tmpdir, "no-files")  # secure_file_priv: an empty dir nobody writes
        os.mkdir(no_files)
        try:
            subprocess.run(
                [install_db, "--no-defaults", f"--datadir={datadir}", "--auth-root-authentication-method=socket",
                 "--skip-test-db", *as_root],
                check=True, capture_output=True, timeout=startup_timeout_s,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            out = getattr(e, "stderr", b"") or b""
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise RuntimeError(f"MariaDB backend: mariadb-install-db failed: {out.decode(errors='replace')[-2000:]}")
        self._stderr = open(os.path.join(self.tmpdir, "mariadbd.out"), "wb")
        self.process = subprocess.Popen(
            [mariadbd, "--no-defaults", f"--datadir={datadir}", f"--socket={self.socket}", "--skip-networking",
             f"--pid-file={os.path.join(self.tmpdir, 'mariadbd.pid')}", f"--log-error={self._log}",
             "--skip-log-bin", "--performance-schema=OFF", "--innodb-buffer-pool-size=64M",
             "--innodb-log-file-size=32M", "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
             "--innodb-file-per-table=OFF", "--max-connections=1000", "--character-set-server=utf8mb4",
             "--local-infile=0", f"--secure-file-priv={no_files}", *as_root],
            stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True,
        )
        self._wait_ready(startup_timeout_s)
        atexit.register(self.stop)

    def _wait_ready(self, timeout_s: float) -> None:
        import pymysql

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if os.path.exists(self.socket):
                try:
                    pymysql.connect(unix_socket=self.socket, user="root").close()
                    return
                except pymysql.err.OperationalError:
                    pass
            time.sleep(0.05)
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"MariaDB backend: mariadbd did not become ready in {timeout_s:.0f} s; log:\n{log}")

    def log_tail(self, n_chars: int = 3000) -> str:
        text = ""
        for path in (self._log, os.path.join(self.tmpdir, "mariadbd.out")):
            try:
                with open(path, errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        return text[-n_chars:] or "(no log)"

    @property
    def url(self) -> str:
        return "mysql://root@localhost/?unix_socket=" + urllib.parse.quote(self.socket)

    def stop(self) -> None:
        process, self.process = getattr(self, "process", None), None
        if process is not None and process.poll() is None:
            process.terminate()  # SIGTERM: mariadbd shuts down cleanly
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if getattr(self, "_stderr", None) is not None:
            self._stderr.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


_shared_server: LocalServer | None = None
_shared_lock = threading.Lock()


def local_server() -> LocalServer:
    """The process's shared local server, started on first use."""
    global _shared_server
    with _shared_lock:
        if _shared_server is None or _shared_server.process is None or _shared_server.process.poll() is not None:
            _shared_server = LocalServer()
        return _shared_server


def is_available() -> bool:
    server = _find_binary("mariadbd", "mysqld")
    return server is not None and _find_binary("mariadb-install-db", "mysql_install_db") is not None
