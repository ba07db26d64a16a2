"""Conveyor's tables, made by Conveyor's own migrations (the SQL it ships per
database). Later versions of the schema are applied by every ``manage.py
migrate`` (a ``post_migrate`` receiver): no Django migration per release."""

from typing import Any

from django.db import migrations


def create_tables(apps: Any, schema_editor: Any) -> None:
    from conveyor.contrib.django.schema import migrate_database

    migrate_database(schema_editor.connection.alias)


class Migration(migrations.Migration):
    # Conveyor migrates on a connection of its own, each step in its own
    # transaction: Django's connection must not hold one open meanwhile (on
    # SQLite it would keep Conveyor's writes waiting)
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create_tables, migrations.RunPython.noop, elidable=False)]
