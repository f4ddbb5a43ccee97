"""Command-line options of ``disagg router`` (no heavy imports: the CLI loads this eagerly)."""

from __future__ import annotations

import argparse
import os
from typing import overload

from disagg_contract import (
    CLIENT_KEYS_DIR,
    CLIENT_KEYS_DIR_ENV,
    ENGINE_API_KEY_ENV,
    ENGINE_KEY_FILE_ENV,
    REDIS_PREFIX_ENV,
    ROUTER_API_KEY_ENV,
    TENANT_SHARE_DIVISOR,
    PrefillRouting,
)
from disagg_router.config import (
    ConfigError,
    DiscoveryKind,
    RouterConfig,
    StoreKind,
    check_url,
)
from disagg_router.tenants import API_KEY_TENANT

_DEFAULTS = RouterConfig()


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every router option on ``parser``."""
    d = _DEFAULTS
    net = parser.add_argument_group("listening")
    net.add_argument("--host", default=d.host, help="address to listen on (default %(default)s)")
    net.add_argument("--port", type=int, default=d.port, help="port (default %(default)s)")
    net.add_argument(
        "--shutdown-timeout",
        type=int,
        default=d.shutdown_timeout_s,
        help="seconds the router finishes the requests in flight, streams included, after "
        "SIGTERM before it cancels them; it takes no new connection meanwhile (default "
        "%(default)s)",
    )

    found = parser.add_argument_group("engine replicas")
    found.add_argument(
        "--discovery",
        choices=[k.value for k in DiscoveryKind],
        default=d.discovery.value,
        help="static URL lists, or the Services' EndpointSlices (default %(default)s)",
    )
    found.add_argument("--prefill", nargs="+", default=[], metavar="URL", help="prefill URLs")
    found.add_argument("--decode", nargs="+", default=[], metavar="URL", help="decode URLs")
    found.add_argument("--namespace", default=d.namespace, help="namespace of the Services")
    found.add_argument("--prefill-service", default="", help="prefill headless Service name")
    found.add_argument("--decode-service", default="", help="decode headless Service name")
    found.add_argument(
        "--port-name", default=d.port_name, help="EndpointSlice port name (default %(default)s)"
    )
    found.add_argument(
        "--kubeconfig",
        default=d.kubeconfig,
        help="kubeconfig for running outside the cluster (default: in-cluster credentials, "
        "else $KUBECONFIG or ~/.kube/config)",
    )

    conv = parser.add_argument_group("conversations")
    conv.add_argument("--store", choices=[k.value for k in StoreKind], default=d.store.value)
    conv.add_argument("--redis-url", default=d.redis_url, help="Redis/Valkey URL for --store redis")
    conv.add_argument(
        "--redis-prefix",
        default=None,
        help=f"key prefix in Redis, one per model sharing a Redis (default: ${REDIS_PREFIX_ENV}, "
        f"else {d.redis_prefix})",
    )
    conv.add_argument(
        "--redis-timeout",
        type=float,
        default=d.redis_timeout_s,
        help="seconds a Redis call (connect, command, reply) may take; past it the turn runs "
        "without reuse, counted in disagg_router_store_errors_total (default %(default)s)",
    )
    conv.add_argument(
        "--conversation-ttl",
        type=float,
        default=d.conversation_ttl_s,
        help="seconds a turn's decode KV is offered to the next turn; must stay below "
        "--decode-kv-ttl minus 5 s (default %(default)s)",
    )
    conv.add_argument(
        "--decode-kv-ttl",
        type=float,
        default=d.decode_kv_ttl_s,
        help="decode's decoder_kv_blocks_ttl, seconds (default %(default)s)",
    )
    conv.add_argument(
        "--max-conversations",
        type=int,
        default=d.max_conversations,
        help="in-memory store bound over all tenants (default %(default)s): when it is reached, "
        "the tenant holding the most conversations gives up its least recently used one; an "
        "entry holds decode's block ids as JSON text, about 6 bytes per KV block of its context",
    )
    conv.add_argument(
        "--max-conversations-per-tenant",
        type=int,
        default=d.max_conversations_per_tenant,
        metavar="N",
        help="conversations each tenant (client key; without keys, each bearer token) keeps in "
        "the store, memory or Redis: its next one evicts its own least recently used, never "
        "another tenant's (default %(default)s)",
    )
    conv.add_argument(
        "--tenant-conversations",
        action="append",
        default=[],
        metavar="TENANT=N",
        help="the conversations one tenant keeps instead of --max-conversations-per-tenant; "
        "repeat for each tenant",
    )
    conv.add_argument(
        "--idle-timeout-s",
        type=float,
        default=d.idle_timeout_s,
        help="seconds without a turn after which a conversation's decode KV is released and its "
        "next turn recomputes; until then the router renews decode's lease every quarter of it "
        "(1 to 15 s), and --decode-kv-ttl stays the hard cap (default %(default)s)",
    )

    auth = parser.add_argument_group(
        "authentication",
        "Clients send a key as 'Authorization: Bearer KEY' (401 otherwise; /health and /metrics "
        "stay open). Each key names a tenant, and each tenant is its own conversation scope: "
        "one conversation id under two tenants is two conversations. Without any key nothing "
        "is checked, and the bearer token a client sends, if any, still scopes its "
        "conversations.",
    )
    auth.add_argument(
        "--api-key",
        default=None,
        help=f"one client key, of the tenant {API_KEY_TENANT!r}; sent to the engines too when "
        f"no --engine-key-file is given (vLLM's --api-key or {ENGINE_API_KEY_ENV}). Default: "
        f"${ROUTER_API_KEY_ENV}; prefer the variable, a flag shows in the process list",
    )
    auth.add_argument(
        "--client-keys-dir",
        default=None,
        metavar="DIR",
        help="a folder (the client-keys Secret, mounted at "
        f"{CLIENT_KEYS_DIR}) in which every file is one client key: the file's name is the "
        "tenant, its content the key (one trailing newline dropped). Read again every "
        "--client-keys-refresh seconds, so a key removed from the Secret is refused once the "
        f"kubelet synced the mount, without a restart. Default: ${CLIENT_KEYS_DIR_ENV}",
    )
    auth.add_argument(
        "--client-keys-refresh",
        type=float,
        default=d.client_keys_refresh_s,
        metavar="SECONDS",
        help="how often the client-keys folder is read again (default %(default)s)",
    )
    auth.add_argument(
        "--engine-key-file",
        default=None,
        metavar="FILE",
        help="the engine credential the router sends prefill and decode as 'Authorization: "
        f"Bearer' (their {ENGINE_API_KEY_ENV}), never a client key; read at start-up. Default: "
        f"${ENGINE_KEY_FILE_ENV}",
    )

    limits = parser.add_argument_group("limits and health")
    limits.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        help="seconds a client has to send a request's line and headers, from the moment it "
        "connects (or, on a kept-alive connection, sends the request's first byte); past it the "
        "router answers 408 and closes the connection, counted in "
        "disagg_router_header_timeouts_total (default %(default)s)",
    )
    limits.add_argument(
        "--body-timeout",
        type=float,
        default=d.body_timeout_s,
        help="seconds a client has to send its whole request body, from the end of its headers; "
        "past it the router answers 408 and closes the connection (default %(default)s)",
    )
    limits.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=d.max_concurrent_requests,
        help="generation requests served at once, each from its headers to the end of its "
        "answer; more get 503 with Retry-After (default %(default)s)",
    )
    limits.add_argument(
        "--max-requests-per-tenant",
        type=int,
        default=None,
        metavar="N",
        help="of those, the most one tenant (the tenant of a client key; every client of a "
        "router without keys is one tenant) may hold at once; its further requests get 429 "
        "with Retry-After while other tenants are still served. Set it below "
        "--max-concurrent-requests so that no tenant, slow bodies included, can take every "
        f"slot (default: --max-concurrent-requests over {TENANT_SHARE_DIVISOR} with "
        "--client-keys-dir, where several tenants share it; all of it without)",
    )
    limits.add_argument(
        "--tenant-requests",
        action="append",
        default=[],
        metavar="TENANT=N",
        help="one tenant's own bound in place of --max-requests-per-tenant, e.g. "
        "--tenant-requests alice=256; repeat the flag for more tenants",
    )
    limits.add_argument("--connect-timeout", type=float, default=d.connect_timeout_s)
    limits.add_argument("--prefill-timeout", type=float, default=d.prefill_timeout_s)
    limits.add_argument("--decode-timeout", type=float, default=d.decode_timeout_s)
    limits.add_argument("--health-interval", type=float, default=d.health_interval_s)
    limits.add_argument("--health-timeout", type=float, default=d.health_timeout_s)
    limits.add_argument("--health-max-backoff", type=float, default=d.health_max_backoff_s)
    limits.add_argument(
        "--decode-affinity-slack",
        type=int,
        default=d.decode_affinity_slack,
        help="keep the previous decode replica unless it has more than this many requests "
        "in flight beyond the least loaded one (default %(default)s)",
    )
    limits.add_argument(
        "--prefill-routing",
        type=PrefillRouting,
        choices=list(PrefillRouting),
        default=d.prefill_routing,
        help="affinity: a conversation's turn goes to the prefill replica of its previous turn "
        "(its prefix cache holds the conversation), with the slack and draining rules of "
        "decode; least-loaded: for prefills without a prefix cache (default %(default)s)",
    )
    limits.add_argument(
        "--prefill-affinity-slack",
        type=int,
        default=d.prefill_affinity_slack,
        help="keep the previous prefill replica unless it has more than this many requests "
        "in flight beyond the least loaded one (default %(default)s)",
    )
    limits.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=d.kv_bytes_per_token,
        help="KV bytes per token, to report P->D bytes saved by decode affinity (0: tokens only)",
    )
    parser.add_argument("--log-format", choices=["text", "json"], default=d.log_format)


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Build and validate a ``RouterConfig`` from parsed options."""
    return RouterConfig(
        prefill_urls=tuple(check_url("--prefill", u) for u in args.prefill),
        decode_urls=tuple(check_url("--decode", u) for u in args.decode),
        host=args.host,
        port=args.port,
        shutdown_timeout_s=args.shutdown_timeout,
        discovery=DiscoveryKind(args.discovery),
        namespace=args.namespace,
        prefill_service=args.prefill_service,
        decode_service=args.decode_service,
        port_name=args.port_name,
        kubeconfig=args.kubeconfig,
        store=StoreKind(args.store),
        redis_url=args.redis_url,
        redis_prefix=_given(args.redis_prefix, REDIS_PREFIX_ENV, _DEFAULTS.redis_prefix),
        redis_timeout_s=args.redis_timeout,
        conversation_ttl_s=args.conversation_ttl,
        decode_kv_ttl_s=args.decode_kv_ttl,
        max_conversations=args.max_conversations,
        max_conversations_per_tenant=args.max_conversations_per_tenant,
        tenant_conversations=tenant_numbers("--tenant-conversations", args.tenant_conversations),
        idle_timeout_s=args.idle_timeout_s,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout,
        header_timeout_s=args.header_timeout,
        max_concurrent_requests=args.max_concurrent_requests,
        max_requests_per_tenant=args.max_requests_per_tenant,
        tenant_requests=tenant_numbers("--tenant-requests", args.tenant_requests),
        connect_timeout_s=args.connect_timeout,
        prefill_timeout_s=args.prefill_timeout,
        decode_timeout_s=args.decode_timeout,
        health_interval_s=args.health_interval,
        health_timeout_s=args.health_timeout,
        health_max_backoff_s=args.health_max_backoff,
        decode_affinity_slack=args.decode_affinity_slack,
        prefill_routing=args.prefill_routing,
        prefill_affinity_slack=args.prefill_affinity_slack,
        kv_bytes_per_token=args.kv_bytes_per_token,
        log_format=args.log_format,
        api_key=_given(args.api_key, ROUTER_API_KEY_ENV),
        client_keys_dir=_given(args.client_keys_dir, CLIENT_KEYS_DIR_ENV, ""),
        client_keys_refresh_s=args.client_keys_refresh,
        engine_key_file=_given(args.engine_key_file, ENGINE_KEY_FILE_ENV, ""),
    ).validate()


def tenant_numbers(flag: str, items: list[str]) -> tuple[tuple[str, int], ...]:
    """``TENANT=N`` items of a repeated flag (``--tenant-requests``, ``--tenant-conversations``)
    as (tenant, N) pairs, in the order given; raise ``ConfigError`` naming ``flag`` for an item
    of another shape (``RouterConfig.validate`` judges the tenants and numbers)."""
    pairs: list[tuple[str, int]] = []
    for item in items:
        tenant, sep, number = item.rpartition("=")
        if not sep or not tenant or not number.strip().isdigit():
            raise ConfigError(
                f"{flag}: {item!r} is not TENANT=N (a tenant's name and a number, e.g. "
                f"{flag} team-a=500)"
            )
        pairs.append((tenant, int(number)))
    return tuple(pairs)


@overload
def _given(value: str | None, env: str) -> str | None: ...
@overload
def _given(value: str | None, env: str, default: str) -> str: ...
def _given(value: str | None, env: str, default: str | None = None) -> str | None:
    """The flag's value when given, else the environment variable's, else ``default``."""
    return value if value is not None else os.environ.get(env, default)
