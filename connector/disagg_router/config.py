"""Router settings: one frozen dataclass, validated once at startup."""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from disagg_contract import (
    CLIENT_KEYS_DIR_ENV,
    DEFAULT_IDLE_TIMEOUT_S,
    ENGINE_KEY_FILE_ENV,
    EXPIRY_MARGIN_S,
    ROUTER_API_KEY_ENV,
    ROUTER_HEADER_TIMEOUT_S,
    ROUTER_PORT,
    TENANT_SHARE_DIVISOR,
    PrefillRouting,
)
from disagg_router.tenants import key_problem, load_tenants, read_key_file


class ConfigError(ValueError):
    """A router setting is invalid; the message names the setting and the fix."""


class StoreKind(enum.StrEnum):
    """Where conversation state lives."""

    MEMORY = "memory"
    REDIS = "redis"


class DiscoveryKind(enum.StrEnum):
    """How the router finds prefill and decode replicas."""

    STATIC = "static"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True)
class RouterConfig:
    """Everything the router needs; see ``options.add_router_arguments`` for the CLI help."""

    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    host: str = "0.0.0.0"
    port: int = ROUTER_PORT
    discovery: DiscoveryKind = DiscoveryKind.STATIC
    namespace: str = "default"
    prefill_service: str = ""
    decode_service: str = ""
    port_name: str = "http"
    kubeconfig: str = ""
    store: StoreKind = StoreKind.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "disagg:conv:"
    redis_timeout_s: float = 1.0
    conversation_ttl_s: float = 450.0
    decode_kv_ttl_s: float = 480.0
    max_conversations: int = 10_000
    max_conversations_per_tenant: int = 10_000
    tenant_conversations: tuple[tuple[str, int], ...] = ()
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_body_bytes: int = 16 * 1024 * 1024
    body_timeout_s: float = 30.0
    header_timeout_s: float = ROUTER_HEADER_TIMEOUT_S
    max_concurrent_requests: int = 1024
    max_requests_per_tenant: int | None = None
    tenant_requests: tuple[tuple[str, int], ...] = ()
    connect_timeout_s: float = 2.0
    prefill_timeout_s: float = 600.0
    decode_timeout_s: float = 3600.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    health_max_backoff_s: float = 30.0
    shutdown_timeout_s: int = 30
    decode_affinity_slack: int = 4
    prefill_routing: PrefillRouting = PrefillRouting.AFFINITY
    prefill_affinity_slack: int = 4
    kv_bytes_per_token: int = 0
    log_format: str = "text"
    api_key: str | None = field(default=None, repr=False)
    client_keys_dir: str = ""
    client_keys_refresh_s: float = 5.0
    engine_key_file: str = ""

    @property
    def requests_per_tenant(self) -> int:
        """One tenant's bound on the request slots: ``--max-requests-per-tenant``; by default
        the whole bound for a router with one tenant (no client keys), and a
        1/TENANT_SHARE_DIVISOR share of it with client keys, where several tenants share it."""
        if self.max_requests_per_tenant is not None:
            return self.max_requests_per_tenant
        if self.client_keys_dir:
            return max(1, self.max_concurrent_requests // TENANT_SHARE_DIVISOR)
        return self.max_concurrent_requests

    @property
    def authenticates(self) -> bool:
        """Whether clients need a key (the API key, or the client-keys folder, even empty)."""
        return self.api_key is not None or bool(self.client_keys_dir)

    def validate(self) -> RouterConfig:
        """Check cross-field rules and return self; raise ``ConfigError`` naming the field.

        No file is read here (a rendered command validates anywhere): the app reads the
        engine key file and the client-keys folder when it is built (``engine_credential``,
        ``check_client_keys``), before the server starts.
        """
        if self.store not in set(StoreKind):
            raise ConfigError(f"--store: {self.store!r} is not one of memory, redis")
        if self.discovery not in set(DiscoveryKind):
            raise ConfigError(f"--discovery: {self.discovery!r} is not one of static, kubernetes")
        if self.store == StoreKind.REDIS:
            require("redis", "--store redis")
        if self.discovery == DiscoveryKind.STATIC:
            if not self.prefill_urls:
                raise ConfigError("--prefill: give at least one prefill URL (http://host:port)")
            if not self.decode_urls:
                raise ConfigError("--decode: give at least one decode URL (http://host:port)")
            for flag, urls in (("--prefill", self.prefill_urls), ("--decode", self.decode_urls)):
                for url in urls:
                    check_url(flag, url)
        elif not (self.prefill_service and self.decode_service):
            raise ConfigError(
                "--prefill-service/--decode-service: both Service names are required "
                "with --discovery kubernetes"
            )
        else:
            require("kubernetes", "--discovery kubernetes")
        limit = self.decode_kv_ttl_s - EXPIRY_MARGIN_S
        if not 0 < self.conversation_ttl_s < limit:
            raise ConfigError(
                f"--conversation-ttl: {self.conversation_ttl_s:g}s must be above 0 and strictly "
                f"below --decode-kv-ttl minus {EXPIRY_MARGIN_S:g}s ({limit:g}s), or "
                "prefill would try to read decode blocks that are already released"
            )
        if not self.idle_timeout_s > 0 or self.idle_timeout_s == float("inf"):
            raise ConfigError("--idle-timeout-s: must be a positive number of seconds")
        if not self.redis_prefix:
            raise ConfigError("--redis-prefix: must not be empty (one prefix per model)")
        for name in (
            "max_conversations",
            "max_conversations_per_tenant",
            "max_body_bytes",
            "max_concurrent_requests",
            "port",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be a positive integer")
        for name in (
            "connect_timeout_s",
            "prefill_timeout_s",
            "decode_timeout_s",
            "health_interval_s",
            "health_timeout_s",
            "health_max_backoff_s",
            "redis_timeout_s",
            "body_timeout_s",
            "header_timeout_s",
            "client_keys_refresh_s",
            "shutdown_timeout_s",
        ):
            if getattr(self, name) <= 0:
                flag = name.removesuffix("_s").replace("_", "-")
                raise ConfigError(f"--{flag}: must be a positive number of seconds")
        self._check_tenant_shares()
        slacks = (self.decode_affinity_slack, self.prefill_affinity_slack)
        if min(slacks) < 0 or self.kv_bytes_per_token < 0:
            raise ConfigError(
                "--decode-affinity-slack/--prefill-affinity-slack/--kv-bytes-per-token: must "
                "not be negative"
            )

        if self.log_format not in ("text", "json"):
            raise ConfigError("--log-format: choose text or json")
        if self.api_key is not None:
            check_key(f"--api-key/{ROUTER_API_KEY_ENV}", self.api_key)
        return self

    def _check_tenant_shares(self) -> None:
        """Each tenant's share of the request slots between 1 and the global bound; each
        tenant's own number (``--tenant-requests``, ``--tenant-conversations``) given once, for
        a tenant name, and positive."""
        whole = self.max_concurrent_requests
        share = self.max_requests_per_tenant
        if share is not None and not 0 < share <= whole:
            raise ConfigError(
                f"--max-requests-per-tenant: {share} must be between 1 and "
                f"--max-concurrent-requests ({whole})"
            )
        _check_tenant_numbers(
            "--tenant-requests", self.tenant_requests, ("--max-concurrent-requests", whole)
        )
        _check_tenant_numbers("--tenant-conversations", self.tenant_conversations, None)


def _check_tenant_numbers(
    flag: str, pairs: tuple[tuple[str, int], ...], bound: tuple[str, int] | None
) -> None:
    """Raise ``ConfigError`` naming ``flag`` for a tenant given twice, a name no client-keys
    file can have, or a number below 1 or past ``bound`` (the flag that bounds it, its value)."""
    seen: set[str] = set()
    for tenant, number in pairs:
        if tenant in seen:
            raise ConfigError(f"{flag}: tenant {tenant!r} is given twice; give it once")
        seen.add(tenant)
        if not tenant or not tenant.isprintable() or "/" in tenant:
            raise ConfigError(
                f"{flag}: {tenant!r} is not a tenant name (a client-keys file name: printable, "
                "without '/')"
            )
        if number <= 0:
            raise ConfigError(f"{flag}: {tenant}={number}: give a positive number")
        if bound is not None and number > bound[1]:
            raise ConfigError(
                f"{flag}: {tenant}={number} must be between 1 and {bound[0]} ({bound[1]})"
            )


def check_key(source: str, key: str) -> None:
    """Raise ``ConfigError`` naming ``source`` unless ``key`` can travel in an
    ``Authorization`` header as is."""
    problem = key_problem(key)
    if problem is not None:
        raise ConfigError(
            f"{source}: {problem} (a Secret made from a file often ends with a newline: "
            "kubectl create secret generic NAME --from-literal=token=KEY)"
        )


def check_client_keys(folder: Path, api_key: str | None) -> None:
    """Raise ``ConfigError`` unless every file of ``folder`` holds a key of its own; at
    start-up a bad file is refused by name (later reads leave it out and log it)."""
    source = f"--client-keys-dir/{CLIENT_KEYS_DIR_ENV}"
    try:
        problems = load_tenants(folder, api_key)[1]
    except OSError as exc:
        raise ConfigError(f"{source}: cannot list {folder}: {exc}") from None
    if problems:
        raise ConfigError(f"{source}: {'; '.join(problems)}")


def engine_credential(config: RouterConfig) -> str | None:
    """What the router sends the engines as ``Authorization: Bearer``: the key of
    ``--engine-key-file``, or without one (as before engine keys existed) the single API key,
    or nothing. Reads the file once; raise ``ConfigError`` naming it when it holds no key."""
    if not config.engine_key_file:
        return config.api_key
    source = f"--engine-key-file/{ENGINE_KEY_FILE_ENV}"
    try:
        key = read_key_file(Path(config.engine_key_file))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    check_key(source, key)
    return key


def require(package: str, option: str) -> None:
    """Raise ``ConfigError`` naming ``option`` when ``package`` is not installed."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"{option}: needs the Python package `{package}`; install it in the router's "
            "image (pip install 'disagg[router]' brings it)"
        )


def check_url(flag: str, url: str) -> str:
    """Return ``url`` without a trailing slash if it is http(s)://host:port, else raise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"{flag}: {url!r} is not a base URL like http://10.0.0.1:8100")
    return url.rstrip("/")
