"""``fxdp.ServerError``: a failed RPC as the client raises it, with the gRPC status code and the
server's message; a server that cannot be reached is named by the address tried."""

from __future__ import annotations

import grpc


class ServerError(RuntimeError):
    """An RPC failed: ``code`` is the grpc.StatusCode, the message is the server's."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code


# gRPC's client-side texts for a server it cannot reach (a server's own UNAVAILABLE, e.g.
# "worker ... was lost", stays as is).
_UNREACHABLE = (
    "failed to connect to all addresses",
    "DNS resolution failed",
    "Connection refused",
)


def server_error(e: grpc.RpcError, address: str) -> ServerError:
    """The ServerError for a failed RPC; a server that cannot be reached is named by the address
    tried, with how to start one (gRPC's own text says only "failed to connect to all addresses")."""
    if e.code() == grpc.StatusCode.UNAVAILABLE and any(
        t in (e.details() or "") for t in _UNREACHABLE
    ):
        return ServerError(
            e.code(),
            f"cannot reach fxdp-server at {address} ({e.details()}); start one "
            "there (`fxdp-server --local-workers 2` listens on 127.0.0.1:50051) or pass its "
            'address: fxdp.Client("HOST:PORT") or FXDP_SERVER=HOST:PORT',
        )
    return ServerError(e.code(), e.details())
