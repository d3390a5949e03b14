"""A worker's direct line (``raysim.runtime.direct_line``): calls and answers over a real Unix
socket, framed whole however the kernel splits them; a call's exception raised on the driver as
itself; a line that breaks is ``LineLost``, and the server takes the next connection."""

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from raysim.errors import ResourceError
from raysim.runtime import direct_line
from raysim.runtime.direct_line import (
    DirectLine,
    LineAddress,
    LineLost,
    Lines,
    LineServer,
    receive_message,
    send_message,
)

RELEASE = threading.Event()  # what a "wait" call waits for (a handler's argument travels pickled)


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not picklable")


class Unloadable(Exception):
    """Pickles, but does not unpickle: its ``__init__`` takes two arguments, its args hold one."""

    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def handler(call):
    kind, value = call
    if kind == "echo":
        return value
    if kind == "raise":
        raise ResourceError(f"worker {value} failed")
    if kind == "unpicklable":
        raise Unpicklable("it stays here")
    if kind == "unloadable":
        raise Unloadable("half", "whole")
    if kind == "stop":
        raise SystemExit(143)  # a stop asked of the worker's process: not the call's own failure
    if kind == "wait":
        return RELEASE.wait(5)
    raise AssertionError(kind)


@pytest.fixture
def server():
    server = LineServer(handler)
    yield server
    server.close()


def test_answers_come_back_in_order_whole(server):
    line = DirectLine(server.address)
    big = bytes(range(256)) * 40_000  # 10 MB: many recv calls on both sides
    for value in ["a", big, {"n": [1, 2, 3]}]:
        line.send(("echo", value))
        assert line.receive() == value
    line.close()


def test_a_calls_exception_is_raised_as_itself_with_the_workers_traceback(server):
    line = DirectLine(server.address)
    line.send(("raise", 7))
    with pytest.raises(ResourceError, match="worker 7 failed") as raised:
        line.receive()
    assert any("raised in a raysim worker" in note and "handler" in note for note in raised.value.__notes__)
    line.send(("echo", "after"))  # the line goes on
    assert line.receive() == "after"


@pytest.mark.parametrize(
    "kind, text", [("unpicklable", "Unpicklable: it stays here"), ("unloadable", "half whole")]
)
def test_an_exception_that_does_not_travel_comes_as_its_text(server, kind, text):
    line = DirectLine(server.address)
    line.send((kind, None))
    with pytest.raises(RuntimeError, match=text):
        line.receive()


def test_a_failure_not_the_calls_own_breaks_the_line_and_the_server_takes_another(server):
    line = DirectLine(server.address)
    line.send(("stop", None))
    with pytest.raises(LineLost, match="closed before it answered"):
        line.receive()
    again = DirectLine(server.address)
    again.send(("echo", 1))
    assert again.receive() == 1


def test_a_line_to_nobody_cannot_open():
    with pytest.raises(OSError):
        DirectLine(LineAddress("\0raysim-line-nobody-listens", bytes(32)))


def test_a_connection_without_the_lines_key_is_not_admitted(server):
    """Anyone on the machine can see the name; only the driver holds the key, given through Ray."""
    with pytest.raises(OSError):  # closed without the acknowledgement (or reset as it closes)
        DirectLine(LineAddress(server.address.name, bytes(32)))
    right = DirectLine(server.address)  # the server goes on
    right.send(("echo", "mine"))
    assert right.receive() == "mine"


def test_a_caller_that_sends_too_slowly_does_not_hold_the_line(monkeypatch, server):
    """One deadline for the whole opening: a byte every 0.3 s (each within a 0.5 s read's
    timeout, so a deadline per read would hold the line past 4 s) is dropped at 0.5 s."""
    monkeypatch.setattr(direct_line, "_ADMISSION_S", 0.5)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(server.address.name)

    def dribble():
        for _ in range(12):
            with contextlib.suppress(OSError):  # dropped part way
                slow.sendall(b"\x00")
            time.sleep(0.3)

    writer = threading.Thread(target=dribble)
    writer.start()
    start = time.monotonic()
    line = DirectLine(server.address)  # waits in the backlog until the slow one is dropped
    assert time.monotonic() - start < 3  # margin for a busy machine: the suite runs in 3 processes
    line.send(("echo", "through"))
    assert line.receive() == "through"
    writer.join()
    try:  # closed unanswered: an end of stream, or a reset where a byte of ours was still unread
        assert slow.recv(1) == b""
    except ConnectionResetError:
        pass
    slow.close()


def test_a_stream_that_ends_within_a_message_is_lost():
    ours, theirs = socket.socketpair()
    theirs.sendall((100).to_bytes(8, "little") + b"only part")
    theirs.close()
    with pytest.raises(ConnectionError, match="9 bytes into a 100-byte message"):
        receive_message(ours)


def test_messages_split_into_small_pieces_arrive_whole():
    ours, theirs = socket.socketpair()
    message = bytes(range(200))
    framed = len(message).to_bytes(8, "little") + message

    def dribble():
        for i in range(0, len(framed), 3):
            theirs.sendall(framed[i : i + 3])
        send_message(theirs, b"")
        theirs.close()

    writer = threading.Thread(target=dribble)
    writer.start()
    assert bytes(receive_message(ours)) == message
    assert bytes(receive_message(ours)) == b""
    assert receive_message(ours) is None  # closed between messages
    writer.join()


def test_lines_wait_for_a_call_left_unanswered_before_the_next(server):
    """A round that raised before reading an answer: the next call waits for it (a worker runs
    one call at a time) and its answer is not taken for the next call's."""
    lines = Lines()
    assert not lines.send(0, ("echo", 1))  # no line yet: Ray's path
    assert lines.open(0, server.address)
    RELEASE.clear()
    assert lines.send(0, ("wait", None))
    assert lines.unanswered == {0}
    start = time.monotonic()
    threading.Timer(0.3, RELEASE.set).start()
    assert lines.send(0, ("echo", "next"))
    assert time.monotonic() - start >= 0.25  # it waited for the first call's answer
    assert lines.receive(0) == "next"
    assert lines.unanswered == set()


def test_a_broken_line_is_closed_marked_and_the_call_goes_elsewhere(server):
    lines = Lines()
    assert lines.open(0, server.address)
    lines.send(0, ("stop", None))
    with pytest.raises(LineLost):
        lines.receive(0)
    assert 0 not in lines.open_lines and lines.broken == {0}
    assert not lines.send(0, ("echo", 1))
    assert lines.open(0, server.address) and lines.broken == set()  # open again
    nobody = LineAddress("\0raysim-line-nobody-listens", bytes(32))
    assert not lines.open(1, None) and not lines.open(2, nobody)


def test_a_line_an_unanswered_call_finds_broken_is_not_sent_on(server):
    """The round that sent "stop" raised before reading its answer: the next call settles it,
    finds the line broken and goes elsewhere (no KeyError)."""
    lines = Lines()
    assert lines.open(0, server.address)
    assert lines.send(0, ("stop", None))
    assert not lines.send(0, ("echo", 1))
    assert lines.broken == {0} and lines.unanswered == set()


def test_an_interrupt_within_an_answer_closes_the_line(server, monkeypatch):
    """Where the stream stands is lost: the line is closed and marked, never read again."""
    lines = Lines()
    assert lines.open(0, server.address)
    assert lines.send(0, ("echo", 1))

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(lines.open_lines[0], "receive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lines.receive(0)
    assert 0 not in lines.open_lines and lines.broken == {0} and lines.unanswered == set()


def test_a_call_that_does_not_pickle_leaves_the_line_open(server):
    lines = Lines()
    assert lines.open(0, server.address)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        lines.send(0, ("echo", lambda: None))  # pickle.dumps refuses a lambda
    assert 0 in lines.open_lines and lines.broken == set() and lines.unanswered == set()
    assert lines.send(0, ("echo", 5)) and lines.receive(0) == 5


def test_a_calls_own_failure_leaves_the_line_open(server):
    lines = Lines()
    assert lines.open(0, server.address)
    assert lines.send(0, ("raise", 3))
    with pytest.raises(ResourceError):
        lines.receive(0)
    assert lines.unanswered == set() and lines.broken == set()
    assert lines.send(0, ("echo", 2)) and lines.receive(0) == 2


@pytest.mark.skipif(os.getuid() != 0, reason="only root can connect as another user")
def test_a_connection_from_another_user_is_closed_even_with_the_key(server):
    """The kernel's peer credentials, checked before the key: another user's process is refused."""
    script = textwrap.dedent(
        f"""
        import os, pickle
        from raysim.runtime.direct_line import DirectLine, LineAddress
        os.setuid(65534)  # nobody
        try:  # closed at once: refused as the key goes, or as the call does, or before its answer
            line = DirectLine(LineAddress({server.address.name!r}, {server.address.key!r}))
            line.send(("echo", 1))
            line.receive()
        except OSError:  # LineLost is one
            print("refused")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "refused", done.stderr
