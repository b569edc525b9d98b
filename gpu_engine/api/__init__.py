"""Front doors of the engine: the public gRPC servicer, its protobuf conversion, and the serve entry point."""
