"""The ``conveyor`` command line: workers, migrations, enqueueing, inspection, a demo.

Entry point: :func:`conveyor.cli.main.main`. The CLI only talks to the
:class:`conveyor.Conveyor` façade and its backend methods; it never holds SQL.
"""
