"""The peers that run as programs of another language: graphile-worker (Node.js) and River (Go).

Both are pinned in bench/peers/ (graphile-worker: package.json and package-lock.json; River:
go.mod and go.sum beside the driver program main.go) and installed by the bench itself on
first use into bench/.peers/ (ignored by git), as bench/.venv holds the Python peers:
`npm ci` of the lock file for graphile-worker, `go build` of the driver for River. A stamp
(the hash of the pinned files) makes a changed pin reinstall.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from common import BENCH

PEERS = BENCH / "peers"
BUILT = BENCH / ".peers"
GRAPHILE_SRC = PEERS / "graphile-worker"
RIVER_SRC = PEERS / "river"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"bench: `{name}` is not on PATH; the {name} peer needs it "
                         "(Node.js with npm for graphile-worker, Go for River), or leave the "
                         "peer out of --systems")
    return found


def _stamp(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _install(target: Path, sources: Sequence[Path], build: Callable[[Path], None]) -> Path:
    """`target` built from `sources` by `build`, unless its stamp says it already is."""
    stamp = target / ".stamp"
    wanted = _stamp(sources)
    if stamp.exists() and stamp.read_text(encoding="utf-8") == wanted:
        return target
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    build(target)
    stamp.write_text(wanted, encoding="utf-8")
    return target


@functools.cache
def graphile_modules() -> Path:
    """The node_modules folder of the pinned graphile-worker (`npm ci` on first use)."""
    def build(target: Path) -> None:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(GRAPHILE_SRC / name, target / name)
        print(f"bench: npm ci of graphile-worker into {target}", flush=True)
        subprocess.run([_tool("npm"), "ci", "--no-audit", "--no-fund", "--loglevel", "error"],
                       cwd=target, check=True)

    sources = [GRAPHILE_SRC / "package.json", GRAPHILE_SRC / "package-lock.json"]
    return _install(BUILT / "graphile-worker", sources, build) / "node_modules"


@functools.cache
def river_binary() -> Path:
    """The River driver program, built with the pinned modules on first use."""
    def build(target: Path) -> None:
        print(f"bench: go build of the River driver into {target}", flush=True)
        subprocess.run([_tool("go"), "build", "-mod=readonly", "-o",
                        str(target / "river-bench"), "."], cwd=RIVER_SRC, check=True)

    sources = [RIVER_SRC / "go.mod", RIVER_SRC / "go.sum", RIVER_SRC / "main.go"]
    return _install(BUILT / "river", sources, build) / "river-bench"


def versions() -> dict[str, str]:
    """The pinned versions of graphile-worker and River and the tools that run them."""
    lock = json.loads((GRAPHILE_SRC / "package-lock.json").read_text(encoding="utf-8"))
    river = re.search(r"github\.com/riverqueue/river (v\S+)",
                      (RIVER_SRC / "go.mod").read_text(encoding="utf-8"))
    return {"graphile-worker": lock["packages"]["node_modules/graphile-worker"]["version"],
            "river": river.group(1) if river else "?",
            "Node.js": _output(["node", "--version"]).removeprefix("v"),
            "Go": _output(["go", "env", "GOVERSION"]).removeprefix("go")}


def _output(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "absent"
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


# -- graphile-worker ------------------------------------------------------------------------

def graphile_argv(*args: str) -> list[str]:
    """argv of the graphile-worker driver (bench/peers/graphile-worker/worker.js)."""
    return [_tool("node"), str(GRAPHILE_SRC / "worker.js"), str(graphile_modules()), *args]


def graphile_migrate(dsn: str) -> None:
    """Create graphile-worker's schema (its own migrations)."""
    subprocess.run(graphile_argv("migrate", dsn), check=True)


ADD_JOBS = ("SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(SELECT "
            "json_populate_record(NULL::graphile_worker.job_spec, spec) "
            "FROM json_array_elements(%s::json) AS spec))")
"""graphile-worker's batch enqueue in SQL: one `add_jobs` call for a JSON array of job specs."""

ADD_JOB = "SELECT FROM graphile_worker.add_job(%s, %s::json)"
"""graphile-worker's single enqueue in SQL."""


# -- River ----------------------------------------------------------------------------------

def river_argv(*args: str) -> list[str]:
    """argv of the River driver (bench/peers/river/main.go)."""
    return [str(river_binary()), *args]


def river_migrate(dsn: str) -> None:
    """Run River's migrations (rivermigrate, up)."""
    subprocess.run(river_argv("migrate", dsn), check=True)


async def river_enqueue(dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                        batch: int) -> None:
    """Insert `payloads` as jobs of `kind` through River's client: `Insert` one by one for
    batch 1, else `InsertManyFast` (COPY FROM) of `batch` jobs at a time."""
    child = await asyncio.create_subprocess_exec(
        *river_argv("enqueue", dsn, kind, str(batch)), stdin=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    lines = "".join(json.dumps(payload) + "\n" for payload in payloads).encode()
    _, stderr = await child.communicate(lines)
    if child.returncode != 0:
        raise RuntimeError(f"river-bench enqueue exited {child.returncode}: {stderr.decode()}")


async def river_single(dsn: str) -> tuple[Callable[[str, dict[str, Any]], Awaitable[None]],
                                          Callable[[], Awaitable[None]]]:
    """An enqueue-one function backed by one River client (`Insert`, one transaction each)
    in a child process answering each insert on a pipe, and its close function."""
    child = await asyncio.create_subprocess_exec(
        *river_argv("single", dsn), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    async def one(kind: str, payload: dict[str, Any]) -> None:
        stdin.write(f"{kind}\t{json.dumps(payload)}\n".encode())
        await stdin.drain()
        if await stdout.readline() != b"ok\n":
            raise RuntimeError(f"river-bench single: no answer for a {kind} job "
                               f"(exit {await child.wait()})")

    async def close() -> None:
        stdin.close()
        if await child.wait() != 0:
            raise RuntimeError(f"river-bench single exited {child.returncode}")

    return one, close


async def river_producer(dsn: str) -> tuple[Callable[[str, Sequence[dict[str, Any]]],
                                                     Awaitable[None]],
                                            Callable[[], Awaitable[None]]]:
    """An enqueue-a-batch function backed by one River client in a child process
    (`InsertManyFast` of each batch, which an empty line ends), and its close function. The
    function returns once the batch is written to the child's pipe, not when it is committed:
    the enqueue-to-start latency the handler records counts from the call all the same."""
    child = await asyncio.create_subprocess_exec(
        *river_argv("enqueue", dsn, "bench_latency", str(10**9)), stdin=asyncio.subprocess.PIPE)
    assert child.stdin is not None
    stdin = child.stdin

    async def many(kind: str, payloads: Sequence[dict[str, Any]]) -> None:
        if kind != "bench_latency":
            raise ValueError(f"river-bench producer enqueues bench_latency jobs, not {kind}")
        stdin.write("".join(json.dumps(p) + "\n" for p in payloads).encode() + b"\n")
        await stdin.drain()

    async def close() -> None:
        stdin.close()
        if await child.wait() != 0:
            raise RuntimeError(f"river-bench enqueue exited {child.returncode}")

    return many, close
