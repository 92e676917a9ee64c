"""Random ids on the append path: the format of ``uuid4().hex``, and a forked
child never repeats its parent's."""

from __future__ import annotations

import os
import random
import re

from shardsink._random_ids import random_hex


def test_an_id_is_32_hex_digits_and_ids_do_not_repeat():
    ids = [random_hex() for _ in range(10_000)]
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_seeding_the_random_module_does_not_repeat_ids():
    kept = random.getstate()  # the suite's other users of random keep theirs
    try:
        random.seed(7)
        first = random_hex()
        random.seed(7)
        assert random_hex() != first
    finally:
        random.setstate(kept)


def test_a_forked_child_draws_other_ids_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, "".join(random_hex() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 4096).decode()
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(child) == 128
    parent = "".join(random_hex() for _ in range(4))
    assert child != parent
