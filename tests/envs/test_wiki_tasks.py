"""The synthetic encyclopedia, the HotpotQA loader and answer grading."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from trace_envs.tasks.hotpotqa import hotpotqa_corpus, load_hotpotqa, record_to_task
from trace_envs.tasks.wiki import SyntheticWikiConfig, default_wiki_index, generate_encyclopedia
from trace_envs.wiki_search.grading import best_em_f1, exact_match, f1_score, normalize_answer


@pytest.fixture(scope="module")
def enc():
    return generate_encyclopedia()


def test_encyclopedia_size_and_determinism(enc) -> None:
    assert len(enc.passages) >= 5000
    again = generate_encyclopedia()
    assert again.passages == enc.passages
    assert [t.fingerprint for t in again.tasks.values()] == [t.fingerprint for t in enc.tasks.values()]
    other = generate_encyclopedia(SyntheticWikiConfig(seed=1))
    assert other.passages != enc.passages
    assert len({p["id"] for p in enc.passages}) == len(enc.passages)


def test_distractors_share_names(enc) -> None:
    titles = [p["title"] for p in enc.passages if p["id"].endswith("-bio")]
    disambiguated = [t for t in titles if t.endswith(")")]
    assert len(disambiguated) > 100, "people who share a full name carry their profession in the title"
    stems = collections.Counter(p["title"].split()[0] for p in enc.passages if p["id"].endswith("-main"))
    assert sum(1 for c in stems.values() if c > 1) > 50, "organisations share name stems"


def test_questions_have_gold_passages_and_hops(enc) -> None:
    by_id = {p["id"]: p for p in enc.passages}
    kinds = collections.Counter(t.data["kind"] for t in enc.tasks.values())
    assert set(kinds) == {"founder-city", "author-year", "hq-country", "founder-country", "org-older",
                          "person-older", "same-city"}
    assert {t.data["hops"] for t in enc.tasks.values()} == {2, 3}
    assert {t.data["type"] for t in enc.tasks.values()} == {"bridge", "comparison"}
    for task in enc.tasks.values():
        gold = task.data["supporting_ids"]
        assert all(g in by_id for g in gold)
        answer = task.data["answers"][0]
        if task.data["kind"] in ("founder-city", "author-year", "hq-country", "founder-country"):
            assert answer in by_id[gold[-1]]["text"], "the answer is stated in the last gold passage"
            assert answer not in task.prompt
        if task.data["kind"] == "same-city":
            assert answer in ("yes", "no")
    assert collections.Counter(t.data["answers"][0] for t in enc.tasks.values() if t.data["kind"] == "same-city")[
        "yes"] >= 10


def test_default_index_is_cached(tmp_path: Path) -> None:
    first = default_wiki_index(cache_dir=tmp_path)
    stamp = (first / "retriever.json").stat().st_mtime_ns
    again = default_wiki_index(cache_dir=tmp_path)
    assert again == first and (first / "retriever.json").stat().st_mtime_ns == stamp
    assert (first.parent / "corpus.jsonl").is_file() and (first.parent / "tasks.jsonl").is_file()
    assert not [p for p in first.parent.parent.iterdir() if p.name.startswith(".")], "no temporary dirs left"


def test_hotpotqa_loader_reads_both_layouts(tmp_path: Path) -> None:
    official = {
        "_id": "abc",
        "question": "Q1?",
        "answer": "A1",
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [["T1", 0], ["T2", 1]],
        "context": [["T1", ["s0. ", "s1."]], ["T2", ["u0. ", "u1."]]],
    }
    columnar = {
        "id": "def",
        "question": "Q2?",
        "answer": "no",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": {"title": ["T3", "T3"], "sent_id": [0, 1]},
        "context": {"title": ["T3", "T1"], "sentences": [["v0. ", "v1."], ["dup"]]},
    }
    path = tmp_path / "hotpot.jsonl"
    path.write_text(json.dumps(official) + "\n" + json.dumps(columnar) + "\n")
    tasks = load_hotpotqa(path)
    assert tasks.ids() == ["hotpotqa-abc", "hotpotqa-def"]
    t = tasks["hotpotqa-abc"]
    assert t.prompt == "Q1?" and t.data["answers"] == ["A1"] and t.data["supporting_titles"] == ["T1", "T2"]
    assert tasks["hotpotqa-def"].data["supporting_facts"] == [["T3", 0], ["T3", 1]]
    corpus = list(hotpotqa_corpus([official, columnar]))
    assert [c["title"] for c in corpus] == ["T1", "T2", "T3"] and corpus[0]["text"] == "s0. s1."
    assert len(load_hotpotqa(path, limit=1)) == 1
    with pytest.raises(ValueError):
        record_to_task({"question": "no answer"})


@pytest.mark.parametrize(
    ("pred", "gold", "em", "f1"),
    [
        ("The Eiffel Tower!", "eiffel tower", 1.0, 1.0),
        ("a  cat", "The cat.", 1.0, 1.0),
        ("yes", "no", 0.0, 0.0),
        ("no", "no", 1.0, 1.0),
        ("Paris France", "Paris", 0.0, 2 / 3),
        ("", "x", 0.0, 0.0),
    ],
)
def test_grading(pred: str, gold: str, em: float, f1: float) -> None:
    assert exact_match(pred, gold) == bool(em)
    assert f1_score(pred, gold) == pytest.approx(f1)
    assert best_em_f1(pred, ["zzz", gold]) == (em, pytest.approx(f1))
    assert normalize_answer("  An  Apple, the PIE ") == "apple pie"
