import os

import pytest

from conveyor import ConfigError, Conveyor, DatabaseUnavailable, SerializationError
from conveyor.backends import open_backend


@pytest.mark.parametrize("url", ["oracle://x/y", "", "conveyor.db", "sqlite://host/x.db"])
def test_malformed_urls_say_what_to_use(url):
    with pytest.raises(ConfigError, match=r"sqlite:///"):
        open_backend(url)


def test_unreachable_postgres_is_one_clear_error():
    with pytest.raises(DatabaseUnavailable, match="cannot connect to PostgreSQL") as err:
        open_backend("postgresql://postgres@127.0.0.1:1/nope")
    assert "password" not in str(err.value)
    assert err.value.transient  # refused: a worker starting waits for it (connect_wait_s)


def test_a_postgres_that_answers_no_is_not_transient(pg_database):
    from urllib.parse import urlsplit, urlunsplit

    from tests.conftest import PG_DEFAULT, PG_ENV

    parts = urlsplit(os.environ.get(PG_ENV, PG_DEFAULT))
    url = urlunsplit(parts._replace(path="/conveyor_no_such_db"))
    with pytest.raises(DatabaseUnavailable, match="does not exist") as err:
        open_backend(url)
    assert not err.value.transient


def test_unreachable_mysql_is_one_clear_error():
    with pytest.raises(DatabaseUnavailable, match="cannot connect to MySQL") as err:
        open_backend("mysql://root:s3cret@127.0.0.1:1/nope")
    assert "s3cret" not in str(err.value)
    assert err.value.transient
    with pytest.raises(ConfigError, match="names no database"):
        open_backend("mariadb://root@127.0.0.1:3306/")


def test_sqlite_in_missing_folder_is_clear(tmp_path):
    with pytest.raises(DatabaseUnavailable, match="does not exist"):
        open_backend(f"sqlite:///{tmp_path}/missing/dir/x.db")


def test_task_parameters_may_not_shadow_send_options(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")
    with pytest.raises(ConfigError, match="priority"):

        @app.task
        def bad(priority):  # would be swallowed by send(priority=...)
            pass


def test_duplicate_task_names_are_refused(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")
    app.task(name="x")(lambda: None)
    with pytest.raises(ConfigError, match="already registered"):
        app.task(name="x")(lambda: None)


def test_bad_arguments_fail_at_send_and_write_nothing(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db", max_payload_bytes=1000)

    @app.task
    def t(x):
        return x

    with pytest.raises(SerializationError, match="cannot be stored as JSON"):
        t.send(object())
    with pytest.raises(SerializationError, match="over the 1,000-byte limit"):
        t.send("x" * 2000)
    with pytest.raises(TypeError, match="bad arguments for task 't'"):
        t.send(1, 2)
    with pytest.raises(ConfigError, match="priority must be an integer"):
        t.send(1, priority="high")
    assert app.counts() == []


@pytest.mark.parametrize("bad", ["a\x00b", "a\nb", "a\tb", "\x1b[31mred", "a\u2028b", "\ud800"])
def test_names_and_keys_are_printable(tmp_path, bad):
    # a control character could forge or garble a line where the CLI and the
    # dashboard show a name; each is refused where it comes in, and nothing is stored
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")

    @app.task(concurrency_key="user", concurrency_limit=1)
    def per_user(user):
        return user

    @app.task(concurrency_key=lambda user: user, concurrency_limit=1, name="by_key")
    def by_key(user):
        return user

    refused = [
        ("a task name", lambda: app.task(name=bad)(lambda: None)),
        ("a task name", lambda: app.enqueue(bad)),
        ("a queue name", lambda: per_user.send("u", queue=bad)),
        ("a queue name", lambda: app.pause_queue(bad)),
        ("a queue name", lambda: app.set_queue_limit(bad, 3)),
        ("default_queue", lambda: Conveyor(f"sqlite:///{tmp_path}/c.db", default_queue=bad)),
        ("tenant", lambda: per_user.send("u", tenant=bad)),
        ("unique_key", lambda: per_user.send("u", unique_key=bad)),
        ("stage", lambda: per_user.send("u", stage=bad)),
        ("a batch name", lambda: per_user.batch([("u",)], name=bad)),
        ("workflow's name", lambda: app.workflow(bad)),
        ("node's name", lambda: app.workflow("w").add(per_user.s("u"), name=bad)),
        ("a token name", lambda: app.create_token("read", name=bad)),
        ("key: an event key", lambda: app.emit_event(bad)),
    ]
    if "\x00" not in bad and "\ud800" not in bad:  # (arguments refuse those first)
        refused += [
            ("limit key of task 'per_user'", lambda: per_user.send(bad)),
            ("key function of task 'by_key'", lambda: by_key.send(bad)),
            ("limit key of task 'per_user'", lambda: per_user.batch([("u",), (bad,)])),
        ]
    for what, call in refused:
        with pytest.raises(ConfigError, match=what):
            call()
    assert app.counts() == [] and app.list_batches() == [] and app.tokens() == []


def test_sync_pool_runs_submissions_concurrently_up_to_its_size():
    import threading

    from conveyor.runtime.pool import DaemonPool

    pool = DaemonPool(3)
    gate = threading.Barrier(3, timeout=5)  # passes only if three run at once
    futures = [pool.submit(gate.wait) for _ in range(3)]
    assert sorted(f.result(timeout=10) for f in futures) == [0, 1, 2]
    again = [pool.submit(lambda i=i: i) for i in range(6)]  # reuses idle threads
    assert [f.result(timeout=10) for f in again] == list(range(6))
    assert pool._threads == 3
    pool.shutdown()


def test_operator_settings_are_checked(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")
    for bad in (True, -1, 2**31, "3"):
        with pytest.raises(ConfigError, match="max_running"):
            app.set_queue_limit("q", bad)
    with pytest.raises(ConfigError, match="queue name"):
        app.pause_queue("")
    with pytest.raises(ConfigError, match="retention"):
        Conveyor(f"sqlite:///{tmp_path}/c.db", retention={"succeeded": 10**12})
    with pytest.raises(ConfigError, match="per finished state"):
        app.prune(retention={"running": 1})


def test_a_sensitive_name_must_be_a_parameter() -> None:
    import pytest as _pytest

    from conveyor import Conveyor
    from conveyor.errors import ConfigError

    app = Conveyor("sqlite:///:memory:")
    with _pytest.raises(ConfigError, match="sensitive: pasword is not a parameter of login"):

        @app.task(sensitive=("pasword",))
        def login(user: str, password: str) -> None: ...


@pytest.mark.parametrize("bad", [0, -5, 1.5, "many", True])
def test_vacuum_threshold_is_a_positive_row_count_or_none(tmp_path, bad):
    with pytest.raises(ConfigError, match="vacuum_dead_rows"):
        Conveyor(f"sqlite:///{tmp_path}/c.db", vacuum_dead_rows=bad)
    assert Conveyor(f"sqlite:///{tmp_path}/c.db", vacuum_dead_rows=None).vacuum_dead_rows is None
