"""The real models of test_real_models.py: Hugging Face ``transformers`` architectures built from
small configs in code (no weights downloaded, dropout off), each with its batches and loss
(``CASES``), and the wrappers that give them one input signature.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Tuple

import pytest
import torch
import torch.nn.functional as F
from _hf_call import KeywordCall

transformers = pytest.importorskip("transformers")
T = transformers
T.logging.set_verbosity_error()

STEPS = 3
B, S, V = 8, 8, 64
NOD = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# The one-layer encoder the encoder and ViT cases share (dropout off).
ENCODER = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    num_labels=3,
    **NOD,
)


class Case(NamedTuple):
    family: str
    make: Callable[[], torch.nn.Module]  # the model, in train mode
    batch: Callable[
        ..., Tuple[torch.Tensor, ...]
    ]  # (generator[, step]) -> (model inputs..., target)
    loss: Callable  # loss_fn(model output, target), or None: the model returns the loss
    batchnorm: bool = False
    stepwise: bool = False  # batch() also takes the step's index


def _ids(g):
    return torch.randint(3, V, (B, S), generator=g)


def lm_batch(g):
    ids = _ids(g)
    return ids, ids.roll(-1, 1)


def cls_batch(g):
    return _ids(g), torch.randint(0, 3, (B,), generator=g)


def masked_cls_batch(g):
    ids, labels = cls_batch(g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[torch.arange(B) % 3 == 1, S - 2 :] = 0  # padded samples, as a tokenizer makes them
    return ids, mask, labels


def image_batch(g):
    return torch.randn(B, 3, 32, 32, generator=g), torch.randint(0, 3, (B,), generator=g)


# A decoder LM trained as users train one: input_ids, the tokenizer's 2-D attention_mask and labels
# (-100 where the mask is 0); the model shifts the labels and computes its own loss.
LM_WITH_MASK = ("input_ids", "attention_mask", "labels")


def lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def cls_loss(out, y):
    return F.cross_entropy(out.logits if hasattr(out, "logits") else out, y)


# Padded rows (sample, pad tokens, side) of each step's batch: with N=2 (4+4) step 1 pads rank 0's
# rows only, step 2 rank 1's only, step 3 none (the batch transformers would skip the mask for).
PADDING = (
    [(1, 2, "right"), (2, 5, "right"), (3, 3, "left")],
    [(5, 3, "right"), (7, 1, "left")],
    [],
)


def padded_lm_batch(g, step):
    ids = _ids(g)
    mask = torch.ones(B, S, dtype=torch.long)
    for row, pads, side in PADDING[step]:
        mask[row, slice(S - pads, S) if side == "right" else slice(0, pads)] = 0
    return ids, mask, ids.masked_fill(mask == 0, -100)


def masked_seq2seq_batch(g):
    ids = _ids(g)
    keep = torch.ones(B, S, dtype=torch.bool)
    keep[torch.arange(B) % 3 == 1, S - 2 :] = False  # padded sources
    enc = keep[:, None, None, :].expand(B, 1, S, S).contiguous()
    dec = torch.ones(S, S, dtype=torch.bool).tril()[None, None].expand(B, 1, S, S).contiguous()
    return ids, enc, dec, ids.roll(-1, 1)


def _lm(cls, cfg_cls, **kw):
    return lambda: cls(cfg_cls(vocab_size=V, max_position_embeddings=16, num_hidden_layers=1, **kw))


def bart_config():
    """A BART of one encoder and one decoder layer, dropout off."""
    return T.BartConfig(
        vocab_size=V,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=16,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )


DECODER = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
GPT2 = dict(
    vocab_size=V,
    n_positions=16,
    n_embd=32,
    n_layer=1,
    n_head=2,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=0,
    eos_token_id=0,
)

CASES: Dict[str, Case] = {
    # decoder LMs
    "gpt2": Case("decoder", lambda: T.GPT2LMHeadModel(T.GPT2Config(**GPT2)), lm_batch, lm_loss),
    "llama": Case("decoder", _lm(T.LlamaForCausalLM, T.LlamaConfig, **DECODER), lm_batch, lm_loss),
    "gpt2_padded": Case(
        "decoder",
        lambda: KeywordCall(T.GPT2LMHeadModel(T.GPT2Config(**GPT2)), LM_WITH_MASK),
        padded_lm_batch,
        None,
        stepwise=True,
    ),
    "llama_padded": Case(
        "decoder",
        lambda: KeywordCall(_lm(T.LlamaForCausalLM, T.LlamaConfig, **DECODER)(), LM_WITH_MASK),
        padded_lm_batch,
        None,
        stepwise=True,
    ),
    "mistral": Case(
        "decoder",
        _lm(T.MistralForCausalLM, T.MistralConfig, sliding_window=4, **DECODER),
        lm_batch,
        lm_loss,
    ),
    "qwen2": Case("decoder", _lm(T.Qwen2ForCausalLM, T.Qwen2Config, **DECODER), lm_batch, lm_loss),
    # a classification head that picks each sequence's last token: logits[arange(B), last]
    "llama_cls": Case(
        "decoder",
        _lm(
            T.LlamaForSequenceClassification, T.LlamaConfig, num_labels=3, pad_token_id=0, **DECODER
        ),
        cls_batch,
        cls_loss,
    ),
    "falcon": Case(
        "decoder",
        lambda: T.FalconForCausalLM(
            T.FalconConfig(
                vocab_size=V,
                hidden_size=32,
                num_attention_heads=4,
                num_hidden_layers=1,
                hidden_dropout=0.0,
                attention_dropout=0.0,
            )
        ),
        lm_batch,
        lm_loss,
    ),
    "opt": Case(
        "decoder",
        lambda: T.OPTForCausalLM(
            T.OPTConfig(
                vocab_size=V,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                ffn_dim=64,
                max_position_embeddings=16,
                dropout=0.0,
                attention_dropout=0.0,
                word_embed_proj_dim=32,
            )
        ),
        lm_batch,
        lm_loss,
    ),
    # encoders (sequence classification)
    "bert": Case(
        "encoder",
        lambda: T.BertForSequenceClassification(
            T.BertConfig(
                vocab_size=V,
                max_position_embeddings=16,
                **ENCODER,
            )
        ),
        cls_batch,
        cls_loss,
    ),
    "roberta": Case(
        "encoder",
        lambda: T.RobertaForSequenceClassification(
            T.RobertaConfig(
                vocab_size=V,
                max_position_embeddings=20,
                pad_token_id=0,
                **ENCODER,
            )
        ),
        cls_batch,
        cls_loss,
    ),
    "distilbert": Case(
        "encoder",
        lambda: T.DistilBertForSequenceClassification(
            T.DistilBertConfig(
                vocab_size=V,
                dim=32,
                n_layers=1,
                n_heads=2,
                hidden_dim=64,
                max_position_embeddings=16,
                num_labels=3,
                dropout=0.0,
                attention_dropout=0.0,
                seq_classif_dropout=0.0,
            )
        ),
        cls_batch,
        cls_loss,
    ),
    "electra": Case(
        "encoder",
        lambda: T.ElectraForSequenceClassification(
            T.ElectraConfig(
                vocab_size=V,
                embedding_size=16,
                max_position_embeddings=16,
                **ENCODER,
            )
        ),
        cls_batch,
        cls_loss,
    ),
    "deberta_v2": Case(
        "encoder",
        lambda: KeywordCall(
            T.DebertaV2ForSequenceClassification(
                T.DebertaV2Config(
                    vocab_size=V,
                    max_position_embeddings=16,
                    pooler_dropout=0.0,
                    **ENCODER,
                )
            ),
            ("input_ids", "attention_mask"),
            "logits",
        ),
        masked_cls_batch,
        cls_loss,
    ),
    # encoder-decoder
    "t5": Case(
        "encoder-decoder",
        lambda: KeywordCall(
            T.T5ForConditionalGeneration(
                T.T5Config(
                    vocab_size=V,
                    d_model=32,
                    d_kv=16,
                    d_ff=64,
                    num_layers=1,
                    num_heads=2,
                    dropout_rate=0.0,
                    decoder_start_token_id=0,
                    pad_token_id=0,
                )
            ),
            ("input_ids", "labels"),
        ),
        lm_batch,
        None,
    ),
    "bart": Case(
        "encoder-decoder",
        # prebuilt 4-D boolean masks (True: attend), which transformers uses as given instead of
        # testing the 2-D mask for padding
        lambda: KeywordCall(
            T.BartForConditionalGeneration(bart_config()),
            ("input_ids", "attention_mask", "decoder_attention_mask", "labels"),
        ),
        masked_seq2seq_batch,
        None,
    ),
    # vision
    "vit": Case(
        "vision",
        lambda: T.ViTForImageClassification(
            T.ViTConfig(
                image_size=32,
                patch_size=8,
                **ENCODER,
            )
        ),
        image_batch,
        cls_loss,
    ),
    "convnext": Case(
        "vision",
        lambda: T.ConvNextForImageClassification(
            T.ConvNextConfig(
                num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3, image_size=32
            )
        ),
        image_batch,
        cls_loss,
    ),
    "swin": Case(
        "vision",
        lambda: T.SwinForImageClassification(
            T.SwinConfig(
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
                num_labels=3,
                drop_path_rate=0.0,
                **NOD,
            )
        ),
        image_batch,
        cls_loss,
    ),
    "resnet": Case(
        "vision",
        lambda: T.ResNetForImageClassification(
            T.ResNetConfig(
                embedding_size=8,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                layer_type="basic",
                num_labels=3,
            )
        ),
        image_batch,
        cls_loss,
        batchnorm=True,
    ),
}
# The uneven split runs for one model of each family (and the BatchNorm one).
UNEVEN = ["llama", "llama_cls", "llama_padded", "bert", "deberta_v2", "t5", "swin", "resnet"]
MATRIX = [(m, 2) for m in CASES] + [(m, 3) for m in UNEVEN]


def make(name: str):
    torch.manual_seed(0)
    return CASES[name].make().train()


def optimizer(model):
    # SGD with momentum: Adam's m / sqrt(v) amplifies the rounding of per-rank partial sums
    # where a gradient is near zero (an embedding row of a rare token: 2.3e-6 on one element of
    # BERT's word embeddings after 3 steps), see test_worker_dist.py, (b).
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batches(name: str):
    g = torch.Generator().manual_seed(1)
    case = CASES[name]
    return [case.batch(g, step) if case.stepwise else case.batch(g) for step in range(STEPS)]
