"""How a client checks a tapdeck server's HTTPS certificate (standard library only: recipes use it).

Without a CA file a client trusts the usual public CAs; `--ca-file` (or `$TAPDECK_CA_FILE`) names a
PEM file of certificates to trust instead: the private CA that signed the server's certificate, or
a self-signed server certificate itself. A certificate nothing trusts is refused, never skipped.
"""

from __future__ import annotations

import os
import ssl

CA_FILE_ENV = "TAPDECK_CA_FILE"
"""Where `--ca-file` is read from when not given (what a server passes to the recipes it runs)."""


def server_trust(ca_file: str | os.PathLike[str] | None) -> ssl.SSLContext | bool:
    """What a client verifies the server with (httpx's `verify`): True, the public CAs, without a
    file; else a context trusting exactly the certificates in `ca_file`. ValueError naming the
    file when it cannot be read or holds no certificate."""
    if not ca_file:
        return True
    try:
        context = ssl.create_default_context(cafile=os.fspath(ca_file))
    except ssl.SSLError as exc:
        raise ValueError(f"--ca-file {ca_file} holds no PEM certificate ({exc.reason or exc})") from None
    except OSError as exc:
        raise ValueError(f"--ca-file {ca_file}: {exc.strerror or exc}") from None
    # A server certificate given as the file is trusted as it stands, not only the root of a chain.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def pinned_to(cert: str | os.PathLike[str]) -> ssl.SSLContext:
    """Trust exactly the certificate in `cert` under any host name: how a process reaches the
    server it started itself, over loopback, while the certificate names the host others use."""
    context = server_trust(cert)
    assert isinstance(context, ssl.SSLContext)
    context.check_hostname = False
    return context


def untrusted_certificate(exc: BaseException) -> str | None:
    """The verifier's reason when `exc` (or what caused it) is a refused server certificate."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen.verify_message or str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


__all__ = ["CA_FILE_ENV", "pinned_to", "server_trust", "untrusted_certificate"]
