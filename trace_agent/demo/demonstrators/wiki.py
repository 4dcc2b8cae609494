"""WikiQA-v0's demonstrator: one search per hop built from what the last search returned, then the answer.

On the synthetic encyclopedia (:mod:`trace_envs.tasks.wiki`) every query after the first is copied from
the passages the env actually returned (the founder named in the organisation's passage, the city it is
headquartered in, ...), and the answer is read off the last passage, so a policy trained on these
episodes learns to copy the bridge entity from its observation rather than to recall it.

A *flawed* episode always starts with the right first search; its mistake comes at a later hop, as a
careless searcher's would (:data:`FLAWS`):

* ``distractor``: the bridge entity is taken from a distractor passage (the organisation's longtime
  director instead of its founder, the author of a similarly named book, the branch city instead of the
  headquarters), and the episode goes on consistently from there;
* ``weak``: a weak next query (only the surname of the bridge person, only the stem of an organisation's
  name); the answer is then read from whatever passage came first, so it is sometimes right;
* ``early``: the answer is given before the last hop (the headquarters city for the founder's birthplace,
  the publication year for the author's birth year, the city for the country, a guess between the two
  entities of a comparison);
* ``misread``: the last passage is misread (the city the person moved to for the birthplace, the death
  year for the birth year, the comparison the wrong way round).

Tasks from other sources (HotpotQA, Search-R1 files) are demonstrated as before: the task's ``queries``
one per hop and the gold answer; a flawed one answers the bridge entity after the first hop.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.demo.demonstrators.base import Demonstration, tool_call
from trace_agent.demo.profiles import WIKI_QA

if TYPE_CHECKING:
    from trace_envs.core import BranchableEnv, TaskSet

__all__ = ["WikiQADemonstrator", "FLAWS", "parse_passages", "Passage", "query_entity", "entity_name_words", "search_call",
           "answer_text"]

#: The mistakes a flawed demonstration can make, per question kind (the first search is always right).
FLAWS: Mapping[str, tuple[str, ...]] = {
    "founder-city": ("distractor", "weak", "early", "misread"),
    "author-year": ("distractor", "weak", "early", "misread"),
    "hq-country": ("distractor", "early"),
    "founder-country": ("distractor", "weak", "early", "misread"),
    "org-older": ("weak", "early", "misread"),
    "person-older": ("weak", "early", "misread"),
    "same-city": ("weak", "early", "misread"),
}

_DOC = re.compile(r"^Doc \d+ \(Title: (.*?)\) (.*)$")
_ORG_MAIN = re.compile(r"^The (.+?) is an? .+? firm headquartered in (\S+)\. It was founded in (\d+) by the (\w+) (.+?)\.$")
_ORG_HISTORY = re.compile(r"^In \d+, the (.+?) opened a branch in (\S+)\. Its longtime director was the (\w+) (.+?)\.$")
_BOOK = re.compile(r"^(.+?) is an? .+? written by the (\w+) (.+?)\. It was first published in (\d+) in (\S+)\.$")
_BIO = (
    re.compile(r"^(?P<name>.+?) \((?P<year>\d+)-\d+\) was an? (?P<prof>\w+) born in (?P<city>\S+)\."),
    re.compile(r"^(?P<name>.+?) was an? (?P<prof>\w+)\. (?:He|She) was born in (?P<year>\d+) in the city of (?P<city>\S+) "),
    re.compile(r"^Born in (?P<city>\S+) in (?P<year>\d+), (?P<name>.+?) worked as an? (?P<prof>\w+) and"),
)
_CAREER = re.compile(r"^In (\d+), (.+?) moved to (\S+), where (?:his|her) work as an? (\w+) drew wide attention\. "
                     r".+ died in \S+ in (\d+)\.")
_CITY = re.compile(r"^(\S+) is a city in (\S+), on the")
_QUESTION_PEOPLE = re.compile(r"the (\w+) ([A-Z]\w+ [A-Z]\w+)")
_QUESTION_ORGS = re.compile(r"the ([A-Z]\w+ [A-Z]\w+)")


def entity_name_words(titles: Sequence[str], *, max_titles: int = 100) -> list[str]:
    """The capitalised words of ``titles`` that occur in at most ``max_titles`` of them, sorted.

    On the default synthetic encyclopedia these are the parts of names (organisations, books,
    people, cities, countries: at most 70 titles each, a shared first name included); the eleven
    organisation kinds ("Shipping", "Records": 110-168 titles) and "The" (493) are kept.
    """
    counts: dict[str, int] = {}
    for title in titles:
        for word in set(re.findall(r"\b[A-Z][a-z]+\b", title)):
            counts[word] = counts.get(word, 0) + 1
    return sorted(w for w, c in counts.items() if c <= max_titles)


@functools.lru_cache(maxsize=1)
def _name_words() -> tuple[list[str], re.Pattern[str]]:
    from trace_envs.tasks.wiki import generate_encyclopedia

    words = entity_name_words([p["title"] for p in generate_encyclopedia().passages])
    return words, re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b")


def query_entity(query: str) -> str:
    """The entity a search query names: the query without a leading "the " (as the demonstrator writes it)."""
    return query[4:] if query[:4].lower() == "the " else query


@dataclass(frozen=True)
class Passage:
    """One ``Doc i (Title: T) text`` line of a search observation."""

    title: str
    text: str


def parse_passages(observation: str) -> list[Passage]:
    """The passages of a search observation, in rank order (lines that are not passages are skipped)."""
    out = []
    for line in observation.splitlines():
        m = _DOC.match(line.strip())
        if m:
            out.append(Passage(m.group(1), m.group(2)))
    return out


def _bio(p: Passage) -> dict[str, str] | None:
    for pattern in _BIO:
        m = pattern.match(p.text)
        if m:
            return m.groupdict()
    return None


def _find_bio(passages: Sequence[Passage], name: str | None, prof: str | None) -> dict[str, str] | None:
    """The biography of ``name`` the ``prof`` among ``passages`` (any biography when ``name`` is None)."""
    for p in passages:
        bio = _bio(p)
        if bio and (name is None or (bio["name"] == name and (prof is None or bio["prof"] == prof))):
            return bio
    return None


def _find_career(passages: Sequence[Passage], name: str, prof: str | None) -> tuple[str, str] | None:
    """(the city ``name`` moved to, the death year) from their career passage."""
    for p in passages:
        m = _CAREER.match(p.text)
        if m and m.group(2) == name and (prof is None or m.group(4) == prof):
            return m.group(3), m.group(5)
    return None


def _other_person(passages: Sequence[Passage], name: str | None) -> tuple[str, str] | None:
    """(profession, name) of the first person other than ``name`` that an organisation's or a book's passage names."""
    for p in passages:
        for pattern, prof, who in ((_ORG_MAIN, 4, 5), (_ORG_HISTORY, 3, 4), (_BOOK, 2, 3)):
            m = pattern.match(p.text)
            if m and m.group(who) != name:
                return m.group(prof), m.group(who)
    return None


def _org_main(passages: Sequence[Passage], org: str | None = None) -> re.Match[str] | None:
    for p in passages:
        m = _ORG_MAIN.match(p.text)
        if m and (org is None or m.group(1) == org):
            return m
    return None


def search_call(query: str, *, question: str | None = None) -> str:
    """A search call whose query is written as it reads in running text, after "the"
    (``the Velmora Foundry``, ``the poet Ana Bel``, ``the Cadwick``), unless it is the question itself.

    The suite's byte-level BPE (Qwen's split pattern) glues one leading non-letter to a word, so a name
    at the start of a string (``"Velmora``) is other tokens than after a space (`` Velmora``), and a
    small policy cannot learn to re-spell a name it has never seen: after "the" each name is the same
    token in the question, the passages and the query, and a person's query is the very span the
    organisation's passage reads ("founded in 1850 by the poet Ana Bel"). "the" is a stopword of the
    BM25 index, so the search results are the same as for the bare name.
    """
    if query != question:
        query = "the " + query_entity(query)
    return tool_call("search", {"query": query})


def answer_text(text: str) -> str:
    """The final answer, after a space (``<answer> Cadwick</answer>``): without it ``>Cadwick`` is one
    pre-token and the city would be spelled in other pieces than in the passage it is read from (see
    :func:`search_call`); the env strips the space."""
    return f"<answer> {text}</answer>"


class _Episode:
    """The scripted plan of one synthetic-encyclopedia episode: its flaw and what it found so far."""

    def __init__(self, kind: str, question: str, queries: Sequence[str], gold: str, flaw: str | None,
                 rng: np.random.Generator) -> None:
        self.kind, self.question, self.queries, self.gold, self.flaw = kind, question, list(queries), gold, flaw
        self.rng = rng
        self.weak_variant = int(rng.integers(2))  # surname or first name / stem only

    # every step returns the next action text from the observations so far (newest last)
    def act(self, turn: int, observations: Sequence[list[Passage]]) -> str:
        handler = getattr(self, "_" + self.kind.replace("-", "_"))
        return handler(turn, observations)

    def search(self, query: str) -> str:
        return search_call(query, question=self.question)

    def _weaken(self, name: str) -> str:
        words = name.split()
        return words[-1] if self.weak_variant or len(words) < 2 else words[0]

    # ------------------------------------------------------------------ bridge questions through a person
    def _bridge_person(self, turn: int, observations: Sequence[list[Passage]]) -> tuple[str, str] | None:
        """(profession, name) of the bridge person as hop 1's passages name them (or the distractor's)."""
        first = observations[0] if observations else []
        entity = self.queries[0]
        if self.kind == "author-year":
            books = [m for m in (_BOOK.match(p.text) for p in first) if m]
            own = next((m for m in books if m.group(1) == entity), None)
            if self.flaw == "distractor":  # the author of a similarly named book, else anyone else named
                other = next((m for m in books if m.group(1) != entity), None)
                if other is not None:
                    return other.group(2), other.group(3)
                return _other_person(first, own.group(3) if own else None) or ((own.group(2), own.group(3).split()[-1])
                                                                              if own else None)
            return (own.group(2), own.group(3)) if own else None
        if self.flaw == "distractor":
            for p in first:
                m = _ORG_HISTORY.match(p.text)
                if m and m.group(1) == entity:  # the longtime director, not the founder
                    return m.group(3), m.group(4)
        m = _org_main(first, entity)
        return (m.group(4), m.group(5)) if m else None

    def _person_hop(self, person: tuple[str, str] | None) -> str:
        if person is None:  # hop 1 did not show it: search the question again
            return self.search(self.question)
        prof, name = person
        if self.flaw == "weak":
            return self.search(self._weaken(name))
        return self.search(f"{prof} {name}")

    def _read_person(self, person: tuple[str, str] | None, passages: Sequence[list[Passage]],
                     field: str) -> str | None:
        """``field`` ("city" or "year") of the person's biography in the last observation."""
        last = passages[-1] if passages else []
        if person is None:
            return None
        prof, name = person
        if self.flaw == "misread":
            career = _find_career(last, name, prof)
            if career:
                return career[0] if field == "city" else career[1]
        bio = _find_bio(last, None, None) if self.flaw == "weak" else _find_bio(last, name, prof)
        return bio[field] if bio else None

    def _founder_city(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        if turn == 0:
            return self.search(self.queries[0])
        person = self._bridge_person(turn, obs)
        if turn == 1:
            if self.flaw == "early":
                m = _org_main(obs[0], self.queries[0])
                return answer_text(m.group(2) if m else self.queries[0])
            return self._person_hop(person)
        return answer_text(self._read_person(person, obs, "city") or self._fallback())

    def _author_year(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        if turn == 0:
            return self.search(self.queries[0])
        person = self._bridge_person(turn, obs)
        if turn == 1:
            if self.flaw == "early":
                book = next((m for m in (_BOOK.match(p.text) for p in obs[0]) if m and m.group(1) == self.queries[0]),
                            None)
                return answer_text(book.group(4) if book else self.queries[0])
            return self._person_hop(person)
        return answer_text(self._read_person(person, obs, "year") or self._fallback())

    def _founder_country(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        if turn == 0:
            return self.search(self.queries[0])
        person = self._bridge_person(turn, obs)
        if turn == 1:
            return self._person_hop(person)
        if turn == 2:
            city = self._read_person(person, obs, "city")
            if self.flaw == "early":
                return answer_text(city or self._fallback())
            return self.search(city) if city else self.search(self.question)
        return answer_text(self._country_of(obs[-1]) or self._fallback())

    @staticmethod
    def _country_of(passages: Sequence[Passage], city: str | None = None) -> str | None:
        for p in passages:
            m = _CITY.match(p.text)
            if m and (city is None or m.group(1) == city):
                return m.group(2)
        return None

    def _hq_country(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        if turn == 0:
            return self.search(self.queries[0])
        if turn == 1:
            m = _org_main(obs[0], self.queries[0])
            city = m.group(2) if m else None
            if self.flaw == "early":
                return answer_text(city or self.queries[0])
            if self.flaw == "distractor":
                branch = next((h for h in (_ORG_HISTORY.match(p.text) for p in obs[0])
                               if h and h.group(1) == self.queries[0]), None)
                city = branch.group(2) if branch else city
            return self.search(city) if city else self.search(self.question)
        return answer_text(self._country_of(obs[-1]) or self._fallback())

    # ------------------------------------------------------------------ comparisons
    def _second_query(self) -> str:
        second = self.queries[1]
        if self.flaw != "weak":
            return second
        if self.kind == "org-older":
            return second.split()[0]  # the stem only: "Velmora" for "Velmora Foundry"
        name = second.rsplit(" ", 1)[0]  # "Name Surname profession" -> the surname or first name only
        return self._weaken(name)

    def _comparison_query(self, k: int) -> str:
        """Hop ``k``'s query, copied from the question (an organisation, or "profession Name Surname")."""
        if self.kind == "org-older":
            orgs = _QUESTION_ORGS.findall(self.question)
            return orgs[k] if len(orgs) > k else self.queries[k]
        people = _QUESTION_PEOPLE.findall(self.question)
        return " ".join(people[k]) if len(people) > k else self.queries[k]

    def _org_older(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        orgs = _QUESTION_ORGS.findall(self.question)[:2]
        if turn == 0:
            return self.search(self._comparison_query(0))
        if turn == 1:
            if self.flaw == "early":
                return answer_text(orgs[0] if orgs else self._fallback())
            return self.search(self._comparison_query(1) if self.flaw != "weak" else self._second_query())
        first = _org_main(obs[0], orgs[0] if orgs else None)
        second = _org_main(obs[1], orgs[1] if len(orgs) > 1 else None) or (_org_main(obs[1]) if self.flaw == "weak"
                                                                            else None)
        if first is None or second is None:
            return answer_text(self._fallback())
        older, newer = (first, second) if int(first.group(3)) < int(second.group(3)) else (second, first)
        return answer_text((newer if self.flaw == "misread" else older).group(1))

    def _people(self) -> list[tuple[str, str]]:
        return _QUESTION_PEOPLE.findall(self.question)[:2]

    def _people_hops(self, turn: int, obs: Sequence[list[Passage]]) -> tuple[str | None, list[dict[str, str] | None]]:
        people = self._people()
        if turn == 0:
            return self.search(self._comparison_query(0)), []
        if turn == 1:
            if self.flaw == "early":
                return None, []
            query = self._comparison_query(1)
            if self.flaw == "weak" and len(people) > 1:
                query = self._weaken(people[1][1])
            return self.search(query), []
        bios = []
        for k, passages in enumerate(obs[:2]):
            prof, name = people[k] if len(people) > k else (None, None)
            weak = self.flaw == "weak" and k == 1
            bios.append(_find_bio(passages, None, None) if weak else _find_bio(passages, name, prof))
        return None, bios

    def _person_older(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        action, bios = self._people_hops(turn, obs)
        if action is not None:
            return action
        people = self._people()
        if turn == 1:  # early: a guess between the two
            return answer_text(people[int(self.rng.integers(len(people)))][1] if people else self._fallback())
        if len(bios) < 2 or bios[0] is None or bios[1] is None:
            return answer_text(self._fallback())
        older, newer = sorted(bios, key=lambda b: int(b["year"]))
        return answer_text((newer if self.flaw == "misread" else older)["name"])

    def _same_city(self, turn: int, obs: Sequence[list[Passage]]) -> str:
        action, bios = self._people_hops(turn, obs)
        if action is not None:
            return action
        if turn == 1:
            return answer_text("yes" if self.rng.integers(2) else "no")
        if len(bios) < 2 or bios[0] is None or bios[1] is None:
            return answer_text(self._fallback())
        same = bios[0]["city"] == bios[1]["city"]
        if self.flaw == "misread":  # compares the cities they moved to
            people = self._people()
            moved = [_find_career(obs[k], people[k][1], people[k][0]) if len(people) > k else None for k in range(2)]
            if moved[0] and moved[1]:
                same = moved[0][0] == moved[1][0]
            else:
                same = not same
        return answer_text("yes" if same else "no")

    def _fallback(self) -> str:
        """What to answer when the passages did not give it: the gold for a clean episode, else the question's
        first entity (a wrong guess)."""
        return self.gold if self.flaw is None else self.queries[0]


class WikiQADemonstrator:
    """WikiQA-v0: one search per hop built from the returned passages, then the answer (see the module doc).

    ``train_overrides`` is the preset of WikiQA-v0's demo policy (``demo_train_config``); the
    demonstration pool (``demonstration_tasks``) is extra questions over the same corpus, none equal
    to a held-out (test) question.
    """

    env_id = WIKI_QA

    #: DemoTrainConfig fields of WikiQA-v0's demo policy (see ``demo_train_config``). Episodes here are
    #: ~450 tokens after the shared system prompt (three passages per search), several times PythonMath's
    #: per-sequence suffix. The policy must *copy* names it has never seen (the question's entity into
    #: the first search, the bridge entity from a passage into the next, the answer from the last), so
    #: ``first_turn_steps`` train first turns alone, where copying is cheap to learn, before whole
    #: episodes; names are not swapped (``augment_copies: 0``: the first-turn probe,
    #: scripts/bench/wiki_copy_probe.py, found swapping harmful). This preset, seed 0, is the shipped
    #: policy (build J: first search right 0.88, held-out success 0.14); every build and what it did on
    #: held-out questions: docs/paper/wiki/README.md.
    train_overrides: Mapping[str, Any] = {
        "steps": 1500,
        "batch_size": 16,
        "first_turn_steps": 1000,
        "flawed_fraction": 0.35,
        "demos_per_task": 1,
        "augment_copies": 0,
        "max_turns": 5,
        "model": {"vocab_size": 4096, "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                  "head_dim": 32, "intermediate_size": 384},
    }

    def __init__(self, *, flaws: Sequence[str] | None = None) -> None:
        """``flaws``: restrict flawed episodes to these mistakes (of :data:`FLAWS`; default: every one a kind has)."""
        known = {f for kind in FLAWS.values() for f in kind}
        if flaws is not None and (not flaws or set(flaws) - known):
            raise ValueError(f"unknown WikiQA flaw in {list(flaws)}; choose from {sorted(known)}")
        self.flaws = None if flaws is None else tuple(flaws)
        self._episode: _Episode | None = None

    def augment(self, demo: Demonstration, rng: np.random.Generator) -> Demonstration:
        """``demo`` with every entity-name word swapped, consistently and one-to-one, for another of the corpus.

        The words swapped are :func:`entity_name_words` of the default encyclopedia; the same
        swap is applied to the question, the queries, the passages and the answer, so the episode
        stays consistent (its reward is kept) while no name can be memorised. Demonstrations on
        other corpora (no such word in them) come back unchanged.
        """
        words, pattern = _name_words()
        text = "\n".join(str(m.get("content", "")) for m in demo.messages)
        found = sorted(set(pattern.findall(text)))
        if not found:
            return demo
        swap = dict(zip(found, (words[j] for j in rng.choice(len(words), size=len(found), replace=False)),
                        strict=True))
        messages = tuple({**m, "content": pattern.sub(lambda hit: swap[hit.group(1)], m["content"])}
                         if isinstance(m.get("content"), str) else m for m in demo.messages)
        return replace(demo, messages=messages)

    @staticmethod
    def first_query(data: Mapping[str, Any]) -> str | None:
        """The entity of a clean episode's first search on a synthetic question (its task ``data``), as
        :func:`query_entity` reads it (``mathematician Fytriast Geiv``, ``Velmora Foundry``); None for
        questions from other sources. The first search needs no observation, so none is given."""
        kind = str(data.get("kind", ""))
        if kind not in FLAWS or not data.get("queries") or not data.get("question"):
            return None
        from trace_envs.actions import parse_action

        episode = _Episode(kind, str(data["question"]), list(data["queries"]), "", None, np.random.default_rng(0))
        (call,) = parse_action(episode.act(0, [])).tool_calls
        return query_entity(str(call.arguments["query"]))

    def demonstration_tasks(self, per_kind: int = 500, seed: int = 1) -> TaskSet:
        """``per_kind`` questions of each of the seven kinds over the default corpus, none a test question."""
        from trace_envs.tasks.wiki import wiki_demonstration_tasks

        return wiki_demonstration_tasks(per_kind, seed=seed)

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        data = env.task.data
        turn = sum(1 for m in env.messages if m.get("role") == "assistant")
        kind = str(data.get("kind", ""))
        if kind not in FLAWS or not data.get("queries") or not data.get("question"):
            return self._generic(data, env.task.prompt, turn, flawed)
        if turn == 0 or self._episode is None:
            choices = [f for f in FLAWS[kind] if self.flaws is None or f in self.flaws]
            flaw = str(rng.choice(choices)) if flawed and choices else None
            self._episode = _Episode(kind, str(data["question"]), list(data.get("queries") or []),
                                     str((data.get("answers") or [""])[0]), flaw, rng)
        observations = [parse_passages(str(m["content"])) for m in env.messages if m.get("role") == "tool"]
        return self._episode.act(turn, observations)

    @staticmethod
    def _generic(data: Mapping[str, Any], prompt: str, turn: int, flawed: bool) -> str:
        queries = list(data.get("queries") or [data.get("question", prompt)])
        if flawed and turn >= 1:
            titles = list(data.get("supporting_titles") or [])
            return answer_text(titles[0] if titles else queries[0])
        if turn < len(queries):
            return tool_call("search", {"query": queries[turn]})
        return answer_text((data.get('answers') or [''])[0])
