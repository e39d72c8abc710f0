"""Using up this process's file descriptors, for tests of what happens when none is left (a real limit, no mock)."""

from __future__ import annotations

import os

__all__ = ["free_descriptors", "use_up_descriptors"]


def use_up_descriptors() -> list[int]:
    """Open ``/dev/null`` until the process's open-file limit refuses; the descriptors taken."""
    taken: list[int] = []
    try:
        while True:
            taken.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        return taken


def free_descriptors(taken: list[int]) -> None:
    """Close what :func:`use_up_descriptors` took."""
    for fd in taken:
        os.close(fd)
    taken.clear()
