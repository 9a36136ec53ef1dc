"""The temperature a language model samples at, one rule for ``predict``, a model's samples and
``serve``: 0 (the most likely token each time) or a finite number from ``MIN_TEMPERATURE`` to
``MAX_TEMPERATURE``.

Sampling divides the logits by the temperature: a positive temperature far below the minimum (1e-320,
a subnormal number) makes that quotient overflow to inf and the probabilities NaN, and one far above
the maximum samples as uniformly as the maximum does. Such a temperature is refused with the range
rather than quietly read as 0: a caller who means the most likely token says 0. Pure Python: the
server's processes check it without torch.
"""

from __future__ import annotations

from numbers import Real

MIN_TEMPERATURE = 1e-4
MAX_TEMPERATURE = 1e4
TEMPERATURES = "0 (the most likely token each time) or a number from 0.0001 to 10000"


def is_temperature(value: object) -> bool:
    """Whether ``value`` is 0 or a number in [MIN_TEMPERATURE, MAX_TEMPERATURE]: no bool, NaN,
    infinity or subnormal number, and no integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return False
    # Python compares an int with a float exactly, without converting it; NaN compares false.
    return value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE


def check_temperature(value: object, name: str = "temperature") -> float:
    """``value`` as a float temperature (-0.0 as 0.0); ValueError naming ``name`` and the range
    otherwise."""
    if not is_temperature(value):
        raise ValueError(f"{name} must be {TEMPERATURES}, got {value!r}")
    return abs(float(value))
