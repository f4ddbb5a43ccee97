"""The connector's scheduler side inside vLLM's real scheduler, with real requests, on CPU.

No engine runs: as vLLM's own connector unit tests do, a ``Scheduler`` is built over a KV
cache config with no tensors, and the model's outputs are played by hand (a sampled token a
step, ``finished_recving`` for a pull). What the tests read is what vLLM would hand its
worker: the connector metadata's reads. A prefill and a decode scheduler pass signed offers
both ways; attacker's offers (malformed, forged, altered, replayed, expired) must each end as a
request scheduled for a full recompute with no read, counted by verdict, never an exception.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import prometheus_client
import pytest
import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_scheduler, pull_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata as nixl_metadata
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from conftest import MODEL_DIR
from disagg.rig.engine import MODEL_NAME, ensure_model
from disagg_connector.lease_service import claim
from disagg_connector.offer import BOUND_KEYS
from disagg_connector.offer_form import REMOTE_FIELDS, Direction, pull_direction
from disagg_connector.prefix_digest import TokenDigest
from disagg_connector.scheduler import DisaggConnectorScheduler, prompt_view
from disagg_connector.stats import OFFER_VERDICTS, DisaggKVConnectorStats, DisaggPromMetrics
from disagg_contract import (
    CONNECTOR_CLASS,
    CONNECTOR_MODULE,
    EXPIRES_AT_KEY,
    EXTRA_BIDIRECTIONAL,
    EXTRA_DECODER_TTL,
    EXTRA_RECOMPUTE_THRESHOLD,
    KV_ROLE,
    LEASE_PORT_ENV,
    OFFER_KEY,
    OFFER_KEY_ENV,
    RETAIN_KEY,
    TOKEN_DIGEST_KEY,
    Role,
)
from disagg_router.payloads import prefill_params

BLOCK = 16
NUM_BLOCKS = 4000  # nothing reports a finished send, so retained blocks stay taken
TTL_S = 60
KEY = "scheduler-side-test-key-0123456789abcdef"
ANSWER = [11, 12, 13, 14, 15]
EOS = 2

pytestmark = pytest.mark.engine


def vllm_config(role: Role) -> VllmConfig:
    return VllmConfig(
        model_config=ModelConfig(
            model=str(MODEL_DIR), dtype="float32", seed=0, served_model_name=MODEL_NAME
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=4,
            max_num_batched_tokens=2048,
            max_model_len=2048,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        kv_transfer_config=KVTransferConfig(
            kv_connector=CONNECTOR_CLASS,
            kv_connector_module_path=CONNECTOR_MODULE,
            kv_role=KV_ROLE[role],
            kv_connector_extra_config={
                EXTRA_BIDIRECTIONAL: True,
                EXTRA_DECODER_TTL: TTL_S,
                EXTRA_RECOMPUTE_THRESHOLD: 1,
            },
        ),
        device_config=DeviceConfig("cpu"),
    )


def build_scheduler(role: Role) -> Scheduler:
    config = vllm_config(role)
    config.cache_config.num_gpu_blocks = NUM_BLOCKS
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )


@dataclass
class Engine:
    """One scheduler and the offer verdicts its stats reported."""

    scheduler: Scheduler
    counted: list[str] = field(default_factory=list)
    batched: set[str] = field(default_factory=set)
    """The requests vLLM told its worker to track for sending (each step's ``reqs_in_batch``)."""

    @property
    def side(self) -> DisaggConnectorScheduler:
        side = self.scheduler.connector.connector_scheduler
        assert isinstance(side, DisaggConnectorScheduler)
        return side

    def verdicts(self) -> list[str]:
        """The verdicts reported since the last call."""
        counted, self.counted = self.counted, []
        return counted


Pair = tuple[Engine, Engine]


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A prefill and a decode scheduler holding the same signing key."""
    ensure_model(MODEL_DIR)
    init_none_hash(sha256)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(OFFER_KEY_ENV, KEY)
        patch.setenv(LEASE_PORT_ENV, "0")  # both lease services in this one process
        yield Engine(build_scheduler(Role.PREFILL)), Engine(build_scheduler(Role.DECODE))


_ids = itertools.count()


def request(prompt: list[int], params: Any, max_tokens: int, **extra: Any) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    sampling.update_from_generation_config({}, EOS)
    req = Request(
        request_id=f"req-{next(_ids)}",
        prompt_token_ids=list(prompt),
        sampling_params=sampling,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
        **extra,
    )
    req.kv_transfer_params = params
    return req


def drive(engine: Engine, req: Request) -> tuple[dict[str, Any] | None, list[Any]]:
    """Run ``req`` to its end: its published params, and every read vLLM asked its worker for.

    The verdicts the scheduler's stats carry (as the engine exports them) go to ``engine``.
    """
    scheduler = engine.scheduler
    scheduler.add_request(req)
    reads: list[Any] = []
    answer = iter(ANSWER)
    for _ in range(500):  # a step that schedules nothing waits for a claim's answer
        out = scheduler.schedule()
        if not out.num_scheduled_tokens:
            time.sleep(0.002)
        meta = out.kv_connector_metadata
        recv = dict(meta.reqs_to_recv) if meta is not None else {}
        reads.extend(recv.values())
        engine.batched.update(meta.reqs_in_batch if meta is not None else ())
        scheduled = list(out.num_scheduled_tokens)
        output = ModelRunnerOutput(
            req_ids=scheduled,
            req_id_to_index={rid: i for i, rid in enumerate(scheduled)},
            sampled_token_ids=[[next(answer)] for _ in scheduled],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(finished_recving=set(recv)) if recv else None,
        )
        for outputs in scheduler.update_from_output(out, output).values():
            stats = outputs.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                engine.counted.extend(stats.kv_connector_stats.get(OFFER_VERDICTS, []))
            for finished in (o for o in outputs.outputs if o.finished):
                assert finished.request_id == req.request_id
                return finished.kv_transfer_params, reads
    raise AssertionError(f"{req.request_id} did not finish")


def first_turn(pair: Pair, prompt: list[int]) -> dict[str, Any]:
    """Prefill then decode for ``prompt``, as the router runs a turn: decode's D->P offer."""
    prefill, decode = pair
    p2d, _ = drive(prefill, request(prompt, prefill_params(None), 1))
    assert p2d is not None and p2d["do_remote_prefill"] is True
    decode_params = {**copy.deepcopy(p2d), RETAIN_KEY: True}  # a conversation's turn
    d2p, reads = drive(decode, request(prompt, decode_params, len(ANSWER)))
    assert [read.remote.block_ids for read in reads] == [p2d["remote_block_ids"]]
    assert d2p is not None and d2p["do_remote_decode"] is True
    return d2p


PROMPT = list(range(100, 180))  # 80 tokens: 5 blocks
NEXT = [*PROMPT, *ANSWER, *range(300, 340)]  # turn 2: history, answer, new message


def test_signed_offers_both_ways_and_a_verified_read_back(
    pair: Pair,
) -> None:
    prefill, decode = pair
    prefill.verdicts(), decode.verdicts()
    d2p = first_turn(pair, PROMPT)
    assert decode.verdicts() == ["prefill_to_decode:verified"]
    assert d2p[OFFER_KEY]["model"] == prefill.side.signer.model

    _, reads = drive(prefill, request(NEXT, prefill_params_for(d2p), 1))
    (read,) = reads
    verified_blocks = len([*PROMPT, *ANSWER[:-1]]) // BLOCK
    assert read.remote.engine_id == d2p["remote_engine_id"]
    assert read.remote.block_ids == [d2p["remote_block_ids"][0][:verified_blocks]]
    assert read.remote.num_tokens == verified_blocks * BLOCK
    assert prefill.verdicts() == ["decode_to_prefill:verified"]


def prefill_params_for(d2p: dict[str, Any]) -> dict[str, Any]:
    """Decode's offer as the router sends it to prefill (a copy: offers are single-use)."""
    return copy.deepcopy({**d2p, "do_remote_decode": True, "do_remote_prefill": False})


def test_the_published_digest_covers_exactly_the_tokens_decode_holds(
    pair: Pair,
) -> None:
    d2p = first_turn(pair, PROMPT)
    held = [*PROMPT, *ANSWER[:-1]]  # the last sampled token has no KV yet
    assert d2p["remote_num_tokens"] == len(held)
    digest = TokenDigest.from_wire(d2p[TOKEN_DIGEST_KEY])
    assert digest == TokenDigest.of_tokens(held, BLOCK)
    assert digest.num_blocks == len(held) // BLOCK
    assert len(d2p["remote_block_ids"][0]) == -(-len(held) // BLOCK)
    assert d2p[EXPIRES_AT_KEY] == d2p[OFFER_KEY]["exp"]


def recompute_check(prefill: Engine, params: Any, prompt: list[int] = NEXT) -> list[Any]:
    """Send ``params`` with ``prompt`` to prefill: served in full, nothing read. The verdicts."""
    req = request(prompt, copy.deepcopy(params), 1)
    published, reads = drive(prefill, req)
    assert reads == []
    assert req.num_computed_tokens >= len(prompt)
    assert published is not None and published["do_remote_prefill"] is True
    assert pull_direction(req.kv_transfer_params or {}) is None
    return prefill.verdicts()


D2P_MALFORMED = "decode_to_prefill:malformed"
MALFORMED = [
    ({"remote_num_tokens": "x"}, D2P_MALFORMED),
    ({"remote_num_tokens": [1]}, D2P_MALFORMED),
    ({"remote_num_tokens": float("inf")}, D2P_MALFORMED),  # what JSON makes of 1e400
    ({"remote_num_tokens": -5}, D2P_MALFORMED),
    ({"remote_num_tokens": 2**70}, D2P_MALFORMED),
    ({"remote_block_ids": [1, 2, 3, 4, 5, 6]}, D2P_MALFORMED),
    ({"remote_block_ids": [[1, 2, "3"]]}, D2P_MALFORMED),
    ({"remote_block_ids": [[1, 2, 3, 4, 5, 2**40]]}, D2P_MALFORMED),
    ({"remote_block_ids": [[1, 2]]}, D2P_MALFORMED),
    ({"remote_block_ids": [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]]}, D2P_MALFORMED),
    ({"remote_engine_id": ["decode"]}, D2P_MALFORMED),
    ({"remote_engine_id": {"a": 1}}, D2P_MALFORMED),
    ({"remote_host": 7}, D2P_MALFORMED),
    ({"remote_port": "5600"}, D2P_MALFORMED),
    ({"remote_port": -1}, D2P_MALFORMED),
    ({"tp_size": "x"}, D2P_MALFORMED),
    ({"remote_blocks_expiry_time": "later"}, D2P_MALFORMED),
    ({EXPIRES_AT_KEY: "never"}, D2P_MALFORMED),
    ({OFFER_KEY: [1, 2]}, D2P_MALFORMED),
    ({TOKEN_DIGEST_KEY: "not a digest"}, "decode_to_prefill:bad-signature"),
    ({"do_remote_prefill": True}, "prefill_to_decode:malformed"),
]


@pytest.mark.parametrize(("change", "verdict"), MALFORMED, ids=lambda case: repr(case)[:40])
def test_each_malformed_offer_is_a_recompute(
    pair: Pair, change: dict[str, Any], verdict: str
) -> None:
    prefill, _ = pair
    d2p = first_turn(pair, PROMPT)
    prefill.verdicts()
    assert recompute_check(prefill, {**prefill_params_for(d2p), **change}) == [verdict]


@pytest.mark.parametrize("params", ["x", ["do_remote_decode"], 7])
def test_params_that_are_not_an_object_are_dropped(pair: Pair, params: object) -> None:
    prefill, _ = pair
    req = request(NEXT, params, 1)
    published, reads = drive(prefill, req)
    assert (published, reads, req.kv_transfer_params) == (None, [], None)
    assert prefill.verdicts() == ["decode_to_prefill:malformed"]


def test_a_forged_offer_for_other_blocks_is_refused(pair: Pair) -> None:
    prefill, _ = pair
    victim = first_turn(pair, PROMPT)
    attacker = list(range(500, 600))
    forged = prefill_params_for(victim)
    forged[TOKEN_DIGEST_KEY] = TokenDigest.of_tokens(attacker, BLOCK).to_wire()
    prefill.verdicts()
    assert recompute_check(prefill, forged, attacker) == ["decode_to_prefill:bad-signature"]
    del forged[OFFER_KEY]
    assert recompute_check(prefill, forged, attacker) == ["decode_to_prefill:unsigned"]


def test_a_private_flag_does_not_skip_the_checks(pair: Pair) -> None:
    prefill, _ = pair
    forged = prefill_params_for(first_turn(pair, PROMPT))
    forged["remote_block_ids"] = [[1, 2, 3, 4, 5, 6]]
    forged["_disagg_verified"] = True
    forged["_remote_blocks_processed"] = False
    prefill.verdicts()
    assert recompute_check(prefill, forged) == ["decode_to_prefill:bad-signature"]


def test_an_altered_block_id_is_refused(pair: Pair) -> None:
    prefill, _ = pair
    altered = prefill_params_for(first_turn(pair, PROMPT))
    altered["remote_block_ids"][0][2] += 1
    prefill.verdicts()
    assert recompute_check(prefill, altered) == ["decode_to_prefill:bad-signature"]


def test_a_replayed_offer_is_refused(pair: Pair) -> None:
    prefill, _ = pair
    d2p = first_turn(pair, PROMPT)
    _, reads = drive(prefill, request(NEXT, prefill_params_for(d2p), 1))
    assert len(reads) == 1
    prefill.verdicts()
    assert recompute_check(prefill, prefill_params_for(d2p)) == ["decode_to_prefill:replayed"]


def test_an_offer_decode_no_longer_holds_is_refused_by_its_claim(pair: Pair) -> None:
    """Whether an offer still holds is decode's to say, on its own clock: released (or lapsed,
    capped, freed) retentions refuse the claim, and prefill recomputes."""
    prefill, decode = pair
    d2p = first_turn(pair, PROMPT)
    retainer = decode.side.retainer
    assert retainer is not None
    assert retainer.table.release(d2p["remote_request_id"], d2p[OFFER_KEY]["id"])
    assert d2p["remote_request_id"] in [rid for rid, _ in retainer.table.take_due()]
    prefill.verdicts()
    assert recompute_check(prefill, prefill_params_for(d2p)) == ["decode_to_prefill:unclaimed"]


def test_a_request_waiting_for_its_claim_frees_no_retained_kv(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its P->D claim is out, decode tells vLLM "not yet" and vLLM asks again each
    step: that is no request short of room, so decode's retained turns stay held."""
    prefill, decode = pair
    d2p = first_turn(pair, PROMPT)
    retainer, desk = decode.side.retainer, decode.side.reader.desk
    assert retainer is not None and desk is not None

    def slow_claim(*args: Any) -> Any:
        time.sleep(0.1)  # a few dozen scheduling steps
        return claim(*args)

    monkeypatch.setattr(desk, "_send", slow_claim)
    other = list(range(500, 560))
    p2d, _ = drive(prefill, request(other, prefill_params(None), 1))
    assert p2d is not None
    _, reads = drive(decode, request(other, copy.deepcopy(p2d), len(ANSWER)))
    assert len(reads) == 1, "the claim was granted and the prompt read"
    assert retainer.table.renew(d2p["remote_request_id"], d2p[OFFER_KEY]["id"]), (
        "turn 1's retention was released while a claim was out"
    )


def test_a_decode_turn_served_as_a_recompute_hands_its_retained_kv_to_the_worker(
    pair: Pair,
) -> None:
    """A refused P->D offer (here a replayed one) makes the turn a recompute on decode, whose KV
    is still retained and offered for the next turn: vLLM's worker must track the request, or it
    ignores the blocks' send deadline and never reports them sent, so they are never freed (not
    even for live requests) and a read back of them is reported as unrecognized."""
    prefill, decode = pair
    other = list(range(600, 660))
    p2d, _ = drive(prefill, request(other, prefill_params(None), 1))
    assert p2d is not None
    turn = {**copy.deepcopy(p2d), RETAIN_KEY: True}
    _, reads = drive(decode, request(other, copy.deepcopy(turn), len(ANSWER)))
    assert len(reads) == 1
    decode.verdicts()
    replay = request(other, copy.deepcopy(turn), len(ANSWER))
    d2p, reads = drive(decode, replay)
    assert reads == [] and decode.verdicts() == ["prefill_to_decode:replayed"]
    assert d2p is not None and d2p["do_remote_decode"] is True, "retained and offered"
    assert replay.request_id in decode.batched, "the worker never tracks the retained blocks"


@pytest.mark.parametrize("skew_s", [-120.0, 120.0])
def test_a_skewed_reader_clock_changes_nothing(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    """Prefill compares none of decode's times with its own clock."""
    prefill, _ = pair
    d2p = first_turn(pair, PROMPT)
    skewed = time.time() + skew_s
    monkeypatch.setattr("disagg_connector.reader.time.time", lambda: skewed)
    prefill.verdicts()
    _, reads = drive(prefill, request(NEXT, prefill_params_for(d2p), 1))
    assert len(reads) == 1
    assert prefill.verdicts() == ["decode_to_prefill:verified"]


def test_a_prefill_offer_of_another_prompt_reads_only_its_matching_blocks(pair: Pair) -> None:
    """Decode is sent prompt B with prefill's signed offer of prompt A's KV: it reads the
    whole blocks the two share and computes the rest, so nothing of A enters its cache."""
    prefill, decode = pair
    p2d, _ = drive(prefill, request(PROMPT, prefill_params(None), 1))
    other = [*PROMPT[:40], *range(700, 740)]  # shares the first 2.5 blocks
    decode.verdicts()
    req = request(other, copy.deepcopy(p2d), len(ANSWER))
    _, reads = drive(decode, req)
    (read,) = reads
    assert read.remote.block_ids == [p2d["remote_block_ids"][0][:2]]
    assert decode.verdicts() == ["prefill_to_decode:diverged"]


def test_a_decode_offer_flipped_into_a_prefill_to_decode_read_is_refused(
    pair: Pair,
) -> None:
    """``do_remote_prefill`` would read every prompt token with no digest check at all."""
    prefill, _ = pair
    flipped = prefill_params_for(first_turn(pair, PROMPT))
    flipped["do_remote_prefill"], flipped["do_remote_decode"] = True, False
    _, reads = drive(prefill, request([*PROMPT, *ANSWER[:-1]], flipped, 1))
    assert reads == []
    assert prefill.verdicts() == ["prefill_to_decode:bad-signature"]


def test_a_prefill_offer_shorter_than_decode_prompt_is_refused(
    pair: Pair,
) -> None:
    """vLLM's worker asserts the remote blocks cover the local ones: it would kill decode."""
    prefill, decode = pair
    p2d, _ = drive(prefill, request(PROMPT, prefill_params(None), 1))
    assert p2d is not None
    decode.verdicts()
    published, reads = drive(decode, request(NEXT, {**p2d, RETAIN_KEY: True}, len(ANSWER)))
    assert reads == []
    assert published is not None and TOKEN_DIGEST_KEY in published
    assert decode.verdicts() == ["prefill_to_decode:malformed"]


def test_lora_and_images_are_bound_into_the_digest(pair: Pair) -> None:
    prefill, decode = pair
    lora = LoRARequest("sql", 1, "/adapters/sql")
    image = MultiModalFeatureSpec(
        data=None, modality="image", identifier="cat", mm_position=PlaceholderRange(20, 30)
    )
    held = request(PROMPT, {"do_remote_decode": False}, 1, lora_request=lora, mm_features=[image])
    held.status = RequestStatus.FINISHED_LENGTH_CAPPED
    held.num_computed_tokens = len(PROMPT)
    params = dict(remote_num_tokens=len(PROMPT), do_remote_decode=True)
    decode.side._publish_digest(held, params, whole_prompt=False)
    digest = TokenDigest.from_wire(params[TOKEN_DIGEST_KEY])

    side = prefill.side
    other = MultiModalFeatureSpec(
        data=None, modality="image", identifier="dog", mm_position=PlaceholderRange(20, 30)
    )
    for extra, verified in [
        ({"lora_request": lora, "mm_features": [image]}, len(PROMPT)),
        ({"lora_request": lora, "mm_features": [other]}, BLOCK),  # the image starts in block 1
        ({"mm_features": [image]}, 0),
        ({}, 0),
    ]:
        offer = {
            **first_turn(pair, PROMPT),
            TOKEN_DIGEST_KEY: digest.to_wire(),
            "remote_num_tokens": len(PROMPT),
        }
        offer["remote_block_ids"] = [offer["remote_block_ids"][0][: len(PROMPT) // BLOCK]]
        req = request(NEXT, offer, 1, **extra)
        side.reader.verify(prompt_view(req), offer, Direction.DECODE_TO_PREFILL)
        assert offer["remote_num_tokens"] == verified, extra
        side.request_finished(req, ([],))


def test_prompt_embeds_are_never_reused(pair: Pair) -> None:
    prefill, _ = pair
    offer = prefill_params_for(first_turn(pair, PROMPT))
    req = request(NEXT, offer, 1, prompt_embeds=torch.zeros(len(NEXT), 4))
    side = prefill.side
    side.reader.verify(prompt_view(req), offer, Direction.DECODE_TO_PREFILL)
    assert offer["remote_num_tokens"] == 0
    side.request_finished(req, ([],))


def test_verdicts_reach_the_log_line_and_labelled_prometheus_counters(
    pair: Pair,
) -> None:
    stats = DisaggKVConnectorStats()
    side = pair[0].side
    registry = prometheus_client.CollectorRegistry()
    metric_types = {
        kind: functools.partial(kind, registry=registry)
        for kind in (
            prometheus_client.Counter,
            prometheus_client.Gauge,
            prometheus_client.Histogram,
        )
    }
    prom = DisaggPromMetrics(side.vllm_config, metric_types, ["engine"], {0: ["0"]})
    for label in ["malformed", "malformed", "bad-signature"]:
        stats.data[OFFER_VERDICTS].append(f"decode_to_prefill:{label}")
    assert stats.reduce()["Offers decode_to_prefill:malformed"] == 2
    prom.observe(stats.data, 0)

    def sample(verdict: str) -> float | None:
        return registry.get_sample_value(
            "vllm:disagg_kv_offers_total",
            {"engine": "0", "direction": "decode_to_prefill", "verdict": verdict},
        )

    assert (sample("malformed"), sample("bad-signature"), sample("replayed")) == (2, 1, 0)


def _keys_read(module: Any) -> set[str]:
    """String keys a vLLM module reads off ``params`` / ``kv_transfer_params``."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        target, key = None, None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and node.args:
                target, key = node.func.value, node.args[0]
        elif isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        if (
            isinstance(target, ast.Name)
            and target.id in ("params", "kv_transfer_params")
            and isinstance(key, ast.Constant)
            and isinstance(key.value, str)
        ):
            keys.add(key.value)
    return keys


def test_every_param_vllm_reads_is_signed_or_handled() -> None:
    read = set().union(*(_keys_read(m) for m in (pull_scheduler, base_scheduler, nixl_metadata)))
    assert {"remote_block_ids", "remote_num_tokens", "tp_size"} <= read
    private = {key for key in read if key.startswith("_")}  # dropped on arrival
    assert read - private - set(BOUND_KEYS) == set()
    assert set(BOUND_KEYS) <= set(REMOTE_FIELDS) | {"do_remote_prefill", "do_remote_decode"}
