"""A round's call to a worker on the driver's own node, and its answer, over a Unix socket
instead of Ray's task path.

Why: with the broadcast and the answer already in shared memory (``shared_segments.py``), what
Ray still costs a round is its calls: about 2 ms from the driver's submission to the first
worker's start, the second worker's start 4-6 ms after the broadcast, and 1.5-1.8 ms from a
worker's return to its answer on the driver (docs/performance.md, "The round outside the
workers"). A message on a Unix socket between two processes of one node takes tens of
microseconds.

How: a worker answers on a socket from a thread of its own (``LineServer``), so Ray's calls
(evaluation, personalization, ``where``) still reach it as before; the driver sends each round's
``ShardCall`` on the line (``DirectLine``) and reads the answer from it, one call at a time per
worker: the driver makes no other call to that worker while one is on the line. Only the
round's calls take the line; Ray keeps everything else: the actors' lifecycle, restarts, and
every other method.

Who may call: only the driver that started the worker. The socket's name is not secret (Linux
lists abstract names in /proc/net/unix), so a connection must come from this user (the kernel's
peer credentials) and open with the line's 32-byte key, which the worker gives the driver
through Ray (``LineAddress``); any other connection is closed unanswered. Without that, any local
process could hand the worker a pickle to run, past the token that guards Ray's own ports.

Failures: an exception raised by the call travels back and is raised on the driver as itself,
with the worker's traceback as a note. A line that breaks (the worker's process died, or was
killed and restarted by Ray) is ``LineLost``: the driver makes the same call through Ray, whose
answer is what Ray would have given (the restarted worker's, or ``RayActorError`` for a worker
dead for good). Sockets live in Linux's abstract namespace (no file to clean up); elsewhere
``LineServer`` cannot bind and the rounds stay on Ray's path.

Usage:
    server = LineServer(worker.train_here)     # a worker, once
    line = DirectLine(server.address)           # the driver, given server.address through Ray
    line.send(call)
    report = line.receive()                     # raises the call's exception, or LineLost
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import pickle
import secrets
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from raysim.runtime.shared_segments import Dumps

log = logging.getLogger("raysim")
_HEADER = 8  # a message's length, little-endian, then its pickled bytes
_KEY_BYTES = 32
_ADMISSION_S = 10.0  # how long a new connection may take to be admitted, the key sent and acknowledged
_ADMITTED = b"\x01"  # the server's acknowledgement: the line is open
_CONNECT_S = 30.0  # how long the driver waits to be admitted (behind another caller, say)


class LineLost(ConnectionError):
    """The line broke: the worker's process is gone (dead, or restarted by Ray)."""


@dataclass(frozen=True)
class LineAddress:
    """Where a worker's line listens, and the key a connection must open with."""

    name: str  # in Linux's abstract namespace: starts with a NUL byte
    key: bytes


@dataclass(frozen=True)
class OnLine:
    """A call sent on a worker's line (its answer to come from there), kept to send again
    another way if the line breaks."""

    call: Any


@dataclass(frozen=True)
class Raised:
    """A call's exception as it travels back, with the worker's traceback."""

    error: BaseException
    where: str


class LineServer:
    """A worker's end: calls read from a socket answered by ``handler`` on a daemon thread, one
    connection (the driver's) at a time.

    Raises (constructor): OSError where the socket cannot be made (no abstract namespace)."""

    def __init__(self, handler: Callable[[Any], Any], dumps: Dumps = pickle.dumps) -> None:
        self.handler, self.dumps = handler, dumps
        if not sys.platform.startswith("linux"):
            raise OSError("direct lines need Linux's abstract socket namespace")
        self.address = LineAddress(
            f"\0raysim-line-{os.getpid()}-{secrets.token_hex(6)}", secrets.token_bytes(_KEY_BYTES)
        )
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.address.name)
        self.listener.listen(16)  # a connect to a full backlog fails at once, not after a wait
        self.closed = False
        threading.Thread(target=self._serve, name="raysim-line", daemon=True).start()

    def _serve(self) -> None:
        warned = False
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError as exc:
                if self.closed:
                    return
                if not warned:  # once until a connection is accepted again
                    log.warning("a direct line could not accept a connection (%s)", exc)
                warned = True
                time.sleep(0.1)  # out of file descriptors, say: not a busy loop
                continue
            warned = False
            with connection:
                if self._admits(connection):
                    self._answer_all(connection)

    def _admits(self, connection: socket.socket) -> bool:
        """Whether the connection comes from this user and opens with the line's key, all within
        ``_ADMISSION_S`` (a caller that says nothing does not hold the line); acknowledged."""
        opening = _KEY_BYTES.to_bytes(_HEADER, "little") + self.address.key
        deadline = time.monotonic() + _ADMISSION_S
        received = b""
        try:
            credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
            if struct.unpack("iII", credentials)[1] != os.getuid():
                return False
            while len(received) < len(opening):
                connection.settimeout(max(deadline - time.monotonic(), 1e-3))
                if not (more := connection.recv(len(opening) - len(received))):
                    return False
                received += more
            if not hmac.compare_digest(received, opening):
                return False
            connection.settimeout(None)
            connection.sendall(_ADMITTED)
        except OSError:  # the caller went away, or took too long
            return False
        return True

    def _answer_all(self, connection: socket.socket) -> None:
        """Answers the calls on ``connection`` until the driver closes it. Any failure other than
        a call's own (the driver gone, a stop asked of this process) ends the connection, not the
        server: the driver makes that call through Ray instead, and may connect again."""
        try:
            while (message := receive_message(connection)) is not None:
                send_message(connection, self._answer(message))
        except OSError:  # the driver went away
            pass
        except BaseException as exc:  # a stop, or a bug here: the call goes through Ray
            log.info("a direct line ended: %r", exc)

    def close(self) -> None:
        """Stops listening; the serving thread ends at its next ``accept``."""
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _answer(self, message: memoryview) -> bytes:
        try:
            return self.dumps(self.handler(pickle.loads(message)))
        except Exception as exc:  # the call's own failure: raised again on the driver
            return self._raised(exc)

    def _raised(self, exc: Exception) -> bytes:
        where = "".join(traceback.format_exception(exc))
        try:
            message = self.dumps(Raised(exc, where))
            pickle.loads(message)  # some exceptions pickle but do not unpickle
            return message
        except Exception:  # travels as its text
            return self.dumps(Raised(RuntimeError(f"{type(exc).__name__}: {exc}"), where))


class DirectLine:
    """The driver's end of one worker's line.

    Raises (constructor): OSError where the worker's socket cannot be reached."""

    def __init__(self, address: LineAddress, dumps: Dumps = pickle.dumps) -> None:
        self.address, self.dumps = address, dumps
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.socket.settimeout(_CONNECT_S)  # a worker busy with another caller, or gone
            self.socket.connect(address.name)
            send_message(self.socket, address.key)
            if self.socket.recv(1) != _ADMITTED:
                raise ConnectionRefusedError("the worker's line did not admit this connection")
            self.socket.settimeout(None)
        except OSError:
            self.socket.close()
            raise

    def send(self, call: Any) -> None:
        """Sends ``call``; its answer is the next ``receive``.

        Raises:
            LineLost: the worker's end is gone.
        """
        try:
            send_message(self.socket, self.dumps(call))
        except OSError as exc:
            raise LineLost(f"the worker's line broke while sending: {exc}") from exc

    def receive(self) -> Any:
        """The answer to the last ``send``; the call's exception raised as itself.

        Raises:
            LineLost: the worker's end is gone before it answered.
        """
        try:
            message = receive_message(self.socket)
        except OSError as exc:
            raise LineLost(f"the worker's line broke while answering: {exc}") from exc
        if message is None:
            raise LineLost("the worker's line closed before it answered")
        answer = pickle.loads(message)
        if isinstance(answer, Raised):
            answer.error.add_note(f"raised in a raysim worker:\n{answer.where}")
            raise answer.error
        return answer

    def close(self) -> None:
        self.socket.close()


def send_message(sock: socket.socket, data: bytes) -> None:
    sock.sendall(len(data).to_bytes(_HEADER, "little"))
    sock.sendall(data)


def receive_message(sock: socket.socket) -> memoryview | None:
    """The next message's bytes; None where the other end closed between messages.

    Raises:
        ConnectionError: the other end closed within a message.
    """
    header = _receive_exactly(sock, _HEADER, at_start=True)
    if header is None:
        return None
    body = _receive_exactly(sock, int.from_bytes(header, "little"), at_start=False)
    assert body is not None, "only a message's start may meet the end of the stream"
    return body


def _receive_exactly(sock: socket.socket, size: int, at_start: bool) -> memoryview | None:
    buffer = memoryview(bytearray(size))
    done = 0
    while done < size:
        got = sock.recv_into(buffer[done:])
        if got == 0:
            if at_start and done == 0:
                return None
            raise ConnectionError(f"the stream ended {done} bytes into a {size}-byte message")
        done += got
    return buffer


class Lines:
    """The driver's direct lines, by worker; at most one call unanswered on each.

    A call left unanswered (its round raised before reading every answer) is waited for before
    the next call to that worker, as Ray runs an actor's calls one after another. A line whose
    stream can no longer be trusted (it broke, or an interrupt landed within a message) is
    closed and its worker marked ``broken``: its calls go through Ray until it answers there and
    gets a new line. The worker holds a lock of its own besides (``ray_workers.ClusterTrainer``)."""

    def __init__(self) -> None:
        self.open_lines: dict[int, DirectLine] = {}
        self.unanswered: set[int] = set()
        self.broken: set[int] = set()  # to open again once the worker answers through Ray

    def open(self, worker: int, address: LineAddress | None, dumps: Dumps = pickle.dumps) -> bool:
        """Whether a line to ``worker`` at ``address`` is open now (None: the worker has none)."""
        self.close(worker)
        self.broken.discard(worker)
        if address is not None:
            with contextlib.suppress(OSError):  # not reachable from here: Ray's path
                self.open_lines[worker] = DirectLine(address, dumps)
        return worker in self.open_lines

    def send(self, worker: int, call: Any) -> bool:
        """Whether ``call`` went on the worker's line; False: it has none, or it broke."""
        if worker in self.open_lines:
            self.settle(worker)
        if worker not in self.open_lines:  # none, or its unanswered call found it broken
            return False
        try:
            with self._trusted_stream(worker):
                self.open_lines[worker].send(call)
        except LineLost:
            return False
        self.unanswered.add(worker)
        return True

    def receive(self, worker: int) -> Any:
        """The answer to the worker's call (``DirectLine.receive``: the call's exception raised).

        Raises:
            LineLost: the line broke (and is closed).
        """
        try:
            with self._trusted_stream(worker):
                return self.open_lines[worker].receive()
        finally:
            self.unanswered.discard(worker)

    @contextlib.contextmanager
    def _trusted_stream(self, worker: int) -> Iterator[None]:
        """Closes the worker's line, marked broken, where its stream can no longer be trusted: it
        broke, or an interrupt landed within a message. An ordinary exception (a call that did not
        pickle, a call's own failure read whole) leaves it open."""
        try:
            yield
        except LineLost:
            self.close(worker, broken=True)
            raise
        except Exception:  # the stream is still whole
            raise
        except BaseException:
            self.close(worker, broken=True)
            raise

    def settle(self, worker: int | None = None) -> None:
        """Waits for the worker's unanswered call (every worker's: None); its answer, or its
        error, belongs to a round that already ended."""
        for one in [worker] if worker is not None else sorted(self.unanswered):
            if one in self.unanswered:
                with contextlib.suppress(Exception):
                    self.receive(one)

    def close(self, worker: int | None = None, broken: bool = False) -> None:
        """Closes the worker's line (every line: None); ``broken``: to open again later."""
        for one in [worker] if worker is not None else list(self.open_lines):
            self.unanswered.discard(one)
            if one in self.open_lines:
                self.open_lines.pop(one).close()
            if broken:
                self.broken.add(one)
