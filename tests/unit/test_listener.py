"""One pass of the listener's loop: which hints wake whom (no database: the
hints are given, as a notifier's ``wait`` returns them)."""

from __future__ import annotations

from conveyor.backends.interfaces import sent_by
from conveyor.runtime.listener import Listener


def _listener(woken: list[str]) -> Listener:
    return Listener(
        lambda: None,  # type: ignore[arg-type,return-value]  # never started
        ["default", "mail"],
        on_work=lambda: woken.append("work"),
        on_flow=lambda: woken.append("flow"),
        on_cancel=lambda: woken.append("cancel"),
        me="me",
    )


def test_one_pass_wakes_whom_the_hints_concern():
    cases = [
        ({"default"}, ["work"]),
        ({"elsewhere"}, []),
        ({sent_by("mail", "another worker")}, ["work"]),  # its outcomes made room
        ({sent_by("mail", "me")}, []),  # this worker's own: it claims again anyway
        ({sent_by("elsewhere", "another worker")}, []),
        ({"@flow"}, ["flow"]),
        ({"@cancel"}, ["cancel"]),
        ({"*"}, ["work", "flow"]),
    ]
    for hints, expected in cases:
        woken: list[str] = []
        _listener(woken).dispatch(hints)
        assert woken == expected, hints
