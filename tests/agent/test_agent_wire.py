"""One contract: the schema, validator and reply builder derived from each declaration agree.

Every message in `contract.MESSAGES` is declared once; `_wire` derives the JSON Schema of the
OpenAPI document, the request validation and the reply builder from it. These tests check the
three against each other for every declared message, with an independent JSON Schema validator
(`jsonschema`) as the referee, and that a field added to a declaration reaches all three.
No agent process: the fast lane runs them.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_agent._errors import ApiError
from sandbox_agent._fields import (
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
from sandbox_agent._openapi import openapi_document
from sandbox_agent._requests import parse_body, parse_exec_request, parse_pty_request
from sandbox_agent._wire import Node, WireError, declared, reply, schema, validate
from sandbox_agent.contract import (
    DEFAULT_MAX_OUTPUT_BYTES,
    MESSAGES,
    ExecRequest,
    Job,
    PtyRequest,
    PtyResize,
    PtySignal,
)

REQUESTS = (ExecRequest, PtyRequest, PtyResize, PtySignal)
_BY_NAME = {decl.__name__: decl for decl in MESSAGES}


def _check(decl: type, body: Any) -> None:
    """`body` is valid by the derived schema, as `jsonschema` (2020-12) judges it."""
    jsonschema.Draft202012Validator(schema(decl)).validate(body)


def _schema_accepts(decl: type, body: Any) -> bool:
    return jsonschema.Draft202012Validator(schema(decl)).is_valid(body)


# ----- generating valid values from a declaration


def _text(n: Node) -> st.SearchStrategy[str]:
    pattern, least = n.find(Pattern), n.find(MinLength)
    if pattern is not None:
        base = st.from_regex(pattern.regex, fullmatch=True)
    else:
        nul = "\x00" if n.find(NoNul) else ""
        alphabet = st.characters(exclude_categories=("Cs",), exclude_characters=nul)
        base = st.text(alphabet, min_size=least.length if least else 0, max_size=12)
    digits = n.find(DigitsAtMost)
    if digits is not None:  # a string of digits is a number; keep it in range
        base = base.filter(lambda s: not (s.isascii() and s.isdigit()) or len(s) < 10)
    shortest = least.length if least else 0
    return base.filter(
        lambda s: len(s) >= shortest and ("\x00" not in s or not n.find(NoNul)) and _utf8(s)
    )


def _utf8(text: str) -> bool:
    """Not a lone surrogate in it: JSON Schema cannot rule them out, the validator does."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _values(n: Node) -> st.SearchStrategy[Any]:
    r = n.find(Range)
    if n.kind == "union":
        return st.one_of([_values(b) for b in n.args])
    if n.kind == "str":
        return _text(n)
    if n.kind == "int":
        return st.integers(r and r.minimum, r and r.maximum)
    if n.kind == "number":
        low = r and (r.minimum if r.minimum is not None else r.exclusive_minimum)
        exclusive = bool(r and r.exclusive_minimum is not None)
        return st.floats(
            low, r and r.maximum, exclude_min=exclusive, allow_nan=False, allow_infinity=False
        )
    if n.kind == "enum":
        return st.sampled_from(n.args)
    if n.kind == "list":
        least = n.find(MinLength)
        items = st.lists(_values(n.args[0]), min_size=least.length if least else 0, max_size=3)
        return items.filter(lambda v: not n.find(FirstNotEmpty) or bool(v[0]))
    if n.kind == "dict":
        return st.dictionaries(_values(n.args[0]), _values(n.args[1]), max_size=3)
    if n.kind == "object":
        assert n.decl is not None
        return _bodies(n.decl)
    return st.just(True) if n.kind == "bool" else st.none()


def _bodies(decl: type) -> st.SearchStrategy[dict[str, Any]]:
    fields = declared(decl)
    required = {f.name: _values(f.node) for f in fields if f.required}
    optional = {f.name: _values(f.node) for f in fields if not f.required}
    return st.fixed_dictionaries(required, optional=optional)


# ----- the three agree on valid bodies


def test_the_served_document_holds_exactly_the_declared_messages() -> None:
    schemas = openapi_document()["components"]["schemas"]
    assert list(schemas) == [decl.__name__ for decl in MESSAGES]
    for name, derived in schemas.items():
        jsonschema.Draft202012Validator.check_schema(derived)
        assert derived == schema(_BY_NAME[name])


@pytest.mark.parametrize("decl", MESSAGES, ids=lambda d: d.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_generated_valid_body_round_trips(decl: type, data: st.DataObject) -> None:
    """Valid by the schema, accepted by the validator, rebuilt by `reply`, still valid."""
    body = data.draw(_bodies(decl))
    _check(decl, json.loads(json.dumps(body)))
    validated = validate(decl, body)
    assert set(validated) == {f.name for f in declared(decl)}
    for name, value in body.items():
        if value is not None:
            assert validated[name] == value, name
    rebuilt = reply(decl, validated)
    _check(decl, rebuilt)
    assert list(rebuilt) == [f.name for f in declared(decl) if f.name in rebuilt]


# ----- each constraint violation: refused by both, with a 400 that names the field


def _minimal(decl: type) -> dict[str, Any]:
    """The smallest valid body: required fields from their `Example` markers."""
    return {f.name: f.node.find(Example).value for f in declared(decl) if f.required}


_OFF_PATTERN = ("has space", "relative", "A=B")


def _violations(n: Node) -> list[tuple[str, Any]]:
    """(constraint, a value breaking it) for each constraint of a field's type."""
    out: list[tuple[str, Any]] = []
    for b in n.branches:
        r = b.find(Range)
        if r is not None and r.minimum is not None:
            out.append(("minimum", r.minimum - 1))
        if r is not None and r.exclusive_minimum is not None:
            out.append(("exclusiveMinimum", r.exclusive_minimum))
        if r is not None and r.maximum is not None:
            out.append(("maximum", r.maximum + 1))
        if b.find(MinLength) is not None:
            out.append(("minLength", "" if b.kind == "str" else []))
        if b.kind == "str" and b.find(NoNul) is not None:
            out.append(("NUL", "a\x00b"))
        if b.find(Pattern) is not None:
            regex = b.find(Pattern).regex
            out.append(("pattern", next(v for v in _OFF_PATTERN if not re.fullmatch(regex, v))))
        if b.find(FirstNotEmpty) is not None:
            out.append(("prefixItems", ["", "x"]))
        if b.kind == "enum":
            out.append(("enum", "NOT-A-MEMBER"))
    if not n.nullable:
        out.append(("type", None))
    takes_objects = any(b.kind == "dict" for b in n.branches)
    out.append(("type", ["a list"] if takes_objects else {"an": "object"}))
    return out


_CASES = [
    pytest.param(decl, f.name, value, id=f"{decl.__name__}.{f.name}:{what}")
    for decl in REQUESTS
    for f in declared(decl)
    for what, value in _violations(f.node)
]


@pytest.mark.parametrize(("decl", "name", "value"), _CASES)
def test_each_constraint_violation_is_a_400_naming_the_field(
    decl: type, name: str, value: Any
) -> None:
    body = {**_minimal(decl), name: value}
    assert _schema_accepts(decl, _minimal(decl))
    assert not _schema_accepts(decl, body), f"the schema accepts {body}"
    with pytest.raises(ApiError) as caught:
        parse_body(decl, body)
    assert (caught.value.status, caught.value.code) == (400, "bad_request")
    assert caught.value.message.startswith(name), caught.value.message


def test_a_key_or_value_of_an_object_field_is_checked_like_a_field() -> None:
    with pytest.raises(WireError, match=r"^env name 'A=B' is invalid: not empty, without '='"):
        validate(ExecRequest, {"command": "ls", "env": {"A=B": "x"}})
    with pytest.raises(WireError, match=r"^env\['A'\] must be a string, got 1$"):
        validate(ExecRequest, {"command": "ls", "env": {"A": 1}})
    assert not _schema_accepts(ExecRequest, {"command": "ls", "env": {"A": 1}})


def test_the_checks_json_schema_cannot_state_are_the_validators_alone() -> None:
    """A digit string past MAX_UID and a lone surrogate: schema-valid, but refused (400)."""
    for body in (
        {"command": "id", "user": "4294967295"},
        {"command": "cat", "stdin": "\ud800"},
    ):
        assert _schema_accepts(ExecRequest, body)
        with pytest.raises(ApiError, match="out of range|lone surrogates"):
            parse_exec_request(body)


@pytest.mark.parametrize("field", ["timeout_s", "max_output_bytes"])
@pytest.mark.parametrize("value", [10**400, -(10**400), float("inf"), float("nan")])
def test_numbers_past_any_float_are_a_400_not_a_crash(field: str, value: float) -> None:
    """JSON integers have no size limit (and Python's json reads 1e400 as inf, NaN as nan)."""
    with pytest.raises(ApiError, match=f"^{field} must be "):
        parse_exec_request({"command": "ls", field: value})


def test_unknown_fields_missing_fields_and_non_objects_are_400s_that_say_what_fits() -> None:
    cases = [
        (ExecRequest, {"command": "ls", "comand": "x"}, "unknown field(s) ['comand']"),
        (ExecRequest, {}, "command is required: it must be a non-empty string or"),
        (PtyResize, {"rows": 10}, 'rows and cols are both required, e.g. {"rows": 40'),
        (PtyRequest, [1], 'the body must be a JSON object such as {"command": "bash"'),
        (PtySignal, {"signal": 9}, "signal must be one of SIGHUP, SIGINT"),
    ]
    for decl, body, message in cases:
        assert not _schema_accepts(decl, body)
        with pytest.raises(ApiError) as caught:
            parse_body(decl, body)
        assert message in caught.value.message


# ----- the six nullable request fields: null means the default


def test_null_request_fields_take_their_documented_defaults() -> None:
    """contract.md: shell, env, max_output_bytes (exec) and env, rows, cols (pty) take null."""
    nulls = {"shell": None, "env": None, "max_output_bytes": None}
    _, spec = parse_exec_request({"command": "ls", **nulls})
    assert (spec.shell, spec.env, spec.max_output_bytes) == (
        "/bin/sh",
        (),
        DEFAULT_MAX_OUTPUT_BYTES,
    )
    _, pty = parse_pty_request({"env": None, "rows": None, "cols": None})
    assert (pty.env, pty.rows, pty.cols) == ((), 24, 80)
    assert _schema_accepts(ExecRequest, {"command": "ls", **nulls})
    with pytest.raises(ApiError, match="pty must be true or false, got null"):
        parse_pty_request({"pty": None})


# ----- a field added to a declaration reaches all three


class _ExtendedExec(ExecRequest, total=False):
    nice: Annotated[int | None, Range(minimum=0, maximum=19), Default(0), Doc("Niceness.")]


class _ExtendedJob(Job):
    cpu_ms: Annotated[float, Range(minimum=0)]


def test_a_field_added_to_a_request_reaches_schema_validator_and_builder() -> None:
    prop = schema(_ExtendedExec)["properties"]["nice"]
    assert prop == {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": 19,
        "default": 0,
        "description": "Niceness.",
    }
    assert validate(_ExtendedExec, {"command": "ls"})["nice"] == 0
    assert validate(_ExtendedExec, {"command": "ls", "nice": 5.0})["nice"] == 5
    with pytest.raises(
        WireError, match="^nice must be an integer 0..19, got 20, which is out of range$"
    ):
        validate(_ExtendedExec, {"command": "ls", "nice": 20})
    assert not _schema_accepts(_ExtendedExec, {"command": "ls", "nice": 20})
    assert reply(_ExtendedExec, {"command": "ls"})["nice"] == 0


def test_a_field_added_to_a_reply_must_be_supplied_by_its_builder() -> None:
    job = {
        "id": "j1",
        "state": "exited",
        "exit_code": 0,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "started_at": 1.0,
        "duration_ms": 2.0,
        "error": None,
    }
    assert schema(_ExtendedJob)["properties"]["cpu_ms"] == {"type": "number", "minimum": 0}
    assert "cpu_ms" in schema(_ExtendedJob)["required"]
    with pytest.raises(TypeError, match="lacks its field 'cpu_ms'"):
        reply(_ExtendedJob, job)
    with pytest.raises(TypeError, match=r"declares no field\(s\) \['cpu_ms'\]"):
        reply(Job, {**job, "cpu_ms": 1.0})
    built = reply(_ExtendedJob, {**job, "cpu_ms": 1.0})
    _check(_ExtendedJob, built)
    assert not _schema_accepts(_ExtendedJob, job)
