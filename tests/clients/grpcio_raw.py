"""A non-Rust gRPC client (grpcio, the gRPC C-core) calling the daemon's
unix sockets the way an operator's Python script would: raw method paths and
hand-encoded protobuf bytes, no generated stubs.

Usage: grpcio_raw.py CONTROL_SOCKET WORKER_SOCKET MODEL
Prints one JSON object on stdout; tests/daemon.rs checks it.

grpc-core sends the socket path, percent-encoded, as `:authority`
(`tmp%2Fx%2Fcontrol.sock` for unix:/tmp/x/control.sock). The daemon's HTTP/2
stack (h2, via the `http` crate) refuses a `%` in an authority's host and
resets the stream with PROTOCOL_ERROR, so a client must name an authority
itself: `grpc.default_authority` (any plain host name; the daemon ignores it).
"""

import json
import sys

import grpc

AUTHORITY = [("grpc.default_authority", "localhost")]


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data, i):
    shift = 0
    value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def fields(data):
    """Top-level fields of a protobuf message: {number: [value, ...]}, with
    varints as ints and length-delimited fields as bytes."""
    out = {}
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            length, i = read_varint(data, i)
            value = data[i : i + length]
            i += length
        elif wire == 1:
            value = data[i : i + 8]
            i += 8
        elif wire == 5:
            value = data[i : i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire} in field {number}")
        out.setdefault(number, []).append(value)
    return out


def string_field(number, text):
    raw = text.encode()
    return varint(number << 3 | 2) + varint(len(raw)) + raw


def call(channel, method, request):
    return channel.unary_unary(method)(request, timeout=10)


def health(channel, service):
    """grpc.health.v1.Health/Check: HealthCheckRequest{service = 1};
    HealthCheckResponse{status = 1}, 1 = SERVING, 2 = NOT_SERVING."""
    reply = call(channel, "/grpc.health.v1.Health/Check", string_field(1, service))
    return fields(reply).get(1, [0])[0]


def main():
    control_path, worker_path, model = sys.argv[1:4]
    result = {"grpcio": grpc.__version__}

    with grpc.insecure_channel("unix:" + control_path, options=AUTHORITY) as control:
        result["health_daemon"] = health(control, "")
        result["health_model"] = health(control, model)
        result["health_inference"] = health(control, "tt.serving.v1.Inference")
        # StatusResponse{daemon = 1: DaemonInfo{pid = 2}, slots = 3: Slot{name = 1}}
        status = fields(call(control, "/tt.serving.v1.Control/Status", b""))
        daemon = fields(status[1][0])
        result["status_pid"] = daemon[2][0]
        result["status_slots"] = [fields(s)[1][0].decode() for s in status.get(3, [])]

    with grpc.insecure_channel("unix:" + worker_path, options=AUTHORITY) as worker:
        # Engine.Info: InfoResponse{context_length = 6}
        info = fields(call(worker, "/tt.serving.v1.Engine/Info", b""))
        result["worker_context_length"] = info.get(6, [0])[0]

    # Without an authority of its own, grpc-core's default is refused.
    # Recorded for the reader, not asserted: a later h2 may accept it.
    with grpc.insecure_channel("unix:" + control_path) as plain:
        try:
            call(plain, "/tt.serving.v1.Control/Status", b"")
            result["default_authority"] = "OK"
        except grpc.RpcError as err:
            result["default_authority"] = f"{err.code().name}: {err.details()}"

    print(json.dumps(result))


if __name__ == "__main__":
    main()
