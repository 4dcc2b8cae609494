"""The offline default for WikiQA: a seeded synthetic encyclopedia of fictional entities.

:func:`generate_encyclopedia` builds, deterministically from a seed, a corpus
of passages about fictional countries, cities, people, organisations and
books, and multi-hop questions over it:

* bridge, 2 hops: "In which city was the founder of the Velmora Foundry born?"
  (organisation -> founder's biography), "In what year was the author of
  *The Glass Harbour* born?" (book -> author), "In which country is the
  Velmora Foundry headquartered?" (organisation -> city);
* bridge, 3 hops: "In which country was the founder of ... born?"
  (organisation -> founder -> city);
* comparison: "Which was founded first, the A or the B?", "Who was born
  earlier, the painter X or the sailor Y?", and yes/no "Were ... born in the
  same city?".

Every name is invented, so the answers can only be found by searching.
Distractors share names and attributes on purpose: two people may share a
full name (told apart by profession, e.g. "Aldric Venn (architect)"),
organisations share a stem ("Velmora Foundry", "Velmora Press"), each
organisation's history passage names another person, and each career
passage names another city than the birthplace. Gold supporting passages are
recorded in every task.

:func:`default_wiki_index` writes the corpus and a bm25s index to a cache
directory (``$TRACE_GYM_CACHE`` or ``~/.cache/trace-gym``) once, atomically;
later calls only open it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_envs.core import Task, TaskSet
from trace_envs.tasks.splits import SplitTaskSet

__all__ = [
    "SyntheticWikiConfig",
    "Encyclopedia",
    "generate_encyclopedia",
    "default_wiki_tasks",
    "WIKI_SPLITS",
    "HELDOUT_FRACTION",
    "wiki_split",
    "wiki_demonstration_tasks",
    "default_wiki_index",
    "cache_root",
    "GENERATOR_VERSION",
]

#: bump when the generator's output changes (it names the cache directory).
GENERATOR_VERSION = 1

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s",
           "st", "t", "th", "v", "z", "sh", "j", "w", "y", "qu", "tr", "bl", "cl", "fl", "sk"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk", "st", "v"]
_PROFESSIONS = ["architect", "painter", "sailor", "chemist", "poet", "banker", "astronomer", "engineer",
                "composer", "cartographer", "physician", "sculptor", "merchant", "botanist", "novelist",
                "mathematician"]
_ORG_KINDS = [("Company", "trading"), ("Records", "music publishing"), ("Shipping", "shipping"),
              ("Foundry", "metalworking"), ("Press", "publishing"), ("Works", "engineering"),
              ("Bank", "banking"), ("Observatory", "scientific"), ("Mills", "textile"),
              ("Brewery", "brewing")]
_ADJ = ["Glass", "Silent", "Crimson", "Hollow", "Iron", "Amber", "Distant", "Broken", "Golden", "Pale",
        "Winter", "Sunken", "Quiet", "Burning", "Silver", "Velvet", "Bitter", "Hidden", "Northern", "Last",
        "Wandering", "Salt", "Painted", "Forgotten", "Endless", "Copper", "Lantern", "Scarlet", "Shallow",
        "Restless"]
_NOUN = ["Harbour", "Orchard", "Tower", "River", "Lantern", "Garden", "Bridge", "Mirror", "Season",
         "Archive", "Meadow", "Compass", "Citadel", "Shore", "Letter", "Engine", "Forest", "Voyage",
         "Kingdom", "Clockmaker", "Island", "Cathedral", "Window", "Horizon", "Ledger", "Festival",
         "Winter", "Canal", "Observatory", "Chorus"]
_GENRES = ["novel", "poetry collection", "travelogue", "treatise", "memoir", "play"]
_ACHIEVEMENTS = ["a series of bold experiments", "a widely read pamphlet", "an unusual style",
                 "long voyages", "a celebrated public lecture", "an influential workshop",
                 "a famous rivalry", "generous patronage of the arts"]


@dataclass(frozen=True, kw_only=True)
class SyntheticWikiConfig:
    """Size and seed of the synthetic encyclopedia.

    Attributes:
        seed: everything (names, facts, questions) is a function of it.
        n_countries / n_cities / n_people / n_orgs / n_books: entity counts (each person and
            organisation has two passages; the defaults give ~5,500 passages).
        shared_name_rate: fraction of people who share a full name with an earlier person.
        n_questions: questions per question type (7 types).
    """

    seed: int = 0
    n_countries: int = 24
    n_cities: int = 160
    n_people: int = 1600
    n_orgs: int = 700
    n_books: int = 700
    shared_name_rate: float = 0.25
    n_questions: int = 60

    def __post_init__(self) -> None:
        if min(self.n_countries, self.n_cities, self.n_people, self.n_orgs, self.n_books) < 4:
            raise ValueError("every entity count must be >= 4")
        if not 0 <= self.shared_name_rate < 1:
            raise ValueError("shared_name_rate must be in [0, 1)")
        if self.n_questions < 1:
            raise ValueError("n_questions must be >= 1")

    @property
    def key(self) -> str:
        """Names this configuration (cache directory and task-set name)."""
        default = SyntheticWikiConfig()
        if self == default:
            return f"synthetic-wiki-v{GENERATOR_VERSION}-seed{self.seed}"
        import hashlib

        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]
        return f"synthetic-wiki-v{GENERATOR_VERSION}-seed{self.seed}-{digest}"


@dataclass(frozen=True)
class Encyclopedia:
    """The generated corpus (``{"id","title","text"}`` records) and its questions."""

    config: SyntheticWikiConfig
    passages: list[dict[str, str]] = field(repr=False)
    tasks: TaskSet = field(repr=False)


@dataclass
class _Person:
    idx: int
    name: str
    profession: str
    birth_city: int
    birth_year: int
    other_city: int
    death_year: int
    pronoun: str
    title: str = ""


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()


def _unique_words(rng: random.Random, n: int, syllables: tuple[int, ...], taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, rng.choice(syllables))
        if 4 <= len(w) <= 12 and w not in taken:
            taken.add(w)
            out.append(w)
    return out


class _Builder:
    def __init__(self, cfg: SyntheticWikiConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"trace-gym-synthetic-wiki|{cfg.seed}")
        self.passages: list[dict[str, str]] = []
        taken: set[str] = set()
        rng = self.rng
        self.countries = _unique_words(rng, cfg.n_countries, (2, 3), taken)
        self.cities = _unique_words(rng, cfg.n_cities, (2, 3), taken)
        self.rivers = _unique_words(rng, cfg.n_cities // 3 + 1, (2,), taken)
        self.languages = [c[:-1] + "ish" if c[-1] in "aeiouy" else c + "ish" for c in self.countries]
        self.city_country = [i % cfg.n_countries for i in range(cfg.n_cities)]
        rng.shuffle(self.city_country)
        self.city_year = [rng.randint(800, 1700) for _ in range(cfg.n_cities)]
        firsts = _unique_words(rng, 150, (2,), taken)
        surnames = _unique_words(rng, 420, (1, 2), taken)
        self.people: list[_Person] = []
        professions_of: dict[str, set[str]] = {}
        for i in range(cfg.n_people):
            if self.people and rng.random() < cfg.shared_name_rate:
                name = rng.choice(self.people).name
            else:
                name = f"{rng.choice(firsts)} {rng.choice(surnames)}"
            used = professions_of.setdefault(name, set())
            profession = rng.choice([p for p in _PROFESSIONS if p not in used] or _PROFESSIONS)
            birth_city = rng.randrange(cfg.n_cities)
            other_city = (birth_city + 1 + rng.randrange(cfg.n_cities - 1)) % cfg.n_cities
            birth_year = rng.randint(1700, 1950)
            used.add(profession)
            self.people.append(_Person(i, name, profession, birth_city, birth_year, other_city,
                                       birth_year + rng.randint(35, 90), rng.choice(["He", "She"])))
        counts: dict[str, int] = {}
        for p in self.people:
            counts[p.name] = counts.get(p.name, 0) + 1
        for p in self.people:
            p.title = f"{p.name} ({p.profession})" if counts[p.name] > 1 else p.name
        stems = _unique_words(rng, cfg.n_orgs // 2 + 1, (2, 3), taken)
        self.orgs: list[dict[str, Any]] = []
        seen: set[str] = set()
        while len(self.orgs) < cfg.n_orgs:
            suffix, industry = rng.choice(_ORG_KINDS)
            name = f"{rng.choice(stems)} {suffix}"
            if name in seen:
                continue
            seen.add(name)
            founder = rng.randrange(cfg.n_people)
            person = self.people[founder]
            self.orgs.append({
                "name": name, "industry": industry, "founder": founder,
                "year": person.birth_year + rng.randint(22, 50), "hq": rng.randrange(cfg.n_cities),
                "other": (founder + 1 + rng.randrange(cfg.n_people - 1)) % cfg.n_people,
                "branch": rng.randrange(cfg.n_cities),
            })
        self.books: list[dict[str, Any]] = []
        seen = set()
        while len(self.books) < cfg.n_books:
            form = rng.randrange(3)
            if form == 0:
                title = f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)}"
            elif form == 1:
                title = f"The {rng.choice(_NOUN)} of {rng.choice(self.cities)}"
            else:
                title = f"{rng.choice(_ADJ)} {rng.choice(_NOUN)}s"
            if title in seen:
                continue
            seen.add(title)
            author = rng.randrange(cfg.n_people)
            self.books.append({"title": title, "author": author, "genre": rng.choice(_GENRES),
                               "year": self.people[author].birth_year + rng.randint(20, 34),
                               "city": rng.randrange(cfg.n_cities)})

    # --------------------------------------------------------------- passages
    def _add(self, doc_id: str, title: str, text: str) -> str:
        self.passages.append({"id": doc_id, "title": title, "text": text})
        return doc_id

    def person_ref(self, i: int) -> str:
        p = self.people[i]
        return f"the {p.profession} {p.name}"

    def write(self) -> None:
        rng = self.rng
        for c, name in enumerate(self.countries):
            capital = next((self.cities[i] for i in range(len(self.cities)) if self.city_country[i] == c), "")
            self._add(f"country-{c:03d}", name,
                      f"{name} is a country whose capital is {capital}. Its official language is "
                      f"{self.languages[c]}, and its people are known for their {rng.choice(_ACHIEVEMENTS)[2:]}.")
        for i, name in enumerate(self.cities):
            country = self.countries[self.city_country[i]]
            self._add(f"city-{i:03d}", name,
                      f"{name} is a city in {country}, on the {self.rivers[i % len(self.rivers)]} river. "
                      f"It was founded in {self.city_year[i]} and has about {rng.randint(8, 900) * 1000} inhabitants.")
        for p in self.people:
            birth, other = self.cities[p.birth_city], self.cities[p.other_city]
            pos = "His" if p.pronoun == "He" else "Her"
            templates = [
                f"{p.name} ({p.birth_year}-{p.death_year}) was {_a(p.profession)} born in {birth}. "
                f"{p.pronoun} is remembered for {rng.choice(_ACHIEVEMENTS)}.",
                f"{p.name} was {_a(p.profession)}. {p.pronoun} was born in {p.birth_year} in the city of {birth} "
                f"and became known for {rng.choice(_ACHIEVEMENTS)}.",
                f"Born in {birth} in {p.birth_year}, {p.name} worked as {_a(p.profession)} and was noted "
                f"for {rng.choice(_ACHIEVEMENTS)}.",
            ]
            self._add(f"person-{p.idx:04d}-bio", p.title, rng.choice(templates))
            self._add(f"person-{p.idx:04d}-career", p.title,
                      f"In {p.birth_year + rng.randint(20, 30)}, {p.name} moved to {other}, where {pos.lower()} "
                      f"work as {_a(p.profession)} drew wide attention. {p.name} died in {other} in {p.death_year}.")
        for j, o in enumerate(self.orgs):
            hq = self.cities[o["hq"]]
            self._add(f"org-{j:04d}-main", o["name"],
                      f"The {o['name']} is {_a(o['industry'])} firm headquartered in {hq}. It was founded in "
                      f"{o['year']} by {self.person_ref(o['founder'])}.")
            self._add(f"org-{j:04d}-history", o["name"],
                      f"In {o['year'] + rng.randint(5, 40)}, the {o['name']} opened a branch in "
                      f"{self.cities[o['branch']]}. Its longtime director was {self.person_ref(o['other'])}.")
        for b, book in enumerate(self.books):
            self._add(f"book-{b:04d}", book["title"],
                      f"{book['title']} is a {book['genre']} written by {self.person_ref(book['author'])}. "
                      f"It was first published in {book['year']} in {self.cities[book['city']]}.")

    # -------------------------------------------------------------- questions
    def questions(self, id_prefix: str = "") -> Iterator[Task]:
        cfg, rng = self.cfg, self.rng
        people, orgs, books = self.people, self.orgs, self.books
        n = cfg.n_questions

        def task(kind: str, i: int, question: str, answer: str, qtype: str, hops: int,
                 supporting: list[str], queries: list[str]) -> Task:
            titles = [self.passages[self._index[d]]["title"] for d in supporting]
            return Task(
                task_id=f"{id_prefix}{kind}-{i:03d}",
                prompt=question,
                data={"question": question, "answers": [answer], "type": qtype, "kind": kind, "hops": hops,
                      "supporting_ids": supporting, "supporting_titles": titles, "queries": queries},
            )

        def search_name(pi: int) -> str:
            p = people[pi]
            return f"{p.name} {p.profession}"

        for i, j in enumerate(rng.sample(range(len(orgs)), n)):
            o, f = orgs[j], orgs[j]["founder"]
            yield task("founder-city", i, f"In which city was the founder of the {o['name']} born?",
                       self.cities[people[f].birth_city], "bridge", 2,
                       [f"org-{j:04d}-main", f"person-{f:04d}-bio"], [o["name"], search_name(f)])
        for i, b in enumerate(rng.sample(range(len(books)), n)):
            a = books[b]["author"]
            yield task("author-year", i, f"In what year was the author of {books[b]['title']} born?",
                       str(people[a].birth_year), "bridge", 2,
                       [f"book-{b:04d}", f"person-{a:04d}-bio"], [books[b]["title"], search_name(a)])
        for i, j in enumerate(rng.sample(range(len(orgs)), n)):
            o = orgs[j]
            yield task("hq-country", i, f"In which country is the {o['name']} headquartered?",
                       self.countries[self.city_country[o["hq"]]], "bridge", 2,
                       [f"org-{j:04d}-main", f"city-{o['hq']:03d}"], [o["name"], self.cities[o["hq"]]])
        for i, j in enumerate(rng.sample(range(len(orgs)), n)):
            o, f = orgs[j], orgs[j]["founder"]
            city = people[f].birth_city
            yield task("founder-country", i, f"In which country was the founder of the {o['name']} born?",
                       self.countries[self.city_country[city]], "bridge", 3,
                       [f"org-{j:04d}-main", f"person-{f:04d}-bio", f"city-{city:03d}"],
                       [o["name"], search_name(f), self.cities[city]])
        i = 0
        while i < n:
            a, b = rng.sample(range(len(orgs)), 2)
            if orgs[a]["year"] == orgs[b]["year"]:
                continue
            first = a if orgs[a]["year"] < orgs[b]["year"] else b
            yield task("org-older", i, f"Which was founded first, the {orgs[a]['name']} or the {orgs[b]['name']}?",
                       orgs[first]["name"], "comparison", 2, [f"org-{a:04d}-main", f"org-{b:04d}-main"],
                       [orgs[a]["name"], orgs[b]["name"]])
            i += 1
        i = 0
        while i < n:
            a, b = rng.sample(range(len(people)), 2)
            pa, pb = people[a], people[b]
            if pa.birth_year == pb.birth_year or pa.name == pb.name:
                continue
            first = pa if pa.birth_year < pb.birth_year else pb
            yield task("person-older", i, f"Who was born earlier, {self.person_ref(a)} or {self.person_ref(b)}?",
                       first.name, "comparison", 2, [f"person-{a:04d}-bio", f"person-{b:04d}-bio"],
                       [search_name(a), search_name(b)])
            i += 1
        for i in range(n):
            a = rng.randrange(len(people))
            if i % 2 == 0:  # half share a birthplace
                b = rng.choice([q for q in range(len(people)) if q != a and people[q].birth_city == people[a].birth_city]
                               or [q for q in range(len(people)) if q != a])
            else:
                b = rng.choice([q for q in range(len(people)) if people[q].birth_city != people[a].birth_city])
            same = people[a].birth_city == people[b].birth_city
            yield task("same-city", i, f"Were {self.person_ref(a)} and {self.person_ref(b)} born in the same city?",
                       "yes" if same else "no", "comparison", 2, [f"person-{a:04d}-bio", f"person-{b:04d}-bio"],
                       [search_name(a), search_name(b)])

    def build(self) -> Encyclopedia:
        self.write()
        self._index = {p["id"]: k for k, p in enumerate(self.passages)}
        tasks = TaskSet(list(self.questions()), name=self.cfg.key)
        return Encyclopedia(config=self.cfg, passages=self.passages, tasks=tasks)


def generate_encyclopedia(config: SyntheticWikiConfig | None = None) -> Encyclopedia:
    """Generate the corpus and questions for ``config`` (default: ``SyntheticWikiConfig()``).

    Deterministic: the same config gives the same passages and tasks on every
    machine and Python version (it uses ``random.Random`` seeded with a string).
    """
    return _Builder(config or SyntheticWikiConfig()).build()


_TASK_CACHE: dict[SyntheticWikiConfig, TaskSet] = {}


def default_wiki_tasks(config: SyntheticWikiConfig | None = None) -> TaskSet:
    """The questions of the synthetic encyclopedia (memoised per config)."""
    config = config or SyntheticWikiConfig()
    if config not in _TASK_CACHE:
        _TASK_CACHE[config] = generate_encyclopedia(config).tasks
    return _TASK_CACHE[config]


#: Split names of the synthetic questions: disjoint question sets over the same corpus.
WIKI_SPLITS: tuple[str, ...] = ("train", "test")

#: Share of each question kind held out in the "test" split.
HELDOUT_FRACTION = 0.25


def wiki_split(split: str, config: SyntheticWikiConfig | None = None) -> TaskSet:
    """The ``"train"`` or ``"test"`` questions of the synthetic encyclopedia (memoised questions).

    The split is fixed per kind of question (seven kinds, ``n_questions`` each): the kind's
    questions are shuffled with a generator seeded by the encyclopedia's seed and the kind,
    and the first ``ceil(HELDOUT_FRACTION * n)`` of them are held out. The two splits are
    disjoint, cover every question, hold every kind in both, and are answered from the same
    corpus and index (a held-out question is new, its passages are not). Tasks keep their
    generation order inside a split; the TaskSet's name is ``<config.key>/<split>`` so a
    snapshot never moves between splits. It is a :class:`~trace_envs.tasks.splits.SplitTaskSet`:
    looking up a question of the other split raises ``TaskNotFoundError`` naming that split.
    """
    import math

    if split not in WIKI_SPLITS:
        raise ValueError(f"unknown WikiQA split {split!r}; choose one of {', '.join(WIKI_SPLITS)} "
                         f"(or 'all' for every question)")
    config = config or SyntheticWikiConfig()
    tasks = default_wiki_tasks(config)
    kinds: dict[str, list[str]] = {}
    for task in tasks.values():
        kinds.setdefault(str(task.data.get("kind", "")), []).append(task.task_id)
    held: set[str] = set()
    for kind, ids in kinds.items():
        order = sorted(ids)
        random.Random(f"trace-gym-wiki-split|{config.seed}|{kind}").shuffle(order)
        held.update(order[:math.ceil(HELDOUT_FRACTION * len(order))])
    chosen = [t for t in tasks.values() if (t.task_id in held) == (split == "test")]
    other = "train" if split == "test" else "test"
    return SplitTaskSet(chosen, name=f"{config.key}/{split}", split=split,
                        elsewhere=dict.fromkeys((t for t in tasks if (t in held) != (split == "test")), other))


def wiki_demonstration_tasks(per_kind: int = 200, *, seed: int = 1,
                             config: SyntheticWikiConfig | None = None) -> TaskSet:
    """Extra questions over the same corpus, for scripted demonstrations: none equal to a test question.

    The corpus is rebuilt exactly as :func:`generate_encyclopedia` builds it (the passages do not depend
    on ``n_questions``), then ``per_kind`` questions of each of the seven kinds are drawn with a generator
    seeded by ``seed`` (ids ``demo<seed>-<kind>-<i>``). Questions whose text is a held-out (``"test"``)
    question are dropped, so a policy warm-started on them has never seen a test question answered;
    train questions may recur. The retriever of the default index answers them (same passages).
    """
    from dataclasses import replace

    config = config or SyntheticWikiConfig()
    builder = _Builder(replace(config, n_questions=per_kind))
    builder.write()
    builder._index = {p["id"]: k for k, p in enumerate(builder.passages)}
    builder.rng = random.Random(f"trace-gym-synthetic-wiki-demo|{config.seed}|{seed}")
    held = {t.prompt for t in wiki_split("test", config).values()}
    seen: set[str] = set()
    tasks = []
    for t in builder.questions(id_prefix=f"demo{seed}-"):
        if t.prompt not in held and t.prompt not in seen:
            seen.add(t.prompt)
            tasks.append(t)
    return TaskSet(tasks, name=f"{config.key}/demo-{per_kind}-{seed}")


def cache_root() -> Path:
    """``$TRACE_GYM_CACHE`` or ``~/.cache/trace-gym``."""
    env = os.environ.get("TRACE_GYM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "trace-gym"


def default_wiki_index(config: SyntheticWikiConfig | None = None, *, cache_dir: str | Path | None = None) -> Path:
    """The directory of the synthetic corpus and its bm25s index, built on first use.

    Layout: ``<cache>/wikiqa/<config.key>/`` with ``corpus.jsonl``, ``tasks.jsonl``
    (for inspection) and ``bm25/`` (a retriever index; open it with
    ``retrievers.load_retriever``). Built in a temporary sibling and renamed
    into place, so concurrent first uses are safe. Returns the ``bm25/`` path.
    """
    config = config or SyntheticWikiConfig()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / "wikiqa" / config.key
    index = final / "bm25"
    if (index / "retriever.json").is_file():
        return index
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{config.key}-", dir=final.parent))
    try:
        from retrievers.bm25 import BM25Retriever
        from retrievers.corpus import iter_corpus, write_corpus

        enc = generate_encyclopedia(config)
        write_corpus(iter_corpus(enc.passages), work / "corpus.jsonl")
        with open(work / "tasks.jsonl", "w", encoding="utf-8") as fh:
            for t in enc.tasks.values():
                fh.write(json.dumps({"task_id": t.task_id, "prompt": t.prompt, **dict(t.data)}) + "\n")
        BM25Retriever.build(work / "corpus.jsonl", work / "bm25")
        _TASK_CACHE.setdefault(config, enc.tasks)
        try:
            os.rename(work, final)
        except OSError:  # another process finished first (or a stale dir without an index)
            if not (index / "retriever.json").is_file():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(work, final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return index
