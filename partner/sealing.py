"""Webhook signing secrets sealed at rest: AES-256-GCM (`cryptography`) under the keys of
PARTNER_ENCRYPTION_KEYS. The first key seals; every listed key opens. Each ciphertext is stored
beside its key's id (the first 8 hex digits of the SHA-256 of the key's bytes) and is bound to its
subscription's id (associated data), so a sealed secret copied onto another row does not open.

One keyring per process, like the one database: set at start-up by `use`, read by `seal`/`open_secret`."""

import base64
import dataclasses
import binascii
import hashlib
import json
import logging
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger(__name__)

KEY_BYTES = 32
NONCE_BYTES = 12  # AES-GCM's standard nonce, random per seal (2^-32 collision bound far off at our volumes)


class SealingError(Exception):
    """A key setting that cannot be used, or a secret sealed under a key this process lacks."""


@dataclasses.dataclass(frozen=True)
class Keyring:
    ciphers: dict  # key id -> AESGCM, in configured order: the first seals
    source: str = "PARTNER_ENCRYPTION_KEYS"  # where the keys came from, as a refusal names it

    @property
    def sealing_id(self) -> str:
        return next(iter(self.ciphers))

    def seal(self, subscription_id: str, secret: str) -> tuple[str, bytes]:
        """(key id, nonce + ciphertext) of `secret` under the first key."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self.ciphers[self.sealing_id].encrypt(nonce, secret.encode(), subscription_id.encode())
        return self.sealing_id, nonce + sealed

    def open(self, subscription_id: str, key_id: str, sealed: bytes) -> str:
        cipher = self.ciphers.get(key_id)
        if cipher is None:
            raise SealingError(f"a webhook secret is sealed under key id {key_id}, which no configured key has")
        sealed = bytes(sealed)
        try:
            return cipher.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], subscription_id.encode()).decode()
        except (InvalidTag, ValueError):  # ValueError: a value too short to hold a nonce
            raise SealingError(f"the secret of {subscription_id} does not open under key id {key_id}") from None


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def new_key() -> str:
    """A fresh key as PARTNER_ENCRYPTION_KEYS lists it: 32 random bytes, base64url, no padding."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).rstrip(b"=").decode()


def decode_key(text) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)) if isinstance(text, str) else b""
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise SealingError("PARTNER_ENCRYPTION_KEYS: each key must be base64url of 32 bytes "
                        "(`flask encryption new-key` makes one)")
    return key


def keyring_of(texts) -> Keyring:
    if isinstance(texts, str):  # a value that was not JSON reaches the config as a string
        try:
            texts = json.loads(texts)
        except ValueError:
            texts = None
    if not isinstance(texts, list) or not texts:
        raise SealingError('PARTNER_ENCRYPTION_KEYS must be a JSON list of keys, e.g. ["<flask encryption new-key>"]')
    keys = [decode_key(text) for text in texts]
    return Keyring({key_id(key): AESGCM(key) for key in keys})


def load_keyring(configured, key_file: str, may_use_file: bool) -> Keyring:
    """The configured keys; unset, the key in `key_file` (made at first use, mode 0600) where a file
    key is allowed (one SQLite host), else a refusal (several hosts must share the key)."""
    if configured not in (None, ""):
        return keyring_of(configured)
    if not may_use_file:
        raise SealingError("PARTNER_ENCRYPTION_KEYS is not set: on PostgreSQL every host must share the "
                        "keys (`flask encryption new-key` makes one)")
    return dataclasses.replace(keyring_of([_file_key(key_file)]), source=f"the key file {key_file}")


def _file_key(path: str) -> str:
    """The key in the file at `path`, made at the first start. Written whole under another name and
    then linked into place, so a process starting at the same moment reads a whole key or none."""
    try:
        with open(path) as file:
            return file.read().strip()
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)  # instance/: ours alone
    key, partial = new_key(), f"{path}.partial-{secrets.token_hex(4)}"
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(key + "\n")
        file.flush()
        os.fsync(file.fileno())
    try:
        os.link(partial, path)  # atomic, and refuses a key another process put there first
    except FileExistsError:
        return _file_key(path)
    finally:
        os.unlink(partial)
    log.warning("PARTNER_ENCRYPTION_KEYS is not set: webhook secrets are sealed with a key generated into %s "
                "(keep it out of backups of the database; production should set PARTNER_ENCRYPTION_KEYS)", path)
    return key


_keyring: Keyring | None = None


def use(keyring: Keyring) -> None:
    global _keyring
    _keyring = keyring


def keyring() -> Keyring:
    if _keyring is None:
        raise SealingError("no encryption keys loaded: create_app loads them")
    return _keyring


def seal(subscription_id: str, secret: str) -> tuple[str, bytes]:
    return keyring().seal(subscription_id, secret)


def open_secret(subscription_id: str, key_id_: str, sealed: bytes) -> str:
    """The plaintext `whsec_…` of a subscription, from its stored key id and sealed bytes."""
    return keyring().open(subscription_id, key_id_, sealed)
