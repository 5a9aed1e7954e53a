"""attn as an attention implementation of Hugging Face transformers.

``attn.transformers.register()`` adds attn to transformers' ``AttentionInterface`` (and its mask
interface) under the name ``"attn"``, so that

    model = AutoModelForCausalLM.from_config(config, attn_implementation="attn")

(or ``from_pretrained(..., attn_implementation="attn")``, or ``model.set_attn_implementation("attn")``)
runs every attention layer through ``attn.torch.scaled_dot_product_attention``, forward and
backward. It follows transformers' own SDPA integration (integrations/sdpa_attention.py): the
model builds the same boolean masks as for ``"sdpa"`` (padding, causal, sliding windows, ...) or
none at all when ``is_causal`` suffices (aligned top-left, as PyTorch's); grouped-query heads are
read without being repeated; Gemma 2's ``attn_logit_softcapping`` arrives as ``softcap`` and
gpt-oss' sinks as ``s_aux``, both computed by attn (transformers' SDPA integration refuses
``softcap`` and has no sinks).

Sliding windows reach attn inside the mask transformers builds (its ``sliding_window_overlay``),
exactly as for SDPA: that mask knows where the cached keys sit, which a window aligned to the
last key would not with a static cache (whose last slots are empty).

transformers is imported only when ``register()`` runs; ``import attn.transformers`` works
without it.
"""

import warnings
from typing import Optional

import torch

from . import torch as _attn_torch

__all__ = ["attention_forward", "register"]

NAME = "attn"

_warned_about_weights = False


def _warn_once_about_weights():
    global _warned_about_weights
    _warned_about_weights = True
    warnings.warn(
        "attn does not return attention weights (with output_attentions=True the outputs' "
        'attentions come back empty, as with "sdpa"): use attn_implementation="eager" for them',
        stacklevel=3,
    )


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[torch.Tensor] = None,
    position_bias: Optional[torch.Tensor] = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """One attention layer of a transformers model: query (B, H_q, L, E), key and value
    (B, H_kv, S, E) → ((B, L, H_q, Ev), None), as transformers' ``sdpa_attention_forward``.

    ``attention_mask`` is the model's mask for this layer (bool, True = attend, or additive
    float), broadcastable to (B, H_q, L, S), or None; ``softcap`` soft-caps the scores (Gemma 2);
    ``s_aux`` holds one sink logit per query head (gpt-oss); ``position_bias`` (T5-style) is
    added to the scores as transformers' SDPA does. ``sliding_window`` is in the mask already."""
    cache = kwargs.get("cache")
    if cache is not None and type(cache).__name__ == "PagedAttentionCache":
        raise NotImplementedError(
            "attn: paged attention caches (continuous batching) are not supported; use the "
            "default caches"
        )
    if kwargs.get("output_attentions", False) and not _warned_about_weights:
        _warn_once_about_weights()
    q_length = query.shape[2]
    # As SDPA: is_causal from the call, else the module's; it applies only when the model left
    # the mask out (a plain causal pattern) and there is more than one query (a single decoding
    # query sees every cached key).
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = q_length > 1 and attention_mask is None and is_causal
    if position_bias is not None:
        from transformers.integrations.sdpa_attention import create_position_bias_mask

        attention_mask = create_position_bias_mask(
            position_bias, attention_mask, is_causal, query, key
        )
        is_causal = False
    output = _attn_torch.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=is_causal,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
        softcap=softcap,
        sinks=s_aux,
    )
    return output.transpose(1, 2).contiguous(), None


# transformers' masking_utils.sdpa_mask, once register() imported it.
_sdpa_mask = None

# model_type → whether that model's attention can take attn (see _mask).
_attention_reaches_attn = {}


def _model_attention_reaches_attn(config) -> bool:
    """Whether the model of ``config`` runs its attention through transformers' interfaces.
    Models that neither take an attention backend nor SDPA (BLOOM, XGLM, MPT: their classes'
    ``_supports_attention_backend`` and ``_supports_sdpa`` both False) compute attention in their
    own code, and only the mask comes from the implementation's name; transformers refuses
    ``"sdpa"`` for them. A model type not found is given the benefit of the doubt."""
    model_type = getattr(config, "model_type", None)
    known = _attention_reaches_attn.get(model_type)
    if known is not None:
        return known
    reaches = True
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        class_name = MODEL_MAPPING_NAMES.get(model_type)
        if isinstance(class_name, (tuple, list)):
            class_name = class_name[0]
        model_class = getattr(transformers, class_name, None) if class_name else None
        if model_class is not None:
            reaches = bool(
                getattr(model_class, "_supports_attention_backend", True)
                or getattr(model_class, "_supports_sdpa", True)
            )
    except (ImportError, AttributeError):
        pass
    _attention_reaches_attn[model_type] = reaches
    return reaches


def _mask(*args, config=None, **kwargs):
    """SDPA's boolean masks (``masking_utils.sdpa_mask``), refused for a model whose attention
    never reaches attn: it would add them to its own float scores (BLOOM, XGLM: logits 80-110%
    off eager's, causality lost) or fail on a mask left out for ``is_causal`` (MPT)."""
    # (Checked in eager calls: a compiled graph need not trace the lookup's imports.)
    if (
        config is not None
        and not torch.compiler.is_compiling()
        and not _model_attention_reaches_attn(config)
    ):
        raise ValueError(
            f'attn_implementation="{getattr(config, "_attn_implementation", NAME)}": the '
            f'"{config.model_type}" models compute attention in their own code, not through '
            'transformers\' AttentionInterface (transformers refuses "sdpa" for them too), so '
            'attn cannot run it; use attn_implementation="eager"'
        )
    return _sdpa_mask(*args, config=config, **kwargs)


def register(name: str = NAME) -> str:
    """Registers attn with transformers under ``name`` (default ``"attn"``): its
    ``AttentionInterface`` gets :func:`attention_forward`, its ``AttentionMaskInterface`` the
    boolean masks of SDPA (``masking_utils.sdpa_mask``), which attn takes as they are. A model
    whose attention is its own code (BLOOM, XGLM, MPT) is refused by name at its first forward
    call, as transformers refuses "sdpa" for it. Returns ``name``, to pass as
    ``attn_implementation``. Calling it again is harmless."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as error:
        raise ImportError(
            "attn.transformers.register() needs Hugging Face transformers >= 5 "
            "(pip install transformers)"
        ) from error
    global _sdpa_mask
    AttentionInterface.register(name, attention_forward)
    _sdpa_mask = sdpa_mask
    AttentionMaskInterface.register(name, _mask)
    return name
