"""The training log of a fit (``[train] logger``): the history's record of every epoch as it is
finished, as a CSV file or as TensorBoard scalars.

- ``csv`` (the default): ``RUN/history.csv``, one row per epoch with the keys of
  ``history.json`` (the ELBO and its terms, the objective, the KL annealing, the learning rate,
  the validation metrics), rewritten atomically from the whole history after every epoch, so a
  resumed fit writes the same file as an uninterrupted one.
- ``tensorboard``: the same keys as scalars in ``RUN/tensorboard/`` (``torch.utils.tensorboard``,
  which needs the ``tensorboard`` package: ``pip install probtrans[tensorboard]``), the epoch as
  the step, and ``seconds``, the wall time of the epoch (training, validation, checkpoint). A
  resumed fit purges the events of the epochs it trains again.
- ``none``: no log.

Wall time goes to TensorBoard only, whose event files hold wall times anyway: ``history.json``
and ``history.csv`` hold what the same specs and seed reproduce byte for byte (the wall time of
each epoch and of the whole fit are in ``timing.json``: ``epoch_seconds``, ``train_seconds``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

from probtrans.errors import ConfigError
from probtrans.storage.io import write_text

#: the file of ``logger = "csv"`` and the folder of ``logger = "tensorboard"`` in a run folder
CSV_FILE, TENSORBOARD_FOLDER = "history.csv", "tensorboard"

Record = Mapping[str, float]


class TrainingLog:
    """Where a fit reports every finished epoch; this one keeps nothing (``logger = "none"``)."""

    def epoch(self, history: Sequence[Record], seconds: float) -> None:
        """Log the last record of ``history`` (the fit's records so far), whose epoch took
        ``seconds`` of wall time."""

    def close(self) -> None:
        """Finish the log (also when training stopped with an error)."""

    def __enter__(self) -> TrainingLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class CsvLog(TrainingLog):
    """``history.csv``: the whole history, rewritten atomically after every epoch."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def epoch(self, history: Sequence[Record], seconds: float) -> None:
        write_text(self.path, csv_text(history))


class TensorBoardLog(TrainingLog):
    """TensorBoard scalars of every epoch, in a folder of event files."""

    def __init__(self, folder: Path, first_epoch: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                '[train] logger = "tensorboard": the tensorboard package is not installed; '
                "install it (pip install tensorboard, or probtrans[tensorboard]) or choose "
                'logger = "csv"'
            ) from None
        # a resumed fit hides the events of the epochs it trains again (its last session may
        # have logged epochs after the state it resumes)
        purge = first_epoch if first_epoch > 1 else None
        self.writer = SummaryWriter(str(folder), purge_step=purge)

    def epoch(self, history: Sequence[Record], seconds: float) -> None:
        record = history[-1]
        step = int(record["epoch"])
        for key, value in record.items():
            if key != "epoch":
                self.writer.add_scalar(key, value, step)
        self.writer.add_scalar("seconds", seconds, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def csv_text(history: Sequence[Record]) -> str:
    """The records as CSV: a header of their keys (in the order they first appear), one row per
    record, numbers as ``history.json`` writes them (the shortest repr)."""
    columns = list(dict.fromkeys(key for record in history for key in record))
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    return out.getvalue()


def open_log(
    logger: Literal["csv", "tensorboard", "none"], folder: Path | None, first_epoch: int
) -> TrainingLog:
    """The log ``logger`` names in the run folder ``folder`` (none without a folder), for a fit
    whose next epoch is ``first_epoch``."""
    if folder is None or logger == "none":
        return TrainingLog()
    if logger == "csv":
        return CsvLog(folder / CSV_FILE)
    return TensorBoardLog(folder / TENSORBOARD_FOLDER, first_epoch)
