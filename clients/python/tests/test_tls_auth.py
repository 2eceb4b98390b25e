"""TLS and bearer tokens against a real server: https with a certificate
the client trusts through ca_file, a tokens file with an admin and a read
token."""

import asyncio
import datetime
import ipaddress
import json
import os
import subprocess
import tempfile

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import leasehold
from leasehold import errors as E
from servers import Cluster, build_binary


def self_signed(dir_):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leasehold-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cf, kf = os.path.join(dir_, "cert.pem"), os.path.join(dir_, "key.pem")
    with open(cf, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(kf, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    os.chmod(kf, 0o600)
    return cf, kf


def token(binary, name, scopes):
    out = subprocess.run([binary, "token", "create", "--name", name, "--scopes", scopes, "--json"],
                         check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    return d["token"], d["entry"]


@pytest.fixture(scope="module")
def secured():
    d = tempfile.mkdtemp(prefix="leasehold-pytest-tls-")
    cf, kf = self_signed(d)
    b = build_binary()
    admin, ae = token(b, "ops", "admin")
    reader, re_ = token(b, "dash", "read")
    tf = os.path.join(d, "tokens.json")
    with open(tf, "w") as f:
        json.dump({"tokens": [ae, re_]}, f)
    os.chmod(tf, 0o600)
    c = Cluster(1, extra=["--tls-cert", cf, "--tls-key", kf, "--tokens-file", tf], ca_file=cf).start()
    yield c, cf, admin, reader
    c.stop()


def test_tls_and_bearer_tokens(secured):
    c, ca, admin, reader = secured

    async def main():
        async with leasehold.Client(c.addrs, ca_file=ca, token=admin) as cl:
            assert cl.addrs[0].startswith("https://")
            l = await cl.acquire("py/tls", "w1", ttl=5)
            assert (await cl.get(l.lease_id)).state == "active"
            await cl.revoke(l.lease_id, "admin may")
        async with leasehold.Client(c.addrs, ca_file=ca, token=reader) as cl:
            assert (await cl.get(l.lease_id)).state == "revoked"
            with pytest.raises(E.PermissionDenied):
                await cl.acquire("py/tls", "w1", ttl=5)
        async with leasehold.Client(c.addrs, ca_file=ca) as cl:
            with pytest.raises(E.Unauthenticated) as ei:
                await cl.get(l.lease_id)
            assert ei.value.status == 401
        # A server whose certificate the client does not trust: no request
        # is sent (the handshake fails), and it is said so.
        async with leasehold.Client(c.addrs, token=admin, ssl=__import__("ssl").create_default_context(),
                                    retry_for=0) as cl:
            with pytest.raises(E.TransportError) as ei:
                await cl.get(l.lease_id)
            assert not ei.value.sent
    asyncio.run(asyncio.wait_for(main(), 60))
