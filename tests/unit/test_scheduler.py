"""The engine thread and the response shaping, with a small random Llama (and the synthetic runner)."""

import threading
import time

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from bls.finish_reason import FinishReason
from embedded_engine.prefix_cache import PrefixCacheLimits
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.responses import TritonRequestStream
from embedded_engine.scheduler import Engine, EngineShutDown, HFModelRunner, build_engine
from embedded_engine.settings import EngineSettings
from embedded_engine.synthetic import TEXT_CYCLE, SyntheticRunner

VOCAB = 256
LIMITS = EngineLimits(VOCAB, max_seq_len=128, max_draft_len=4)
PROMPTS = ([5, 17, 42, 99, 3, 250], [7, 7, 8, 100, 31])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def engine(model):
    engine = Engine(HFModelRunner(model), LIMITS, max_active=4)
    yield engine
    engine.shutdown()


def greedy(model, prompt, n, eos=None):
    output = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return output[0, len(prompt) :].tolist()


def make_request(prompt, output_len, request_id="r", limits=LIMITS, exclude_input=True, **extra):
    inputs = {
        "input_ids": np.array([prompt], np.int32),
        "input_lengths": np.array([len(prompt)], np.int32),
        "request_output_len": np.array([output_len], np.int32),
        **extra,
    }
    (request,) = parse_generation_requests(inputs, request_id, limits, exclude_input)
    return request


class Collector:
    """Events of one sequence, in order, with a wait for the final one."""

    def __init__(self, on_each=None):
        self.events = []
        self.done = threading.Event()
        self._on_each = on_each

    def __call__(self, event):
        self.events.append(event)
        if event.finished:
            self.done.set()
        if self._on_each:
            self._on_each(self, event)

    def wait(self):
        assert self.done.wait(30), "no final event"
        assert sum(e.finished for e in self.events) == 1 and self.events[-1].finished
        return self

    @property
    def tokens(self):
        return [t for e in self.events for t in e.token_ids]

    @property
    def final(self):
        return self.events[-1]


def test_greedy_output_equals_model_generate_for_concurrent_requests(model, engine):
    collectors = [Collector() for _ in PROMPTS]
    order = []
    for index, (prompt, collector) in enumerate(zip(PROMPTS, collectors, strict=True)):
        engine.submit(make_request(prompt, 12, f"r{index}"), lambda e, c=collector, i=index: (order.append(i), c(e)))
    for prompt, collector in zip(PROMPTS, collectors, strict=True):
        collector.wait()
        assert collector.tokens == greedy(model, prompt, 12)
        assert collector.final.finish_reason == FinishReason.LENGTH
        assert all(len(e.token_ids) == 1 for e in collector.events)  # streaming granularity: one token per step
    # In-flight batching: the second sequence starts before the first finishes, then they alternate.
    last_of_first = len(order) - 1 - order[::-1].index(0)
    assert order.index(1) < last_of_first
    assert [0, 1, 0, 1] == order[order.index(1) - 1 : order.index(1) + 3]


def test_end_id_stops_without_the_end_token(model, engine):
    expected = greedy(model, PROMPTS[0], 12)
    end_id = expected[5]
    first = expected.index(end_id)
    collector = Collector()
    engine.submit(make_request(PROMPTS[0], 12, end_id=np.array([end_id], np.int32)), collector)
    collector.wait()
    assert collector.tokens == expected[:first]
    assert collector.final.finish_reason == FinishReason.END_ID
    assert greedy(model, PROMPTS[0], 12, eos=end_id) == expected[: first + 1]  # generate keeps the eos


def test_stop_words_stay_in_the_output(model, engine):
    expected = greedy(model, PROMPTS[0], 12)
    stop = np.array([[[expected[3], expected[4]], [2, -1]]], np.int32)
    collector = Collector()
    engine.submit(make_request(PROMPTS[0], 12, stop_words_list=stop), collector)
    collector.wait()
    assert collector.tokens == expected[:5]
    assert collector.final.finish_reason == FinishReason.STOP_WORDS


def test_requests_beyond_max_active_wait_in_the_queue(model):
    engine = Engine(HFModelRunner(model), LIMITS, max_active=1)
    try:
        order = []
        collectors = [Collector(on_each=lambda c, e, i=i: order.append((i, e.finished))) for i in range(3)]
        for i, collector in enumerate(collectors):
            engine.submit(make_request(PROMPTS[i % 2], 3, f"q{i}"), collector)
        for i, collector in enumerate(collectors):
            assert collector.wait().tokens == greedy(model, PROMPTS[i % 2], 3)
        # One active sequence at a time: each starts only after the previous one's final event.
        assert order == [(i, step == 2) for i in range(3) for step in range(3)]
    finally:
        engine.shutdown()


def test_cancel_by_request_id_ends_running_and_queued_sequences():
    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=1)
    all_submitted = threading.Event()
    try:
        def cancel_after_three(collector, event):
            if len(collector.events) == 3:
                # On the engine thread: the cancel must not race ahead of the other submits.
                assert all_submitted.wait(5)
                engine.cancel("victim")

        running = Collector(on_each=cancel_after_three)
        queued = Collector()
        other = Collector()
        engine.submit(make_request([1, 2], 1000, "victim", limits=engine.limits), running)
        engine.submit(make_request([1, 2], 1000, "victim", limits=engine.limits), queued)
        engine.submit(make_request([1, 2], 5, "other", limits=engine.limits), other)
        all_submitted.set()
        running.wait(), queued.wait(), other.wait()
        assert len(running.tokens) == 3 and running.final.finish_reason == FinishReason.CANCELLED
        assert queued.tokens == [] and queued.final.finish_reason == FinishReason.CANCELLED
        assert len(other.tokens) == 5 and other.final.finish_reason == FinishReason.LENGTH
        assert engine.cancel("nobody") == 0
    finally:
        engine.shutdown()


def test_every_steps_events_come_inside_the_step_scope():
    """A paced engine's step scope (ResponseLoop.held) spans every sequence's step of an iteration: the
    sending loop then hands a step's responses over together, as a GPU step's tokens come out."""
    entered = []
    in_step = [False]

    class Scope:
        def __enter__(self):
            in_step[0] = True
            entered.append(1)

        def __exit__(self, *exc):
            in_step[0] = False

    inside = []
    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=2, step_scope=Scope)
    try:
        collectors = [Collector(on_each=lambda c, e: inside.append(in_step[0])) for _ in range(2)]
        for index, collector in enumerate(collectors):
            engine.submit(make_request([1, 2], 4, f"r{index}", limits=engine.limits), collector)
        for collector in collectors:
            assert len(collector.wait().tokens) == 4
    finally:
        engine.shutdown()
    assert len(inside) >= 8 and all(inside) and len(entered) >= 4


class CountingRunner(HFModelRunner):
    """The real model, counting forwards and failing on a poisoned prompt token."""

    POISON = 13

    def __init__(self, model):
        super().__init__(model)
        self.forwards = 0
        self.feeds = []  # (past_length, tokens fed) of every forward

    def forward(self, cache, token_ids, past_length, num_logits):
        if past_length == 0 and self.POISON in token_ids:
            raise RuntimeError("poisoned prompt")
        self.forwards += 1
        self.feeds.append((past_length, len(token_ids)))
        return super().forward(cache, token_ids, past_length, num_logits)


def test_client_disconnect_stops_work_at_once(model):
    runner = CountingRunner(model)
    engine = Engine(runner, LIMITS)
    try:
        disconnected = threading.Event()
        collector = Collector(on_each=lambda c, e: len(c.events) == 2 and disconnected.set())
        engine.submit(make_request(PROMPTS[0], 50), collector, is_cancelled=disconnected.is_set)
        collector.wait()
        assert len(collector.tokens) == 2 and collector.final.finish_reason == FinishReason.CANCELLED
        assert runner.forwards == 2  # no step after the disconnect was seen
    finally:
        engine.shutdown()


def test_a_failing_request_does_not_hurt_the_others(model):
    engine = Engine(CountingRunner(model), LIMITS)
    try:
        bad, good = Collector(), Collector()
        engine.submit(make_request([1, CountingRunner.POISON, 2], 5, "bad"), bad)
        engine.submit(make_request(PROMPTS[1], 5, "good"), good)
        assert isinstance(bad.wait().final.error, RuntimeError)
        assert good.wait().tokens == greedy(model, PROMPTS[1], 5)

        def explode(collector, event):
            raise ValueError("client callback bug")

        broken = Collector(on_each=explode)
        engine.submit(make_request(PROMPTS[0], 50, "broken"), broken)
        assert broken.wait().final.finish_reason == FinishReason.CANCELLED  # the failing callback cancels only its own
        after = Collector()
        engine.submit(make_request(PROMPTS[0], 3, "after"), after)
        assert after.wait().tokens == greedy(model, PROMPTS[0], 3)
    finally:
        engine.shutdown()


def test_shutdown_ends_unfinished_requests_with_an_error():
    slow = SyntheticRunner()
    original = slow.forward
    slow.forward = lambda *args: (time.sleep(0.01), original(*args))[1]
    engine = Engine(slow, EngineLimits(128256, 4096), max_active=1)
    running, queued = Collector(), Collector()
    engine.submit(make_request([1], 4000, "a", limits=engine.limits), running)
    engine.submit(make_request([1], 4000, "b", limits=engine.limits), queued)
    time.sleep(0.05)
    engine.shutdown()
    assert isinstance(running.wait().final.error, EngineShutDown)
    assert isinstance(queued.wait().final.error, EngineShutDown)
    with pytest.raises(EngineShutDown):
        engine.submit(make_request([1], 4, "c", limits=engine.limits), Collector())


def test_log_probs_and_logits_match_the_model(model, engine):
    prompt = PROMPTS[0]
    collector = Collector()
    engine.submit(
        make_request(
            prompt, 4, return_log_probs=np.array([True]), return_context_logits=np.array([True]),
            return_generation_logits=np.array([True]),
        ),
        collector,
    )
    collector.wait()
    tokens = collector.tokens
    with torch.no_grad():
        full = model(torch.tensor([prompt + tokens])).logits[0]
    context = collector.events[0].context_logits
    assert context.shape == (len(prompt), VOCAB)
    np.testing.assert_allclose(context, full[: len(prompt)].numpy(), atol=1e-4)
    generation = np.concatenate([e.generation_logits for e in collector.events])
    np.testing.assert_allclose(generation, full[len(prompt) - 1 : -1].numpy(), atol=1e-4)
    log_probs = [p for e in collector.events for p in e.log_probs]
    expected = torch.log_softmax(full[len(prompt) - 1 : -1], -1)[torch.arange(4), torch.tensor(tokens)]
    np.testing.assert_allclose(log_probs, expected.numpy(), atol=1e-4)


def test_seeded_sampling_is_reproducible(engine):
    def sample(seed):
        collector = Collector()
        extra = dict(runtime_top_k=np.array([20], np.int32), temperature=np.array([1.5], np.float32),
                     seed=np.array([seed], np.uint64))
        engine.submit(make_request(PROMPTS[0], 10, **extra), collector)
        return collector.wait().tokens

    assert sample(7) == sample(7)
    assert len({tuple(sample(seed)) for seed in range(4)}) > 1


# ---- KV-cache reuse across requests ------------------------------------------------------------


def run_one(engine, prompt, output_len, request_id="r", **extra):
    collector = Collector()
    engine.submit(make_request(prompt, output_len, request_id, **extra), collector)
    return collector.wait()


def prefill_of_next_request(runner, engine, prompt, output_len, **extra):
    """(past_length, tokens fed) of the request's first forward, and its output tokens."""
    first = len(runner.feeds)
    tokens = run_one(engine, prompt, output_len, **extra).tokens
    return runner.feeds[first], tokens


def test_a_continued_sequence_prefills_only_its_new_tokens(model):
    runner = CountingRunner(model)
    engine = Engine(runner, LIMITS)
    try:
        prompt = PROMPTS[0]
        first = run_one(engine, prompt, 6).tokens
        assert first == greedy(model, prompt, 6)
        # The parked cache holds prompt + 5 tokens (the 6th was never fed): only the last token is new.
        continued = prompt + first
        prefill, tokens = prefill_of_next_request(runner, engine, continued, 5)
        assert prefill == (len(continued) - 1, 1)
        assert tokens == greedy(model, continued, 5)
        # A prompt that leaves the cached sequence part-way (shared: prompt + 3 tokens) reuses the shared part.
        branched = prompt + first[:3] + [first[3] ^ 1, 7]
        prefill, tokens = prefill_of_next_request(runner, engine, branched, 4)
        assert prefill == (len(prompt) + 3, 2)
        assert tokens == greedy(model, branched, 4)
        # The same prompt again: everything but its last token comes from the cache.
        prefill, tokens = prefill_of_next_request(runner, engine, branched, 4)
        assert prefill == (len(branched) - 1, 1) and tokens == greedy(model, branched, 4)
        # Context logits need the whole prompt run: no reuse for them.
        prefill, _ = prefill_of_next_request(runner, engine, branched, 2, return_context_logits=np.array([True]))
        assert prefill == (0, len(branched))
        # Nothing shared: a full prefill.
        prefill, tokens = prefill_of_next_request(runner, engine, PROMPTS[1], 3)
        assert prefill == (0, len(PROMPTS[1])) and tokens == greedy(model, PROMPTS[1], 3)
    finally:
        engine.shutdown()


def speculate(engine, prompt, rounds):
    """The BLS loop of draft-target decoding against one engine, with given draft proposals: for each round
    (draft, output_len), send the whole sequence with the draft and append what comes back."""
    sequence = list(prompt)
    for index, (draft, output_len) in enumerate(rounds):
        extra = {"draft_input_ids": np.array([draft], np.int32)} if draft else {}
        sequence += run_one(engine, sequence, output_len, f"t{index}", **extra).tokens
    return sequence[len(prompt):]


def test_speculative_rounds_with_rejected_drafts_equal_generate_with_and_without_reuse(model):
    prompt = PROMPTS[1]
    expected = greedy(model, prompt, 20)
    wrong = [(t + 1) % VOCAB for t in expected]
    rounds = [
        (expected[0:4], 5),  # all accepted, plus the target's own token
        ([expected[5], wrong[6], expected[7], expected[8]], 5),  # rejected at 2: fill to 5 by decoding
        ([wrong[10], wrong[11]], 3),  # nothing accepted
        ([expected[13], expected[14], wrong[15], wrong[16]], 3),  # rejected, and the request ends right there
        (expected[16:19], 4),
    ]
    assert sum(n for _, n in rounds) == 20
    runner = CountingRunner(model)
    outputs = {}
    for reuse in (PrefixCacheLimits(), None):
        engine = Engine(runner, LIMITS, reuse=reuse)
        try:
            first = len(runner.feeds)
            outputs[reuse is not None] = speculate(engine, prompt, rounds)
            feeds = runner.feeds[first:]
        finally:
            engine.shutdown()
        verifications = [feed for feed in feeds if feed[1] > 1]
        if reuse:  # every round after the first feeds only its last sequence token and the draft
            assert verifications[1:] == [(len(prompt) + offset - 1, len(draft) + 1)
                                         for offset, (draft, _) in zip((5, 10, 13, 16), rounds[1:], strict=True)]
    assert outputs[True] == outputs[False] == expected


def test_a_request_that_ends_on_a_rejected_draft_parks_no_kv_of_it(model):
    runner = CountingRunner(model)
    engine = Engine(runner, LIMITS)
    try:
        prompt = PROMPTS[0]
        expected = greedy(model, prompt, 10)
        draft = [expected[0], expected[1], (expected[2] + 1) % VOCAB, expected[3]]
        # Ends at its 3rd token, the target's own in place of the rejected draft: no crop happens then.
        assert run_one(engine, prompt, 3, draft_input_ids=np.array([draft], np.int32)).tokens == expected[:3]
        continued = prompt + expected[:5]  # goes on past the rejected position, so no re-fed token hides it
        prefill, tokens = prefill_of_next_request(runner, engine, continued, 5)
        assert prefill == (len(prompt) + 2, 3)
        assert tokens == expected[5:]
    finally:
        engine.shutdown()


def test_a_cancelled_request_parks_a_cache_that_its_continuation_reuses(model):
    runner = CountingRunner(model)
    engine = Engine(runner, LIMITS)
    try:
        disconnected = threading.Event()
        cancelled = Collector(on_each=lambda c, e: len(c.events) == 3 and disconnected.set())
        engine.submit(make_request(PROMPTS[0], 50), cancelled, is_cancelled=disconnected.is_set)
        assert cancelled.wait().final.finish_reason == FinishReason.CANCELLED
        continued = PROMPTS[0] + cancelled.tokens
        prefill, tokens = prefill_of_next_request(runner, engine, continued, 6)
        assert prefill == (len(continued) - 1, 1)
        assert tokens == greedy(model, continued, 6)
    finally:
        engine.shutdown()


def test_a_parked_cache_serves_one_of_two_concurrent_requests(model):
    runner = CountingRunner(model)
    engine = Engine(runner, LIMITS)
    try:
        prompt = PROMPTS[0] + run_one(engine, PROMPTS[0], 4).tokens
        first = len(runner.feeds)
        sender = serve(engine, inputs_for([prompt, prompt], 3))  # two rows, both want the parked cache
        prefills = [feed for feed in runner.feeds[first:] if feed[0] < len(prompt)]
        assert sorted(prefills) == [(0, len(prompt)), (len(prompt) - 1, 1)]  # one row reused it, one could not
        expected = greedy(model, prompt, 3)
        assert [o["output_ids"].tolist() for o, _ in sender.responses] == [[[prompt + expected]]] * 2
    finally:
        engine.shutdown()


# ---- responses: events -> tensors, as the tensorrtllm backend shapes them ------------------------


class FakeSender:
    def __init__(self):
        self.responses = []  # (outputs, final)
        self.error = None
        self.closed = threading.Event()

    def send(self, outputs, final=False):
        assert not self.closed.is_set()
        self.responses.append((outputs, final))
        if final:
            self.closed.set()

    def send_error(self, error):
        self.error = error
        self.closed.set()

    def finish(self):
        self.responses.append((None, True))
        self.closed.set()

    def is_cancelled(self):
        return self.closed.is_set()


def serve(engine, inputs, exclude_input=False):
    requests = parse_generation_requests(inputs, "t", engine.limits, exclude_input)
    sender = FakeSender()
    stream = TritonRequestStream(requests, sender, engine.limits.vocab_size)
    for request in requests:
        engine.submit(request, stream.on_event, sender.is_cancelled)
    assert sender.closed.wait(30)
    return sender


def inputs_for(prompts, output_len, **extra):
    width = max(map(len, prompts))
    return {
        "input_ids": np.array([p + [0] * (width - len(p)) for p in prompts], np.int32),
        "input_lengths": np.array([len(p) for p in prompts], np.int32),
        "request_output_len": np.full(len(prompts), output_len, np.int32),
        **extra,
    }


def test_non_streaming_response_holds_prompt_and_output(model, engine):
    prompt = PROMPTS[0]
    sender = serve(engine, inputs_for([prompt], 5, return_log_probs=np.array([True])))
    (outputs, final), = sender.responses
    assert final
    expected = prompt + greedy(model, prompt, 5)
    assert outputs["output_ids"].dtype == np.int32 and outputs["output_ids"].tolist() == [[expected]]
    assert outputs["sequence_length"].tolist() == [[len(expected)]]
    assert outputs["output_log_probs"].shape == (1, 1, 5)
    assert outputs["cum_log_probs"].shape == (1, 1)
    assert outputs["cum_log_probs"][0, 0] == pytest.approx(outputs["output_log_probs"].sum(), abs=1e-4)
    assert "batch_index" not in outputs and "context_logits" not in outputs


def test_exclude_input_in_output_and_logits_shapes(model, engine):
    prompt = PROMPTS[1]
    sender = serve(
        engine,
        inputs_for([prompt], 3, return_context_logits=np.array([True]), return_generation_logits=np.array([True])),
        exclude_input=True,
    )
    (outputs, final), = sender.responses
    assert outputs["output_ids"].tolist() == [[greedy(model, prompt, 3)]]
    assert outputs["context_logits"].shape == (1, len(prompt), VOCAB)
    assert outputs["generation_logits"].shape == (1, 1, 3, VOCAB)


def test_streaming_sends_new_tokens_only_and_final_on_the_last(model, engine):
    prompt = PROMPTS[0]
    expected = greedy(model, prompt, 4)
    sender = serve(engine, inputs_for([prompt], 4, streaming=np.array([True])))
    assert [o["output_ids"].tolist() for o, _ in sender.responses] == [[[[t]]] for t in expected]
    assert [o["sequence_length"].tolist() for o, _ in sender.responses] == [[[1]]] * 4
    assert [final for _, final in sender.responses] == [False, False, False, True]


def test_streaming_end_id_gives_an_empty_final_chunk(model, engine):
    prompt = PROMPTS[0]
    expected = greedy(model, prompt, 8)
    end_id = expected[2]
    sender = serve(engine, inputs_for([prompt], 8, streaming=np.array([True]), end_id=np.array([end_id], np.int32)))
    last, final = sender.responses[-1]
    assert final and last["output_ids"].shape == (1, 1, 0) and last["sequence_length"].tolist() == [[0]]
    assert [t for o, _ in sender.responses for t in o["output_ids"].ravel()] == expected[: expected.index(end_id)]


def test_batch_rows_answer_separately_with_batch_index(model, engine):
    sender = serve(engine, inputs_for(list(PROMPTS), 3))
    assert len(sender.responses) == 2
    assert [final for _, final in sender.responses] == [False, True]
    by_row = {int(o["batch_index"][0, 0]): o for o, _ in sender.responses}
    for row, prompt in enumerate(PROMPTS):
        assert by_row[row]["output_ids"].tolist() == [[prompt + greedy(model, prompt, 3)]]


def test_an_error_ends_the_triton_request_once(model):
    engine = Engine(CountingRunner(model), LIMITS)
    try:
        sender = serve(engine, inputs_for([PROMPTS[0], [1, CountingRunner.POISON]], 20, streaming=np.array([True])))
        assert isinstance(sender.error, RuntimeError)
        assert not any(final for _, final in sender.responses)
    finally:
        engine.shutdown()


# ---- the synthetic runner ---------------------------------------------------------------------


def test_synthetic_runner_emits_readable_text(tokenizer_dir):
    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096))
    try:
        collector = Collector()
        engine.submit(make_request([128000, 9906], 12, limits=engine.limits), collector)
        tokens = collector.wait().tokens
        assert len(tokens) == 12 and set(tokens) <= set(TEXT_CYCLE)
        text = AutoTokenizer.from_pretrained(str(tokenizer_dir)).decode(tokens)
        assert "quick brown fox" in text or "lazy dog" in text
    finally:
        engine.shutdown()


def test_synthetic_per_token_overhead_through_the_scheduler(capsys):
    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=8)
    try:
        for concurrency in (1, 8):
            collectors = [Collector() for _ in range(concurrency)]
            start = time.perf_counter()
            for i, collector in enumerate(collectors):
                engine.submit(make_request([128000, 9906], 200, f"b{i}", limits=engine.limits), collector)
            for collector in collectors:
                collector.wait()
            per_token_us = (time.perf_counter() - start) / (200 * concurrency) * 1e6
            with capsys.disabled():
                print(f"\nsynthetic runner, {concurrency} concurrent: {per_token_us:.0f} us per token")
            assert per_token_us < 2000
    finally:
        engine.shutdown()


def test_build_engine_from_settings():
    engine = build_engine(EngineSettings(synthetic=True, max_seq_len=1024, max_draft_len=3, max_active_requests=2))
    try:
        assert engine.limits == EngineLimits(128256, 1024, 3)
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="checkpoint_dir"):
        build_engine(EngineSettings())
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        build_engine(EngineSettings(synthetic=True, max_seq_len=10**6))


def test_a_step_time_paces_every_active_sequence_like_a_gpu_step():
    """step_s: one token per active sequence per step, each step at least step_s long, whatever the load."""
    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=8, step_s=0.05)
    try:
        collectors = [Collector() for _ in range(4)]
        start = time.perf_counter()
        for i, collector in enumerate(collectors):
            engine.submit(make_request([128000, 9906], 6, f"s{i}", limits=engine.limits), collector)
        for collector in collectors:
            collector.wait()
        elapsed = time.perf_counter() - start
    finally:
        engine.shutdown()
    assert all(len(c.tokens) == 6 for c in collectors)
    assert elapsed >= 5 * 0.05  # the 6th token ends the 6th step: no step was shorter than step_s
    # One response per step: each sequence's events carry one token each.
    assert all(len(event.token_ids) <= 1 for c in collectors for event in c.events)


def test_beyond_max_queued_a_request_is_refused_at_once():
    from embedded_engine.scheduler import EngineAtCapacity

    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=1, max_queued=1, step_s=0.05)
    try:
        running, waiting = Collector(), Collector()
        engine.submit(make_request([128000, 9906], 50, "a", limits=engine.limits), running)
        engine.submit(make_request([128000, 9906], 50, "b", limits=engine.limits), waiting)
        with pytest.raises(EngineAtCapacity, match="at capacity"):
            engine.submit(make_request([128000, 9906], 50, "c", limits=engine.limits), Collector())
        engine.cancel("a")
        engine.cancel("b")
        running.wait(), waiting.wait()
    finally:
        engine.shutdown()


def test_a_dead_engine_thread_ends_every_sequence_and_refuses_new_ones(monkeypatch):
    """If the loop itself dies, nobody waits for it: queued and running sequences end with an error, and
    later requests fail at once (UNAVAILABLE), naming the cause."""
    from embedded_engine.scheduler import EngineFailed

    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=1, step_s=0.02)
    try:
        first, second = Collector(), Collector()
        engine.submit(make_request([128000, 9906], 500, "a", limits=engine.limits), first)
        engine.submit(make_request([128000, 9906], 500, "b", limits=engine.limits), second)

        def broken(sequence):
            raise RuntimeError("scheduler bug")

        monkeypatch.setattr(engine, "_cancelled", broken)
        for collector in (first, second):
            final = collector.wait().events[-1]
            assert isinstance(final.error, EngineFailed) and "scheduler bug" in str(final.error)
        assert isinstance(engine.failure, RuntimeError)
        with pytest.raises(EngineFailed, match="reload the model"):
            engine.submit(make_request([128000, 9906], 5, "c", limits=engine.limits), Collector())
    finally:
        engine.shutdown()


def test_drain_waits_for_running_sequences_and_refuses_new_ones():
    engine = Engine(SyntheticRunner(), EngineLimits(128256, 4096), max_active=2, step_s=0.01)
    try:
        collector = Collector()
        engine.submit(make_request([128000, 9906], 5, "a", limits=engine.limits), collector)
        assert engine.drain(10)
        assert collector.done.is_set() and len(collector.tokens) == 5
        with pytest.raises(EngineShutDown, match="unloading"):
            engine.submit(make_request([128000, 9906], 5, "b", limits=engine.limits), Collector())
    finally:
        engine.shutdown()


def test_each_iteration_first_asks_whether_responses_wait_to_be_sent():
    """wait_for_sending (the sending loop's backlog bound) is asked before every step with the active count."""
    asked = []
    engine = build_engine(EngineSettings(synthetic=True, max_seq_len=1024, max_active_requests=4),
                          wait_for_sending=asked.append)
    try:
        done = threading.Event()
        engine.submit(make_request(PROMPTS[0], 5), lambda event: done.set() if event.finished else None)
        assert done.wait(10)
    finally:
        engine.shutdown()
    assert len(asked) >= 5 and set(asked) <= {0, 1} and 1 in asked
