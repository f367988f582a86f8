"""A PgBouncer of a test's own (transaction pooling mode unless asked for another), in front
of a private server.

Binary: `pgbouncer` on PATH or in /usr/sbin (Debian's package). PgBouncer refuses to run as
root, so as root it runs as the private server's user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ports import free_port
from psycopg.conninfo import make_conninfo


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")


class PgBouncer:
    """pgbouncer -d with a config of its own: `pool_mode` pooling, trust, TCP only."""

    def __init__(self, binary: str, *, server_port: int, run_as: str | None,
                 pool_size: int = 20, pool_mode: str = "transaction") -> None:
        """In front of PostgreSQL on 127.0.0.1:`server_port`; `run_as`: the user it runs as
        (needed as root), None: this process's; `pool_mode`: transaction or session."""
        self.binary = binary
        self.folder = Path(tempfile.mkdtemp(prefix="jobpool-pgb-"))
        self.port = free_port()
        self.user = run_as
        (self.folder / "users.txt").write_text('"postgres" ""\n')
        (self.folder / "pgb.ini").write_text(f"""\
[databases]
* = host=127.0.0.1 port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.folder / "users.txt"}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 500
logfile = {self.folder / "pgb.log"}
pidfile = {self.folder / "pgb.pid"}
""")
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname)

    def start(self) -> None:
        command = [self.binary, "-d", str(self.folder / "pgb.ini")]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"pgbouncer failed to start:\n{result.stdout}\n{result.stderr}")
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer does not listen on {self.port}:\n{self.log()}")

    def log(self) -> str:
        path = self.folder / "pgb.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def remove(self) -> None:
        pidfile = self.folder / "pgb.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
        shutil.rmtree(self.folder, ignore_errors=True)
