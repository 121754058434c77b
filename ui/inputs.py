"""Values from the page's controls and from API calls, checked with a one-line reason each.

Numbers arrive as floats, ints, strings or None (and, through the API, as anything at all);
a public app must answer every one of them with a readable message, never a traceback.
No torch here: the Plan tab uses it too.
"""

from __future__ import annotations

import math

from memstep.errors import MemstepError
from memstep.schedules import MAX_SIZE_TOKENS


def whole_number(value, name: str, least: int, most: int = MAX_SIZE_TOKENS) -> int:
    """A whole number from a control or an API call (numbers arrive as floats, ints or None;
    anything else gets one readable line)."""
    if value is None or value == "":
        raise MemstepError(f"{name} is empty: type a whole number")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MemstepError(f"{name} must be a whole number, not {type(value).__name__}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise MemstepError(f"{name} must be a whole number (got {str(value)[:40]!r})") from None
    if not math.isfinite(number) or not number.is_integer():
        raise MemstepError(f"{name} must be a whole number (got {str(value)[:40]!r})")
    if not least <= number <= most:
        raise MemstepError(f"{name} must be from {least:,} to {most:,} (got {number:.6g})")
    return int(number)


def choice(value, name: str, choices, default: str) -> str:
    """One of ``choices`` (case-insensitive); empty gives ``default``."""
    if value is None or value == "":
        return default
    if not isinstance(value, str) or value.strip().lower() not in choices:
        raise MemstepError(f"{name} must be one of {', '.join(choices)} (got {str(value)[:40]!r})")
    return value.strip().lower()


def flag(value, name: str) -> bool:
    """A yes/no setting: true or false (None, a control not sent, is false). Nothing else, not
    even 1 or "x": a public API answers a wrong type with its name, not with a guess."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise MemstepError(f"{name} must be true or false, not {type(value).__name__}")
    return value


def text(value, name: str, most: int) -> str:
    """A text field: a string of at most ``most`` characters (None is empty), valid Unicode."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MemstepError(f"{name} must be a text, not {type(value).__name__}")
    if len(value) > most:
        raise MemstepError(f"{name} must be at most {most:,} characters (got {len(value):,})")
    return valid_unicode(value, name)


def valid_unicode(value, name: str):
    """``value`` unchanged when it is not a string or encodes as UTF-8; a string holding an
    unpaired surrogate (JSON's "\\ud800" alone) is refused in one line: the tokenizer, the answer's
    JSON and the error message itself would each fail on it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise MemstepError(f"{name} holds an unpaired surrogate ({value[err.start]!r} at character "
                               f"{err.start:,}): send valid Unicode text") from None
    return value


def number(value, name: str, least: int, most: int) -> int:
    """A whole number from an API call: an int (or a float with no fraction, as JSON and the
    page's number boxes send them); no strings, no bools."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemstepError(f"{name} must be a whole number, not {type(value).__name__}")
    return whole_number(value, name, least, most)


def real(value, name: str) -> float:
    """A finite number from a control or an API call (no strings, no bools)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MemstepError(f"{name} must be a number (got {str(value)[:40]!r})")
    return float(value)


def names(value, name: str, choices) -> list[str]:
    """A list of names, each one of ``choices`` (a checkbox group's value)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v in choices for v in value):
        raise MemstepError(f"{name} must be a list of {', '.join(choices)}")
    return value
