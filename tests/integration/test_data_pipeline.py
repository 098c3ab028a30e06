"""The Ray Data pipeline on a real Ray cluster: counts and rejects, a disjoint hash split, a prompt
order that does not depend on block timing, Parquet sources, noisy demos."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from raypost.config import DataConfig
from raypost.data import final_answer, synthetic


def test_pipeline_counts_and_writes_rejects(ray_cluster, tiny_model, tmp_path):
    from raypost.data import preprocess

    good = [{"question": f"q{i} has 3 pens", "answer": f"3 + {i} = {3 + i}\n#### {3 + i}"} for i in range(20)]
    lines = [json.dumps(r) for r in good] + [
        "{not json",
        json.dumps({"question": "x"}),
        json.dumps({"question": "", "answer": "#### 1"}),
        json.dumps({"question": "long " * 400, "answer": "#### 1"}),
    ]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(lines) + "\n")
    cfg = DataConfig(path=str(f), max_seq_len=128)
    assert cfg.source == "jsonl"
    rows, _ = preprocess.read_splits(cfg.model_copy(update={"eval_path": str(f)}))
    tokenized = preprocess.tokenize(rows, str(tiny_model), cfg)
    rejects = tmp_path / "rejects.jsonl"
    kept, counts = preprocess.split_rejects(tokenized, "train", rejects)
    assert (counts.read, counts.kept, counts.rejected) == (24, 20, 4)
    reasons = [json.loads(x)["reason"] for x in rejects.read_text().splitlines()]
    assert len(reasons) == 4
    assert any(r.startswith("bad JSON") for r in reasons)
    assert any("missing field 'answer'" in r for r in reasons)
    assert any("field 'question' is empty" in r for r in reasons)
    assert any(r.startswith("too long") and "data.max_seq_len=128" in r for r in reasons)
    too_long = [json.loads(x) for x in rejects.read_text().splitlines() if "too long" in x][0]
    assert json.loads(too_long["raw"])["question"].startswith("long long")  # which row, not just why
    assert sorted(r["answer"] for r in kept.take_all()) == sorted(str(3 + i) for i in range(20))


def test_all_rows_bad_is_a_clear_error(ray_cluster, tiny_model, tmp_path):
    from raypost.data import DataError, preprocess

    f = tmp_path / "bad.jsonl"
    f.write_text("{oops\n" + json.dumps({"q": 1}) + "\n")
    cfg = DataConfig(path=str(f), eval_path=str(f))
    rows, _ = preprocess.read_splits(cfg)
    with pytest.raises(DataError, match=r"every one of the 2 train rows was rejected"):
        preprocess.split_rejects(preprocess.tokenize(rows, str(tiny_model), cfg), "train", tmp_path / "r.jsonl")


def test_hash_split_is_disjoint(ray_cluster, tmp_path):
    from raypost.data import preprocess

    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) for i in range(400)) + "\n")
    train, evals = preprocess.read_splits(DataConfig(path=str(f), eval_fraction=0.2))
    a, b = {r["id"] for r in train.take_all()}, {r["id"] for r in evals.take_all()}
    assert not a & b and len(a) + len(b) == 400 and 40 < len(b) < 120


def _late_block(batch: dict, late: int) -> dict:
    """A map over range(400) in 4 blocks whose block ``late`` finishes last (a busy node)."""
    import time

    if batch["id"][0] == 100 * late:
        time.sleep(1.5)
    return batch


def test_the_prompt_order_does_not_depend_on_which_block_finished_first(ray_cluster):
    """A resumed run skips a cursor's worth of its seeded prompt order, rebuilt from freshly
    prepared rows: that order must not depend on which block of the preparation finished first."""
    import ray

    from raypost.data import preprocess
    from raypost.utils.cluster import configure_ray_data

    configure_ray_data()

    def order(late: int) -> list[int]:
        prepared = (
            ray.data.range(400, override_num_blocks=4)
            .map_batches(_late_block, fn_kwargs={"late": late}, batch_format="numpy")
            .materialize()
        )
        assert [r["id"] for r in prepared.iter_rows()] == list(range(400))
        return [r["id"] for r in preprocess.epoch_order(prepared, 2, seed=0).iter_rows()]

    first = order(late=0)
    assert sorted(first[:400]) == sorted(first[400:]) == list(range(400)) and first[:400] != first[400:]
    assert order(late=3) == first


def test_parquet_source(ray_cluster, tmp_path):
    from raypost.data import preprocess

    pd.DataFrame({"question": ["a", "b", ""], "answer": ["#### 1", "#### 2", "#### 3"]}).to_parquet(
        tmp_path / "d.parquet"
    )
    cfg = DataConfig(path=str(tmp_path / "d.parquet"), eval_path=str(tmp_path / "d.parquet"))
    assert cfg.source == "parquet"
    rows, _ = preprocess.read_splits(cfg)
    got = sorted((r["question"], r["reject"] != "") for r in rows.take_all())
    assert got == [("", True), ("a", False), ("b", False)]


def test_noisy_demos_change_the_sft_target_not_the_gold(ray_cluster):
    from raypost.data import preprocess

    clean = synthetic.generate(400, seed=5, max_operand=10)
    noisy = synthetic.generate(400, seed=5, max_operand=10, prefix="train", guess_fraction=0.5)
    assert [r["question"] for r in clean] == [r["question"] for r in noisy]  # same problems
    demos = [r for r in noisy if "demo" in r]
    assert 150 < len(demos) < 250
    assert synthetic.guess("Ava has 12 pens. Ava buys 3 more pens.") == "#### 12"

    cfg = DataConfig(synthetic={"num_train": 400, "seed": 5, "num_eval": 50, "guess_fraction": 0.5})
    train, evals = preprocess.read_splits(cfg)
    by_id = {r["id"]: r for r in train.take_all()}
    assert len(by_id) == 400
    for row in noisy:
        got = by_id[row["id"]]
        assert got["answer"] == final_answer(row["answer"])  # gold: the true result
        assert got["solution"] == row.get("demo", row["answer"])  # SFT target: the demo where there is one
    assert all("\n#### " in r["solution"] for r in evals.take_all())  # held-out rows keep worked solutions
