"""An SSH tunnel for the stack's ateapi calls to a borrowed host.

A host stack's API NodePort answers on the host's loopback only (kind's port mapping listens on
127.0.0.1 there), so the `ActorTemplate` and `Atespace` resources reach it the way an operator
does with the `sshTunnel` output: a local port forwarded over SSH. The SSH connection is made by
the same code as the host's shell steps (`commands._ssh`): host key checking is on, with the
key the stack config gives or the one the host's first step recorded.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from gym_substrate.stack.commands import _ssh

__all__ = ["SSHTunnel"]


class SSHTunnel:
    """`with SSHTunnel(ssh, remote=(host, port)) as local_port:` forwards 127.0.0.1:local_port
    here to `remote` as the SSH host sees it, for as long as the block runs."""

    def __init__(self, ssh: Mapping[str, Any], *, remote: tuple[str, int], name: str) -> None:
        self._ssh = dict(ssh)
        self._remote = remote
        self._name = name
        self._client: Any = None
        self._server: socket.socket | None = None
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> int:
        known = self._ssh.get("knownHostKey")
        self._client, _ = _ssh(self._name, "tunnel", self._ssh, known)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.2)
        self._server = server
        accept = threading.Thread(target=self._accept, name="ssh-tunnel", daemon=True)
        accept.start()
        self._threads.append(accept)
        return int(server.getsockname()[1])

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._server is not None:
            self._server.close()
        if self._client is not None:
            self._client.close()

    def _accept(self) -> None:
        assert self._server is not None
        transport = self._client.get_transport()
        while not self._closed.is_set():
            try:
                sock, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                chan = transport.open_channel("direct-tcpip", self._remote, peer)
            except Exception:  # the host refused the forward: the client sees a reset
                sock.close()
                continue
            pump = threading.Thread(target=self._pump, args=(sock, chan), daemon=True)
            pump.start()
            self._threads.append(pump)

    def _pump(self, sock: socket.socket, chan: Any) -> None:
        try:
            while not self._closed.is_set():
                ready, _, _ = select.select([sock, chan], [], [], 0.2)
                if sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        break
                    sock.sendall(data)
        except OSError:
            pass
        finally:
            chan.close()
            sock.close()
