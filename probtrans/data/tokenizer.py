"""Word-level tokenizer of text data, learned on a training split (Hugging Face ``tokenizers``).

Text is lower-cased (optionally with the ``<br />`` HTML line breaks of IMDB reviews replaced by
spaces) and split on whitespace and between word characters and punctuation; the ``vocab_size``
most frequent words seen at least ``min_freq`` times are kept. Id 0 is padding, id 1 unknown, so
words unseen in training map to the unknown id. Sequences are cut at ``max_len`` tokens and
padded to the longest of their batch.

A sentence-pair task's rows are pairs of texts (``data.text_pair_column``), encoded as the
tokenizer's pair: a pretrained tokenizer's own pair template ([CLS] a [SEP] b [SEP] for BERT,
cut longest text first), a word-level one's a [SEP] b. A backbone that takes segment ids gets
them from the token ids (:func:`pair_segments`, :func:`segment_ids`).

:func:`encoder` and :func:`decoder` are what a :class:`~probtrans.data.bundle.DataBundle` of text
keeps (``encode``, ``decode``) to turn new texts into token ids and ids back into words.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tokenizers import Encoding, Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

from probtrans.data.rows import is_text_pair, kind_of, pair_kind_of
from probtrans.errors import ConfigError, ProbtransError
from probtrans.hub import backbone_folder, backbone_tokenizer
from probtrans.specs import DataSpec

PAD, UNK = "[PAD]", "[UNK]"  # ids 0 and 1
SEP = "[SEP]"  # id 2 of a word-level tokenizer of pairs: between a pair's two texts
#: a pair of texts to encode: the separator between them is what :func:`pair_separator` finds
PROBE_PAIR = ("first text", "second text")


def pad_id(tokenizer: Tokenizer) -> int:
    """The id that pads the token ids of ``tokenizer`` (0 for a word-level one learned here)."""
    padding = tokenizer.padding
    return 0 if padding is None else int(padding["pad_id"])


def pretrained_tokenizer(spec: DataSpec) -> Tokenizer:
    """The pretrained tokenizer of ``data.tokenizer``, cutting at ``max_len`` tokens."""
    tokenizer = backbone_tokenizer(backbone_folder(spec.tokenizer, None, "data.tokenizer"))
    tokenizer.enable_truncation(spec.max_len)
    return tokenizer


def train_tokenizer(
    texts: list[str] | list[tuple[str, str]], spec: DataSpec, strip_html: bool
) -> Tokenizer:
    """A word-level tokenizer whose vocabulary is learned from ``texts`` (the training split;
    pairs of texts: both, a [SEP] token between them), or the pretrained one of
    ``data.tokenizer``."""
    pairs = bool(texts) and is_text_pair(texts[0])
    if spec.tokenizer is not None:
        tokenizer = pretrained_tokenizer(spec)
        if pairs:
            pair_separator(tokenizer, spec.tokenizer)  # refuses a tokenizer without one
        return tokenizer
    steps = [normalizers.Replace("<br />", " ")] if strip_html else []
    tokenizer = Tokenizer(WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = [PAD, UNK, SEP] if pairs else [PAD, UNK]
    trainer = WordLevelTrainer(
        vocab_size=spec.vocab_size, min_frequency=spec.min_freq, special_tokens=specials
    )
    words = (text for pair in texts for text in pair) if pairs else texts
    tokenizer.train_from_iterator(words, trainer)
    if pairs:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A", pair=f"$A {SEP} $B:1", special_tokens=[(SEP, specials.index(SEP))]
        )
    tokenizer.enable_truncation(spec.max_len)
    tokenizer.enable_padding(pad_id=0, pad_token=PAD)  # to the longest sequence of a batch
    return tokenizer


def filling_max_len(mask: torch.Tensor, max_len: int) -> int:
    """How many rows of a token mask (N, L) fill all ``max_len`` tokens: the texts the
    tokenizer cut to them (without a word), and any exactly that long."""
    return int((mask.sum(1) >= max_len).sum())


def pair_separator(tokenizer: Tokenizer, name: str = "the tokenizer") -> int:
    """The id of the special token that ``tokenizer`` (``name``, for messages) puts between a
    pair's two texts ([SEP] in BERT's [CLS] a [SEP] b [SEP]); ConfigError for a tokenizer that
    puts none (GPT-2's, without a pair template: the pair would read as one text)."""
    return separator_of(tokenizer.encode(*PROBE_PAIR), name)


def separator_of(encoding: Encoding, name: str) -> int:
    """The id of the first special token between the two texts of a pair's ``encoding`` (see
    :func:`pair_separator`)."""
    sequences = encoding.sequence_ids
    first_end = max(i for i, s in enumerate(sequences) if s == 0)
    second = sequences.index(1) if 1 in sequences else len(sequences)
    between = [i for i in range(first_end + 1, second) if encoding.special_tokens_mask[i]]
    if not between:
        raise ConfigError(
            f"data.text_pair_column: {name} puts no special token between a pair's two texts "
            f"(it has no pair template, as a decoder's): join the two texts into one column, "
            f"or use an encoder's tokenizer"
        )
    return encoding.ids[between[0]]


def pair_segments(tokenizer: Tokenizer, name: str = "the tokenizer") -> int | None:
    """For a backbone with segment embeddings: the separator after whose first occurrence
    ``tokenizer``'s pairs are in segment 1 (BERT's form, [CLS] a [SEP] b [SEP] with segment 1
    from b on, which :func:`segment_ids` gives back from the token ids), or None where its
    pairs are one segment (RoBERTa's template); ConfigError for segments of another form."""
    encoding = tokenizer.encode(*PROBE_PAIR)
    separator = separator_of(encoding, name)
    types = torch.tensor(encoding.type_ids)
    if not types.any():
        return None
    if not torch.equal(segment_ids(torch.tensor([encoding.ids]), separator)[0], types):
        raise ConfigError(
            f"data.text_pair_column: {name} gives a pair the segment ids {encoding.type_ids}, "
            f"not 1 from the first separator token on (BERT's form) that probtrans gives a "
            f"backbone; join the two texts into one column"
        )
    return separator


def segment_ids(ids: torch.Tensor, separator: int) -> torch.Tensor:
    """The segment ids (B, L) of pairs of texts encoded as token ids (B, L): 0 up to the first
    ``separator`` token, 1 after it (as BERT's pair template gives them; padding gets 1 where a
    pair is shorter than its batch, which its attention mask hides)."""
    seen = (ids == separator).long().cumsum(-1)  # (B, L): separators up to and including here
    return ((seen - (ids == separator).long()) > 0).long()


def encode(tokenizer: Tokenizer, texts: list[str] | list[tuple[str, str]]) -> torch.Tensor:
    """Token ids (N, L) of ``texts`` (or of pairs of texts, each encoded as the tokenizer's
    pair), L the longest (truncated) sequence, padded with :func:`pad_id`."""
    encodings = tokenizer.encode_batch(texts)
    if not encodings:
        return torch.zeros((0, 0), dtype=torch.int32)
    return torch.tensor([e.ids for e in encodings], dtype=torch.int32)


def encoder(
    tokenizer: Tokenizer, pairs: bool = False
) -> Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]]:
    """texts (``pairs``: pairs of texts, tuples of two strings) → (token ids (N, L) long, mask
    (N, L) bool, true where ids are not padding) with ``tokenizer``; a text without a single
    word (empty or only white space), or a text where a pair is expected or the other way
    round, raises ProbtransError naming it (as text ``first`` + its place: the row of a chunk
    of inputs that starts at row ``first``)."""

    def encode_texts(texts: list[str], first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(texts, str):
            raise ProbtransError("encode: give a list of texts, not one string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if pairs and not is_text_pair(text):
                raise ProbtransError(
                    f"encode: text {first + i} is {pair_kind_of(text)}, not a pair of texts "
                    f"(this data set's inputs are pairs: give (text, text_pair) tuples of two "
                    f"strings)"
                )
            if not pairs and not isinstance(text, str):
                pair = " (this data set's inputs are single texts)" if is_text_pair(text) else ""
                raise ProbtransError(
                    f"encode: text {first + i} is {kind_of(text)}, not a string{pair}"
                )
            if pairs and not all(part.strip() for part in text):
                raise ProbtransError(
                    f"encode: text {first + i} ({tuple(text)!r}) has an empty text"
                )
        ids = encode(tokenizer, [tuple(text) for text in texts] if pairs else texts).long()
        mask = ids != pad_id(tokenizer)
        empty = (~mask.any(1)).nonzero().flatten().tolist() if len(ids) else []
        if empty:
            row = empty[0]
            raise ProbtransError(f"encode: text {first + row} ({texts[row]!r}) has no words")
        return ids, mask

    return encode_texts


def decoder(tokenizer: Tokenizer) -> Callable[[list[int]], str]:
    """token ids → the words the model sees (lower-cased, unknown words as ``[UNK]``), padding
    left out."""

    padding = pad_id(tokenizer)

    def decode_ids(ids: list[int]) -> str:
        return tokenizer.decode([int(i) for i in ids if i != padding], skip_special_tokens=False)

    return decode_ids
