"""A node's identity: one Ed25519 key for libp2p, hivemind and message signatures.

The peer id is computed here exactly as libp2p does it (protobuf-encoded public key, identity
multihash because it is ≤42 bytes, base58btc), so this module needs no libp2p import; a test
checks it against py-libp2p.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import IdentityError, SignatureError
from protocol.files import atomic_write_bytes

KEY_FILE = "identity.key"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
# libp2p crypto.pb: KeyType Ed25519 = 1; field 1 varint (type), field 2 bytes (data)
_PB_ED25519_PUB = bytes([0x08, 0x01, 0x12, 0x20])
_PB_ED25519_PRIV = bytes([0x08, 0x01, 0x12, 0x40])


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + out


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer id (base58btc, '12D3KooW...') of a raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise IdentityError(f"an Ed25519 public key has 32 bytes, got {len(public_key)}")
    encoded = _PB_ED25519_PUB + public_key
    return b58encode(bytes([0x00, len(encoded)]) + encoded)  # identity multihash


def verify(public_key: bytes, signature: bytes, data: bytes) -> None:
    """Raise SignatureError unless ``signature`` is ``public_key``'s signature of ``data``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError) as e:
        raise SignatureError("signature does not verify") from e


@dataclass(frozen=True)
class Identity:
    """An Ed25519 private key and what derives from it. Never logged: repr hides the key."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        if len(seed) != 32:
            raise IdentityError(f"an Ed25519 seed has 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def seed(self) -> bytes:
        """The 32 raw private bytes (what libp2p's Ed25519PrivateKey.from_bytes takes)."""
        return self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    def libp2p_private_key_protobuf(self) -> bytes:
        """The key as libp2p's MarshalPrivateKey writes it (what hivemind's p2pd
        ``identity_path`` file holds): Ed25519 data = seed ‖ public key."""
        return _PB_ED25519_PRIV + self.seed + self.public_key

    def __repr__(self) -> str:
        return f"Identity(peer_id={self.peer_id})"


def load_or_create_identity(data_dir: str | os.PathLike[str]) -> Identity:
    """Load ``data_dir/identity.key``, creating it (mode 0600, atomically) if absent.

    A file that exists but cannot be parsed raises IdentityError: a node never silently
    takes a new identity.
    """
    path = Path(data_dir) / KEY_FILE
    if not path.exists():
        identity = Identity.generate()
        pem = identity.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _create_exclusive(path, pem)
    return _load(path)


def _create_exclusive(path: Path, data: bytes) -> None:
    """Write atomically, but never replace a key another process created meanwhile."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    atomic_write_bytes(tmp, data, mode=0o600)
    try:
        os.link(tmp, path)  # fails if path exists: the first writer wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _load(path: Path) -> Identity:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        data = path.read_bytes()
    except OSError as e:
        raise IdentityError(f"cannot read identity key {path}: {e.strerror}") from None
    if mode & 0o077:
        raise IdentityError(
            f"identity key {path} is readable by others (mode {mode:o}); run: chmod 600 {path}"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise IdentityError(
            f"identity key {path} is corrupt ({e}); restore it from a backup, or move it away "
            "to start with a new identity (a new peer id)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"identity key {path} is not an Ed25519 key")
    return Identity(key)
