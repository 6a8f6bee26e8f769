"""Development TLS certificates and SuperNode authentication keys.

For loopback tests and first multi-machine trials only: a throw-away certificate authority,
a SuperLink certificate for the given host names and addresses, and one EC key pair per
SuperNode in the OpenSSH format that ``flower-supernode --auth-supernode-private-key`` and
``flwr supernode register`` read. Production deployments use certificates from their own CA.
Uses ``cryptography``, which Flower depends on.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 30


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "oneshotfl development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def write_certificates(out: Path, hosts: Sequence[str]) -> dict[str, Path]:
    """Write ``ca.crt``, ``ca.key``, ``server.pem`` and ``server.key`` into ``out``.

    Args:
        out: the directory (created).
        hosts: host names and IP addresses the SuperLink is reached by (its SAN entries).

    Raises:
        ValueError: when ``hosts`` is empty.
    """
    if not hosts:
        raise ValueError("hosts: expected at least one SuperLink host name or address, got none")
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("oneshotfl development CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        "ca": out / "ca.crt",
        "ca_key": out / "ca.key",
        "server_cert": out / "server.pem",
        "server_key": out / "server.key",
    }
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["ca_key"], _pem_key(ca_key))
    paths["server_cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_private(paths["server_key"], _pem_key(server_key))
    return paths


def write_node_keys(out: Path, nodes: int, prefix: str = "node") -> list[tuple[Path, Path]]:
    """Write one OpenSSH EC key pair per SuperNode: ``<prefix>-<i>`` and ``<prefix>-<i>.pub``.

    Raises:
        ValueError: when ``nodes`` is below 1.
    """
    if nodes < 1:
        raise ValueError(f"nodes: expected at least 1, got {nodes}")
    out.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        private = out / f"{prefix}-{i}"
        public = out / f"{prefix}-{i}.pub"
        _write_private(
            private,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            ),
        )
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
            + b"\n"
        )
        pairs.append((private, public))
    return pairs
