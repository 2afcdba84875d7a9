"""The one error type every public entry point raises for bad input."""

from __future__ import annotations


class SpecError(ValueError):
    """Bad input: names the problem, marks its position with a caret, says how to fix it.

    ``text`` is the string that was being read (a type, a mesh, a shard_order) and
    ``pos`` the 0-based offset of the offending character in it. ``subject`` is the
    word of the input the error is about (an axis name, a dtype, a number), so a reader
    that knows where that word was written can add the caret (see :meth:`at`).
    """

    def __init__(
        self,
        message: str,
        *,
        text: str | None = None,
        pos: int | None = None,
        hint: str | None = None,
        subject: str | None = None,
    ) -> None:
        self.message = message
        self.subject = subject
        self.text = text
        self.pos = pos
        self.hint = hint
        super().__init__(self._render())

    def at(self, text: str, pos: int | None) -> SpecError:
        """The same error, shown against ``text`` with a caret at ``pos``."""
        return SpecError(self.message, text=text, pos=pos, hint=self.hint, subject=self.subject)

    def _render(self) -> str:
        lines = [self.message]
        if self.text is not None:
            lines.append(f"    {self.text}")
            if self.pos is not None:
                pos = max(0, min(self.pos, len(self.text)))
                lines.append("    " + " " * pos + "^")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


def number_text(n: int, most: int = 30) -> str:
    """``n`` in digits, or "a number of N digits" past ``most`` digits: a message about a
    huge number must not itself fail at Python's 4,300-digit int-string limit, and a
    thousand digits tell a reader no more than their count."""
    if -(10**most) < n < 10**most:
        return str(n)
    import math

    digits = int(math.log10(abs(n))) + 1  # float rounding can miss by one next to a power of 10
    if 10 ** (digits - 1) > abs(n):
        digits -= 1
    elif 10**digits <= abs(n):
        digits += 1
    return f"{'a negative' if n < 0 else 'a'} number of {digits:,} digits"


def value_text(value: object) -> str:
    """``repr(value)`` for an error message, where a number too long to print (Python's
    4,300-digit limit) would otherwise raise while the message is built: an int of more than
    30 digits is "a number of N digits", anything else that cannot be printed is named by
    its type."""
    if isinstance(value, int) and not isinstance(value, bool):
        return number_text(value)
    try:
        return repr(value)
    except ValueError:
        return f"a {type(value).__name__} holding a number too long to print"
    except Exception:  # a repr that raises: the message names the type instead
        return f"a {type(value).__name__} that cannot be printed"


def locate(text: str | None, word: str, start: int = 0) -> int | None:
    """Offset of ``word`` as a whole identifier in ``text`` (for carets on semantic errors)."""
    if text is None:
        return None
    import re

    m = re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text[start:])
    return None if m is None else start + m.start()
