"""The launcher's side of a multi-node server: every rank builds its group's NIXL engine id
from the leader's address, the group's revision and the leader pod's IPs (resolved with
bounded retries), so the ranks of one group incarnation agree and a recreated group does not
reuse its predecessor's id; a headless worker execs ``vllm serve``."""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence

import pytest

from disagg.cli import build_parser
from disagg_connector.commands import group_rank
from disagg_connector.launch_config import LaunchConfigError, group_engine_id
from disagg_connector.launcher import (
    API_SERVER_MODULE,
    CLI_MODULE,
    LEADER_ATTEMPTS,
    GroupRank,
    leader_ips,
    rank_engine_id,
    vllm_command,
)
from disagg_contract import KV_TRANSFER_CONFIG_FLAG, POD_IP_ENV

ADDRESS = "big-prefill-1.big-prefill-1.ml"
REVISION = "5d8f7c9b4"


class FakeResolver:
    """A stand-in for the cluster's DNS: answers ``ADDRESS`` from a script, one answer per
    call (an exception is raised), the last answer repeated."""

    def __init__(self, *answers: Sequence[str] | OSError) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, name: str) -> Sequence[str]:
        assert name == ADDRESS
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, OSError):
            raise answer
        return answer


def _no_record() -> OSError:
    return socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_the_id_names_the_group_its_revision_and_its_leaders_ips() -> None:
    assert group_engine_id(ADDRESS, REVISION, ["10.0.3.7"]) == f"{ADDRESS}/{REVISION}/10.0.3.7"
    dual = group_engine_id(ADDRESS, REVISION, ["fd00::7", "10.0.3.7", "fd00::7"])
    assert dual == f"{ADDRESS}/{REVISION}/10.0.3.7,fd00::7"


def test_ids_differ_between_groups_revisions_and_incarnations() -> None:
    ids = {
        group_engine_id(ADDRESS, REVISION, ["10.0.3.7"]),
        group_engine_id("big-prefill-0.big-prefill-0.ml", REVISION, ["10.0.3.7"]),
        group_engine_id(ADDRESS, "77c4d9f5b", ["10.0.3.7"]),
        group_engine_id(ADDRESS, REVISION, ["10.0.5.12"]),
    }
    assert len(ids) == 4


@pytest.mark.parametrize(
    ("address", "revision", "flag"),
    [
        ("$(LWS_LEADER_ADDRESS)", REVISION, "--leader-address"),
        (ADDRESS, "$(DISAGG_LWS_REVISION)", "--group-revision"),
        (ADDRESS, "", "--group-revision"),
    ],
)
def test_an_unexpanded_variable_is_refused(address: str, revision: str, flag: str) -> None:
    with pytest.raises(LaunchConfigError, match=f"{flag} .* lacks a variable it names"):
        group_engine_id(address, revision, ["10.0.3.7"])


def test_every_rank_of_one_incarnation_builds_the_same_id() -> None:
    resolver = FakeResolver(["10.0.3.7"])
    leader = rank_engine_id(
        GroupRank(ADDRESS, REVISION, headless_worker=False), {POD_IP_ENV: "10.0.3.7"}, resolver
    )
    workers = {
        rank_engine_id(GroupRank(ADDRESS, REVISION, headless_worker=True), {}, resolver)
        for _ in range(3)
    }
    assert workers == {leader} == {f"{ADDRESS}/{REVISION}/10.0.3.7"}


def test_a_recreated_group_gets_a_new_id() -> None:
    """The LeaderWorkerSet controller recreates a group with the same leader name and
    revision; its new leader pod has a new IP, and so the group a new id."""
    rank = GroupRank(ADDRESS, REVISION, headless_worker=True)
    before = rank_engine_id(rank, {}, FakeResolver(["10.0.3.7"]))
    after = rank_engine_id(rank, {}, FakeResolver(["10.0.9.40"]))
    assert before != after


def test_resolution_retries_until_the_leaders_record_appears() -> None:
    resolver = FakeResolver(_no_record(), [], _no_record(), ["10.0.3.7"])
    slept: list[float] = []
    assert leader_ips(ADDRESS, resolve=resolver, retry_s=0.5, sleep=slept.append) == ["10.0.3.7"]
    assert resolver.calls == 4 and slept == [0.5, 0.5, 0.5]


def test_the_leader_waits_for_a_record_with_its_own_ip() -> None:
    """A record left from the group's previous leader is not taken for the new one."""
    resolver = FakeResolver(["10.0.3.7"], ["10.0.9.40"])
    slept: list[float] = []
    assert leader_ips(ADDRESS, "10.0.9.40", resolve=resolver, sleep=slept.append) == ["10.0.9.40"]
    assert resolver.calls == 2 and len(slept) == 1


def test_resolution_gives_up_after_its_bound_saying_why() -> None:
    resolver = FakeResolver(_no_record())
    slept: list[float] = []
    with pytest.raises(LaunchConfigError) as caught:
        leader_ips(ADDRESS, resolve=resolver, attempts=5, retry_s=2.0, sleep=slept.append)
    assert resolver.calls == 5 and slept == [2.0] * 4
    message = str(caught.value)
    assert f"{ADDRESS!r} did not resolve in 5 attempts 2s apart" in message
    assert "Name or service not known" in message and "leader pod running" in message
    assert LEADER_ATTEMPTS > 5


def test_the_leader_gives_up_on_a_record_that_never_names_it() -> None:
    with pytest.raises(LaunchConfigError, match=r"to this pod IP 10\.0\.9\.40 .*not 10\.0\.9\.40"):
        leader_ips(
            ADDRESS,
            "10.0.9.40",
            resolve=FakeResolver(["10.0.3.7"]),
            attempts=3,
            sleep=lambda _s: None,
        )


def test_the_leader_needs_its_pod_ip() -> None:
    resolver = FakeResolver(["10.0.3.7"])
    with pytest.raises(LaunchConfigError, match=f"{POD_IP_ENV} is not set"):
        rank_engine_id(GroupRank(ADDRESS, REVISION, headless_worker=False), {}, resolver)
    assert resolver.calls == 0


def test_an_unexpanded_address_is_refused_before_any_lookup() -> None:
    resolver = FakeResolver(["10.0.3.7"])
    rank = GroupRank("$(LWS_LEADER_ADDRESS)", REVISION, headless_worker=True)
    with pytest.raises(LaunchConfigError, match="lacks a variable it names"):
        rank_engine_id(rank, {}, resolver)
    assert resolver.calls == 0


def test_a_headless_worker_execs_vllm_serve_and_the_leader_the_api_server() -> None:
    config: dict[str, object] = {"kv_role": "kv_both", "engine_id": "g"}
    worker = vllm_command(["--model", "m", "--headless"], config, headless=True)
    assert worker[:4] == [sys.executable, "-m", CLI_MODULE, "serve"]
    assert worker[4:7] == ["--model", "m", "--headless"]
    assert worker[-2] == KV_TRANSFER_CONFIG_FLAG
    assert vllm_command(["--model", "m"], config)[:3] == [sys.executable, "-m", API_SERVER_MODULE]


def test_the_cli_names_a_rank_only_with_both_its_groups_values() -> None:
    parser = build_parser()
    base = ["serve", "--role", "prefill", "--config", "/etc/disagg/prefill.json"]
    assert group_rank(parser.parse_args([*base, "--", "--model", "m"])) is None
    group = ["--leader-address", ADDRESS, "--group-revision", REVISION, "--headless-worker"]
    rank = group_rank(parser.parse_args([*base, *group, "--", "--model", "m"]))
    assert rank == GroupRank(ADDRESS, REVISION, headless_worker=True)
    for partial in (["--leader-address", ADDRESS], ["--headless-worker"]):
        with pytest.raises(SystemExit, match="needs both --leader-address and --group-revision"):
            group_rank(parser.parse_args([*base, *partial, "--", "--model", "m"]))
