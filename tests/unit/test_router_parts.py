"""Router parts without servers: config rules, selection, backoff, KV params, EndpointSlices."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import (
    DiscoveryV1EndpointPort,
    V1Endpoint,
    V1EndpointConditions,
    V1EndpointSlice,
    V1ObjectMeta,
)

from disagg.cli import build_parser
from disagg_contract import READ_REPORT_KEY, TENANT_SHARE_DIVISOR, Role
from disagg_router.config import ConfigError, DiscoveryKind, RouterConfig, require
from disagg_router.conversation import TurnEntry
from disagg_router.discovery.kubernetes import _SliceState, slice_endpoints
from disagg_router.limits import RequestSlots
from disagg_router.payloads import (
    EngineBodies,
    decode_params,
    prefill_params,
    read_report,
    routable,
    strip_from_events,
)
from disagg_router.replicas import ReplicaPool
from disagg_router.routing import Affinity, Choice, ConversationAffinity, LeastOutstanding

URLS = ("http://127.0.0.1:8100",)


def pool(role: Role, *urls: str) -> ReplicaPool:
    replicas = ReplicaPool(role, interval_s=1.0, max_backoff_s=5.0)
    replicas.set_urls(urls)
    return replicas


def test_conversation_ttl_must_stay_below_decode_ttl_minus_margin() -> None:
    RouterConfig(URLS, URLS, conversation_ttl_s=474.9, decode_kv_ttl_s=480).validate()
    with pytest.raises(ConfigError, match=r"--conversation-ttl.*475"):
        RouterConfig(URLS, URLS, conversation_ttl_s=475, decode_kv_ttl_s=480).validate()


@pytest.mark.parametrize(
    ("config", "flag"),
    [
        (RouterConfig((), URLS), "--prefill"),
        (RouterConfig(URLS, ("10.0.0.1:8200",)), "--decode"),
        (
            RouterConfig(discovery=DiscoveryKind.KUBERNETES, prefill_service="p"),
            "--prefill-service",
        ),
        (RouterConfig(URLS, URLS, max_body_bytes=0), "--max-body-bytes"),
        (RouterConfig(URLS, URLS, health_interval_s=0), "--health-interval"),
        (RouterConfig(URLS, URLS, shutdown_timeout_s=0), "--shutdown-timeout"),
        (RouterConfig(URLS, URLS, log_format="xml"), "--log-format"),
        (RouterConfig(URLS, URLS, store="mongo"), "--store"),
        (RouterConfig(URLS, URLS, max_requests_per_tenant=0), "--max-requests-per-tenant"),
        (
            RouterConfig(URLS, URLS, max_concurrent_requests=8, max_requests_per_tenant=9),
            "--max-requests-per-tenant",
        ),
        (RouterConfig(URLS, URLS, tenant_requests=(("a", 0),)), "--tenant-requests"),
        (RouterConfig(URLS, URLS, tenant_requests=(("a", 1), ("a", 2))), "--tenant-requests"),
        (RouterConfig(URLS, URLS, tenant_requests=(("a/b", 1),)), "--tenant-requests"),
        (RouterConfig(URLS, URLS, tenant_requests=(("", 1),)), "--tenant-requests"),
    ],
)
def test_invalid_settings_name_their_flag(config: RouterConfig, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        config.validate()


def test_cli_builds_a_validated_config_without_importing_the_server_stack() -> None:
    from disagg_router.options import config_from_args

    args = build_parser().parse_args(
        ["router", "--prefill", "http://p:8100/", "--decode", "http://d:8200", "--store", "redis"]
    )
    config = config_from_args(args)
    assert config.prefill_urls == ("http://p:8100",) and config.store == "redis"
    with pytest.raises(ConfigError, match="--decode"):
        config_from_args(build_parser().parse_args(["router", "--prefill", "http://p:1"]))


def test_tenant_shares_come_from_their_flags() -> None:
    from disagg_router.options import config_from_args

    base = ["router", "--prefill", "http://p:8100", "--decode", "http://d:8200"]
    shares = ["--max-requests-per-tenant", "8", "--tenant-requests", "alice=32"]
    args = build_parser().parse_args([*base, *shares, "--tenant-requests", "a=b=2"])
    config = config_from_args(args)
    assert config.max_requests_per_tenant == 8
    assert config.tenant_requests == (("alice", 32), ("a=b", 2))
    assert config_from_args(build_parser().parse_args(base)).max_requests_per_tenant is None
    for bad in ("alice", "alice=", "alice=-3", "alice=x"):
        args = build_parser().parse_args([*base, "--tenant-requests", bad])
        with pytest.raises(ConfigError, match=r"--tenant-requests: .* is not TENANT=N"):
            config_from_args(args)


def test_with_client_keys_no_tenant_takes_every_slot_by_default(tmp_path: Path) -> None:
    """Several tenants share a router with client keys: each may hold half its slots unless
    told otherwise; one tenant (no keys, or only the API key) keeps every slot."""
    from disagg_router.options import config_from_args

    base = ["router", "--prefill", "http://p:8100", "--decode", "http://d:8200"]
    base += ["--max-concurrent-requests", "9"]
    keys = ["--client-keys-dir", str(tmp_path)]
    share = {
        flags: config_from_args(build_parser().parse_args([*base, *flags])).requests_per_tenant
        for flags in ((), tuple(keys), (*keys, "--max-requests-per-tenant", "9"))
    }
    assert list(share.values()) == [9, 9 // TENANT_SHARE_DIVISOR, 9]
    slots = RequestSlots(9, share[tuple(keys)], {})
    assert sum(slots.take("alice") for _ in range(9)) == 4
    assert slots.take("bob"), "alice's slow bodies leave bob slots"


def test_request_slots_bound_each_tenant_under_the_whole() -> None:
    slots = RequestSlots(5, 2, {"bob": 3})
    assert [slots.take("alice") for _ in range(3)] == [True, True, False]
    assert [slots.take("bob") for _ in range(4)] == [True, True, True, False]
    assert slots.in_flight == 5 and not slots.take("carol"), "the whole is held"
    slots.give_back("alice")
    assert slots.take("carol") and not slots.take("carol")
    for tenant in ("alice", "bob", "bob", "bob", "carol"):
        slots.give_back(tenant)
    assert slots.in_flight == 0
    assert [slots.take("bob") for _ in range(4)] == [True, True, True, False], "all given back"
    assert RequestSlots(3).share("anyone") == 3, "without a share, the whole"


def test_tenant_conversations_are_tenant_equals_number_each_tenant_once() -> None:
    from disagg_router.options import config_from_args

    base = ["router", "--prefill", "http://p:1", "--decode", "http://d:1"]
    given = ["--tenant-conversations", "team-a=500", "--tenant-conversations", "b=c=7"]
    config = config_from_args(build_parser().parse_args([*base, *given]))
    assert config.tenant_conversations == (("team-a", 500), ("b=c", 7))
    for wrong, says in (
        (["team-a"], "not TENANT=N"),
        (["team-a=many"], "not TENANT=N"),
        (["=5"], "not TENANT=N"),
        (["a=1", "a=2"], "given twice"),
        (["a=0"], "positive number"),
    ):
        args = [arg for item in wrong for arg in ("--tenant-conversations", item)]
        with pytest.raises(ConfigError, match=f"--tenant-conversations.*{says}"):
            config_from_args(build_parser().parse_args([*base, *args]))
    with pytest.raises(ConfigError, match="--max-conversations-per-tenant"):
        config_from_args(build_parser().parse_args([*base, "--max-conversations-per-tenant=0"]))


def test_building_the_cli_imports_no_server_dependency() -> None:
    probe = (
        "import sys; from disagg.cli import build_parser; build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'fastapi', 'uvicorn', 'httpx', 'redis', 'kubernetes', 'prometheus_client'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_prefill_choice_is_least_outstanding_and_skips_unhealthy_and_excluded() -> None:
    prefill = pool(Role.PREFILL, "http://a", "http://b", "http://c")
    a, b, c = prefill.members()
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    routing = LeastOutstanding()
    assert routing.choose(prefill) == Choice(b, Affinity.NONE)
    prefill.mark_failed(b)
    assert routing.choose(prefill, "http://b") == Choice(c, Affinity.NONE)
    assert routing.choose(prefill, exclude=(c,)) == Choice(a, Affinity.NONE)
    prefill.mark_failed(a)
    prefill.mark_failed(c)
    assert routing.choose(prefill) == Choice(None, Affinity.NONE)


def test_prefill_ties_rotate() -> None:
    prefill = pool(Role.PREFILL, "http://a", "http://b")
    picked = {LeastOutstanding().choose(prefill).replica for _ in range(4)}
    assert picked == set(prefill.members())


def test_decode_affinity_kept_unless_overloaded_unhealthy_or_gone() -> None:
    decode = pool(Role.DECODE, "http://a", "http://b")
    a, b = decode.members()
    routing = ConversationAffinity(slack=2)
    assert routing.choose(decode).affinity is Affinity.NONE
    assert routing.choose(decode, "http://a") == Choice(a, Affinity.KEPT)
    a.outstanding = 2
    assert routing.choose(decode, "http://a") == Choice(a, Affinity.KEPT)
    assert routing.choose(decode, "http://a", exclude=(a,)) == Choice(b, Affinity.UNHEALTHY)
    a.outstanding = 3
    assert routing.choose(decode, "http://a") == Choice(b, Affinity.OVERLOADED)
    a.outstanding = 0
    decode.mark_failed(a)
    assert routing.choose(decode, "http://a") == Choice(b, Affinity.UNHEALTHY)
    assert routing.choose(decode, "http://gone") == Choice(b, Affinity.GONE)
    assert routing.choose(decode, exclude=(b,)) == Choice(None, Affinity.NONE)


def test_a_draining_replica_takes_no_new_request_and_is_not_health_checked() -> None:
    decode = pool(Role.DECODE, "http://a", "http://b")
    a, b = decode.members()
    a.outstanding, b.outstanding = 0, 5
    decode.set_urls(["http://a", "http://b"], draining=["http://a/"])
    assert decode.get("http://a") is a and a.draining and not b.draining
    assert a.healthy, "a leaving replica is not a failed one"
    assert decode.available() == [b] and decode.draining() == [a]
    routing = ConversationAffinity(slack=2)
    assert routing.choose(decode, "http://a") == Choice(b, Affinity.DRAINING)
    assert routing.choose(decode) == Choice(b, Affinity.NONE)
    assert LeastOutstanding().choose(decode) == Choice(b, Affinity.NONE)
    assert decode.due(time.monotonic() + 60) == [b]
    decode.set_urls(["http://b"], draining=["http://b"])
    assert decode.get("http://a") is None, "gone once its endpoint is"
    assert routing.choose(decode, "http://b") == Choice(None, Affinity.DRAINING)


def test_failed_replicas_back_off_exponentially_up_to_the_cap() -> None:
    prefill = pool(Role.PREFILL, "http://a")
    (a,) = prefill.members()
    delays = []
    for _ in range(5):
        prefill.mark_failed(a, now=100.0)
        delays.append(a.next_check - 100.0)
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert prefill.due(104.0) == [] and prefill.due(105.0) == [a]
    prefill.mark_ok(a, now=105.0)
    assert a.healthy and a.failures == 0


def test_membership_changes_keep_state_of_staying_replicas() -> None:
    decode = pool(Role.DECODE, "http://a", "http://b")
    a = decode.get("http://a")
    assert a is not None
    a.outstanding = 5
    decode.set_urls(["http://a/", "http://c"])
    assert decode.get("http://a") is a and a.outstanding == 5
    assert decode.get("http://b") is None and decode.get("http://c") is not None


def test_prefill_params_on_miss_and_on_hit() -> None:
    miss = prefill_params(None)
    assert miss["do_remote_decode"] is True and miss["remote_block_ids"] is None
    decode_params = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [[4, 5]],
        "remote_engine_id": "d",
        "remote_request_id": "r",
        "remote_host": "10.0.0.2",
        "remote_port": 5600,
        "remote_num_tokens": 40,
        "verified_digest": "kept-as-is",
    }
    hit = prefill_params(TurnEntry(decode_params, "http://d", time.time(), time.time() + 9, 1))
    assert hit == {**decode_params, "do_remote_decode": True, "do_remote_prefill": False}


@pytest.mark.parametrize("host", [None, "", "0.0.0.0", "localhost", "127.0.0.1", "::"])
def test_unroutable_side_channel_hosts_become_the_replica_address(host: str | None) -> None:
    assert routable({"remote_host": host, "x": 1}, "10.1.2.3") == {
        "remote_host": "10.1.2.3",
        "x": 1,
    }


def test_routable_keeps_real_hosts_and_rejects_non_dicts() -> None:
    assert routable({"remote_host": "10.9.9.9"}, "10.1.2.3") == {"remote_host": "10.9.9.9"}
    assert routable(None, "10.1.2.3") is None
    assert routable(["x"], "10.1.2.3") is None


def test_strip_from_events_removes_and_returns_params() -> None:
    plain = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    final = {"choices": [], "kv_transfer_params": {"remote_engine_id": "d"}}
    events = plain + b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"
    stripped, params = strip_from_events(events)
    assert params == {"remote_engine_id": "d"}
    assert b"kv_transfer_params" not in stripped
    assert stripped.startswith(plain) and stripped.endswith(b"data: [DONE]\n\n")
    assert strip_from_events(plain) == (plain, None)


def test_strip_from_events_cuts_the_null_field_vllm_033_puts_on_every_chunk() -> None:
    chunks = [
        b'{"id":"c","choices":[{"delta":{"content":"say \\"kv_transfer_params\\":null"}}],'
        b'"kv_transfer_params":null}',
        b'{"kv_transfer_params":null,"id":"c","choices":[]}',
        b'{"id":"c","choices":[],"kv_transfer_params":{"remote_engine_id":"d"}}',
    ]
    for chunk in chunks:
        assert json.loads(chunk)["kv_transfer_params"] in (None, {"remote_engine_id": "d"})
    events = b"".join(b"data: " + chunk + b"\n\n" for chunk in chunks[:2])
    stripped, params = strip_from_events(events)
    assert params is None
    assert [json.loads(e[6:]) for e in stripped.split(b"\n\n") if e] == [
        {k: v for k, v in json.loads(c).items() if k != "kv_transfer_params"} for c in chunks[:2]
    ]
    events += b"data: " + chunks[2] + b"\n\ndata: [DONE]\n\n"
    stripped, params = strip_from_events(events)
    assert params == {"remote_engine_id": "d"}
    assert b'"kv_transfer_params":' not in stripped
    assert stripped.endswith(b'data: {"id":"c","choices":[]}\n\ndata: [DONE]\n\n')


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {
            "messages": [{"role": "user", "content": "é"}],
            "stream": True,
            "max_tokens": 9,
            "max_completion_tokens": 8,
            "min_tokens": 2,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        },
        {"stream": False},
        {},
    ],
)
def test_engine_bodies_are_the_client_body_with_each_calls_members(body: dict[str, Any]) -> None:
    bodies = EngineBodies({**body, "cache_salt": "as-sent"}, "tenant-salt")
    params = {"do_remote_decode": True}
    dropped = ("max_completion_tokens", "min_tokens", "stream_options")
    salted = {**body, "cache_salt": "tenant-salt"}
    prefill = {k: v for k, v in salted.items() if k not in dropped}
    prefill.update(stream=False, max_tokens=1, kv_transfer_params=params)
    assert json.loads(bodies.prefill(params)) == prefill
    assert json.loads(bodies.decode(None)) == salted
    assert json.loads(bodies.decode(params)) == {**salted, "kv_transfer_params": params}


Conditions = tuple[bool | None, bool | None, bool | None]
"""An endpoint's ready, serving and terminating conditions (None: unset)."""


def endpoint_slice(
    name: str, port_name: str, *endpoints: tuple[str, bool | None] | tuple[str, Conditions]
) -> V1EndpointSlice:
    def conditions(state: bool | Conditions | None) -> V1EndpointConditions:
        if isinstance(state, tuple):
            ready, serving, terminating = state
            return V1EndpointConditions(ready=ready, serving=serving, terminating=terminating)
        return V1EndpointConditions(ready=state)

    return V1EndpointSlice(
        address_type="IPv4",
        metadata=V1ObjectMeta(name=name),
        ports=[DiscoveryV1EndpointPort(name=port_name, port=8200)],
        endpoints=[
            V1Endpoint(addresses=[ip], conditions=conditions(state)) for ip, state in endpoints
        ],
    )


def test_endpoint_slices_yield_ready_endpoints_on_the_named_port() -> None:
    ready = endpoint_slice("s1", "http", ("10.0.0.1", True), ("10.0.0.2", False), ("fd00::1", None))
    assert slice_endpoints(ready, "http") == {
        "http://10.0.0.1:8200": False,
        "http://[fd00::1]:8200": False,
    }
    assert slice_endpoints(endpoint_slice("s2", "metrics", ("10.0.0.1", True)), "http") == {
        "http://10.0.0.1:8200": False
    }
    state = _SliceState("http")
    state.reset([ready])
    state.apply("ADDED", endpoint_slice("s3", "http", ("10.0.0.3", True)))
    assert state.urls() == [
        "http://10.0.0.1:8200",
        "http://10.0.0.3:8200",
        "http://[fd00::1]:8200",
    ]
    state.apply("DELETED", ready)
    assert state.urls() == ["http://10.0.0.3:8200"]


def test_terminating_endpoints_are_draining_members_serving_or_not() -> None:
    leaving = endpoint_slice(
        "s1",
        "http",
        ("10.0.0.1", (True, True, False)),
        ("10.0.0.2", (False, True, True)),  # terminating, still serving (in-flight streams)
        ("10.0.0.3", (False, False, True)),  # terminating, no longer serving
        ("10.0.0.4", (False, False, False)),  # starting up: not ready yet
        ("10.0.0.5", (None, None, None)),
    )
    assert slice_endpoints(leaving, "http") == {
        "http://10.0.0.1:8200": False,
        "http://10.0.0.2:8200": True,
        "http://10.0.0.3:8200": True,
        "http://10.0.0.5:8200": False,
    }
    state = _SliceState("http")
    state.reset([leaving, endpoint_slice("s2", "http", ("10.0.0.1", (False, True, True)))])
    assert state.urls() == [f"http://10.0.0.{i}:8200" for i in (1, 2, 3, 5)]
    assert state.draining() == [f"http://10.0.0.{i}:8200" for i in (1, 2, 3)], "draining wins"
    state.apply("MODIFIED", endpoint_slice("s1", "http", ("10.0.0.5", True)))
    state.apply("DELETED", endpoint_slice("s2", "http"))
    assert (state.urls(), state.draining()) == (["http://10.0.0.5:8200"], [])


def test_json_logs_are_one_object_per_line() -> None:
    from disagg_router.server import JsonFormatter

    record = logging.LogRecord(
        "disagg.router", logging.INFO, __file__, 1, "Prefill done in %dms", (12,), None
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line)["message"] == "Prefill done in 12ms"
    assert json.loads(line)["level"] == "INFO"


def test_missing_packages_are_named_with_the_option_needing_them() -> None:
    with pytest.raises(ConfigError, match="--store redis: needs the Python package `nope`"):
        require("nope", "--store redis")
    require("json", "--anything")


def test_prefill_read_report_is_taken_only_as_token_counts_and_never_sent_to_decode() -> None:
    report = {"offered": 40, "verified": 32, "diverged": 8, "read": 32}
    params = {"remote_host": "10.0.0.1", READ_REPORT_KEY: report}
    assert read_report(params) == report
    assert READ_REPORT_KEY not in (decode_params(params, retain=True) or {})
    assert READ_REPORT_KEY in params, "the router's copy of prefill's answer is left alone"
    for bad in (
        "40",
        {**report, "read": -1},
        {**report, "verified": 1.5},
        {**report, "read": True},
    ):
        assert read_report({READ_REPORT_KEY: bad}) is None, bad
    partial = {k: v for k, v in report.items() if k != "diverged"}
    assert read_report({READ_REPORT_KEY: partial}) is None
    assert read_report(None) is None and read_report({}) is None
