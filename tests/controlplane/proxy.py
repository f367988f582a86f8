"""A TCP proxy on 127.0.0.1 in front of the API server that a test can cut: every open
connection (the operator's watches among them) ends and new ones are refused until it is
restored, as when the network between the operator and the API server drops."""

from __future__ import annotations

import contextlib
import socket
import threading

from ports import free_port


class CuttableProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target` (TLS passes through untouched)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def restore(self) -> None:
        """Listen (again) and forward new connections."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """End every connection and refuse new ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
