"""Parsing BFCL's Python-style call lists: literals only, nothing evaluated."""

from __future__ import annotations

import pytest

from trace_envs.actions import PythonCall, looks_like_call_list, parse_call_list


def test_calls_with_positional_and_keyword_literals() -> None:
    parsed = parse_call_list("[cd(folder='document'), sort('final_report.pdf'), "
                             "lockDoors(unlock=False, door=['driver', 'passenger']), mean([1, 2.5, -3])]")
    assert parsed.ok
    assert parsed.calls == (
        PythonCall("cd", (), {"folder": "document"}),
        PythonCall("sort", ("final_report.pdf",), {}),
        PythonCall("lockDoors", (), {"unlock": False, "door": ["driver", "passenger"]}),
        PythonCall("mean", ([1, 2.5, -3],), {}),
    )
    assert parsed.calls[1].to_source() == "sort('final_report.pdf')"


@pytest.mark.parametrize("text", [
    "ls(a=True)",
    "```python\n[ls(a=True)]\n```",
    "<think>list it</think>[ls(a=True)]",
    "  [ls(a=True)]  \n",
])
def test_accepted_wrappings(text: str) -> None:
    parsed = parse_call_list(text)
    assert parsed.ok and parsed.calls == (PythonCall("ls", (), {"a": True}),)
    assert looks_like_call_list(text)


def test_empty_list_is_no_call() -> None:
    assert looks_like_call_list("[]") and parse_call_list("[]") == parse_call_list("[]")
    parsed = parse_call_list("[]")
    assert parsed.ok and parsed.calls == ()


@pytest.mark.parametrize("text, fragment", [
    ("[__import__('os').system('id')]", "plain name"),
    ("[os.system('id')]", "plain name"),
    ("[cd(folder=__import__('os'))]", "not a literal"),
    ("[cd(folder=x)]", "not a literal"),
    ("[cd(folder='a'[0])]", "not a literal"),
    ("[cd(folder=1 + 2)]", "not a literal"),
    ("[cd(folder=(lambda: 1)())]", "not a literal"),
    ("[cd(folder=[c for c in 'ab'])]", "not a literal"),
    ("[cd(*['a'])]", "*-unpacking"),
    ("[cd(**{'folder': 'a'})]", "**-unpacking"),
    ("[_load_scenario({})]", "starting with '_'"),
    ("[__class__()]", "starting with '_'"),
    ("[cd(folder='a', folder='b')]", "given twice"),
    ("[cd(folder='a'", "not valid Python syntax"),
    ("[1, 2]", "not a function call"),
    ("[ls()][0]", "expected a list"),
])
def test_refused(text: str, fragment: str) -> None:
    parsed = parse_call_list(text)
    assert not parsed.ok and parsed.calls == ()
    assert fragment in parsed.error_message()


def test_one_bad_call_refuses_the_whole_list() -> None:
    parsed = parse_call_list("[cd(folder='a'), ls(a=__import__('os'))]")
    assert not parsed.ok and parsed.calls == ()


@pytest.mark.parametrize("text", ["Done.", "I moved the file (as asked).", "Done (moved it).", "[Note] all good",
                                  "Mr. Smith's file is ready", ""])
def test_prose_is_not_a_call_list(text: str) -> None:
    assert not looks_like_call_list(text)


def test_pathological_input_never_raises() -> None:
    for text in ["[" * 10_000, "[f(" + "[" * 10_000 + "])]", "[f(x=" + "(" * 300 + "1" + ")" * 300 + ")]",
                 "[f(x='" + "a" * 100_000 + "')]", "\x00[f()]", None]:
        parsed = parse_call_list(text)  # type: ignore[arg-type]
        assert isinstance(parsed.ok, bool)
