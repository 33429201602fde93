"""A recording stand-in for ateapi's template RPCs, for the kind and host stacks' live tests.

Those stacks install Substrate on a test cluster where no Substrate program runs (kwok nodes run
no container), so nothing would answer the stack's ActorTemplate resource on the API NodePort.
This answers in its place, over TLS with a certificate for `api.ate-system.svc` signed by the CA
the test cluster publishes as the servicedns trust bundle (so the stack's own `ca` step pins
it), and records every call with whether it carried a bearer token. It implements only what the
stack calls: CreateAtespace / DeleteAtespace, CreateActorTemplate (stored; its golden tag is
"built" at once), GetActorTemplate, DeleteActorTemplate; anything else is UNIMPLEMENTED. The
real server's behaviour is tested against the local backend (test_stack_templates.py,
test_existing_live.py); this fake only lets the install's wiring run end to end.

    python ateapi_fake.py --listen 127.0.0.1:30443 --cert s.crt --key s.key --log calls.jsonl
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import uuid
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from gym_substrate.ateapi import ateapi_pb2 as pb
from gym_substrate.ateapi import ateapi_pb2_grpc as pb_grpc


class Recorder(pb_grpc.ControlServicer):
    def __init__(self, log: Path) -> None:
        self.log = log
        self.lock = threading.Lock()
        self.atespaces: set[str] = set()
        self.templates: dict[str, pb.ActorTemplate] = {}

    def _record(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        token = dict(context.invocation_metadata()).get("authorization", "")
        entry = {
            "method": method,
            "request": json_format.MessageToDict(request),
            "bearer": token.startswith("Bearer ") and len(token) > len("Bearer "),
        }
        with self.lock, self.log.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    def CreateAtespace(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._record("CreateAtespace", request, context)
        name = request.atespace.metadata.name
        if name in self.atespaces:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Atespace {name} already exists")
        self.atespaces.add(name)
        return request.atespace

    def DeleteAtespace(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._record("DeleteAtespace", request, context)
        name = request.atespace.name
        if name not in self.atespaces:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Atespace {name} not found")
        if any(key.startswith(f"{name}/") for key in self.templates):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {name} is not empty")
        self.atespaces.discard(name)
        return pb.Atespace(metadata=pb.ResourceMetadata(name=name))

    def CreateActorTemplate(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._record("CreateActorTemplate", request, context)
        meta = request.actor_template.metadata
        key = f"{meta.atespace}/{meta.name}"
        if meta.atespace not in self.atespaces:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"Atespace {meta.atespace} not found"
            )
        if key in self.templates:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"ActorTemplate {key} already exists")
        stored = pb.ActorTemplate()
        stored.CopyFrom(request.actor_template)
        stored.metadata.uid = str(uuid.uuid4())
        self.templates[key] = stored
        return stored

    def GetActorTemplate(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._record("GetActorTemplate", request, context)
        key = f"{request.actor_template.atespace}/{request.actor_template.name}"
        found = self.templates.get(key)
        if found is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"ActorTemplate {key} not found")
        golden = found.status.golden_snapshot_status.golden_tag
        golden.atespace, golden.name = "ate-golden", found.metadata.uid
        return found

    def DeleteActorTemplate(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self._record("DeleteActorTemplate", request, context)
        key = f"{request.actor_template.atespace}/{request.actor_template.name}"
        found = self.templates.pop(key, None)
        if found is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"ActorTemplate {key} not found")
        return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--cert", required=True, type=Path)
    parser.add_argument("--key", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    args = parser.parse_args(argv)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControlServicer_to_server(Recorder(args.log), server)
    creds = grpc.ssl_server_credentials([(args.key.read_bytes(), args.cert.read_bytes())])
    server.add_secure_port(args.listen, creds)
    server.start()
    print(f"ateapi fake listening on {args.listen}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
