"""The fork servers' one message framing (:mod:`packrat.runtime.framing`): the fork server and
the pod's zygote read and write the same frames, descriptors travelling with them."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from packrat.runtime.framing import MAX_MESSAGE, recv_message, send_message


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        yield ours, theirs


def test_a_message_and_its_descriptors_arrive_together(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    read_end, write_end = os.pipe()
    try:
        send_message(ours, {"argv": ["-m", "x"], "env": {"A": "1"}}, [write_end])
        msg, fds = recv_message(theirs, max_fds=4)
        assert msg == {"argv": ["-m", "x"], "env": {"A": "1"}}
        assert len(fds) == 1
        os.write(fds[0], b"through the passed descriptor")
        os.close(fds[0])
        assert os.read(read_end, 100) == b"through the passed descriptor"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_message_larger_than_one_read_is_gathered(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    ours.setblocking(True)
    big = {"env": {f"K{i}": "v" * 100 for i in range(2000)}}  # ~230 kB, several reads
    sender = threading.Thread(target=send_message, args=(ours, big))
    sender.start()
    msg, fds = recv_message(theirs)
    sender.join()
    assert msg == big
    assert fds == []


def test_a_closed_channel_and_bad_frames_are_errors(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    ours.sendall((MAX_MESSAGE + 1).to_bytes(4, "big"))
    with pytest.raises(ValueError, match="message of"):
        recv_message(theirs)
    ours.sendall((2).to_bytes(4, "big") + b"[]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        recv_message(theirs)
    ours.sendall((10).to_bytes(4, "big") + b'{"a"')
    ours.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionError, match="mid-message"):
        recv_message(theirs)
    with pytest.raises(ConnectionError, match="closed the channel"):
        recv_message(theirs)
