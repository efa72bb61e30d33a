"""Tiny pretrained-style Hugging Face models for the backbone tests: random weights, hidden size
32, 2 layers, a WordPiece tokenizer trained here with ``tokenizers`` (an image processor for
the ViT), saved with
``save_pretrained`` into a folder that the backbone code loads as it would a hub snapshot."""

from __future__ import annotations

from pathlib import Path

import torch

#: a few sentences to learn the tokenizer's vocabulary from
TEXTS = [
    "the film was wonderful and the actors were great",
    "a dull and boring movie with a terrible plot",
    "I loved every minute of this beautiful story",
    "the worst acting I have ever seen on screen",
    "an excellent script , clever and funny",
    "bad direction , bad music and a weak ending",
]
SPECIAL = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
TEXT_FAMILIES = ("bert", "roberta", "distilbert", "modernbert")
#: encoder-decoder models, whose encoder a classifier reads texts with
ENCODER_DECODERS = ("t5", "bart")
#: the sizes of every tiny model: hidden size 32, 4 heads, 2 layers
TINY_SIZES = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64)


def tiny_tokenizer(texts: list[str] = TEXTS, pad_first: bool = True):
    """A fast WordPiece tokenizer (``PreTrainedTokenizerFast``) with [CLS] … [SEP] around each
    text (a pair as BERT's: [CLS] a [SEP] b [SEP], segment 1 from b on); [PAD] is id 0 unless
    ``pad_first`` is False (then id 1, as in RoBERTa)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    order = ["pad", "unk", "cls", "sep", "mask"]
    if not pad_first:
        order = ["cls", "pad", "sep", "unk", "mask"]
    specials = [SPECIAL[name] for name in order]
    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL["unk"]))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials)
    )
    cls, sep = SPECIAL["cls"], SPECIAL["sep"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **{f"{name}_token": token for name, token in SPECIAL.items()},
    )


def tiny_decoder_tokenizer(texts: list[str] = TEXTS):
    """A fast WordPiece tokenizer as a decoder's (GPT-2's, Llama's): no padding token, an
    end-of-text token its texts do not carry (id 0), nothing added around a text."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", SPECIAL["unk"]]
    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL["unk"]))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials)
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=specials[0], unk_token=SPECIAL["unk"]
    )


def save_tiny_gpt2(folder: Path, seed: int = 0) -> Path:
    """A tiny GPT-2 (causal; linear maps of ``transformers``' Conv1D; random weights) and its
    tokenizer without a padding token (:func:`tiny_decoder_tokenizer`), with
    ``save_pretrained``; returns the folder."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    tokenizer = tiny_decoder_tokenizer()
    sizes = dict(n_embd=32, n_head=4, n_layer=2, n_positions=64)
    config = GPT2Config(vocab_size=len(tokenizer), **sizes, bos_token_id=0, eos_token_id=0)
    GPT2Model(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def tiny_config(family: str, vocab_size: int = 200, **sizes):
    """A config of ``family`` (bert, roberta, distilbert, modernbert, vit, t5, bart) with hidden
    size 32, 4 heads and 2 layers (ModernBERT's both of global attention, unless ``layer_types``
    says otherwise); ``sizes`` override."""
    from transformers import (
        BertConfig,
        DistilBertConfig,
        ModernBertConfig,
        RobertaConfig,
        ViTConfig,
    )

    if family == "distilbert":
        return DistilBertConfig(
            vocab_size=vocab_size,
            dim=32,
            n_heads=4,
            n_layers=2,
            hidden_dim=64,
            max_position_embeddings=64,
            pad_token_id=0,
            **sizes,
        )
    common = TINY_SIZES
    if family == "modernbert":  # [PAD] 0, [CLS] 2, [SEP] 3: the tiny tokenizer's ids
        ids = dict(pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
        sizes = {"layer_types": ["full_attention"] * 2, **sizes}
        return ModernBertConfig(
            **common, vocab_size=vocab_size, max_position_embeddings=64, **ids, **sizes
        )
    if family in ENCODER_DECODERS:  # as TINY_SIZES, in each one's own names
        from transformers import BartConfig, T5Config

        if family == "t5":
            t5 = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
            return T5Config(vocab_size=vocab_size, pad_token_id=0, **{**t5, **sizes})
        bart = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
        stacks = dict(encoder_layers=2, decoder_layers=2)
        heads = dict(encoder_attention_heads=4, decoder_attention_heads=4)
        ids = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=3)
        return BartConfig(vocab_size=vocab_size, **{**bart, **stacks, **heads, **ids, **sizes})
    if family == "vit":
        return ViTConfig(**common, image_size=8, patch_size=2, num_channels=1, **sizes)
    if family == "roberta":
        return RobertaConfig(
            **common, vocab_size=vocab_size, max_position_embeddings=66, pad_token_id=1, **sizes
        )
    return BertConfig(**common, vocab_size=vocab_size, max_position_embeddings=64, **sizes)


def save_tiny_backbone(family: str, folder: Path, seed: int = 0, **sizes) -> Path:
    """Write a tiny ``family`` model (random weights, ``AutoModel``; ``sizes`` override its
    config) and, for text, its tokenizer into ``folder`` with ``save_pretrained``; returns the
    folder."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    tokenizer = None
    config = tiny_config(family, **sizes)
    if family != "vit":
        tokenizer = tiny_tokenizer(pad_first=family != "roberta")
        config = tiny_config(family, vocab_size=len(tokenizer), **sizes)
    model = AutoModel.from_config(config)
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    else:
        tiny_image_processor().save_pretrained(folder)
    return Path(folder)


def tiny_image_processor():
    """The ViT image processor of the tiny ViT: 8×8 single-channel images, standardised with
    mean 0.5 and standard deviation 0.25."""
    from transformers import ViTImageProcessor

    return ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.25])
