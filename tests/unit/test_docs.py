"""The docs cannot drift: every name, command, file and config they quote must exist.

Scans README.md and docs/*.md. Code means inline code spans and fenced blocks.
- ``raysim.x.y`` names in code import (the longest module prefix, then attributes), and so do the
  names of ``from raysim.x import a, b`` lines and ``P.name`` (``raysim.params as P``);
- ``raysim <command> [--option]`` and ``make <target>`` in code are real subcommands, options and
  Makefile targets;
- repository paths in code (``raysim/...``, ``algorithms/...``, ``jobs/...``, ...) exist, and every
  ``jobs/...yaml`` named anywhere validates;
- dotted config keys in inline code (``evaluation.heldout_fraction``) are fields of the job config;
- fenced YAML blocks that hold a job, or some of its sections (completed with a minimal dataset,
  model and algorithm), validate;
- a fenced block right after ``<!-- quoted from PATH -->`` appears verbatim in PATH (up to a
  common indent).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"(?<![\w./-])raysim(?:\.[A-Za-z_]\w*)+")
_FROM_IMPORT = re.compile(r"^\s*from (raysim(?:\.\w+)*) import ([\w, ]+)$", re.M)
_P_NAME = re.compile(r"(?<![\w.])P\.([A-Za-z_]\w*)")
# a command line: `raysim ...` at the start of a span or line (after VAR=value settings and an
# optional path or `python -m`), or after ` -- ` (ray job submit)
_COMMAND = re.compile(
    r"(?:^|(?<= -- ))\s*(?:[A-Z_]+=\S+ +)*(?:\S*python -m |\S*/)?raysim ([a-z][\w-]*)((?: +[^\s`|#]+)*)", re.M
)
_SHELL = ("", "bash", "sh", "shell", "console")
_MAKE = re.compile(r"(?<![\w./-])make ([a-z][\w-]*)")
_PATH = re.compile(r"(?<![\w./~<-])((?:raysim|algorithms|datasets|jobs|tests|docs)/[\w./{},*-]*\w)")
# a module named inside its room, as architecture.md's run diagram does (engine/loop.py): raysim/...
_ROOMS = "|".join(sorted(p.name for p in (REPO / "raysim").iterdir() if (p / "__init__.py").is_file()))
_ROOM_PATH = re.compile(rf"(?<![\w./~<-])((?:{_ROOMS})/\w+\.py)")
_CONFIG_KEY = re.compile(r"^(engine|evaluation|resources|tracking|privacy)((?:\.\w+)+)")
_QUOTED = re.compile(r"<!-- quoted from (\S+) -->\s*\n```[\w-]*\n(.*?)^```", re.M | re.S)


def _code(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(language, body) of every fenced block, and every inline code span outside them."""
    blocks = [(m.group(1), m.group(2)) for m in _FENCE.finditer(text)]
    prose = _FENCE.sub("", text)
    return blocks, _SPAN.findall(prose)


def _all_code(text: str) -> list[str]:
    blocks, spans = _code(text)
    return [body for _, body in blocks] + spans


def _braces(path: str) -> list[str]:
    """``a/{b,c}.yaml`` -> ``a/b.yaml``, ``a/c.yaml`` (nested braces are not used in the docs)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c).replace(" ", "") for c in itertools.product(*choices)]


def _resolve(name: str) -> None:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: the name is stale
        return
    raise ModuleNotFoundError(name)


# Stale quotes in text another change owns: strict, so the entry must go when the text is fixed.
OWNED_ELSEWHERE: dict[tuple[str, str], str] = {}  # (doc, quoted name) -> who will fix it


def _doc_items(pattern_of, label: str) -> list:
    items = []
    for doc in DOCS:
        for found in pattern_of(doc.read_text()):
            owner = OWNED_ELSEWHERE.get((doc.name, found))
            marks = [pytest.mark.xfail(strict=True, reason=f"stale in {owner}")] if owner else []
            items.append(pytest.param(doc, found, id=f"{doc.name}:{label}:{found}", marks=marks))
    return items


def _names(text: str) -> list[str]:
    out = set()
    for code in _all_code(text):
        out |= {m.rstrip(".") for m in _NAME.findall(code)}
        for module, names in _FROM_IMPORT.findall(code):
            out |= {f"{module}.{n.split(' as ')[0].strip()}" for n in names.split(",") if n.strip()}
        out |= {f"raysim.params.{n}" for n in _P_NAME.findall(code)}
    return sorted(out)


@pytest.mark.parametrize("doc,name", _doc_items(_names, "name"))
def test_quoted_raysim_names_resolve(doc, name):
    try:
        _resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{doc.name} quotes `{name}`, which does not resolve: {exc}")


def _subcommands() -> dict[str, set[str]]:
    from raysim.cli.main import _parser

    parser = _parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: _options(p) for name, p in sub.choices.items()}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """A command's options, its tools' too (``raysim analyze RUN_ID line --points``)."""
    found = {opt for action in parser._actions for opt in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found |= {opt for tool in action.choices.values() for opt in _options(tool)}
    return found


def _commands(text: str) -> list[str]:
    """Commands in inline spans and in shell blocks (no language or a shell's; ```text is output)."""
    blocks, spans = _code(text)
    found = set()
    for code in spans + [body for lang, body in blocks if lang in _SHELL]:
        for command, rest in _COMMAND.findall(code):
            options = re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
            found.add(" ".join([command, *options]))
    return sorted(found)


@pytest.mark.parametrize("doc,command", _doc_items(_commands, "command"))
def test_quoted_cli_commands_exist(doc, command):
    name, *options = command.split()
    commands = _subcommands()
    assert name in commands, f"{doc.name} quotes `raysim {name}`; the CLI has {sorted(commands)}"
    unknown = [o for o in options if o not in commands[name]]
    assert not unknown, f"{doc.name}: `raysim {name}` has no option {unknown}"


def _make_targets(text: str) -> list[str]:
    return sorted({t for code in _all_code(text) for t in _MAKE.findall(code)})


@pytest.mark.parametrize("doc,target", _doc_items(_make_targets, "make"))
def test_quoted_make_targets_exist(doc, target):
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    assert target in targets, f"{doc.name} quotes `make {target}`; the Makefile has {sorted(targets)}"


def _paths(text: str) -> list[str]:
    found = set()
    for code in _all_code(text):
        for path in _PATH.findall(code):
            found |= set(_braces(path.split(":")[0]))
        found |= {f"raysim/{path}" for path in _ROOM_PATH.findall(code)}
    # job files are checked wherever they are named, code or prose
    found |= {p for m in re.findall(r"jobs/[\w./{},-]*\.yaml", text) for p in _braces(m)}
    return sorted(found)


@pytest.mark.parametrize("doc,path", _doc_items(_paths, "path"))
def test_quoted_paths_exist_and_job_files_validate(doc, path):
    from raysim.bench.bench_file import load_benchmark
    from raysim.config import load_jobs

    matches = sorted(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
    assert matches, f"{doc.name} names {path}, which does not exist"
    for match in matches:
        if path.startswith("jobs/") and match.suffix == ".yaml":
            is_bench = "bench" in match.relative_to(REPO / "jobs").parts
            assert load_benchmark(match, [])[0] if is_bench else load_jobs(match), match


def _fields(model: type[BaseModel], keys: list[str]) -> bool:
    """Whether ``keys`` is a path of fields through nested config models."""
    for i, key in enumerate(keys):
        if key not in model.model_fields:
            return False
        nested = [a for a in _models(model.model_fields[key].annotation)]
        if i + 1 < len(keys):
            if not nested:
                return False
            return any(_fields(m, keys[i + 1 :]) for m in nested)
    return True


def _models(annotation) -> list[type[BaseModel]]:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _config_keys(text: str) -> list[str]:
    _, spans = _code(text)
    return sorted({"".join(m) for span in spans for m in _CONFIG_KEY.findall(span.strip())})


@pytest.mark.parametrize("doc,key", _doc_items(_config_keys, "key"))
def test_quoted_config_keys_exist(doc, key):
    """A span like `engine.x` is a job config key or a module-relative name (`engine.round.y`)."""
    from raysim.config import JobConfig

    if _fields(JobConfig, key.split(".")):
        return
    try:
        _resolve(f"raysim.{key}")
    except (ImportError, AttributeError):
        pytest.fail(f"{doc.name} quotes `{key}`: neither a job config key nor a name under raysim.")


# what a YAML block that shows only some sections of a job is completed with
_BASE_JOB = {"dataset": {"name": "digits"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}


def _job_blocks(text: str) -> list[str]:
    """First lines of the fenced YAML blocks that hold a job, or sections of one."""
    from raysim.config import JobConfig

    blocks, _ = _code(text)
    sections = set(JobConfig.model_fields) | {"variants", "sweep"}
    out = []
    for lang, body in blocks:
        raw = yaml.safe_load(body) if lang == "yaml" else None
        if isinstance(raw, dict) and raw and set(raw) <= sections:
            out.append(body.splitlines()[0])
    return out


@pytest.mark.parametrize("doc,first_line", _doc_items(_job_blocks, "job"))
def test_job_blocks_validate(doc, first_line, tmp_path):
    from raysim.config import deep_merge, load_jobs

    [body] = [b for lang, b in _code(doc.read_text())[0] if lang == "yaml" and b.startswith(first_line)]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(deep_merge(_BASE_JOB, yaml.safe_load(body))))
    assert load_jobs(tmp_path / "job.yaml")
    if "sweep" in yaml.safe_load(body):  # its axes exist in every variant, each cell's job validates
        from raysim.config.cells import load_sweep

        assert load_sweep(tmp_path / "job.yaml").cells


def _quotes(text: str) -> list[str]:
    return [f"{path}#{i}" for i, (path, _) in enumerate(_QUOTED.findall(text))]


@pytest.mark.parametrize("doc,quote", _doc_items(_quotes, "quote"))
def test_quoted_code_is_verbatim_in_its_file(doc, quote):
    path, index = quote.rsplit("#", 1)
    body = _QUOTED.findall(doc.read_text())[int(index)][1]
    assert _is_quoted(body, (REPO / path).read_text()), f"{doc.name} quotes {path}, but the file differs"


def _is_quoted(block: str, source: str) -> bool:
    """Whether ``block``'s lines are consecutive lines of ``source``, up to a common indent (a
    docstring's example may be quoted flush left)."""
    lines, file_lines = block.rstrip("\n").splitlines(), source.splitlines()
    want = textwrap.dedent("\n".join(lines))
    return any(
        textwrap.dedent("\n".join(file_lines[i : i + len(lines)])) == want
        for i in range(len(file_lines) - len(lines) + 1)
    )


def test_the_scanner_finds_what_it_should():
    """The patterns themselves: a stale name, command, target, path and key each fail."""
    text = (
        "`raysim.train.local.no_such_thing` and `raysim run x.yaml --resume c.pt` and `make demo`\n"
        "```\nraysim submit --now\nfrom raysim.train.local import train_local, gone as g\n```\n"
        "```\nfrom raysim import run\n raysim runs (final)\nX=1 .venv/bin/raysim ls\n```\n"
        "```text\nraysim output\n```\n"
        "`engine.eval_every` `evaluation.heldout_fraction: 0.2` `jobs/{a,b}.yaml` `P.load_into`\n"
    )
    assert "raysim.train.local.no_such_thing" in _names(text)
    names = set(_names(text))
    assert {"raysim.train.local.train_local", "raysim.train.local.gone", "raysim.params.load_into"} <= names
    assert _commands(text) == ["ls", "run --resume", "runs", "submit --now"]
    assert _make_targets(text) == ["demo"]
    assert _paths(text) == ["jobs/a.yaml", "jobs/b.yaml"]
    assert _config_keys(text) == ["engine.eval_every", "evaluation.heldout_fraction"]
    from raysim.config import JobConfig

    assert not _fields(JobConfig, ["engine", "eval_every"])
    assert _fields(JobConfig, ["evaluation", "personalization", "epochs"])
    with pytest.raises(AttributeError):
        _resolve("raysim.train.local.no_such_thing")
    assert _job_blocks("```yaml\nengine: {eval_every: 5}\n```\n```yaml\nx: 1\n```\n") == [
        "engine: {eval_every: 5}"
    ]
    source = "def f():\n    x = 1\n    return x\n"
    assert _is_quoted("x = 1\nreturn x\n", source) and _is_quoted(source, source)
    assert not _is_quoted("x = 2\nreturn x\n", source) and not _is_quoted("return x\nx = 1\n", source)


# ---- what a new user meets first: the algorithm list, citations, help texts, the docs index ----

SOURCES = sorted(
    p
    for pattern in (
        "jobs/**/*.yaml",
        "raysim/**/*.py",
        "algorithms/*.py",
        "datasets/*.py",
        "tools/**/*.py",
        "tests/**/*.py",
    )
    for p in REPO.glob(pattern)
    if p != Path(__file__).resolve()
)
# a file only the maintainers have: the shared folder beside a clone, its brief, the paper notes
_OUTSIDE = re.compile(
    r"(?<![\w/.-])(?:\.\./)*shared/\w[\w./{},-]*|ARCHITECTURE\.md|notes/(?:fedfish|fedgucci|lss|ima|fusefl)\.md"
)
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_HELP_KEY = re.compile(  # lower case: ``dataset.KEY=value`` is a placeholder
    r"(?<![\w./-])((?:dataset|model|algorithm|engine|evaluation|resources|tracking|privacy)(?:\.[a-z_]\w*)+)"
)


def test_every_registered_algorithm_is_named_in_the_readme():
    from raysim import registry

    built_in = [
        e.name
        for e in registry.entries("algorithm")
        if (REPO / "algorithms") in Path(inspect.getfile(e.factory)).parents
    ]
    spans = set(_code((REPO / "README.md").read_text())[1])
    missing = [name for name in built_in if name not in spans]
    assert len(built_in) > 30, built_in  # not the test plugins (tests/plugins), which RAYSIM_PLUGIN_PATH adds
    assert not missing, f"README.md's list of algorithms lacks {missing} (`raysim ls algorithms` lists them)"


@pytest.mark.parametrize("path", DOCS + SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_cites_a_file_outside_the_repository(path):
    text = path.read_text()
    outside = sorted(set(_OUTSIDE.findall(text)))
    assert not outside, f"{path.relative_to(REPO)} cites {outside}, which a clone lacks: cite the paper"
    for target in _LINK.findall(text) if path.suffix == ".md" else []:
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(REPO) and resolved.exists(), f"{path.name} links {target}"


# a section of the maintainers' notes on a paper ("notes 3.2", "(notes A5)", "the notes' reading",
# "sec. 3.2 of the notes", "FedGuCci's notes"): the notes are not in the repository, the paper is
_NOTES = re.compile(
    r"(?<!release )\bnotes'?\s+(?:§\s*|sec(?:tion)?\.?\s*)?(?:\d+(?:\.\d+)*|A\d+)\b|\bnotes\s+§"
    r"|\bthe notes(?:'| \()|\bof the notes\b|\b(?:engineering|reading|maintainers'?)\s+notes\b"
    r"|\b(?:its|(?:FedFish|FedGuCci|LSS|IMA|FuseFL)(?:'s)?)\s+notes\b|\[notes:"
    r"|\bnotes\s+(?:fedfish|fedgucci|lss|ima|fusefl)\.md|\b(?:fedfish|fedgucci|lss|ima|fusefl)\.md\s+§?\d",
    re.I,
)


def _notes_cited(text: str) -> list[str]:
    """The notes' sections ``text`` cites, also across a line break of a comment or docstring."""
    return _NOTES.findall(re.sub(r"\n\s*(?:#\s*)?", " ", text))


@pytest.mark.parametrize("path", DOCS + SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_cites_the_maintainers_notes(path):
    cited = sorted(set(_notes_cited(path.read_text())))
    assert not cited, (
        f"{path.relative_to(REPO)} cites {cited} of the maintainers' notes, which a clone lacks: cite the "
        "paper's section, equation or table (docs/papers.md), the authors' code, or state the choice"
    )


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.description or "", parser.epilog or ""]
    for action in parser._actions:
        texts.append(action.help or "")
        if isinstance(action, argparse._SubParsersAction):
            texts += [a.help or "" for a in action._choices_actions]
            texts += [t for p in action.choices.values() for t in _help_texts(p)]
    return texts


def _is_config_key(key: str) -> bool:
    """A field path of the job config, or of any registered plugin's Config for the plugin sections."""
    from raysim import registry
    from raysim.config import JobConfig

    section, *rest = key.split(".")
    if section in ("dataset", "model", "algorithm"):
        kind = "model" if section == "model" else section
        return rest == ["name"] or any(_fields(e.config, rest) for e in registry.entries(kind) if e.config)
    return _fields(JobConfig, key.split("."))


def test_every_config_key_a_help_text_quotes_exists():
    from raysim.cli.main import _parser

    keys = sorted({k.rstrip(".") for text in _help_texts(_parser()) for k in _HELP_KEY.findall(text)})
    assert keys, "the scanner found no key in the help texts"
    bad = [k for k in keys if not _is_config_key(k)]
    assert not bad, f"`raysim ... --help` quotes config keys that do not exist: {bad}"


def _job_commands() -> list[tuple[Path, str]]:
    """Commands in the comments of the job files: indented example lines (``#   raysim run ...``)
    and inline code spans; prose that merely starts a line with "raysim" is neither."""
    found = set()
    for path in REPO.glob("jobs/**/*.yaml"):
        comments = [line[1:] for line in path.read_text().splitlines() if line.startswith("#")]
        examples = [line for line in comments if line.startswith("  ")] + _SPAN.findall("\n".join(comments))
        for command, rest in (c for example in examples for c in _COMMAND.findall(example)):
            options = re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)
            found.add((path, " ".join([command, *options])))
    return sorted(found)


@pytest.mark.parametrize("path,command", _job_commands(), ids=lambda v: str(v).replace(str(REPO) + "/", ""))
def test_commands_in_job_files_exist(path, command):
    name, *options = command.split()
    commands = _subcommands()
    assert name in commands, f"{path.name} quotes `raysim {name}`"
    unknown = [o for o in options if o not in commands[name]]
    assert not unknown, f"{path.name}: `raysim {name}` has no option {unknown}"


def test_every_doc_is_listed_in_the_docs_index():
    index = (REPO / "docs" / "README.md").read_text()
    listed = set(_LINK.findall(index))
    missing = [
        p.name for p in sorted((REPO / "docs").glob("*.md")) if p.name != "README.md" and p.name not in listed
    ]
    assert not missing, f"docs/README.md does not list {missing}: add a line for each"


def test_the_new_scanners_find_what_they_should():
    assert _OUTSIDE.findall(
        "see ../shared/papers/notes/ima.md and ARCHITECTURE.md; --output-dir /shared/x"
    ) == [
        "../shared/papers/notes/ima.md",
        "ARCHITECTURE.md",
    ]
    assert _OUTSIDE.findall("(notes/fedgucci.md section 4)") == ["notes/fedgucci.md"]
    bad = (
        "(notes 3.2), notes §2.9 item 7, (notes\n    A5), # the notes' reading, sec. 3.2 of the"
        " notes,\n# notes 2.4; FedGuCci's notes recommend; the LSS notes follow; notes ima.md 2.3;"
        " [notes: ours]"
    )
    assert _notes_cited(bad) == [
        "notes 3.2",
        "notes §2.9",
        "notes A5",
        "the notes'",
        "of the notes",
        "notes 2.4",
        "FedGuCci's notes",
        "LSS notes",
        "notes ima.md",
        "[notes:",
    ]
    fine = (
        "release notes 2.0; the driver notes each cell; ## Environment notes; notes = []; the notes, a check"
    )
    assert _notes_cited(fine) == []
    assert _HELP_KEY.findall("e.g. dataset.alpha or engine.num_rounds, not eval/central.x, dataset.KEY") == [
        "dataset.alpha",
        "engine.num_rounds",
    ]
    assert not _is_config_key("dataset.alpha") and _is_config_key("dataset.partition.alpha")
    assert _is_config_key("algorithm.local.lr") and not _is_config_key("engine.eval_every")
