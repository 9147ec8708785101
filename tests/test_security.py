"""TLS is one option away, a plain client cannot join a TLS cluster, exposure is warned about."""

from __future__ import annotations

import shutil
import subprocess
import warnings

import pytest

from outcore import cluster
from outcore.errors import ClusterError

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A self-signed CA and a certificate it signed for 127.0.0.1 / localhost."""
    d = tmp_path_factory.mktemp("tls")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "node.key",
        "-out", "node.csr")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "node.pem")
    return {"tls_cert": str(d / "node.pem"), "tls_key": str(d / "node.key"),
            "tls_ca": str(d / "ca.pem")}


def test_tls_cluster_works_and_a_plain_client_cannot_join(certs):
    client = cluster.start("local", workers=1, memory_limit="400MiB", **certs)
    try:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(lambda x: x * 2, 21).result() == 42
        records = cluster.placement(client)
        assert records[0]["address"].startswith("tls://")
        with pytest.raises(ClusterError, match="No scheduler answered"):
            cluster.start(address.replace("tls://", "tcp://"))
        joined = cluster.start(address, **certs)  # a client with the certificate joins
        try:
            assert joined.submit(sum, [1, 2]).result() == 3
        finally:
            cluster.stop(joined)
    finally:
        cluster.stop(client)


@pytest.mark.parametrize(
    ("kind", "drop", "words"),
    [("local", "tls_ca", "tls_ca= is missing"), ("threads", None, "threads"),
     ("tcp://127.0.0.1:8786", None, "not tls://")],
)
def test_incomplete_or_inapplicable_tls_is_refused(certs, kind, drop, words):
    options = {k: v for k, v in certs.items() if k != drop}
    with pytest.raises(ClusterError, match=words):
        cluster.ClusterOptions(kind=kind, **options).validate()


def test_public_dashboard_warns():
    with pytest.warns(UserWarning, match="beyond this machine"):
        cluster.ClusterOptions(kind="local", dashboard_address=":8787").warn_if_exposed()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cluster.ClusterOptions(kind="local").warn_if_exposed()
