//! gRPC channels over unix sockets (the control socket, worker sockets):
//! `tt_serving_proto::uds::channel`, shared with ttctl.

pub use tt_serving_proto::uds::channel;
