"""Generated stubs for Substrate's `ateapi` gRPC API.

Import `gym_substrate.ateapi.ateapi_pb2` and `gym_substrate.ateapi.ateapi_pb2_grpc`; the proto
is `ateapi.proto` beside them and `_generate.py` regenerates them.
"""
