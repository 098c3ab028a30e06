"""The data boundary: every kind of bad row becomes a reject with its file, line and reason, and
every good row is kept (issue 43). Missing inputs are config errors before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from raypost.config import DataConfig, ModelConfig
from raypost.config.base import ConfigError
from raypost.data.rows import qa_schema

GOOD = {"question": "Ann has 3 pens and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}


def good(i: int) -> bytes:
    return json.dumps({"question": f"q{i}: 3 plus {i}?", "answer": f"3 + {i} = {3 + i}\n#### {3 + i}"}).encode()


# One row per kind: (line as bytes, the reason's start). Each fails on the old reader (read_text +
# str.splitlines + json.loads), which aborted the read or split the row.
BAD_ROWS = [
    (b"[" * 100_000 + b"]" * 100_000, "bad JSON: JSON nested too deeply"),
    (b'{"question": "caf\xe9?", "answer": "#### 1"}', "invalid UTF-8: byte 17"),
    (b'{"question": "x", "answer": "#### 1"' + b" " * 1_100_000 + b"}", "row too large"),
    (json.dumps({"question": ["not", "text"], "answer": "#### 2"}).encode(), "field 'question' is list"),
    (json.dumps({"question": "q", "answer": {"n": 2}}).encode(), "field 'answer' is dict"),
    (b'{"question": "q", "answer": ', "bad JSON"),
    (b"null", "row is NoneType"),
]


@pytest.mark.parametrize("line,reason", BAD_ROWS, ids=lambda x: x[:20] if isinstance(x, str) else None)
def test_a_bad_line_is_a_reject_with_its_reason(line: bytes, reason: str):
    row = qa_schema("question", "answer").parse_line(line)
    assert row["reject"].startswith(reason), row["reject"]
    assert row["raw"] and len(row["raw"]) <= 2000


@pytest.mark.parametrize(
    "line,answer",
    [
        (json.dumps({"question": "a\u2028b?", "answer": "#### 3"}, ensure_ascii=False).encode(), "3"),
        (json.dumps(GOOD).encode() + b"\r", "7"),  # CRLF file
    ],
)
def test_a_good_line_with_odd_characters_is_kept(line: bytes, answer: str):
    row = qa_schema("question", "answer").parse_line(line)
    assert row["reject"] == "" and row["answer"] == answer


def test_every_bad_row_kind_goes_through_the_data_phase(ray_cluster, tiny_model, tmp_path: Path):
    """A file holding every bad-row kind, with a BOM and CRLF lines, plus a Parquet file with a
    wrong-typed row: every good row is kept, every bad one is in rejects.jsonl with its file and line."""
    from raypost.phases.data import prepare

    lines = [good(0)]
    expected: dict[int, str] = {}
    for i, (bad, reason) in enumerate(BAD_ROWS):
        lines += [bad, good(i + 1)]
        expected[len(lines) - 1] = reason  # 1-based number of the bad line
    lines.append(json.dumps({"question": "x\u2028y = 40 + 2?", "answer": "#### 42"}, ensure_ascii=False).encode())
    lines.append(json.dumps({"question": "long " * 400, "answer": "#### 1"}).encode())
    expected[len(lines)] = "too long"
    f = tmp_path / "train.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n")
    evals = tmp_path / "eval.jsonl"
    evals.write_bytes(b"\n".join([good(50), b'{"question": "  ", "answer": "#### 1"}', good(51)]))

    cfg = DataConfig(path=str(f), eval_path=str(evals), max_seq_len=128)
    _, data = prepare(cfg, ModelConfig(path=str(tiny_model)), tmp_path / "run")

    kept = sorted(r["answer"] for r in data.train.take_all())
    assert kept == sorted([str(3 + i) for i in range(len(BAD_ROWS) + 1)] + ["42"])
    assert sorted(r["answer"] for r in data.eval.take_all()) == ["53", "54"]
    rejects = [json.loads(x) for x in (tmp_path / "run" / "rejects.jsonl").read_text().splitlines()]
    train = {r["line"]: r for r in rejects if r["split"] == "train"}
    assert sorted(train) == sorted(expected)
    for line, reason in expected.items():
        assert train[line]["file"] == str(f) and train[line]["reason"].startswith(reason), train[line]
    [bad_eval] = [r for r in rejects if r["split"] == "eval"]
    assert (bad_eval["file"], bad_eval["line"]) == (str(evals), 2) and "is empty" in bad_eval["reason"]
    assert data.counts["train"]["rejected"] == len(expected)


def test_parquet_rejects_name_their_file_and_row(ray_cluster, tmp_path: Path):
    from raypost.data.sources import read_source

    f = tmp_path / "rows.parquet"
    pd.DataFrame({"question": ["2 + 2?", "  ", "5 + 1?"], "answer": ["#### 4", "#### 1", "#### 6"]}).to_parquet(f)
    rows = read_source(DataConfig(path=str(f)), str(f), "train").take_all()
    assert [r["answer"] for r in rows if not r["reject"]] == ["4", "6"]
    [bad] = [r for r in rows if r["reject"]]
    assert bad["where"] == f"{f}:2" and "is empty" in bad["reject"]


@pytest.mark.parametrize(
    "data,match",
    [
        ({"path": "/nonexistent/train.jsonl"}, r"data.path: '/nonexistent/train.jsonl' does not exist"),
        (
            {"source": "parquet", "path": "/tmp", "eval_path": "/nonexistent/e.parquet"},
            r"data.eval_path: .* does not exist",
        ),
        ({"source": "hf", "path": "no-such-org/no-such-dataset"}, r"data.path: the HF dataset .*HF_DATASETS_OFFLINE"),
    ],
)
def test_missing_inputs_are_config_errors_before_ray(data, match, monkeypatch):
    from raypost.phases.data import check_data_inputs

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=match):
        check_data_inputs(DataConfig(**data))


def test_hf_dataset_rows_name_their_dataset_split_and_row(ray_cluster, tmp_path: Path):
    """An HF dataset (a local folder that ``datasets.load_dataset`` reads, as a hub id would be)."""
    from raypost.data.sources import read_source

    folder = tmp_path / "ds"
    folder.mkdir()
    rows = [{"question": "2 + 2?", "answer": "#### 4"}, {"question": " ", "answer": "#### 1"}]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = DataConfig(source="hf", path=str(folder), hf_split="train")
    got = read_source(cfg, str(folder), "train").take_all()
    assert [r["answer"] for r in got if not r["reject"]] == ["4"]
    [bad] = [r for r in got if r["reject"]]
    assert bad["where"] == f"{folder}[train]:2" and "is empty" in bad["reject"]
