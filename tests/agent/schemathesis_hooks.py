"""A check the agent's schemathesis run adds (loaded through SCHEMATHESIS_HOOKS).

schemathesis' own positive_data_acceptance fails on every 400 to a schema-valid request, but a
few 400s depend on the sandbox, not on the request's shape: a user name that is not in its
passwd, a path that is a directory. This check fails on any other 400 to a schema-valid request:
one the document should have ruled out.
"""

from __future__ import annotations

import json

import schemathesis

# The messages of the 400s that depend on what exists in the sandbox (_jobs.py, _files.py).
STATE_DEPENDENT = (
    "unknown user",
    "is a directory",
    "is not a directory",
    "is not a regular file",
    "END is before START",
)


@schemathesis.check
def schema_valid_requests_are_not_malformed(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    if case.method.upper() == "HEAD":  # no body says why; GET answers the same request
        return None
    message = json.loads(response.content)["error"]["message"]
    if any(reason in message for reason in STATE_DEPENDENT):
        return None
    msg = f"a schema-valid request was refused as malformed: {message}"
    raise AssertionError(msg)
