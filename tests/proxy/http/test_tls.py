"""HTTPS where the bind leaves loopback: `serve` with a certificate and key answers HTTPS (uvicorn's
own TLS); `attach`, `rollout --server` and the recipes' admin client refuse a certificate they do
not trust and go through with `--ca-file`; a bind beyond loopback without TLS says in one line what
crosses the network readable. Every certificate is made here; every connection is to 127.0.0.1."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tapdeck.app.commands.attach import Target, _check
from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ConfigError, ServerConfig, TlsFiles, check_tls, cleartext_warning
from tapdeck.runner.recipes.admin_client import AdminClient, AdminError
from tapdeck.schema.tls import server_trust
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import server_with_upstream
from tests.support.ports import free_port

STRONG_KEY = "Tls-Test-Admin-Key-4f9c2e7a1b3d5e8f0a2c"
WAIT_S = 120


def make_certificate(folder: Path, *names: str) -> TlsFiles:
    """A self-signed certificate for `names` (IP addresses or DNS names) and its key, as PEM files."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    files = TlsFiles(cert=folder / "cert.pem", key=folder / "key.pem")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.key.chmod(0o600)
    return files


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_certificate(tmp_path_factory.mktemp("cert"), "127.0.0.1", "localhost")


@pytest.fixture(scope="module")
def server(tls, tmp_path_factory):
    with server_with_upstream(tmp_path_factory.mktemp("tls") / "data", tls=tls) as (_up, srv):
        yield srv


def tapdeck(*args: str, tmp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`tapdeck ARGS` in its own process, with none of the user's keys, data or CA file."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("TAPDECK_ADMIN_KEY", "TAPDECK_CA_FILE"))
    }
    env = (
        clean
        | {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "TAPDECK_DATA_DIR": str(tmp / "data"),
            "XDG_CONFIG_HOME": str(tmp / "config"),
            "COLUMNS": "200",
        }
        | (env or {})
    )
    return subprocess.run(
        [sys.executable, "-c", "from tapdeck.app.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def last_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.strip()][-1]


def test_the_server_answers_https_with_its_certificate(server, tls):
    assert server.url.startswith("https://127.0.0.1:")
    reply = httpx.get(f"{server.url}/health", verify=server_trust(tls.cert), timeout=30)
    assert reply.status_code == 200 and reply.json()["status"] == "ok"
    # Sessions advertise the address sandboxes use: https, as the server now is.
    opened = httpx.post(
        f"{server.url}/admin/sessions",
        json={},
        verify=server_trust(tls.cert),
        timeout=60,
        headers={"Authorization": f"Bearer {server.admin_key}"},
    )
    assert opened.status_code == 200, opened.text
    assert all(url.startswith("https://") for url in opened.json()["base_urls"].values())


def test_plain_http_to_the_https_port_gets_no_http_answer(server):
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: tapdeck\r\n\r\n")
        try:
            reply = sock.recv(4096)
        except ConnectionResetError:
            reply = b""
    assert not reply.startswith(b"HTTP/1.1 200")


def test_a_client_without_the_ca_refuses_the_certificate(server):
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{server.url}/health", timeout=30)


@pytest.mark.medium
def test_attach_refuses_an_untrusted_certificate_and_goes_through_with_the_ca_file(server, tls, tmp_path):
    refused, _ = asyncio.run(_check(Target("s", server.url, server.admin_key, verify=True)))
    assert refused is not None and "does not trust" in refused and "--ca-file" in refused
    trusted = Target("s", server.url, server.admin_key, verify=server_trust(tls.cert))
    assert asyncio.run(_check(trusted)) == (None, False)
    # The command line: the same refusal, one line, exit 1 (the TUI never starts).
    result = tapdeck("attach", server.url, "--admin-key", server.admin_key, tmp=tmp_path)
    assert result.returncode == 1
    assert "does not trust" in last_line(result) and "--ca-file" in last_line(result)
    result = tapdeck(
        "attach",
        server.url,
        "--admin-key",
        server.admin_key,
        "--ca-file",
        str(tmp_path / "missing.pem"),
        tmp=tmp_path,
    )
    assert result.returncode == 2 and "missing.pem" in last_line(result)


@pytest.mark.medium
def test_rollout_server_refuses_an_untrusted_certificate_and_goes_through_with_the_ca_file(
    server, tls, tmp_path
):
    """Resuming a run the server does not have: with the CA the server's own 404 comes back, so
    the request went through; without it the certificate is refused first."""
    args = ("rollout", "--server", server.url, "--admin-key", server.admin_key, "--resume", "run-nonexistent")
    refused = tapdeck(*args, tmp=tmp_path)
    assert refused.returncode == 1
    assert "does not trust" in last_line(refused) and "--ca-file" in last_line(refused)
    through = tapdeck(*args, "--ca-file", str(tls.cert), tmp=tmp_path)
    assert through.returncode == 1
    assert "no run run-nonexistent on the server" in last_line(through), through.stderr
    from_env = tapdeck(*args, tmp=tmp_path, env={"TAPDECK_CA_FILE": str(tls.cert)})
    assert "no run run-nonexistent on the server" in last_line(from_env), from_env.stderr


@pytest.mark.medium
def test_train_server_refuses_an_untrusted_certificate_and_goes_through_with_the_ca_file(
    server, tls, tmp_path
):
    args = ("train", "--server", server.url, "--admin-key", server.admin_key, "--list")
    refused = tapdeck(*args, tmp=tmp_path)
    assert refused.returncode == 1
    assert "does not trust" in last_line(refused) and "--ca-file" in last_line(refused)
    listed = tapdeck(*args, "--ca-file", str(tls.cert), tmp=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "data-check" in listed.stdout


def test_the_recipes_admin_client_refuses_an_untrusted_certificate_and_goes_through_with_it(server, tls):
    untrusted = AdminClient(server.url, server.admin_key, timeout_s=30)
    try:
        with pytest.raises(AdminError, match="does not trust") as refused:
            untrusted.run("run-nonexistent")
        assert refused.value.status == 0
    finally:
        untrusted.close()
    trusted = AdminClient(server.url, server.admin_key, timeout_s=30, ca_file=str(tls.cert))
    try:
        with pytest.raises(AdminError) as answered:
            trusted.run("run-nonexistent")
        assert answered.value.status == 404
    finally:
        trusted.close()


def test_a_server_trusts_its_own_certificate_under_any_host_name(tmp_path):
    """A certificate naming only the public host: the server's own health check over loopback
    (pinned to that certificate) passes, while a client checking host names refuses 127.0.0.1."""
    tls = make_certificate(tmp_path / "cert", "tapdeck.example")
    up = FakeVllm().start()
    try:
        with LocalServer(
            ServerConfig(
                host="127.0.0.1", port=0, engine_url=up.base_url, data_dir=tmp_path / "data", tls=tls
            )
        ) as server:
            assert (
                httpx.get(f"{server.url}/health", verify=server.client_trust, timeout=30).status_code == 200
            )
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                httpx.get(f"{server.url}/health", verify=server_trust(tls.cert), timeout=30)
    finally:
        up.stop()


def test_a_key_that_is_not_the_certificates_is_refused_by_name(tmp_path):
    one = make_certificate(tmp_path / "one", "127.0.0.1")
    other = make_certificate(tmp_path / "other", "127.0.0.1")
    with pytest.raises(ConfigError, match="--tls-key") as refused:
        check_tls(TlsFiles(cert=one.cert, key=other.key))
    assert str(other.key) in str(refused.value)
    with pytest.raises(ConfigError, match="No such file"):
        check_tls(TlsFiles(cert=tmp_path / "nope.pem", key=one.key))
    check_tls(one)


@pytest.mark.parametrize(
    "host, tls, warned",
    [
        ("0.0.0.0", False, True),
        ("192.0.2.10", False, True),
        ("::", False, True),
        ("0.0.0.0", True, False),
        ("127.0.0.1", False, False),
        ("::1", False, False),
        ("localhost", False, False),
    ],
)
def test_only_a_bind_beyond_loopback_without_tls_is_warned(tmp_path, host, tls, warned):
    files = TlsFiles(cert=tmp_path / "c.pem", key=tmp_path / "k.pem") if tls else None
    line = cleartext_warning(ServerConfig(host=host, data_dir=tmp_path, tls=files))
    assert (line is not None) == warned
    if line is not None:
        assert "\n" not in line and "in the clear" in line and "--tls-cert" in line
        assert all(word in line for word in ("session keys", "admin key", "prompt"))


def _serve_stderr(args: list[str], tmp: Path, engine_url: str) -> tuple[str, str]:
    """Start `tapdeck serve ARGS` on 0.0.0.0 (reached over 127.0.0.1 only), wait for its first
    line on stdout, stop it; its stdout and stderr."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAPDECK_")} | {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "TAPDECK_ADMIN_KEY": STRONG_KEY,
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from tapdeck.app.cli import main; main()",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--engine",
            engine_url,
            "--data-dir",
            str(tmp / "data"),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    stuck = threading.Timer(WAIT_S, process.kill)  # a server that never starts ends the wait below
    stuck.start()
    try:
        first = process.stdout.readline()  # "tapdeck server at …" once it answers
    finally:
        stuck.cancel()
        process.terminate()
        out, err = process.communicate(timeout=60)
    assert first.startswith("tapdeck server at"), (first, err)
    return first + out, err


@pytest.mark.medium
def test_serve_beyond_loopback_without_tls_starts_and_says_what_is_in_the_clear(tmp_path, tls):
    up = FakeVllm().start()
    try:
        out, err = _serve_stderr([], tmp_path / "plain", up.base_url)
        warnings = [line for line in err.splitlines() if "in the clear" in line]
        assert len(warnings) == 1, err
        assert warnings[0].startswith("tapdeck serve: warning: 0.0.0.0 is beyond loopback")
        out, err = _serve_stderr(
            ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)], tmp_path / "tls", up.base_url
        )
        assert "https://0.0.0.0:" in out
        assert "in the clear" not in err
    finally:
        up.stop()
