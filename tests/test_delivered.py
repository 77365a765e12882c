"""``failure.delivered``: the wait that keeps an aborting rank's message.

A launcher that kills an aborted job drops what the rank left in its stderr
pipe (``tests/test_failure.py`` runs the jobs, where a launcher is at hand);
these tests need none.
"""

import os
import threading
import time

from mpiredist.runtime.failure import delivered


def test_delivered_waits_until_the_pipe_is_read():
    read, write = os.pipe()
    with os.fdopen(write, "w") as stream:
        stream.write("x" * 100)
        stream.flush()
        t0 = time.monotonic()
        assert delivered(stream, wait=0.2) is False         # nobody reads: gives up
        assert 0.2 <= time.monotonic() - t0 < 2
        timer = threading.Timer(0.3, os.read, (read, 1000))
        timer.start()
        t0 = time.monotonic()
        assert delivered(stream, wait=5) is True            # returns once it was read
        assert 0.25 <= time.monotonic() - t0 < 4
        timer.join()
    os.close(read)


def test_delivered_does_not_wait_on_a_file(tmp_path):
    with open(tmp_path / "log", "w") as stream:
        stream.write("x" * 100)
        stream.flush()
        t0 = time.monotonic()
        assert delivered(stream, wait=5) is True
        assert time.monotonic() - t0 < 1
