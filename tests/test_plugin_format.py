"""A file format added by a plugin: one registration call in a module of its own (here a toy
pipe-separated ``.psv`` table) makes it readable as training data and as an out-of-domain set,
usable by ``probtrans predict`` as input and output, listed in the command's help, and its rows
checked and named by file and line like the built-in formats'."""

from __future__ import annotations

import csv
import textwrap

import pytest

import probtrans
from probtrans.cli import main
from probtrans.data.formats import FORMATS
from probtrans.errors import ProbtransError
from tests.conftest import TINY_MODEL, plugin_imported, tiny_inference

PLUGIN = '''
"""A toy plugin: pipe-separated tables, a header line then one row per line."""

from pathlib import Path

from probtrans.data.formats import Format, register_format
from probtrans.data.rows import Rows
from probtrans.data.writers import table_rows


def read_psv(path: Path, options) -> Rows:
    lines = [line.split("|") for line in path.read_text(encoding="utf-8").splitlines()]
    header, rows = lines[0], lines[1:]
    column = {name: [row[header.index(name)] for row in rows] for name in header}
    labels = column.get(options.label_column) if options.read_labels else None
    return Rows(column[options.text_column], labels, None, lambda row: f"{path}:{row + 2}")


def write_psv(chunks, path: Path) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for number, columns in enumerate(chunks):  # a chunk of rows at a time
            if number == 0:
                fh.write("|".join(columns) + "\\n")
            fh.writelines("|".join(map(str, row)) + "\\n" for row in table_rows(columns))


register_format(Format("PSV", (".psv",), "text", read_psv, write_psv))
'''

WORDS = {"neg": ["bad", "awful", "dull"], "pos": ["good", "great", "fine"]}


def rows(n: int) -> list[str]:
    """n ``text|label`` lines, the label said by one of its words."""
    labels = ["neg", "pos"]
    return [f"the film was {WORDS[labels[i % 2]][i % 3]} really|{labels[i % 2]}" for i in range(n)]


@pytest.fixture
def plugin(tmp_path):
    """The plugin module imported (its one registration), forgotten after the test."""
    with plugin_imported(tmp_path, "psv_plugin", PLUGIN, FORMATS):
        yield


def test_a_plugin_format_is_read_predicted_written_and_listed(plugin, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.psv").write_text("\n".join(["text|label", *rows(40)]) + "\n")
    (data / "questions.psv").write_text("text\nwhy is it so\nwhere is the film\n")
    model = tmp_path / "model.toml"
    spec = f"""
        [data]
        kind = "text"
        train = "data/train.psv"
        max_len = 8

        [[data.ood]]
        name = "questions"
        source = "data/questions.psv"

        [model]{TINY_MODEL.split("[model]", 1)[1]}"""
    model.write_text(textwrap.dedent(spec))
    run = probtrans.fit(
        model, tiny_inference(tmp_path, "map"), out=tmp_path / "run", progress=False
    )
    assert set(run.metrics["ood"]) == {"questions"}  # read as training data and as an OOD set

    inputs = tmp_path / "inputs.psv"
    inputs.write_text("text|label\nthe film was great|pos\nthe film was awful|neg\n")
    out_csv, out_psv = tmp_path / "out.csv", tmp_path / "out.psv"
    for out in (out_csv, out_psv):
        argv = ["predict", str(tmp_path / "run"), str(inputs), "--out", str(out), "--labels"]
        assert main(argv) == 0
    with open(out_csv, newline="") as fh:
        written = list(csv.DictReader(fh))
    assert [row["label"] for row in written] == ["pos", "neg"]
    lines = out_psv.read_text().splitlines()
    assert lines[0].split("|") == list(written[0]) and len(lines) == 3

    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    assert ".psv" in capsys.readouterr().out


def test_a_plugin_format_rows_are_checked_and_named_by_line(plugin, tmp_path):
    from probtrans.data.files import parse_source, read_texts

    path = tmp_path / "bad.psv"
    path.write_text("text|label\nfine|pos\n |neg\nok|\n")
    with pytest.raises(ProbtransError) as err:
        read_texts(parse_source(str(path)))
    assert str(err.value) == f"{path}:3: 'text' is empty; {path}:4: 'label' is missing"


def test_an_unknown_suffix_names_the_known_ones(tmp_path):
    from probtrans.data.files import parse_source, read_texts

    path = tmp_path / "in.psv"
    path.write_text("text|label\nfine|pos\n")
    known = r"\.csv, \.tsv, \.jsonl, \.jsonl\.gz, \.parquet files"
    with pytest.raises(ProbtransError, match=rf"'\.psv'; texts are read from {known}"):
        read_texts(parse_source(str(path)))
