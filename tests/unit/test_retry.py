import random

import pytest

from conveyor import Backoff, ConfigError


def test_schedule_grows_exponentially_then_caps():
    b = Backoff(base=1, factor=2, cap=10, jitter=0)
    assert [b.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_jitter_stays_within_its_band_and_spreads():
    b = Backoff(base=4, factor=3, cap=1000, jitter=0.5)
    rng = random.Random(7)
    delays = [b.delay(3, rng) for _ in range(500)]
    assert all(18 <= d <= 36 for d in delays)  # 4 * 3**2 = 36, spread down to half
    assert max(delays) - min(delays) > 10


@pytest.mark.parametrize("kwargs", [{"base": -1}, {"factor": 0.5}, {"jitter": 2}])
def test_bad_backoff_is_refused(kwargs):
    with pytest.raises(ConfigError):
        Backoff(**kwargs)
