import pytest

from conveyor import ConfigError, Conveyor
from conveyor.task import parse_rate


@pytest.mark.parametrize(
    ("spec", "per_s"), [("5/s", 5), ("120/m", 2), ("3600/h", 1), ("1/min", 1 / 60)]
)
def test_rates_parse_to_tokens_per_second(spec, per_s):
    assert parse_rate(spec) == pytest.approx(per_s)


@pytest.mark.parametrize("spec", ["100", "x/s", "10/d", "0/s", "-1/m"])
def test_bad_rates_say_how_to_write_one(spec):
    with pytest.raises(ConfigError, match="rate_limit"):
        parse_rate(spec)


def test_rate_options_are_checked_on_the_task(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")
    with pytest.raises(ConfigError, match="need a rate_limit"):
        app.task(rate_burst=5)(lambda: None)
    with pytest.raises(ConfigError, match=r"rate_key 'user' .* not one of its parameters"):
        app.task(rate_limit="1/s", rate_key="user")(lambda x: None)

    @app.task(rate_limit="120/m", rate_key="user")
    def call(user, text):
        return text

    insert = call.build(("ann", "hi"), {})
    assert (insert.rate_key, insert.rate_per_s, insert.rate_burst) == ("user=ann", 2.0, 2.0)


def test_queue_rate_limit_settings_are_checked(tmp_path):
    app = Conveyor(f"sqlite:///{tmp_path}/c.db")
    with pytest.raises(ConfigError, match="rate_limit"):
        app.set_queue_rate_limit("q", "fast")
    with pytest.raises(ConfigError, match="burst"):
        app.set_queue_rate_limit("q", "10/s", burst=0)
    with pytest.raises(ConfigError, match="no queue named 'q'"):
        app.set_queue_rate_limit("q", "120/m")  # a typo is not a new queue
    app.set_queue_rate_limit("q", "120/m", force=True)  # burst defaults to one second's worth


def test_a_keyed_claims_window_narrows_while_claims_fill_and_widens_when_short():
    from conveyor.backends.sql.logic import WINDOW_MAX, WINDOW_MIN, next_window_factor

    factor = WINDOW_MAX
    for _ in range(5):  # claims come back full: look less far ahead
        factor = next_window_factor(factor, asked=100, got=100)
    assert factor == WINDOW_MIN
    factor = next_window_factor(factor, asked=100, got=40)  # keys full: look further
    assert factor == WINDOW_MIN * 2
    for _ in range(5):
        factor = next_window_factor(factor, asked=100, got=0)
    assert factor == WINDOW_MAX
