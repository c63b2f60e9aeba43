"""Certificates and keys for the local control plane (`streams.kube_cluster`): a CA, the
kube-apiserver's serving certificate (for 127.0.0.1 and localhost), and the service-account
signing key pair. Generated afresh into a folder the caller owns; nothing is committed."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path  # the service-account token signing key (RSA, PKCS#8)
    sa_pub: Path


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def make_pki(folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Pki:
    """A CA and a serving certificate for `hosts` (IP addresses and DNS names), signed by it,
    and an RSA key pair for service-account tokens, written as PEM files into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "koordstream-local-ca")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return Pki(
        ca_cert=_write(folder / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM)),
        ca_key=_write(folder / "ca.key", _pem_key(ca_key), private=True),
        serving_cert=_write(folder / "apiserver.crt", cert.public_bytes(serialization.Encoding.PEM)),
        serving_key=_write(folder / "apiserver.key", _pem_key(key), private=True),
        sa_key=_write(folder / "sa.key", _pem_key(sa), private=True),
        sa_pub=_write(folder / "sa.pub", sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)),
    )
