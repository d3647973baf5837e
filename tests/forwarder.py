"""A loopback TCP forwarder to pull the cable between a client and a real server, in the test's process.

A client pointed at `Forwarder.port` reaches the server through it. `cut()` resets every connection it
carries, both ways (the client sees its connection reset, the server a client gone) and resets every new
one as soon as it is accepted, until `restore()`: an outage as the client sees one, while the server,
shared with other tests and engineers, runs on undisturbed. `replies_held()` lets every request reach the
server and holds back every byte of its answers until it ends, then hands them over in order: replies
that come after the client's timeout, of requests the server has applied. The forwarder listens on a
loopback address, 127.0.0.1 unless told (another one is a host name that a server's certificate does not
give).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# How often a connection's thread looks whether the cable was cut, at most.
_POLL = 0.05
_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, not an orderly FIN: what a peer sees of a pulled cable, at once."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass  # already closed by the peer
    sock.close()


class Forwarder:
    def __init__(self, host: str, port: int, listen: str = "127.0.0.1") -> None:
        if not listen.startswith("127."):
            raise ValueError(f"the forwarder listens on loopback only, not {listen!r}")
        self.target = (host, port)
        self.listen = listen
        self._listener = socket.create_server((listen, 0))
        self._listener.settimeout(_POLL)
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._held = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: set[threading.Thread] = set()
        self.accepted = 0  # connections accepted while the cable was in, for the tests to see traffic
        self._acceptor = threading.Thread(target=self._accept, name=f"forwarder:{self.port}", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            if self._cut.is_set():
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            self.accepted += 1
            pair = threading.Thread(target=self._carry, args=(client, server), daemon=True)
            with self._lock:
                self._pairs.add(pair)
            pair.start()

    def _carry(self, client: socket.socket, server: socket.socket) -> None:
        """Copy bytes both ways until one side closes (then close the other in turn) or the cable is cut
        (then reset both); the server's while its replies are held, once they no longer are."""
        peers = {client: server, server: client}
        held = bytearray()
        try:
            while not self._cut.is_set() and not self._closed.is_set():
                if held and not self._held.is_set():
                    client.sendall(held)
                    held.clear()
                readable, _, _ = select.select(list(peers), [], [], _POLL)
                for sock in readable:
                    try:
                        data = sock.recv(_CHUNK)
                        if data and sock is server and self._held.is_set():
                            held += data
                        elif data:
                            peers[sock].sendall(data)
                    except OSError:
                        data = b""
                    if not data:
                        return
        finally:
            # On a side's orderly close, the other's is orderly too: a reset could drop the data sent
            # just before, still unread in the peer's buffer.
            close = _reset if self._cut.is_set() or self._closed.is_set() else socket.socket.close
            close(client)
            close(server)
            with self._lock:
                self._pairs.discard(threading.current_thread())

    def cut(self) -> None:
        """Reset every connection carried, and every new one until `restore()`; returns once they are."""
        self._cut.set()
        self._join_pairs()

    def restore(self) -> None:
        self._cut.clear()

    @contextmanager
    def cable_pulled(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.restore()

    @contextmanager
    def replies_held(self) -> Iterator[None]:
        """Hold back the server's answers while inside (its requests still reach it), then deliver them."""
        self._held.set()
        try:
            yield
        finally:
            self._held.clear()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._acceptor.join()
        self._join_pairs()

    def _join_pairs(self) -> None:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.join()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
