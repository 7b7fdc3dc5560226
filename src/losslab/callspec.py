"""Call-like text `name(key=value, ...)`: the one grammar behind loss specs and revisions.

Stdlib only, so every layer may import it (`losses.parse_loss_spec`, `plan.parse_registry_spec`
and `plan.parse_revision` build on it; each keeps its own validation of names and values).

Grammar (whitespace allowed around tokens):

    call   := NAME [ "(" [ arg ("," arg)* [","] ] ")" ]
    arg    := KEY "=" value
    value  := literal | inf | nan | bare-word
    literal := a Python literal (`ast.literal_eval`): 0.8, 1e-3, -2, 'x', "x", True, None, [1, 2]
    inf    := inf | -inf | infinity | nan  (any case, as `float()` reads them)
    bare-word := text without whitespace, quotes, commas or "=" (e.g. token-mean); only where the
                 caller allows it, and read as a string

Commas split arguments only outside quotes and brackets, so `k={'x': [1, 2]}` and `s='a,b'` are
one argument each. `format_call(*parse_call(text))` is a canonical form that parses back to the
same name and values.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

_CALL = re.compile(r"\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?:\((?P<args>.*)\))?\s*", re.DOTALL)
_KEYWORD = re.compile(r"\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=(?P<value>.*)", re.DOTALL)
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
_BARE = re.compile(r"[^\s,'\"=]+")
_BARE_OUT = re.compile(r"[A-Za-z_][\w.-]*")  # strings `format_value` may leave unquoted
_LITERALS = "number, inf, nan, quoted string, True/False/None, list, tuple or dict"


class CallSpecError(ValueError):
    """Text that does not follow the call grammar; `part` is the offending piece (None: the shape).

    The message names the whole text and the part, e.g. `cannot parse parameters 'low=0.1 high=2'
    in loss spec 'ppo(low=0.1 high=2)': value '0.1 high=2' is not a literal (...)`.
    """

    def __init__(self, message: str, *, text: str, part: str | None = None) -> None:
        super().__init__(message)
        self.text = text
        self.part = part


def split_top_level(text: str) -> list[str]:
    """Split `text` at commas outside quotes and brackets; parts are stripped, empty ones kept.

    A backslash inside quotes escapes the next character. An unclosed quote or bracket runs to
    the end of the text (the value parser then rejects that part).
    """
    parts: list[str] = []
    depth, quote, escaped, start = 0, "", False, 0
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def split_keyword(part: str) -> tuple[str, str] | None:
    """`(key, value text)` when `part` is `key=value` with an identifier key, else None."""
    match = _KEYWORD.fullmatch(part)
    if match is None:
        return None
    return match["key"], match["value"].strip()


def parse_value(text: str, *, bare_words: bool = False) -> Any:
    """One value: a Python literal, inf/nan, or (when `bare_words`) a bare word as a string.

    Raises:
        CallSpecError: the text is none of those; the message names it and what was expected.
    """
    value = text.strip()
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    if _NON_FINITE.fullmatch(value):
        return float(value)
    if bare_words and _BARE.fullmatch(value):
        return value
    expected = _LITERALS + (" or bare word" if bare_words else "")
    raise CallSpecError(
        f"value {value!r} is not a literal ({expected})" if value else "empty value",
        text=text,
        part=value,
    )


def parse_call(
    text: str, *, what: str = "call", bare_words: bool = False
) -> tuple[str, dict[str, Any]]:
    """Parse `name` or `name(key=value, ...)` into `(name, {key: value})`, in written order.

    Args:
        text: the call text.
        what: what the text is, for error messages (e.g. "loss spec").
        bare_words: read unquoted words such as `token-mean` as strings (loss specs do; plan
            registry specs and revisions do not, so a typo'd name is not silently a string).

    Raises:
        CallSpecError: the text is not of the form, an argument is not `key=value`, a value is not
            a literal, or a key is given twice; the message names the text and the bad part.
    """
    match = _CALL.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise CallSpecError(
            f"cannot parse {what} {text!r}: not a {what} of the form name or "
            "name(keyword=value, ...)",
            text=str(text),
        )
    name, args = match["name"], match["args"]
    kwargs: dict[str, Any] = {}
    parts = split_top_level(args) if args is not None and args.strip() else []
    for i, part in enumerate(parts):
        if not part and i == len(parts) - 1 and i > 0:
            continue  # one trailing comma
        where = f"cannot parse parameters {part!r} in {what} {text!r}"
        keyword = split_keyword(part)
        if keyword is None:
            reason = "empty argument between commas" if not part else "expected keyword=value"
            raise CallSpecError(f"{where}: {reason}", text=text, part=part)
        key, value_text = keyword
        if key in kwargs:
            raise CallSpecError(
                f"parameter {key!r} is given twice in {what} {text!r}", text=text, part=part
            )
        try:
            kwargs[key] = parse_value(value_text, bare_words=bare_words)
        except CallSpecError as exc:
            raise CallSpecError(f"{where}: {exc}", text=text, part=part) from None
    return name, kwargs


def format_value(value: Any, *, bare_words: bool = False) -> str:
    """The text `parse_value` reads back as `value` (floats exactly; inf/nan by name).

    Strings are double-quoted, or left bare when `bare_words` and the word reads back as itself.
    """
    if isinstance(value, str):
        if bare_words and _BARE_OUT.fullmatch(value) and _reads_as_itself(value):
            return value
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a Python string literal
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # inf, -inf, nan: `float()` words, not Python literals
    return repr(value)


def _reads_as_itself(word: str) -> bool:
    try:
        return parse_value(word, bare_words=True) == word
    except CallSpecError:
        return False


def format_call(name: str, kwargs: Mapping[str, Any], *, bare_words: bool = False) -> str:
    """`name(k=v, ...)` in argument order; `parse_call` of it gives back `name` and `kwargs`."""
    args = ", ".join(f"{k}={format_value(v, bare_words=bare_words)}" for k, v in kwargs.items())
    return f"{name}({args})"
