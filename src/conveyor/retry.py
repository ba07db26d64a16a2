"""Capped exponential backoff with jitter."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (1-based) is ``min(cap, base * factor ** (n - 1))``,
    then spread by ``jitter``: multiplied by a uniform factor in ``[1 - jitter, 1]``
    so that jobs failing together do not all come back at the same instant.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ConfigError(
                f"backoff base and cap must be >= 0, got base={self.base} cap={self.cap}"
            )
        if self.factor < 1:
            raise ConfigError(f"backoff factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"backoff jitter must be between 0 and 1, got {self.jitter}")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (the first retry is 1)."""
        raw = min(self.cap, self.base * self.factor ** max(0, retry - 1))
        spread = (rng or random).uniform(1.0 - self.jitter, 1.0)
        return raw * spread

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Backoff | None:
        return cls(**data) if data else None

    @classmethod
    def coerce(cls, value: Backoff | dict[str, Any] | None) -> Backoff | None:
        if value is None or isinstance(value, Backoff):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise ConfigError(
            f"backoff must be a conveyor.Backoff or a dict, got {type(value).__name__}"
        )
