"""`torch.compile` on a prepared model: it trains like the eager model, breaks no graph per decoder layer, and
compiles a bounded number of times while flattened batches change their total length and sequence count.

Compilation is slow on two cores, so each compiled model is built once per module (fixtures) and every assertion
reads the run it recorded.
"""

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.registry import lookup_backend
from torch._inductor import cpp_builder
from torch._inductor.exc import InvalidCxxCompiler

from flatcollate import DataCollatorWithFlattening
from flatcollate.boundaries import Boundaries
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow

# Six batches: total lengths 29, 7, 22, 20, 14, 26; sequence counts 5, 2, 4, 1, 7, 5 (a length-1 sequence in three).
LENGTH_MIXES = [[9, 1, 5, 12, 2], [3, 4], [7, 7, 7, 1], [20], [2] * 7, [5, 11, 6, 1, 3]]
STEPS = len(LENGTH_MIXES)
LEARNING_RATE = 0.5


def _has_cpp_compiler() -> bool:
    """Whether inductor finds the C++ compiler it builds CPU kernels with (`torch._inductor.config.cpp.cxx`)."""
    try:
        cpp_builder.get_cpp_compiler()
    except InvalidCxxCompiler:
        return False
    return True


HAS_CPP_COMPILER = _has_cpp_compiler()
needs_cpp = pytest.mark.skipif(not HAS_CPP_COMPILER, reason="inductor on CPU needs a C++ compiler (none found)")


def flattened_batches(seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    collate = DataCollatorWithFlattening()
    return [
        collate([{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in lengths])
        for lengths in LENGTH_MIXES
    ]


class CountingBackend:
    """A dynamo backend that counts the graphs it compiles and the graph runs, then hands each graph to `backend`.

    Graph runs per forward are what a graph break costs at run time: one graph per forward means no break at all;
    `torch._dynamo.explain` lists each break once per code location, however many layers run through it.
    """

    def __init__(self, backend: str):
        self.backend, self.compiles, self.runs = lookup_backend(backend), 0, 0

    def __call__(self, graph_module, example_inputs):
        self.compiles += 1
        compiled = self.backend(graph_module, example_inputs)

        def run(*args):
            self.runs += 1
            return compiled(*args)

        return run


def train(model, batches: list[dict], counter: CountingBackend | None = None) -> dict:
    """SGD steps, one per batch; the losses, the graph runs of each forward and the trained parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses, runs = [], []
    for batch in batches:
        before = counter.runs if counter else 0
        loss = model(**batch).loss
        runs.append((counter.runs if counter else 0) - before)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    module = getattr(model, "_orig_mod", model)  # the compiled wrapper prefixes every name with `_orig_mod.`
    parameters = {name: p.detach().clone() for name, p in module.named_parameters()}
    return {"losses": torch.stack(losses), "runs": runs, "parameters": parameters}


class CountingHostCopies:
    """Counts the copies of boundaries from the device to the host (`Boundaries.copy_to_host`, the one place)."""

    stores = 0

    @staticmethod
    def copy(original):
        def counting(cu_seqlens):
            CountingHostCopies.stores += 1
            return original(cu_seqlens)

        return staticmethod(counting)


def compiled_and_eager_runs(family: str, backend: str, dynamic: bool | None, **overrides) -> dict:
    batches = flattened_batches()
    eager = prepare_model_for_flattening(tiny_causal_lm(family, **overrides)).train()
    initial = {name: p.detach().clone() for name, p in eager.named_parameters()}
    twin = copy.deepcopy(eager)
    torch._dynamo.reset()
    counter = CountingBackend(backend)
    compiled = torch.compile(twin, backend=counter, dynamic=dynamic)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Boundaries, "copy_to_host", CountingHostCopies.copy(Boundaries.copy_to_host))
        compiled_run = train(compiled, batches, counter)
    return {
        "initial": initial,
        "eager": train(eager, batches),
        "compiled": compiled_run,
        "compiles": counter.compiles,
        "host_copies": CountingHostCopies.stores,
        "dynamic": dynamic,
    }


# Llama on inductor (aot_eager without a C++ compiler) with `dynamic=True`; Mistral with a sliding window smaller than
# most sequences on aot_eager with `dynamic=None`, the automatic dynamic shapes `Trainer(torch_compile=True)` uses.
LLAMA_BACKEND = "inductor" if HAS_CPP_COMPILER else "aot_eager"
RUNS = [
    pytest.param(("llama", LLAMA_BACKEND, True, {}), id=f"llama-{LLAMA_BACKEND}-dynamic"),
    pytest.param(("mistral", "aot_eager", None, {"sliding_window": 3}), id="mistral-window-aot_eager-automatic"),
]


@pytest.fixture(scope="module", params=RUNS)
def run(request):
    family, backend, dynamic, overrides = request.param
    CountingHostCopies.stores = 0
    return compiled_and_eager_runs(family, backend, dynamic, **overrides)


def test_compiled_training_matches_eager_losses_and_parameters(run):
    eager, compiled = run["eager"], run["compiled"]
    torch.testing.assert_close(compiled["losses"], eager["losses"], atol=1e-5, rtol=0)
    moved = 0.0
    for name, value in eager["parameters"].items():
        torch.testing.assert_close(compiled["parameters"][name], value, atol=1e-5, rtol=0, msg=name)
        moved = max(moved, float((value - run["initial"][name]).abs().max()))
    assert moved > 1e-2  # the steps changed the weights: equal parameters are not the initial ones


def test_compiled_forward_runs_one_graph_for_every_batch(run):
    # One graph per forward, whatever the batch: the guard's checks run eagerly before it, nothing breaks the decoder
    # layers, and no batch falls back to eager after too many recompilations.
    assert run["compiled"]["runs"] == [1] * STEPS


def test_boundaries_are_copied_to_the_host_once_per_training_step(run):
    # The guard copies `cu_seq_lens_q` once; every layer's attention, forward and recomputing backward, reuses it.
    assert run["host_copies"] == STEPS


def test_recompilations_stay_bounded_as_lengths_and_sequence_counts_change(run):
    # A forward and a backward graph. `dynamic=True`: total length, sequence count and `max_length` are symbols from
    # the first compile, so the two graphs serve all six batches. `dynamic=None`: the first batch compiles with static
    # shapes, the second (another length) once more with symbolic ones, which serve the remaining four.
    assert run["compiles"] <= (2 if run["dynamic"] else 4)


def explain(layers: int):
    """`torch._dynamo.explain` of a `layers`-deep Llama's forward on a flattened batch (dynamo's tracing only)."""
    model = prepare_model_for_flattening(tiny_causal_lm("llama", num_hidden_layers=layers)).train()
    torch._dynamo.reset()
    return torch._dynamo.explain(model)(**flattened_batches(seed=layers)[0])


def test_graph_breaks_do_not_grow_with_the_number_of_layers():
    two, four = explain(2), explain(4)
    assert (two.graph_count, two.graph_break_count) == (four.graph_count, four.graph_break_count) == (1, 0)
    assert two.break_reasons == four.break_reasons == []


def test_guard_checks_every_call_under_compile():
    model = prepare_model_for_flattening(tiny_causal_lm("llama")).train()
    counter = CountingBackend("eager")
    compiled = torch.compile(model, backend=counter, dynamic=True)
    first, second = flattened_batches()[:2]
    compiled(**first)
    # Same arguments and dtypes as the compiled call, so no new trace: the guard refuses at run time.
    arange = torch.arange(second["input_ids"].shape[1])[None]
    with pytest.raises(ValueError, match="do not restart where `cu_seq_lens_q` starts sequences"):
        compiled(**{**second, "position_ids": arange})
    assert counter.compiles == 1
    with pytest.raises(ValueError, match="attention_mask"):
        compiled(**second, attention_mask=torch.ones_like(second["input_ids"]))


def test_patched_mask_builders_of_the_family_do_not_break_the_graph():
    # Another model of the family prepared on its own backend patches the module's mask builders; a model on the
    # packed backend passes through them without reading the forward's slot, so dynamo still traces one graph.
    prepare_model_for_flattening(tiny_causal_lm("llama"), attn_implementation=None)
    two = explain(2)
    assert (two.graph_count, two.graph_break_count) == (1, 0), two.break_reasons
