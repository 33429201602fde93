"""Everything the agent derives from the declarations in `contract.py`: one walker, three uses.

- `validate(Decl, body)`: a parsed JSON request body checked against its declaration, with
  defaults filled in, or `WireError` whose message names the field and what it accepts;
- `reply(Decl, values)`: a reply built in declaration order, refusing a missing or unknown key;
- `schema(Decl)`: the declaration as a JSON Schema (OpenAPI 3.1) object;
- `conforms(Decl, body)`: a parsed JSON reply checked against its declaration (the provider's
  client checks every reply so), or `WireError` naming the field.

A field is its type (str, int, float, bool, None, Literal, list, dict, a nested TypedDict or a
union of those) with the markers of `_fields` in `typing.Annotated`. Markers on a nullable field
(`Annotated[int | None, Range(...)]`) constrain its non-null value. Standard library only.
"""

from __future__ import annotations

import copy
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, get_args, get_origin

from ._fields import (
    ContentEncoding,
    Default,
    DigitsAtMost,
    Doc,
    Example,
    FirstNotEmpty,
    MinLength,
    NoNul,
    Pattern,
    Range,
)
from ._numbers import json_integer, parse_decimal

__all__ = [
    "Field",
    "Node",
    "WireError",
    "conforms",
    "declared",
    "describe",
    "reply",
    "schema",
    "validate",
]

_NO_NUL = "^[^\\x00]*$"
_SCALARS = {str: "str", int: "int", float: "number", bool: "bool", type(None): "null"}
# Markers that describe the field rather than constrain its value.
_FIELD_MARKERS = (Doc, Default, Example)


class WireError(ValueError):
    """A body that breaks its declaration; the message names the field and what it accepts."""


@dataclass(frozen=True, eq=False)
class Node:
    """One type of the contract: its kind, its markers and its parts."""

    kind: str  # str int number bool null enum list dict object union
    meta: tuple[object, ...] = ()
    args: tuple[Any, ...] = ()  # enum: values; list: (item,); dict: (key, value); union: branches
    decl: type | None = None  # object: the TypedDict

    def find(self, cls: type[Any]) -> Any:
        return next((m for m in self.meta if isinstance(m, cls)), None)

    @property
    def branches(self) -> tuple[Node, ...]:
        """The non-null alternatives of a union (the node itself otherwise)."""
        if self.kind != "union":
            return (self,)
        return tuple(b for b in self.args if b.kind != "null")

    @property
    def nullable(self) -> bool:
        return self.kind == "null" or (
            self.kind == "union" and any(b.kind == "null" for b in self.args)
        )


@dataclass(frozen=True, eq=False)
class Field:
    name: str
    node: Node
    required: bool


def node(tp: Any, meta: tuple[object, ...] = ()) -> Node:
    """`tp` (a contract type, possibly Annotated) as a Node."""
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return node(tp.__origin__, meta + tuple(tp.__metadata__))
    if origin in (typing.Required, typing.NotRequired):
        return node(get_args(tp)[0], meta)
    if tp in _SCALARS:
        return Node(_SCALARS[tp], meta)
    if origin is Literal:
        return Node("enum", meta, get_args(tp))
    if origin is list:
        return Node("list", meta, (node(get_args(tp)[0]),))
    if origin is dict:
        key, value = get_args(tp)
        return Node("dict", meta, (node(key), node(value)))
    if origin in (typing.Union, types.UnionType):
        return _union(get_args(tp), meta)
    if typing.is_typeddict(tp):
        return Node("object", meta, decl=tp)
    raise TypeError(f"the contract cannot declare {tp!r}")


def _union(members: tuple[Any, ...], meta: tuple[object, ...]) -> Node:
    """A union; value markers on it go to its one non-null branch."""
    own = tuple(m for m in meta if isinstance(m, _FIELD_MARKERS))
    pushed = tuple(m for m in meta if not isinstance(m, _FIELD_MARKERS))
    branches = [node(m) for m in members]
    if pushed:
        real = [i for i, b in enumerate(branches) if b.kind != "null"]
        if len(real) != 1:
            raise TypeError(f"markers {pushed} on a union of several types: put them on one")
        branch = branches[real[0]]
        branches[real[0]] = Node(branch.kind, branch.meta + pushed, branch.args, branch.decl)
    return Node("union", own, tuple(branches))


@cache
def declared(decl: type) -> tuple[Field, ...]:
    """The fields of a TypedDict declaration, in order."""
    hints = typing.get_type_hints(decl, include_extras=True)
    required = decl.__required_keys__  # type: ignore[attr-defined]
    return tuple(Field(name, node(tp), name in required) for name, tp in hints.items())


# ----- describing a type in a message


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _phrase(n: Node) -> str:
    """One alternative of `n` in words."""
    if n.kind == "str":
        pattern, least = n.find(Pattern), n.find(MinLength)
        if pattern is not None:
            return pattern.says or f"a string matching {pattern.regex.strip('^$')}"
        return "a non-empty string" if least is not None and least.length else "a string"
    if n.kind in ("int", "number"):
        base = "an integer" if n.kind == "int" else "a number"
        r = n.find(Range)
        if r is None:
            return base
        if r.minimum is not None and r.maximum is not None:
            return f"{base} {_number(r.minimum)}..{_number(r.maximum)}"
        parts = [f"> {_number(r.exclusive_minimum)}"] if r.exclusive_minimum is not None else []
        parts += [f">= {_number(r.minimum)}"] if r.minimum is not None else []
        parts += [f"at most {_number(r.maximum)}"] if r.maximum is not None else []
        return f"{base} {' and '.join(parts)}"
    if n.kind == "enum":
        return json.dumps(n.args[0]) if len(n.args) == 1 else f"one of {', '.join(n.args)}"
    if n.kind == "list":
        item = n.args[0]
        nouns = {"str": "strings", "int": "integers", "number": "numbers"}
        least = "a non-empty list" if n.find(MinLength) else "a list"
        return f"{least} of {nouns.get(item.kind, 'values')}"
    if n.kind == "dict":
        return f"an object mapping names to {'strings' if n.args[1].kind == 'str' else 'values'}"
    return "a JSON object"


def _alternatives(n: Node) -> list[str]:
    if n.kind == "union":
        return [word for b in n.args for word in _alternatives(b)]
    return {"null": ["null"], "bool": ["true", "false"]}.get(n.kind) or [_phrase(n)]


def describe(n: Node) -> str:
    """What `n` accepts, in words: "an integer 1..65535 or null"."""
    words = _alternatives(n)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _preview(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _wrong(n: Node, value: Any, path: str, why: str = "") -> WireError:
    return WireError(f"{path} must be {describe(n)}, got {_preview(value)}{why}")


def example(decl: type) -> str:
    """A small valid body of `decl`, from its fields' `Example` markers."""
    shown = {f.name: f.node.find(Example).value for f in declared(decl) if f.node.find(Example)}
    return json.dumps(shown)


# ----- validating a request body


def validate(decl: type, body: Any, path: str = "the body") -> dict[str, Any]:
    """`body` checked against `decl`: every declared field present (defaults filled in)."""
    fields = declared(decl)
    if not isinstance(body, dict):
        raise WireError(f"{path} must be a JSON object such as {example(decl)}")
    names = [f.name for f in fields]
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise WireError(f"unknown field(s) {unknown}; allowed fields: {names}")
    if any(f.required and f.name not in body for f in fields):
        raise WireError(_missing(decl, fields))
    prefix = "" if path == "the body" else f"{path}."
    out: dict[str, Any] = {}
    for f in fields:
        raw = body.get(f.name)
        default = f.node.find(Default)
        if raw is None and default is not None and (f.name not in body or f.node.nullable):
            out[f.name] = copy.deepcopy(default.value)
        elif f.name not in body:
            out[f.name] = None
        else:
            out[f.name] = _value(f.node, raw, prefix + f.name)
    return out


def _missing(decl: type, fields: tuple[Field, ...]) -> str:
    required = [f for f in fields if f.required]
    if len(required) == 1:
        return f"{required[0].name} is required: it must be {describe(required[0].node)}"
    names = [f.name for f in required]
    listed = f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} are {'both' if len(names) == 2 else 'all'} required, e.g. {example(decl)}"


def _accepts(n: Node, value: Any) -> bool:
    """Whether `value` has the JSON type of `n` (its limits are checked later)."""
    kind = n.kind
    if kind == "null":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return json_integer(value) is not None
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "enum":
        return any(type(value) is type(v) for v in n.args)
    python = {"str": str, "list": list, "dict": dict, "object": dict}[kind]
    return isinstance(value, python)


def _value(n: Node, value: Any, path: str) -> Any:
    if n.kind == "union":
        for branch in n.args:
            if _accepts(branch, value):
                return _value(branch, value, path)
        raise _wrong(n, value, path)
    if not _accepts(n, value):
        raise _wrong(n, value, path)
    if n.kind == "int":
        value = json_integer(value)
    if n.kind in ("int", "number"):
        _check_range(n, value, path)
    elif n.kind == "str":
        _check_text(n, value, path)
    elif n.kind == "enum" and value not in n.args:
        raise _wrong(n, value, path)
    elif n.kind == "list":
        return _list(n, value, path)
    elif n.kind == "dict":
        return _dict(n, value, path)
    elif n.kind == "object":
        assert n.decl is not None
        return validate(n.decl, value, path)
    return value


def _check_range(n: Node, value: float, path: str) -> None:
    r = n.find(Range)
    if r is None:
        return
    inside = (
        (not isinstance(value, float) or math.isfinite(value))  # an int may be past any float
        and (r.minimum is None or value >= r.minimum)
        and (r.exclusive_minimum is None or value > r.exclusive_minimum)
        and (r.maximum is None or value <= r.maximum)
    )
    if not inside:
        raise _wrong(n, value, path, ", which is out of range")


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _check_text(n: Node, value: str, path: str) -> None:
    least = n.find(MinLength)
    if least is not None and len(value) < least.length:
        if not value:
            raise WireError(f"{path} must not be empty")
        raise _wrong(n, value, path)
    if n.find(NoNul) is not None and "\x00" in value:
        raise WireError(f"{path} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise WireError(f"{path} must be valid Unicode (no lone surrogates)") from None
    pattern = n.find(Pattern)
    if pattern is not None and _regex(pattern.regex).fullmatch(value) is None:
        raise _wrong(n, value, path)
    digits = n.find(DigitsAtMost)
    ascii_digits = value.isascii() and value.isdigit()
    if digits is not None and ascii_digits and parse_decimal(value, digits.maximum) is None:
        raise WireError(
            f"{path} {_preview(value)} is out of range: a string of ASCII digits is "
            f"{digits.what} 0..{digits.maximum}"
        )


def _list(n: Node, value: list[Any], path: str) -> list[Any]:
    least = n.find(MinLength)
    if least is not None and len(value) < least.length:
        raise _wrong(n, value, path)
    items = [_value(n.args[0], item, f"{path}[{i}]") for i, item in enumerate(value)]
    if n.find(FirstNotEmpty) is not None and items and not items[0]:
        raise WireError(f"{path}[0] (the program) must not be empty")
    return items


def _dict(n: Node, value: dict[str, Any], path: str) -> dict[str, Any]:
    key_node, value_node = n.args
    out = {}
    for key, item in value.items():
        try:
            _value(key_node, key, "")
        except WireError:
            raise WireError(f"{path} name {key!r} is invalid: {describe(key_node)}") from None
        out[key] = _value(value_node, item, f"{path}[{key!r}]")
    return out


# ----- checking a reply


def conforms(decl: type, body: Any, path: str = "the reply") -> None:
    """`body` holds every field `decl` requires, each as declared, else `WireError`.

    Fields `decl` does not name are let through: a newer agent may add some to a reply.
    """
    if not isinstance(body, dict):
        raise WireError(f"{path} must be a JSON object, got {_preview(body)}")
    for f in declared(decl):
        if f.name in body:
            _value(f.node, body[f.name], f.name)
        elif f.required:
            raise WireError(f"{f.name} is missing: it must be {describe(f.node)}")


# ----- building a reply


def reply(decl: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The reply `decl` with `values`, in declaration order; a missing or unknown key is a bug."""
    fields = declared(decl)
    unknown = set(values) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"{decl.__name__} declares no field(s) {sorted(unknown)}")
    out: dict[str, Any] = {}
    for f in fields:
        if f.name in values:
            out[f.name] = _plain(f.node, values[f.name])
        elif (default := f.node.find(Default)) is not None:
            out[f.name] = copy.deepcopy(default.value)
        elif f.required:
            raise TypeError(f"{decl.__name__} reply lacks its field {f.name!r}")
    return out


def _plain(n: Node, value: Any) -> Any:
    """`value` as JSON data: nested declarations built by `reply`, tuples as lists."""
    if isinstance(value, Mapping) and n.kind == "object" and n.decl is not None:
        return reply(n.decl, value)
    if isinstance(value, tuple):
        return list(value)
    return value


# ----- the JSON Schema


def schema(decl: type) -> dict[str, Any]:
    """`decl` as a JSON Schema object (OpenAPI 3.1): closed, its required fields listed."""
    fields = declared(decl)
    out: dict[str, Any] = {"type": "object"}
    required = [f.name for f in fields if f.required]
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    out["properties"] = {f.name: _schema(f.node) for f in fields}
    return out


def _schema(n: Node) -> dict[str, Any]:
    if n.kind == "union":
        real = n.branches
        if len(real) == 1 and real[0].kind in ("str", "int", "number", "bool", "dict"):
            out = _schema(real[0])
            out["type"] = [out["type"], "null"]
        else:
            out = {"oneOf": [_schema(b) for b in real]}
            if n.nullable:
                out["oneOf"].append({"type": "null"})
    else:
        out = _plain_schema(n)
    default, doc = n.find(Default), n.find(Doc)
    if default is not None:
        out["default"] = copy.deepcopy(default.value)
    if doc is not None:
        out["description"] = doc.text
    return out


def _plain_schema(n: Node) -> dict[str, Any]:
    kind = n.kind
    if kind == "enum":
        return {"const": n.args[0]} if len(n.args) == 1 else {"enum": list(n.args)}
    if kind == "object":
        assert n.decl is not None
        return schema(n.decl)
    if kind == "list":
        item = _schema(n.args[0])
        out: dict[str, Any] = {"type": "array"}
        if n.find(MinLength) is not None:
            out["minItems"] = n.find(MinLength).length
        if n.find(FirstNotEmpty) is not None:
            out["prefixItems"] = [{**item, "minLength": 1}]
        out["items"] = item
        return out
    if kind == "dict":
        names = {k: v for k, v in _schema(n.args[0]).items() if k != "type"}
        return {
            "type": "object",
            "propertyNames": names,
            "additionalProperties": _schema(n.args[1]),
        }
    json_type = {"str": "string", "int": "integer", "number": "number", "bool": "boolean"}
    out = {"type": json_type.get(kind, "null")}
    if kind == "str":
        least, pattern = n.find(MinLength), n.find(Pattern)
        if least is not None:
            out["minLength"] = least.length
        if pattern is not None or n.find(NoNul) is not None:
            out["pattern"] = pattern.regex if pattern is not None else _NO_NUL
        if (encoding := n.find(ContentEncoding)) is not None:
            out["contentEncoding"] = encoding.name
    r = n.find(Range)
    if r is not None:
        bounds = {"minimum": r.minimum, "exclusiveMinimum": r.exclusive_minimum}
        bounds["maximum"] = r.maximum
        out.update({k: v for k, v in bounds.items() if v is not None})
    return out
