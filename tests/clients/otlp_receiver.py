"""A real OTLP/gRPC trace receiver: the OpenTelemetry protocol's own Python
package (opentelemetry-proto, from PyPI) served by grpcio, as a collector
would take spans.

Usage: otlp_receiver.py OUT_FILE
Listens on 127.0.0.1 (a free port), prints `PORT <n>` on stdout once it
listens, then appends one JSON object per received span to OUT_FILE:
service (the resource's service.name), resource (its other attributes),
trace_id, span_id, parent_span_id (hex; "" for a root), name, kind,
attributes, events ([{name, attributes}]), status ({code, message}).
Runs until killed.
"""

import json
import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)


def value(v):
    """An AnyValue as plain JSON."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def Export(self, request, context):
        lines = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            service = resource.pop("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(
                        json.dumps(
                            {
                                "service": service,
                                "resource": resource,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "name": span.name,
                                "kind": span.kind,
                                "attributes": attributes(span.attributes),
                                "events": [
                                    {"name": e.name, "attributes": attributes(e.attributes)}
                                    for e in span.events
                                ],
                                "status": {
                                    "code": span.status.code,
                                    "message": span.status.message,
                                },
                            }
                        )
                    )
        with self.lock:
            with open(self.out, "a") as f:
                for line in lines:
                    f.write(line + "\n")
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    out = sys.argv[1]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(out), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
