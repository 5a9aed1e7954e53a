# attn inside Hugging Face transformers models: small randomly initialised causal LMs built from
# config objects (nothing downloaded) run with attn_implementation="attn" and "eager" on the same
# weights; logits (padded batches included) and one training step's parameter gradients must
# agree. Llama with grouped-query heads, Mistral with a sliding window shorter than the sequence,
# Gemma 2 with logit soft-capping and its sliding layers, gpt-oss with attention sinks; and a
# bf16 Llama, whose attn forward and backward must be as accurate as eager bf16 attention.
import copy

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the transformers tests need it"
)
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: the model tests need it"
)

import attn.transformers  # noqa: E402

# Logits: float32 through two layers, attn's and eager's attention rounding differently by a few
# ulps, amplified by the layers after it (norms, MLP, the vocabulary projection).
LOGITS_RTOL = 1e-4
# Parameter gradients: the backward pass through the same layers, each one's rounding compounding;
# relative to each parameter's largest gradient.
GRADIENT_RTOL = 1e-3

BATCH, LENGTH = 3, 12
COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,  # grouped-query heads: 4 query heads per key/value head
    head_dim=8,
    max_position_embeddings=64,
    attention_dropout=0.0,
    # Larger weights than the default 0.02, so that the scores are O(1) to O(10): attention is
    # far from uniform and Gemma 2's soft-capping (at 5) changes them.
    initializer_range=0.2,
)


def llama():
    return transformers.LlamaConfig(**COMMON)


def mistral():
    return transformers.MistralConfig(**COMMON, sliding_window=5)


def gemma2():
    return transformers.Gemma2Config(
        **COMMON,
        sliding_window=5,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=None,
        query_pre_attn_scalar=8,
    )


def gpt_oss():
    config = dict(COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=5)
    return transformers.GptOssConfig(**config)


CONFIGS = {"llama": llama, "mistral": mistral, "gemma2": gemma2, "gpt_oss": gpt_oss}


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert attn.transformers.register() == "attn"


def model_pair(name):
    """The same random weights under attn and eager attention, in evaluation mode."""
    make_config = CONFIGS[name]
    if name == "gpt_oss" and not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no gpt-oss")
    torch.manual_seed(0)
    config = make_config()
    eager = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="eager"
    ).eval()
    mine = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation="attn"
    ).eval()
    mine.load_state_dict(eager.state_dict())
    assert mine.config._attn_implementation == "attn"
    if name == "gpt_oss":  # the sinks start at zero: make them matter
        with torch.no_grad():
            for model in (eager, mine):
                for layer in model.model.layers:
                    layer.self_attn.sinks.copy_(
                        torch.linspace(-1.0, 2.0, COMMON["num_attention_heads"])
                    )
    return eager, mine


PADDINGS = {
    "none": None,
    "all_ones": lambda: torch.ones(BATCH, LENGTH, dtype=torch.long),
    # Row 1 padded on the left (4 tokens), row 2 on the right (3 tokens).
    "left_and_right": lambda: torch.tensor(
        [[1] * LENGTH, [0] * 4 + [1] * (LENGTH - 4), [1] * (LENGTH - 3) + [0] * 3]
    ),
}


def assert_relative(actual, expected, rtol, name):
    actual, expected = actual.detach().double(), expected.detach().double()
    scale = max(expected.abs().max().item(), 1e-6)
    error = (actual - expected).abs().max().item()
    assert error <= rtol * scale, f"{name}: max error {error:.3g} > {rtol} × {scale:.3g}"


def count_calls():
    """Records the calls that reach attn's attention function while the model runs."""
    calls = []
    original = attn.transformers.attention_forward

    def spy(module, query, key, value, *args, **kwargs):
        # What attn reads: the model's own (transposed) query, key and value, without a copy.
        in_place = all(
            attn._data_pointer(t.detach(), strided=True) == t.data_ptr()
            for t in (query, key, value)
        )
        calls.append((kwargs.get("softcap"), in_place))
        return original(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register("attn", spy)
    return calls, lambda: transformers.AttentionInterface.register("attn", original)


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_gradients_match_eager(name, padding):
    eager, mine = model_pair(name)
    torch.manual_seed(1)
    input_ids = torch.randint(0, COMMON["vocab_size"], (BATCH, LENGTH))
    attention_mask = PADDINGS[padding]() if PADDINGS[padding] else None
    # Only real tokens count: a padded query's output is arbitrary (eager's float mask gives it
    # uniform weights over padding, attn zeros), and no real token attends to it.
    real = (
        torch.ones(BATCH, LENGTH, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.bool()
    )
    # The loss predicts token t + 1 from position t: keep the labels whose position and
    # predecessor are both real tokens.
    counted = real.clone()
    counted[:, 1:] &= real[:, :-1]
    labels = input_ids.masked_fill(~counted, -100)

    calls, restore = count_calls()
    try:
        output = mine(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    finally:
        restore()
    expected = eager(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert len(calls) == COMMON["num_hidden_layers"]  # every layer ran through attn
    assert all(in_place for _, in_place in calls)
    if name == "gemma2":
        assert [softcap for softcap, _ in calls] == [5.0, 5.0]
    assert_relative(output.logits[real], expected.logits[real], LOGITS_RTOL, "logits")

    # One training step: the loss over real tokens, every parameter's gradient.
    output.loss.backward()
    expected.loss.backward()
    eager_parameters = dict(eager.named_parameters())
    for parameter_name, parameter in mine.named_parameters():
        reference = eager_parameters[parameter_name].grad
        if reference is None:
            assert parameter.grad is None or not parameter.grad.any(), parameter_name
            continue
        assert parameter.grad is not None, f"{parameter_name}: no gradient through attn"
        assert_relative(parameter.grad, reference, GRADIENT_RTOL, f"d {parameter_name}")


@pytest.mark.parametrize("name, cache", [("mistral", None), ("llama", "static")])
def test_generation_with_a_cache_matches_eager(name, cache):
    # Decoding: the padded prompt, then one query at a time against the cached keys, whose mask
    # (left padding, Mistral's window, a static cache's empty slots) attn reads as key ranges.
    eager, mine = model_pair(name)
    torch.manual_seed(2)
    input_ids = torch.randint(1, COMMON["vocab_size"], (2, 6))
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    settings = dict(
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    if cache is not None:
        settings["cache_implementation"] = cache
    ours = mine.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
    theirs = eager.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
    assert torch.equal(ours.sequences, theirs.sequences)
    for step, (mine_scores, eager_scores) in enumerate(zip(ours.scores, theirs.scores)):
        assert_relative(mine_scores, eager_scores, LOGITS_RTOL, f"scores at step {step}")


def test_register_names_the_implementation():
    assert "attn" in transformers.AttentionInterface()
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert "attn" in ALL_MASK_ATTENTION_FUNCTIONS


@pytest.mark.parametrize("model_type", ["bloom", "xglm", "mpt"])
def test_a_model_whose_attention_is_its_own_code_is_refused(model_type):
    # BLOOM, XGLM and MPT compute attention themselves and took only the mask from attn's name:
    # BLOOM and XGLM added SDPA's boolean mask to their float scores (logits 80-110% off eager's,
    # causality lost, no warning), MPT failed on a mask left out ("'NoneType' object has no
    # attribute 'to'"). transformers refuses "sdpa" for them; attn now does too, by name.
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=128, hidden_size=64, d_model=64, n_layer=1, num_layers=1,
        n_layers=1, n_head=4, n_heads=4, attention_heads=4, ffn_dim=128,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="attn")
    with pytest.raises(ValueError, match=f'the "{model_type}" models compute attention in their '
                                         'own code.*use attn_implementation="eager"'):
        model(input_ids=torch.randint(0, 128, (1, 6)))


def test_models_of_other_flags_are_not_refused():
    # T5's attention reaches attn although its class declares no attention backend (it takes
    # SDPA); gpt-oss declares the backend but not SDPA: neither flag alone marks a model refused.
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                   num_heads=4, decoder_start_token_id=0)
    eager = transformers.AutoModelForSeq2SeqLM.from_config(
        copy.deepcopy(config), attn_implementation="eager").eval()
    mine = transformers.AutoModelForSeq2SeqLM.from_config(
        copy.deepcopy(config), attn_implementation="attn").eval()
    mine.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        expected = eager(input_ids=ids, decoder_input_ids=ids).logits
        actual = mine(input_ids=ids, decoder_input_ids=ids).logits
    assert_relative(actual, expected, LOGITS_RTOL, "T5 logits")


def test_bfloat16_model_is_as_accurate_as_eager_in_bfloat16():
    # A bf16 model: attn's bf16 kernels (forward and backward, vdpbf16ps where the CPU has it)
    # against eager attention in bf16, both measured against the same model in float32. Each
    # layer rounds its activations to bf16 (2⁻⁸ relative), so neither matches float32 closely;
    # attn must be no less accurate than eager: within twice eager's error, logits and every
    # parameter's gradient (relative to its largest entry).
    reference, _ = model_pair("llama")
    eager, mine = model_pair("llama")
    eager, mine = eager.to(torch.bfloat16), mine.to(torch.bfloat16)
    torch.manual_seed(3)
    input_ids = torch.randint(0, COMMON["vocab_size"], (BATCH, LENGTH))
    dtypes = []
    original = attn.transformers.attention_forward

    def spy(module, query, key, value, *args, **kwargs):
        dtypes.append((query.dtype, key.dtype, value.dtype))
        return original(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register("attn", spy)
    try:
        output = mine(input_ids=input_ids, labels=input_ids)
    finally:
        transformers.AttentionInterface.register("attn", original)
    # Every layer's attention ran through attn, on the model's bf16 tensors.
    assert dtypes == [(torch.bfloat16,) * 3] * COMMON["num_hidden_layers"]
    expected = eager(input_ids=input_ids, labels=input_ids)
    truth = reference(input_ids=input_ids, labels=input_ids)
    assert output.logits.dtype == torch.bfloat16

    def error(actual, wanted):
        actual, wanted = actual.detach().double(), wanted.detach().double()
        return (actual - wanted).abs().max().item() / max(wanted.abs().max().item(), 1e-6)

    ours, theirs = error(output.logits, truth.logits), error(expected.logits, truth.logits)
    assert ours <= 2 * theirs + 1e-3, f"logits: attn {ours:.3g}, eager {theirs:.3g}"
    output.loss.backward()
    expected.loss.backward()
    truth.loss.backward()
    eager_parameters = dict(eager.named_parameters())
    reference_parameters = dict(reference.named_parameters())
    for parameter_name, parameter in mine.named_parameters():
        wanted = reference_parameters[parameter_name].grad
        if wanted is None:
            continue
        ours = error(parameter.grad, wanted)
        theirs = error(eager_parameters[parameter_name].grad, wanted)
        assert ours <= 2 * theirs + 1e-3, f"d {parameter_name}: attn {ours:.3g}, eager {theirs:.3g}"


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_a_compiled_model_matches_eager(name):
    from torch._inductor.compile_fx import compile_fx

    # torch.compile(fullgraph=True) of a whole model, padded on both sides, in inference and for
    # one training step: the graph holds attn's operators (Gemma 2's soft cap among their
    # options) and the logits and gradients are eager attention's, as the uncompiled model's are.
    eager, mine = model_pair(name)
    torch.manual_seed(1)
    input_ids = torch.randint(0, COMMON["vocab_size"], (BATCH, LENGTH))
    attention_mask = PADDINGS["left_and_right"]()
    real = attention_mask.bool()
    counted = real.clone()
    counted[:, 1:] &= real[:, :-1]
    labels = input_ids.masked_fill(~counted, -100)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module.code)
        return compile_fx(graph_module, example_inputs)  # Inductor, as torch.compile's default

    # Inference (no_grad: the operator's Autograd kernel runs at every call), then training
    # (AOTAutograd's compiled forward and backward).
    for training in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(mine.train(training), fullgraph=True, backend=recording_backend)
        with torch.set_grad_enabled(training):
            # The second call: the first one after compiling runs under a mode of PyTorch's.
            for _ in range(2):
                output = compiled(input_ids=input_ids, attention_mask=attention_mask,
                                  labels=labels)
            expected = eager.train(training)(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        assert graphs.pop().count("torch.ops.attn.sdpa.default(") == COMMON["num_hidden_layers"]
        assert not graphs, f"training {training}: {len(graphs) + 1} graphs"
        assert_relative(output.logits[real], expected.logits[real], LOGITS_RTOL,
                        f"logits, training {training}")
    output.loss.backward()
    expected.loss.backward()
    eager_parameters = dict(eager.named_parameters())
    for parameter_name, parameter in mine.named_parameters():
        reference = eager_parameters[parameter_name].grad
        if reference is not None:
            assert_relative(parameter.grad, reference, GRADIENT_RTOL, f"d {parameter_name}")
