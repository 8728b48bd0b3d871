"""Local TCP ports for test servers and benchmark children."""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before by this process (a child binds it a moment
    later, so two children must not be given the same one)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def closed_port() -> int:
    """A port nothing listens on (a connection to it is refused)."""
    return free_port()
