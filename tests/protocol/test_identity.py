from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from protocol import IdentityError, load_or_create_identity
from protocol.identity import KEY_FILE


def test_created_with_mode_0600_and_stable(tmp_path):
    a = load_or_create_identity(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    b = load_or_create_identity(tmp_path)
    assert a.peer_id == b.peer_id
    assert a.peer_id.startswith("12D3KooW")
    assert load_or_create_identity(tmp_path / "other").peer_id != a.peer_id


def test_corrupt_key_is_an_error_not_a_new_identity(tmp_path):
    load_or_create_identity(tmp_path)
    path = tmp_path / KEY_FILE
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create_identity(tmp_path)
    assert b"garbage" in path.read_bytes()  # never overwritten


def test_world_readable_key_refused(tmp_path):
    load_or_create_identity(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_identity(tmp_path)


def test_repr_hides_the_key(tmp_path):
    ident = load_or_create_identity(tmp_path)
    assert ident.seed.hex() not in repr(ident)


def test_peer_id_matches_py_libp2p(tmp_path):
    """Computed in a separate process: libp2p must not share a process with hivemind."""
    ident = load_or_create_identity(tmp_path)
    code = (
        "import sys\n"
        "from libp2p.crypto.ed25519 import Ed25519PrivateKey\n"
        "from libp2p.crypto.keys import KeyPair\n"
        "from libp2p.peer.id import ID\n"
        "k = Ed25519PrivateKey.from_bytes(bytes.fromhex(sys.argv[1]))\n"
        "print(ID.from_pubkey(k.get_public_key()).to_base58())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, ident.seed.hex()], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == ident.peer_id


def test_cli_identity_prints_the_same_id(tmp_path):
    run = lambda: subprocess.run([sys.executable, "-m", "node", "identity", "--data-dir",  # noqa: E731
                                  str(tmp_path)], capture_output=True, text=True, check=True)
    first = run().stdout.strip()
    assert first == run().stdout.strip() == load_or_create_identity(tmp_path).peer_id


def test_cli_identity_corrupt_key_exits_nonzero(tmp_path):
    (tmp_path / KEY_FILE).write_bytes(b"nope")
    os.chmod(tmp_path / KEY_FILE, 0o600)
    out = subprocess.run([sys.executable, "-m", "node", "identity", "--data-dir", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "corrupt" in out.stderr
