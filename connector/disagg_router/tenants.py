"""Client keys and the tenants they name; each tenant is its own conversation scope.

Keys come from a folder (the mounted client-keys Secret: every regular file is one key, its
name the tenant, its content the key) and from the single ``--api-key``, whose tenant is
``API_KEY_TENANT``. The kubelet updates a mounted Secret in place (it swaps the folder's
``..data`` symlink), so the folder is read again every ``refresh_s`` seconds, on the first
request after that interval: a key removed from the Secret is refused once the kubelet has
synced the mount, without restarting the router or the engines. A request's key is looked
up by its SHA-256 digest, so the lookup's timing says nothing about the keys it is compared
with. Standard library only: the CLI checks the folder at start-up without the server stack.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

API_KEY_TENANT = "default"
"""The tenant of the single ``--api-key`` (``DISAGG_API_KEY``): a file of this name in the
client-keys folder is a second key of the same tenant, sharing its conversations."""


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot travel in an ``Authorization`` header as is; None when it can."""
    if not key or not key.isascii() or not key.isprintable() or " " in key:
        return "a key must be non-empty printable ASCII without spaces or newlines"
    return None


def read_key_file(path: Path) -> str:
    """The key a file holds: its text without one trailing newline (``\\n`` or ``\\r\\n``),
    as ``kubectl create secret --from-file`` and editors leave it."""
    text = path.read_text(encoding="utf-8")
    return text.removesuffix("\n").removesuffix("\r")


def read_client_keys(folder: Path) -> tuple[dict[str, str], list[str]]:
    """Tenant -> key for every regular file of ``folder`` (symlinks followed, as a mounted
    Secret's are), and one line per file left out: a key that cannot be a bearer token, or
    one key in several files (which tenant it names would be a guess). Raises ``OSError``
    when the folder cannot be listed."""
    keys: dict[str, str] = {}
    problems: list[str] = []
    for entry in sorted(folder.iterdir()):
        try:
            if not entry.is_file():
                continue
            if not entry.name.isprintable():
                problems.append(f"{entry!r}: the file name is not a printable tenant name")
                continue
            key = read_key_file(entry)
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{entry}: unreadable ({exc})")
            continue
        problem = key_problem(key)
        if problem is not None:
            problems.append(f"{entry}: {problem}")
            continue
        keys[entry.name] = key
    return keys, problems


def tenants_by_digest(pairs: Iterable[tuple[str, str]]) -> tuple[dict[bytes, str], list[str]]:
    """SHA-256 of each key -> the tenant it belongs to, from (tenant, key) pairs; a key given
    to several tenants is dropped, with one line for it in the problems returned."""
    owners: dict[bytes, set[str]] = {}
    for tenant, key in pairs:
        owners.setdefault(hashlib.sha256(key.encode()).digest(), set()).add(tenant)
    problems = [
        f"one key is given to tenants {', '.join(sorted(names))}: refused for all of them"
        for names in owners.values()
        if len(names) > 1
    ]
    tenants = {digest: min(names) for digest, names in owners.items() if len(names) == 1}
    return tenants, problems


def load_tenants(folder: Path | None, api_key: str | None) -> tuple[dict[bytes, str], list[str]]:
    """SHA-256 of each client key -> its tenant, from ``api_key`` (tenant ``API_KEY_TENANT``)
    and the files of ``folder``, and one line per file or key left out. Raises ``OSError`` when
    the folder cannot be listed."""
    pairs = [(API_KEY_TENANT, api_key)] if api_key is not None else []
    problems: list[str] = []
    if folder is not None:
        keys, problems = read_client_keys(folder)
        pairs += keys.items()
    tenants, shared = tenants_by_digest(pairs)
    return tenants, problems + shared


class TenantKeys:
    """The tenant of each client key, the folder's part re-read at most every ``refresh_s``.

    A folder that cannot be read keeps the keys last read (a failed read revokes nothing); a
    file that cannot hold a key is left out and logged, once per change of the problems.
    """

    def __init__(
        self,
        folder: Path | None,
        api_key: str | None,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._folder = folder
        self._api_key = api_key
        self._refresh_s = refresh_s
        self._clock = clock
        self._tenants: dict[bytes, str] = {}
        self._problems: list[str] = []
        self._next_read = 0.0
        self._reload()

    def tenant_of(self, token: bytes) -> str | None:
        """The tenant whose key ``token`` is, or None."""
        if self._folder is not None and self._clock() >= self._next_read:
            self._reload()
        return self._tenants.get(hashlib.sha256(token).digest())

    def tenants(self) -> frozenset[str]:
        """Every tenant with a usable key now."""
        return frozenset(self._tenants.values())

    def _reload(self) -> None:
        self._next_read = self._clock() + self._refresh_s
        try:
            tenants, problems = load_tenants(self._folder, self._api_key)
        except OSError as exc:
            folder = self._folder
            log.warning("client keys: %s unreadable, keeping those read before: %s", folder, exc)
            return
        if problems != self._problems:
            for problem in problems:
                log.warning("client keys: %s", problem)
            self._problems = problems
        before = self.tenants()
        self._tenants = tenants
        after = self.tenants()
        if after != before:
            log.info(
                "client keys: %d tenants (added %s, removed %s)",
                len(after),
                ", ".join(sorted(after - before)) or "none",
                ", ".join(sorted(before - after)) or "none",
            )
