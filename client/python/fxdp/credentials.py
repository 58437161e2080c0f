"""The channel credentials of ``fxdp.Client``: TLS, a client certificate and a bearer token, from
arguments or ``$FXDP_TLS_CA`` / ``$FXDP_TOKEN_FILE`` (docs/security.md)."""

from __future__ import annotations

import os
from typing import Optional, Union

import grpc


def _read(path: Union[str, os.PathLike], what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what} '{os.fspath(path)}': {e.strerror}") from None


def channel_credentials(
    tls_ca, token, token_file, tls_cert, tls_key
) -> Optional["grpc.ChannelCredentials"]:
    """TLS (+ a bearer token) credentials, or None for a plain channel (see Client)."""
    tls_ca = (tls_ca if tls_ca is not None else os.environ.get("FXDP_TLS_CA")) or None  # "": plain
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token is None:
        token_file = (
            token_file if token_file is not None else os.environ.get("FXDP_TOKEN_FILE") or None
        )
        if token_file is not None:
            token = _read(token_file, "token_file").decode("utf-8", "replace").strip()
            if not token:
                raise ValueError(f"token_file '{os.fspath(token_file)}' is empty")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together")
    if tls_ca is None:
        if token is not None or tls_cert is not None:
            raise ValueError(
                "a token or client certificate needs TLS: pass tls_ca (the CA of the server's "
                "certificate; gRPC sends tokens over TLS only)"
            )
        return None
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca, "tls_ca"),
        private_key=_read(tls_key, "tls_key") if tls_key is not None else None,
        certificate_chain=_read(tls_cert, "tls_cert") if tls_cert is not None else None,
    )
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds
